// The official `ollama` npm client (pinned in package.json) against a real
// bin/parley and the real tiny model: `node --test node/` from scripts/.
//
// It starts bin/parley itself (env PARLEY_BIN, default <repo>/bin/parley;
// `make build` makes it) on a free loopback port with stories260K (env
// PARLEY_TEST_MODEL) and an API key, which the client sends as a header, and
// always stops the server, also when a step fails. Replies are greedy
// (temperature 0), so a streamed reply must be the same text as the whole one.
// A Copilot-style probe (/api/version, /api/tags, /api/show per model) runs
// with curl, as a client written in another language would send it.
import { describe, test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { Ollama } from 'ollama';
import { startAPIServer, stopAPIServer } from '../lib/parley-server.mjs';

const API_KEY = 'ollama-test-key';
const run = promisify(execFile);

describe('ollama npm client', { timeout: 600_000 }, () => {
  let server;
  let dataDir;
  let port;
  let ollama;
  let model;
  const messages = [
    { role: 'system', content: 'You tell short stories.' },
    { role: 'user', content: 'Tell me about a dog named Max.' },
  ];
  const greedy = (n) => ({ temperature: 0, num_predict: n });

  before(async () => {
    ({ server, port, dataDir } = await startAPIServer('ollama', { apiKey: API_KEY }));
    ollama = new Ollama({ host: `http://127.0.0.1:${port}`, headers: { Authorization: `Bearer ${API_KEY}` } });
  });

  after(() => stopAPIServer(server, dataDir));

  test('list names the loaded model as name:latest', async () => {
    const { models } = await ollama.list();
    assert.equal(models.length, 1);
    model = models[0].name;
    assert.match(model, /^[a-z0-9._-]+:latest$/);
    assert.equal(models[0].details.format, 'gguf');
    assert.ok(models[0].size > 0);
  });

  test('show gives capabilities, model_info and parameters; an unknown model is a 404', async () => {
    const show = await ollama.show({ model });
    assert.deepEqual(show.capabilities, ['completion']);
    const arch = show.model_info['general.architecture'];
    assert.ok(arch);
    assert.ok(show.model_info[`${arch}.context_length`] > 0);
    assert.match(show.parameters, /num_ctx/);
    await assert.rejects(ollama.show({ model: 'llama3.1:8b' }), (err) => {
      assert.equal(err.status_code, 404);
      assert.match(err.error, /llama3\.1:8b/);
      return true;
    });
  });

  test('ps shows the model with its context and expiry', async () => {
    const { models } = await ollama.ps();
    assert.equal(models.length, 1);
    assert.equal(models[0].name, model);
    assert.ok(models[0].context_length > 0);
    assert.ok(new Date(models[0].expires_at) > new Date());
  });

  test('chat streamed equals chat whole, with Ollama\'s counts and timings', async () => {
    const whole = await ollama.chat({ model, messages, options: greedy(24), keep_alive: '5m' });
    assert.equal(whole.done, true);
    assert.equal(whole.message.role, 'assistant');
    assert.ok(whole.message.content.length > 0);
    assert.equal(whole.eval_count, 24);
    assert.equal(whole.done_reason, 'length');
    for (const k of ['total_duration', 'load_duration', 'prompt_eval_count', 'prompt_eval_duration', 'eval_duration']) {
      assert.ok(whole[k] > 0, `${k} is ${whole[k]}`);
    }
    const stream = await ollama.chat({ model, messages, options: greedy(24), stream: true, keep_alive: -1 });
    let text = '';
    let last;
    for await (const part of stream) {
      text += part.message.content;
      last = part;
    }
    assert.equal(last.done, true);
    assert.equal(last.eval_count, 24);
    assert.equal(text, whole.message.content);
  });

  test('generate streamed equals generate whole; its context continues the next', async () => {
    const req = { model, prompt: 'Once upon a time', options: greedy(16) };
    const whole = await ollama.generate(req);
    assert.ok(whole.response.length > 0);
    assert.ok(Array.isArray(whole.context) && whole.context.length > whole.prompt_eval_count);
    let text = '';
    for await (const part of await ollama.generate({ ...req, stream: true })) text += part.response;
    assert.equal(text, whole.response);
    const next = await ollama.generate({ model, prompt: ' The end.', context: whole.context, options: greedy(8) });
    assert.ok(next.prompt_eval_count >= whole.context.length);
    const raw = await ollama.generate({ model, prompt: 'Lily had a cat', raw: true, options: greedy(8) });
    assert.ok(raw.response.length > 0);
  });

  test('format with a JSON schema constrains the reply', async () => {
    const schema = {
      type: 'object', properties: { name: { type: 'string', maxLength: 12 } }, required: ['name'], additionalProperties: false,
    };
    const res = await ollama.chat({ model, messages, format: schema, options: greedy(48) });
    if (res.done_reason === 'stop') {
      const v = JSON.parse(res.message.content);
      assert.equal(typeof v.name, 'string');
    } else {
      assert.match(res.message.content, /^\{\s*"name"\s*:\s*"/);
    }
  });

  test('a bad option is a 400 that names it', async () => {
    await assert.rejects(ollama.chat({ model, messages, options: { temperature: 'hot' } }), (err) => {
      assert.equal(err.status_code, 400);
      assert.match(err.error, /options\.temperature/);
      return true;
    });
    await assert.rejects(ollama.pull({ model: 'llama3.1' }), (err) => {
      assert.equal(err.status_code, 501);
      assert.match(err.error, /--model/);
      return true;
    });
  });

  test('aborting a stream cancels its reply; the server goes on', async () => {
    const stream = await ollama.chat({ model, messages, options: greedy(400), stream: true });
    let parts = 0;
    await assert.rejects(async () => {
      for await (const part of stream) {
        assert.equal(part.done, false);
        if (++parts === 2) stream.abort();
      }
    }, (err) => err.name === 'AbortError');
    // The server logs the reply as cancelled, well before 400 tokens.
    const deadline = Date.now() + 120_000; // polls for the line; the bound only catches a hang
    let line;
    while (!line && Date.now() < deadline) {
      line = server.output.split('\n').find((l) => l.includes('"route":"ollama-chat"') && l.includes('"finish":"cancelled"'));
      if (!line) await new Promise((r) => setTimeout(r, 50));
    }
    assert.ok(line, `no cancelled ollama-chat reply in the log:\n${server.output.slice(-4000)}`);
    assert.ok(JSON.parse(line).reply_tokens < 400);
    const after = await ollama.chat({ model, messages, options: greedy(4) });
    assert.equal(after.eval_count, 4);
  });

  test('a Copilot-style probe with curl: version, tags, then show for each model', async () => {
    const base = `http://127.0.0.1:${port}`;
    const curl = async (...args) => {
      const { stdout } = await run('curl', ['-sS', '--fail-with-body', '-H', `Authorization: Bearer ${API_KEY}`, ...args]);
      return JSON.parse(stdout);
    };
    const { version } = await curl(`${base}/api/version`);
    assert.match(version, /^\d+\.\d+\.\d+$/);
    const { models } = await curl(`${base}/api/tags`);
    assert.ok(models.length >= 1);
    for (const m of models) {
      const show = await curl('-X', 'POST', `${base}/api/show`, '-d', JSON.stringify({ model: m.model }));
      assert.ok(show.capabilities.includes('completion'));
      assert.ok(!show.capabilities.includes('vision'));
    }
    const { stdout } = await run('curl', ['-sS', '-o', '/dev/null', '-w', '%{http_code}', '-I', `${base}/`]);
    assert.equal(stdout, '200');
  });
});
