// The official `openai` npm client with the Responses API's hosted mcp tool, against a real bin/parley running the
// reference MCP server (@modelcontextprotocol/server-everything over stdio, from scripts/node_modules) for its users.
// The model is a scripted synthetic one (tools/mkgguf -script: stories260K's vocabulary, a few small layers) whose
// greedy reply calls get-sum(19, 23) and, once it reads the tool's result, answers in words: the whole loop runs
// through llama.cpp. Run from scripts/: node --test node/mcp.test.mjs (PARLEY_BIN, PARLEY_TEST_MODEL,
// PARLEY_MCP_EVERYTHING).
import { describe, test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';
import { startAPIServer, stopAPIServer } from '../lib/parley-server.mjs';
import { ANSWER, EVERYTHING, writeEverythingConfig, writeToolCallingModel } from '../lib/mcp-fixture.mjs';

const API_KEY = 'node-mcp-key';

describe('openai npm client: the hosted mcp tool', { timeout: 600_000 }, () => {
  let dir;
  let server;
  let dataDir;
  let client;

  before(async () => {
    assert.ok(existsSync(EVERYTHING), `no ${EVERYTHING}: npm ci in scripts/, or set PARLEY_MCP_EVERYTHING`);
    dir = await mkdtemp(path.join(os.tmpdir(), 'parley-mcp-'));
    const model = await writeToolCallingModel(dir);
    const config = await writeEverythingConfig(dir, ['get-sum', 'echo']);
    ({ server, dataDir } = await startAPIServer('mcp', {
      apiKey: API_KEY, args: ['--model', model, '--temperature', '0', '--mcp-config', config],
    }));
    client = new OpenAI({ baseURL: `${server.url}v1`, apiKey: API_KEY, maxRetries: 0, timeout: 120_000 });
  });

  after(async () => {
    await stopAPIServer(server, dataDir);
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  const mcpTool = (approval) => ({ type: 'mcp', server_label: 'everything', server_url: 'https://ignored.example/mcp', require_approval: approval });

  test('responses.create calls the server tool and answers', async () => {
    const r = await client.responses.create({ model: 'parley', input: 'What is 19 + 23?', max_output_tokens: 200, tools: [mcpTool('never')] });
    assert.deepEqual(r.output.map((it) => it.type), ['mcp_list_tools', 'mcp_call', 'message']);
    const [list, call] = r.output;
    assert.equal(list.server_label, 'everything');
    assert.deepEqual(list.tools.map((t) => t.name).sort(), ['echo', 'get-sum'], 'the user\'s policy names the tools listed');
    assert.equal(call.name, 'get-sum');
    assert.match(call.output, /42/);
    assert.equal(call.error ?? null, null);
    assert.equal(r.output_text.trim(), ANSWER);
  });

  test('streamed: the mcp events in order, then the answer', async () => {
    const stream = await client.responses.create({ model: 'parley', input: 'What is 19 + 23?', max_output_tokens: 200, tools: [mcpTool('never')], stream: true });
    const types = [];
    let completed;
    for await (const ev of stream) {
      if (ev.type !== 'response.output_text.delta') types.push(ev.type);
      if (ev.type === 'response.completed') completed = ev.response;
    }
    for (const want of ['response.mcp_list_tools.completed', 'response.mcp_call_arguments.done', 'response.mcp_call.in_progress', 'response.mcp_call.completed']) {
      assert.ok(types.includes(want), `no ${want} in ${types.join(' ')}`);
    }
    assert.ok(types.indexOf('response.mcp_call.completed') < types.indexOf('response.output_text.done'));
    assert.deepEqual(completed.output.map((it) => it.type), ['mcp_list_tools', 'mcp_call', 'message']);
  });

  test('require_approval: an mcp_approval_request, then an mcp_approval_response continues the turn', async () => {
    const first = await client.responses.create({ model: 'parley', input: 'What is 19 + 23?', max_output_tokens: 200, tools: [mcpTool('always')] });
    assert.deepEqual(first.output.map((it) => it.type), ['mcp_list_tools', 'mcp_approval_request']);
    const req = first.output[1];
    assert.equal(req.name, 'get-sum');
    const second = await client.responses.create({
      model: 'parley', previous_response_id: first.id, max_output_tokens: 200, tools: [mcpTool('always')],
      input: [{ type: 'mcp_approval_response', approval_request_id: req.id, approve: true }],
    });
    assert.deepEqual(second.output.map((it) => it.type), ['mcp_list_tools', 'mcp_call', 'message']);
    assert.equal(second.output[1].approval_request_id, req.id);
    assert.match(second.output[1].output, /42/);
    assert.equal(second.output_text.trim(), ANSWER);
  });

  test('chat.completions: the server call and its result before the answer, streamed and not', async () => {
    const body = { model: 'parley', messages: [{ role: 'user', content: 'What is 19 + 23?' }], max_tokens: 200,
      tools: [{ type: 'mcp', server_label: 'everything', allowed_tools: ['get-sum'] }] };
    const r = await client.chat.completions.create(body);
    const [call, result] = r.choices[0].server_messages;
    assert.equal(call.tool_calls[0].function.name, 'get-sum');
    assert.equal(result.role, 'tool');
    assert.equal(result.tool_call_id, call.tool_calls[0].id);
    assert.match(result.content, /42/);
    assert.equal(r.choices[0].message.content.trim(), ANSWER);
    assert.equal(r.choices[0].finish_reason, 'stop');

    const stream = await client.chat.completions.create({ ...body, stream: true });
    const seen = [];
    let text = '';
    for await (const chunk of stream) {
      const d = chunk.choices[0]?.delta;
      if (!d) continue;
      if (d.role === 'tool') seen.push('result');
      else if (d.tool_calls) seen.push('call');
      else if (d.content) text += d.content;
    }
    assert.deepEqual(seen, ['call', 'result']);
    assert.equal(text.trim(), ANSWER);
  });

  test('a server the user may not use is a 400 naming it', async () => {
    await assert.rejects(
      client.responses.create({ model: 'parley', input: 'hi', tools: [{ type: 'mcp', server_label: 'elsewhere', require_approval: 'never' }] }),
      (err) => err.status === 400 && /elsewhere/.test(err.message) && err.param === 'tools[0].server_label');
  });
});
