// Images through the real clients (openai, @anthropic-ai/sdk, ollama, the AI SDK) to a real bin/parley serving a
// synthetic vision model: `node --test node/vision.test.mjs` from scripts/.
//
// The model and its projector are made by the project's own model tool (go run ./tools/mkgguf -mmproj), and the
// server runs them on the current engine with libmtmd (make setup-vision): without libmtmd.so in the engine's
// folder (PARLEY_ENGINE_LIB, else lib/llama-current) the suite is skipped. Each client sends one PNG made here and
// must get a reply; a second OpenAI turn repeating the image must find it cached.
import { describe, test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { deflateSync } from 'node:zlib';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { Ollama } from 'ollama';
import { generateText } from 'ai';
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import { ROOT, startAPIServer, stopAPIServer } from '../lib/parley-server.mjs';

const API_KEY = 'vision-test-key';
const LIB = process.env.PARLEY_ENGINE_LIB || path.join(ROOT, 'lib', 'llama-current');
const skip = existsSync(path.join(LIB, 'libmtmd.so')) ? false : `no libmtmd.so in ${LIB} (make setup-vision)`;

// crc32 of a PNG chunk's type and data.
function crc32(buf) {
  let c = ~0;
  for (const b of buf) {
    c ^= b;
    for (let k = 0; k < 8; k++) c = (c >>> 1) ^ (0xedb88320 & -(c & 1));
  }
  return ~c >>> 0;
}

// png is a w x h RGB PNG whose pixels depend on seed.
function png(w, h, seed) {
  const chunk = (type, data) => {
    const len = Buffer.alloc(4); len.writeUInt32BE(data.length);
    const td = Buffer.concat([Buffer.from(type, 'latin1'), data]);
    const crc = Buffer.alloc(4); crc.writeUInt32BE(crc32(td));
    return Buffer.concat([len, td, crc]);
  };
  const ihdr = Buffer.alloc(13);
  ihdr.writeUInt32BE(w, 0); ihdr.writeUInt32BE(h, 4);
  ihdr[8] = 8; ihdr[9] = 2; // 8-bit RGB
  const raw = Buffer.alloc(h * (1 + 3 * w));
  for (let y = 0; y < h; y++) {
    for (let x = 0; x < w; x++) {
      const o = y * (1 + 3 * w) + 1 + 3 * x;
      raw[o] = (x * 7 + seed) & 255; raw[o + 1] = (y * 13) ^ seed; raw[o + 2] = (x * y + 3 * seed) & 255;
    }
  }
  return Buffer.concat([Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]),
    chunk('IHDR', ihdr), chunk('IDAT', deflateSync(raw)), chunk('IEND', Buffer.alloc(0))]);
}

describe('images through the real clients', { timeout: 600_000, skip }, () => {
  let server, port, dataDir, tmp;
  const image = png(40, 32, 1);
  const b64 = image.toString('base64');
  const dataURL = `data:image/png;base64,${b64}`;

  before(async () => {
    tmp = await mkdtemp(path.join(os.tmpdir(), 'parley-vision-'));
    const model = path.join(tmp, 'model.gguf');
    const mmproj = path.join(tmp, 'mmproj-model.gguf');
    execFileSync('go', ['run', './tools/mkgguf', '-o', model, '-mmproj', mmproj,
      '-name', 'vision', '-dim', '64', '-layers', '1', '-heads', '4', '-kv-heads', '4', '-ffn', '64'], { cwd: ROOT, stdio: 'ignore' });
    ({ server, port, dataDir } = await startAPIServer('vision', {
      apiKey: API_KEY,
      args: ['--model', model, '--mmproj', mmproj, '--engine', 'current', '--engine-lib', LIB, '--parallel', '1', '--temperature', '0'],
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
