// Several models in one server with the official `openai` npm client (v5):
// the client lists the models, then switches between them request by
// request, streamed and not, while the server loads the one asked for and
// unloads another to keep at most two loaded. Against a real bin/parley
// serving stories260K (its --model, the default) and two synthetic models
// of other shapes (written by tools/mkgguf into the test's data folder).
import { describe, test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import path from 'node:path';
import OpenAI from 'openai';
import { ROOT, MODEL, startAPIServer, stopAPIServer } from '../lib/parley-server.mjs';
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';

const API_KEY = 'node-models-key';
const PROMPT = 'Once upon a time';

// mkgguf writes a synthetic model with stories260K's vocabulary.
function mkgguf(out, layers, dim) {
  execFileSync('go', ['run', './tools/mkgguf', '-o', out, '-vocab', MODEL, '-name', path.basename(out, '.gguf'),
    '-layers', String(layers), '-dim', String(dim), '-heads', '4', '-kv-heads', '2', '-ffn', String(2 * dim)],
  { cwd: ROOT, stdio: ['ignore', 'ignore', 'inherit'], timeout: 300_000 });
}

describe('several models with the openai client', { timeout: 600_000 }, () => {
  let server;
  let dataDir;
  let modelsDir;
  let openai;
  let base;

  before(async () => {
    modelsDir = await mkdtemp(path.join(os.tmpdir(), 'parley-models-'));
    mkgguf(path.join(modelsDir, 'wide.gguf'), 2, 256);
    mkgguf(path.join(modelsDir, 'deep.gguf'), 6, 64);
    let port;
    ({ server, port, dataDir } = await startAPIServer('models', {
      apiKey: API_KEY, args: ['--models', modelsDir, '--max-loaded-models', '2', '--ctx', '512', '--parallel', '2'],
    }));
    base = `http://127.0.0.1:${port}`;
    openai = new OpenAI({ baseURL: `${base}/v1`, apiKey: API_KEY, maxRetries: 0, timeout: 120_000 });
  });

  after(async () => {
    await stopAPIServer(server, dataDir);
    if (modelsDir) await rm(modelsDir, { recursive: true, force: true });
  });

  const greedy = async (model) => {
    const res = await openai.chat.completions.create({ model, messages: [{ role: 'user', content: PROMPT }], max_tokens: 12, temperature: 0 });
    assert.equal(res.model, model);
    assert.equal(res.choices[0].finish_reason, 'length');
    return res.choices[0].message.content;
  };

  test('models.list names every model with its state', async () => {
    const ids = [];
    for await (const m of openai.models.list()) {
      ids.push(m.id);
      assert.equal(m.object, 'model');
      assert.equal(m.state, 'unloaded');
      assert.ok(m.size_bytes > 0);
    }
    assert.deepEqual(ids.sort(), ['deep', 'stories260K', 'wide']);
  });

  test('switching models request by request; each model answers as it does alone', async () => {
    const alone = {};
    for (const m of ['stories260K', 'wide', 'deep']) alone[m] = await greedy(m);
    assert.notEqual(alone.stories260K, alone.wide);
    assert.notEqual(alone.wide, alone.deep);
    for (const m of ['deep', 'stories260K', 'wide', 'stories260K', 'deep']) {
      assert.equal(await greedy(m), alone[m], `${m} after a switch`);
    }
    let loaded = 0;
    for await (const m of openai.models.list()) if (m.state === 'loaded') loaded++;
    assert.ok(loaded <= 2, `${loaded} models loaded, over --max-loaded-models 2`);
  });

  test('a streamed reply from a model that is not loaded', async () => {
    const stream = await openai.chat.completions.create({
      model: 'wide', messages: [{ role: 'user', content: PROMPT }], max_tokens: 12, temperature: 0, stream: true,
    });
    let text = '';
    for await (const chunk of stream) {
      assert.equal(chunk.model, 'wide');
      text += chunk.choices[0]?.delta?.content ?? '';
    }
    assert.equal(text, await greedy('wide'));
  });

  test('an unknown model is a 404 that names the models served', async () => {
    await assert.rejects(greedy('gpt-4o'), (err) => {
      assert.ok(err instanceof OpenAI.NotFoundError, `${err}`);
      assert.match(err.message, /deep, stories260K, wide|stories260K/);
      return true;
    });
  });
});
