// Embeddings and rerank with the official clients, against a real
// bin/parley serving stories260K (its --model, a chat model) beside a
// synthetic embedding model and reranker (tools/mkgguf, the shapes
// scripts/embedding-reference.sh gives it): the openai client's
// embeddings.create (float, base64, dimensions), ollama's embed, the AI
// SDK's embedMany (openai-compatible and openai providers), LangChain's
// OpenAIEmbeddings, and rerank by fetch in Jina's, Cohere's and
// llama-server's shapes. Every vector and score is compared with the ones
// llama.cpp's own embedding tool computes (llm/testdata).
import { describe, test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';
import { Ollama } from 'ollama';
import { embedMany } from 'ai';
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import { createOpenAI } from '@ai-sdk/openai';
import { OpenAIEmbeddings } from '@langchain/openai';
import { ROOT, MODEL, startAPIServer, stopAPIServer } from '../lib/parley-server.mjs';

const API_KEY = 'node-embeddings-key';
const CHAT = path.basename(MODEL, '.gguf');
// float32 rounding of the reference tool's printed decimals.
const near = (got, want) => Math.abs(got - want) <= 1e-4 + 1e-4 * Math.abs(want);

function assertVector(got, want, what) {
  assert.equal(got.length, want.length, `${what}: ${got.length} values, want ${want.length}`);
  for (let i = 0; i < want.length; i++) {
    assert.ok(near(got[i], want[i]), `${what}: value ${i} is ${got[i]}, llama.cpp's ${want[i]}`);
  }
  const norm = Math.hypot(...got);
  assert.ok(Math.abs(norm - 1) < 1e-5, `${what}: norm ${norm}, want 1`);
}

// prefix is v's first n values scaled to unit length: what dimensions: n gives.
function prefix(v, n) {
  const p = v.slice(0, n);
  const norm = Math.hypot(...p);
  return p.map((x) => x / norm);
}

describe('embeddings and rerank beside a chat model', { timeout: 600_000 }, () => {
  let server, dataDir, modelsDir, base, ref;

  before(async () => {
    ref = JSON.parse(await readFile(path.join(ROOT, 'llm', 'testdata', 'embedding-reference.json'), 'utf8'));
    modelsDir = await mkdtemp(path.join(os.tmpdir(), 'parley-embed-models-'));
    const mkgguf = path.join(modelsDir, 'mkgguf');
    execFileSync('go', ['build', '-o', mkgguf, './tools/mkgguf'], { cwd: ROOT, stdio: ['ignore', 'ignore', 'inherit'], timeout: 300_000 });
    const shape = ['-layers', '2', '-dim', '64', '-heads', '4', '-kv-heads', '4', '-ffn', '128', '-ctx', '512',
      '-std', '0.2', '-resid-std', '0.2', '-type', 'f32', '-vocab', MODEL, '-arch', 'bert'];
    for (const pooling of ['mean', 'rank']) {
      execFileSync(mkgguf, ['-o', path.join(modelsDir, `bert-${pooling}.gguf`), '-name', `bert-${pooling}`, '-pooling', pooling, ...shape],
        { stdio: ['ignore', 'ignore', 'inherit'], timeout: 60_000 });
    }
    let port;
    ({ server, port, dataDir } = await startAPIServer('embeddings', { apiKey: API_KEY, args: ['--models', modelsDir, '--ctx', '512'] }));
    base = `http://127.0.0.1:${port}`;
  });

  after(async () => {
    await stopAPIServer(server, dataDir);
    if (modelsDir) await rm(modelsDir, { recursive: true, force: true });
  });

  const mean = () => ref.models['bert-mean'].l2;

  test('openai embeddings.create: float, base64 and dimensions', async () => {
    const openai = new OpenAI({ baseURL: `${base}/v1`, apiKey: API_KEY, maxRetries: 0 });
    // The client asks for base64 unless told otherwise and decodes it.
    const res = await openai.embeddings.create({ model: 'bert-mean', input: ref.inputs });
    assert.equal(res.model, 'bert-mean');
    assert.equal(res.data.length, ref.inputs.length);
    assert.ok(res.usage.prompt_tokens > 0 && res.usage.total_tokens === res.usage.prompt_tokens);
    res.data.forEach((d, i) => { assert.equal(d.index, i); assertVector(d.embedding, mean()[i], `input ${i}`); });

    const float = await openai.embeddings.create({ model: 'bert-mean', input: ref.inputs[1], encoding_format: 'float' });
    assertVector(float.data[0].embedding, mean()[1], 'float');

    const b64 = await openai.embeddings.create({ model: 'bert-mean', input: ref.inputs[1], encoding_format: 'base64' });
    assert.equal(typeof b64.data[0].embedding, 'string');
    const bytes = Buffer.from(b64.data[0].embedding, 'base64');
    const v = Array.from(new Float32Array(bytes.buffer, bytes.byteOffset, bytes.length / 4));
    assertVector(v, mean()[1], 'base64');

    const short = await openai.embeddings.create({ model: 'bert-mean', input: ref.inputs, dimensions: 16 });
    short.data.forEach((d, i) => assertVector(d.embedding, prefix(mean()[i], 16), `dimensions 16, input ${i}`));

    // A chat model has no embeddings: a 400 that says so.
    await assert.rejects(openai.embeddings.create({ model: CHAT, input: 'hi' }),
      (err) => err.status === 400 && /not an embedding model/.test(err.message));
    // Chat still answers beside the embedding model.
    const chat = await openai.chat.completions.create({ model: CHAT, messages: [{ role: 'user', content: 'Once upon a time' }], max_tokens: 8 });
    assert.ok(chat.choices[0].message.content.length > 0);
  });

  test('ollama embed', async () => {
    const ollama = new Ollama({ host: base, headers: { Authorization: `Bearer ${API_KEY}` } });
    const res = await ollama.embed({ model: 'bert-mean', input: ref.inputs });
    assert.equal(res.model, 'bert-mean');
    res.embeddings.forEach((e, i) => assertVector(e, mean()[i], `input ${i}`));
    const one = await ollama.embed({ model: 'bert-mean:latest', input: ref.inputs[0] });
    assertVector(one.embeddings[0], mean()[0], 'one string');
    // Over the model's 512 tokens: cut by default, refused with truncate: false.
    const long = 'Once upon a time there was a little cat. '.repeat(80);
    const cut = await ollama.embed({ model: 'bert-mean', input: long });
    assert.equal(cut.prompt_eval_count, 512);
    await assert.rejects(ollama.embed({ model: 'bert-mean', input: long, truncate: false }),
      // Parley's Ollama API answers a prompt over a limit 413, as its /api/chat does.
      (err) => err.status_code === 413 && /at most 512/.test(err.message));
  });

  test('AI SDK embedMany', async () => {
    const compatible = createOpenAICompatible({ name: 'parley', baseURL: `${base}/v1`, apiKey: API_KEY });
    const a = await embedMany({ model: compatible.embeddingModel('bert-mean'), values: ref.inputs, maxRetries: 0 });
    a.embeddings.forEach((e, i) => assertVector(e, mean()[i], `openai-compatible, input ${i}`));
    assert.ok(a.usage.tokens > 0);

    const openai = createOpenAI({ baseURL: `${base}/v1`, apiKey: API_KEY });
    const b = await embedMany({ model: openai.embeddingModel('bert-mean'), values: ref.inputs, maxRetries: 0 });
    b.embeddings.forEach((e, i) => assertVector(e, mean()[i], `openai, input ${i}`));
  });

  test('LangChain OpenAIEmbeddings', async () => {
    const lc = new OpenAIEmbeddings({ model: 'bert-mean', apiKey: API_KEY, configuration: { baseURL: `${base}/v1` }, maxRetries: 0 });
    const docs = await lc.embedDocuments(ref.inputs);
    docs.forEach((e, i) => assertVector(e, mean()[i], `document ${i}`));
    assertVector(await lc.embedQuery(ref.inputs[2]), mean()[2], 'query');
  });

  // rerank posts body to path and returns the parsed reply.
  async function rerank(p, body) {
    const res = await fetch(base + p, { method: 'POST', headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${API_KEY}` }, body: JSON.stringify(body) });
    const json = await res.json();
    assert.equal(res.status, 200, JSON.stringify(json));
    return json;
  }

  test('rerank in Jina\'s, Cohere\'s and llama-server\'s shapes', async () => {
    const scores = ref.models['bert-rank'].scores;
    const order = scores.map((s, i) => i).sort((a, b) => scores[b] - scores[a]);
    // Jina: strings, top_n, return_documents.
    const jina = await rerank('/v1/rerank', { model: 'bert-rank', query: ref.query, documents: ref.documents, top_n: 2, return_documents: true });
    assert.equal(jina.model, 'bert-rank');
    assert.deepEqual(jina.results.map((r) => r.index), order.slice(0, 2));
    for (const r of jina.results) {
      assert.ok(near(r.relevance_score, scores[r.index]), `document ${r.index}: ${r.relevance_score}, llama.cpp's ${scores[r.index]}`);
      assert.equal(r.document.text, ref.documents[r.index]);
    }
    assert.ok(jina.usage.total_tokens > 0);
    // Cohere's older shape: documents as objects with a text.
    const cohere = await rerank('/v1/rerank', { model: 'bert-rank', query: ref.query, documents: ref.documents.map((text) => ({ text })) });
    assert.deepEqual(cohere.results.map((r) => r.index), order);
    // llama-server's: /reranking, no model (the one reranker served).
    const ls = await rerank('/reranking', { query: ref.query, documents: ref.documents });
    assert.equal(ls.model, 'bert-rank');
    ls.results.forEach((r) => assert.ok(near(r.relevance_score, scores[r.index])));
  });
});
