// Images through the real clients (openai, @anthropic-ai/sdk, ollama, the AI SDK) to a real bin/parley serving a
// synthetic vision model: `node --test node/vision.test.mjs` from scripts/.
//
// The model and its projector are made by the project's own model tool (go run ./tools/mkgguf -mmproj), and the
// server runs them on the current engine with libmtmd (make setup-vision): without libmtmd.so in the engine's
// folder (PARLEY_ENGINE_LIB, else lib/llama-current) the suite is skipped. Each client sends one PNG made here and
// must get a reply; a second OpenAI turn repeating the image must find it cached.
import { describe, test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { Ollama } from 'ollama';
import { generateText } from 'ai';
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import { startAPIServer, stopAPIServer } from '../lib/parley-server.mjs';
import { makeVisionModel, png, visionSkip as skip } from '../lib/testimage.mjs';

const API_KEY = 'vision-test-key';

describe('images through the real clients', { timeout: 600_000, skip }, () => {
  let server, port, dataDir, tmp;
  const image = png(40, 32, 1);
  const b64 = image.toString('base64');
  const dataURL = `data:image/png;base64,${b64}`;

  before(async () => {
    tmp = await mkdtemp(path.join(os.tmpdir(), 'parley-vision-'));
    ({ server, port, dataDir } = await startAPIServer('vision', {
      apiKey: API_KEY,
      args: [...makeVisionModel(tmp), '--parallel', '1', '--temperature', '0'],
    }));
  });

  after(async () => {
    await stopAPIServer(server, dataDir);
    if (tmp) await rm(tmp, { recursive: true, force: true });
  });

  test('openai: an image_url part (data: URL), and the next turn finds the image cached', async () => {
    const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: API_KEY, maxRetries: 0 });
    const models = [];
    for await (const m of client.models.list()) models.push(m);
    assert.deepEqual(models[0].capabilities, ['vision']);
    const messages = [{ role: 'user', content: [{ type: 'image_url', image_url: { url: dataURL } }, { type: 'text', text: 'What is in the picture?' }] }];
    const first = await client.chat.completions.create({ model: models[0].id, messages, max_tokens: 8 });
    assert.ok(first.choices[0].message.content.length > 0);
    assert.ok(first.usage.prompt_tokens >= 16, `${first.usage.prompt_tokens} prompt tokens: the image takes 16`);
    messages.push(first.choices[0].message, { role: 'user', content: 'And then?' });
    const second = await client.chat.completions.create({ model: models[0].id, messages, max_tokens: 8 });
    const cached = second.usage.prompt_tokens_details?.cached_tokens ?? 0;
    assert.ok(second.usage.prompt_tokens - cached < first.usage.prompt_tokens,
      `second turn: ${second.usage.prompt_tokens} prompt tokens, ${cached} cached; the first had ${first.usage.prompt_tokens}`);
  });

  test('@anthropic-ai/sdk: a base64 image block', async () => {
    const client = new Anthropic({ baseURL: `http://127.0.0.1:${port}`, apiKey: API_KEY, maxRetries: 0 });
    const m = await client.messages.create({ model: 'vision', max_tokens: 8, messages: [{ role: 'user', content: [
      { type: 'image', source: { type: 'base64', media_type: 'image/png', data: b64 } },
      { type: 'text', text: 'Describe it.' }] }] });
    assert.equal(m.type, 'message');
    assert.ok(m.content[0].text.length > 0);
  });

  test('ollama: images on a chat message, and show says vision', async () => {
    const ollama = new Ollama({ host: `http://127.0.0.1:${port}`, headers: { Authorization: `Bearer ${API_KEY}` } });
    const show = await ollama.show({ model: 'vision' });
    assert.ok(show.capabilities.includes('vision'), JSON.stringify(show.capabilities));
    const r = await ollama.chat({ model: 'vision', messages: [{ role: 'user', content: 'Describe it.', images: [b64] }], options: { num_predict: 8 } });
    assert.ok(r.message.content.length > 0);
  });

  test('AI SDK: an image part', async () => {
    const provider = createOpenAICompatible({ name: 'parley', baseURL: `http://127.0.0.1:${port}/v1`, apiKey: API_KEY });
    const r = await generateText({ model: provider('vision'), maxOutputTokens: 8, maxRetries: 0, messages: [
      { role: 'user', content: [{ type: 'image', image, mediaType: 'image/png' }, { type: 'text', text: 'Describe it.' }] }] });
    assert.ok(r.text.length > 0);
  });

  test('a truncated image is a 400 naming its part', async () => {
    const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: API_KEY, maxRetries: 0 });
    await assert.rejects(client.chat.completions.create({ model: 'vision', max_tokens: 4, messages: [{ role: 'user', content: [
      { type: 'image_url', image_url: { url: `data:image/png;base64,${image.subarray(0, 60).toString('base64')}` } }] }] }),
    (err) => err.status === 400 && err.message.includes('messages[0].content[0]'));
  });
});
