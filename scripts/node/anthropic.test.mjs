// The official Anthropic SDK (@anthropic-ai/sdk) against a real bin/parley and
// the real tiny model: `node --test node/` from scripts/ (node 20). Like
// openai.test.mjs it starts bin/parley itself (PARLEY_BIN, PARLEY_TEST_MODEL),
// here with --parallel 4 --cache-slots 8, and always stops it.
//
// Replies are greedy (temperature 0), so the stream's accumulated message
// must equal the whole one. stories260K knows nothing of tools: its calls
// parse and validate because the grammar from input_schema forces them. Usage follows Anthropic's accounting:
// input_tokens are the prompt tokens evaluated, cache_read_input_tokens those
// read from Parley's KV cache; count_tokens counts the prompt, their sum.
import { describe, test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import Anthropic from '@anthropic-ai/sdk';
import { startAPIServer, stopAPIServer } from '../lib/parley-server.mjs';

const API_KEY = 'node-anthropic-key';
const MODEL = 'claude-parley'; // any name: Parley serves its one model

// billing is Claude Code's first system block: a tag that changes on every request.
function billing() {
  return { type: 'text', text: `x-anthropic-billing-header: cc_version=2.1.37.a1b; cc_entrypoint=cli; cch=${Math.random().toString(16).slice(2, 7)};` };
}

// promptTokens is the whole prompt a reply's usage accounts for.
const promptTokens = (u) => u.input_tokens + (u.cache_read_input_tokens ?? 0) + (u.cache_creation_input_tokens ?? 0);

describe('@anthropic-ai/sdk', { timeout: 600_000 }, () => {
  let server;
  let dataDir;
  let client;

  before(async () => {
    let port;
    ({ server, port, dataDir } = await startAPIServer('anthropic', { apiKey: API_KEY, args: ['--parallel', '4', '--cache-slots', '8'] }));
    client = new Anthropic({ baseURL: `http://127.0.0.1:${port}`, apiKey: API_KEY, maxRetries: 0, timeout: 120_000 });
  });

  after(() => stopAPIServer(server, dataDir));

  test('models.list and models.retrieve name the loaded model', async () => {
    const models = [];
    for await (const m of client.models.list()) models.push(m);
    assert.equal(models.length, 1);
    assert.equal(models[0].type, 'model');
    const one = await client.models.retrieve(models[0].id);
    assert.equal(one.id, models[0].id);
    await assert.rejects(client.models.retrieve('nope'), (err) => err instanceof Anthropic.NotFoundError);
  });

  const params = {
    model: MODEL, max_tokens: 24, temperature: 0,
    system: [billing(), { type: 'text', text: 'You tell short stories.', cache_control: { type: 'ephemeral' } }],
    messages: [{ role: 'user', content: 'Tell me about a dog named Max.' }],
    metadata: { user_id: 'node-test' },
  };

  test('messages.stream accumulates the message messages.create returns', async () => {
    const whole = await client.messages.create(params);
    assert.equal(whole.type, 'message');
    assert.equal(whole.role, 'assistant');
    assert.equal(whole.content.length, 1);
    assert.equal(whole.content[0].type, 'text');
    assert.ok(whole.content[0].text.length > 0);
    assert.equal(whole.stop_reason, 'max_tokens');
    assert.equal(whole.usage.output_tokens, 24);

    const stream = client.messages.stream({ ...params, system: [billing(), params.system[1]] });
    const types = [];
    let text = '';
    stream.on('streamEvent', (ev) => types.push(ev.type));
    stream.on('text', (t) => { text += t; });
    const final = await stream.finalMessage();
    // (The SDK drops ping events; the raw stream below has one.)
    assert.deepEqual(types.slice(0, 2), ['message_start', 'content_block_start']);
    assert.deepEqual(types.slice(-3), ['content_block_stop', 'message_delta', 'message_stop']);
    assert.equal(text, whole.content[0].text);

    // The same message but for its id and how its prompt divides between
    // evaluated and cached tokens: the second request reads the first's cache.
    // (parsed_output is the SDK's own addition to a stream's message.)
    const strip = ({ parsed_output: _, ...m }) => ({ ...m, id: '', usage: { ...m.usage, input_tokens: 0, cache_read_input_tokens: 0 } });
    assert.equal(final.parsed_output ?? null, null);
    assert.deepEqual(strip(final), strip(whole));
    assert.equal(promptTokens(final.usage), promptTokens(whole.usage));
    assert.ok(final.usage.input_tokens <= 1, `streamed request evaluated ${final.usage.input_tokens} tokens: want its prompt read from the cache`);
  });

  test('the raw stream has Anthropic\'s event lines, a ping among them', async () => {
    const res = await fetch(`${client.baseURL}/v1/messages`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-api-key': API_KEY, 'anthropic-version': '2023-06-01' },
      body: JSON.stringify({ ...params, stream: true }),
    });
    assert.equal(res.status, 200);
    assert.equal(res.headers.get('content-type'), 'text/event-stream');
    const names = [...(await res.text()).matchAll(/^event: (\w+)\ndata: (.*)\n\n/gm)].map(([, name, data]) => {
      assert.equal(JSON.parse(data).type, name);
      return name;
    });
    assert.deepEqual(names.slice(0, 3), ['message_start', 'ping', 'content_block_start']);
    assert.equal(names.at(-1), 'message_stop');
  });

  test('count_tokens agrees with usage', async () => {
    const { system, messages } = params;
    const counted = await client.messages.countTokens({ model: MODEL, system, messages });
    const m = await client.messages.create({ ...params, max_tokens: 2 });
    assert.equal(counted.input_tokens, promptTokens(m.usage));
    const again = await client.messages.countTokens({ model: MODEL, system: 'You tell short stories.', messages });
    assert.equal(again.input_tokens, counted.input_tokens, 'the billing header block is not part of the prompt');
  });

  test('stop_sequences end the reply with stop_reason stop_sequence', async () => {
    const whole = await client.messages.create(params);
    const stop = whole.content[0].text.trim().split(/\s+/)[2];
    const m = await client.messages.create({ ...params, stop_sequences: [stop] });
    assert.equal(m.stop_reason, 'stop_sequence');
    assert.equal(m.stop_sequence, stop);
    assert.equal(m.content[0].text, whole.content[0].text.slice(0, whole.content[0].text.indexOf(stop)));
  });

  test('a tool round trip: tool_use (streamed too), then its tool_result', async () => {
    const tools = [{
      name: 'get_weather', description: 'Weather in a city',
      input_schema: {
        type: 'object', additionalProperties: false, required: ['city', 'unit'],
        properties: { city: { type: 'string', maxLength: 16 }, unit: { enum: ['c', 'f'] } },
      },
    }];
    const messages = [{ role: 'user', content: 'What is the weather in Paris?' }];
    const call = { model: MODEL, max_tokens: 200, temperature: 0, system: 'You call tools.', tools, messages };
    const m = await client.messages.create({ ...call, tool_choice: { type: 'any' } });
    assert.equal(m.stop_reason, 'tool_use');
    const use = m.content.find((b) => b.type === 'tool_use');
    assert.ok(use, JSON.stringify(m.content));
    assert.equal(use.name, 'get_weather');
    // The input validates: the grammar from input_schema constrained it.
    assert.deepEqual(Object.keys(use.input).sort(), ['city', 'unit']);
    assert.equal(typeof use.input.city, 'string');
    assert.ok(use.input.city.length <= 16);
    assert.ok(['c', 'f'].includes(use.input.unit));

    const stream = client.messages.stream({ ...call, tool_choice: { type: 'tool', name: 'get_weather' } });
    let json = '';
    stream.on('inputJson', (delta) => { json += delta; });
    const final = await stream.finalMessage();
    assert.equal(final.stop_reason, 'tool_use');
    const streamedUse = final.content.find((b) => b.type === 'tool_use');
    assert.deepEqual(streamedUse.input, use.input);
    assert.deepEqual(JSON.parse(json), use.input);

    const counted = await client.messages.countTokens({ model: MODEL, system: call.system, tools, messages });
    assert.equal(counted.input_tokens, promptTokens(m.usage));

    messages.push({ role: 'assistant', content: m.content });
    messages.push({ role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: '21 degrees and sunny' }] });
    const next = await client.messages.create({ ...call, max_tokens: 24, tool_choice: { type: 'auto' } });
    assert.ok(next.content.length > 0);
    assert.ok(next.usage.cache_read_input_tokens >= promptTokens(m.usage) - 4, JSON.stringify(next.usage));
  });

  // Eight clients at once, each a 10-turn conversation resent whole every
  // turn (with a billing header that changes every time), on 4 decoding
  // slots and 8 cache slots: after the first turn each request evaluates
  // at most its new tokens (the last reply and the new message) + 4.
  test('a 10-turn conversation stays warm, 8 clients at once on --parallel 4', async () => {
    const topics = ['dog', 'cat', 'bird', 'fish', 'tree', 'sun', 'moon', 'star', 'rain', 'snow'];
    const worst = [];
    async function converse(c) {
      const messages = [];
      let prev = null;
      let most = 0;
      for (let turn = 0; turn < 10; turn++) {
        messages.push({ role: 'user', content: `I am client ${c}. Tell me about the ${topics[(turn + c) % 10]}.` });
        const m = await client.messages.create({
          model: MODEL, max_tokens: 16, temperature: 0, messages,
          system: [billing(), { type: 'text', text: 'You tell short stories.' }],
        });
        const prompt = promptTokens(m.usage);
        if (prev) {
          const fresh = prompt - prev.prompt - prev.output;
          assert.ok(m.usage.input_tokens <= fresh + 4,
            `client ${c} turn ${turn + 1}: evaluated ${m.usage.input_tokens} of ${prompt} prompt tokens, ${fresh} of them new`);
          most = Math.max(most, m.usage.input_tokens - fresh);
        }
        prev = { prompt, output: m.usage.output_tokens };
        messages.push({ role: 'assistant', content: m.content.map((b) => b.text).join('') });
      }
      worst[c] = most;
    }
    await Promise.all(Array.from({ length: 8 }, (_, c) => converse(c)));
    console.log(`warm: most tokens evaluated beyond the new ones, per client: ${worst.join(' ')}`);
  });

  // Hostile bodies, each refused with a 400 in Anthropic's shape whose
  // message names the field.
  const hostile = [
    ['missing max_tokens', 'max_tokens', { model: MODEL, messages: [{ role: 'user', content: 'Hi' }] }],
    ['a truncated image (a PNG signature alone)', 'messages[0].content[0]',
      { model: MODEL, max_tokens: 4, messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'iVBORw0KGgo=' } }] }] }],
    ['a block of an unknown type', 'messages[0].content[1].type',
      { model: MODEL, max_tokens: 4, messages: [{ role: 'user', content: [{ type: 'text', text: 'Hi' }, { type: 'video', url: 'x' }] }] }],
    ['a tool_use block from the user', 'messages[0].content[0].type',
      { model: MODEL, max_tokens: 4, messages: [{ role: 'user', content: [{ type: 'tool_use', id: 't', name: 'f', input: {} }] }] }],
    ['a tool_result answering no tool_use', 'messages[0].content[0].tool_use_id',
      { model: MODEL, max_tokens: 4, messages: [{ role: 'user', content: [{ type: 'tool_result', tool_use_id: 'nope', content: '4' }] }] }],
    ['a server tool', 'tools[0].type',
      { model: MODEL, max_tokens: 4, tools: [{ type: 'web_search_20250305', name: 'web_search' }], messages: [{ role: 'user', content: 'Hi' }] }],
    ['a text block whose text is a number', 'messages[0].content[0].text',
      { model: MODEL, max_tokens: 4, messages: [{ role: 'user', content: [{ type: 'text', text: 5 }] }] }],
    ['10,000 blocks', 'messages[0].content',
      { model: MODEL, max_tokens: 4, messages: [{ role: 'user', content: Array.from({ length: 10_000 }, () => ({ type: 'text', text: 'a' })) }] }],
    ['a system block of the wrong type', 'system[0].type',
      { model: MODEL, max_tokens: 4, system: [{ type: 'image' }], messages: [{ role: 'user', content: 'Hi' }] }],
  ];
  for (const [name, field, body] of hostile) {
    test(`400 naming ${field}: ${name}`, async () => {
      await assert.rejects(client.messages.create(body), (err) => {
        assert.ok(err instanceof Anthropic.BadRequestError, `${err}`);
        assert.equal(err.status, 400);
        assert.equal(err.error?.type, 'error');
        assert.equal(err.error?.error?.type, 'invalid_request_error');
        assert.ok(err.error.error.message.startsWith(field), err.error.error.message);
        return true;
      });
    });
  }

  test('a wrong key is an AuthenticationError', async () => {
    const wrong = new Anthropic({ baseURL: client.baseURL, apiKey: 'wrong', maxRetries: 0 });
    await assert.rejects(wrong.messages.create(params), (err) => err instanceof Anthropic.AuthenticationError && err.error?.error?.type === 'authentication_error');
  });
});
