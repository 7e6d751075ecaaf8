// OpenAI legacy completions (POST /v1/completions) with the two JS clients
// that use it: the official `openai` npm client (v5) and Hugging Face's
// `@huggingface/inference` (v4), whose `endpoint(url).textGeneration` and
// `textGenerationStream` post there. Against a real bin/parley and the real
// tiny model, started like openai.test.mjs starts it. Greedy replies, so the
// streamed and the non-streamed text of one prompt must be the same.
import { describe, test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { InferenceClient } from '@huggingface/inference';
import { startAPIServer, stopAPIServer } from '../lib/parley-server.mjs';

const API_KEY = 'node-completions-key';
const PROMPT = 'Once upon a time, there was a little dog';

describe('/v1/completions with the openai and @huggingface/inference clients', { timeout: 600_000 }, () => {
  let server;
  let dataDir;
  let base;
  let openai;
  let reference = '';

  before(async () => {
    let port;
    ({ server, port, dataDir } = await startAPIServer('completions', { apiKey: API_KEY }));
    base = `http://127.0.0.1:${port}`;
    openai = new OpenAI({ baseURL: `${base}/v1`, apiKey: API_KEY, maxRetries: 0, timeout: 120_000 });
  });

  after(() => stopAPIServer(server, dataDir));

  test('openai: completions.create with logprobs and usage', async () => {
    const res = await openai.completions.create({ model: 'parley', prompt: PROMPT, max_tokens: 20, temperature: 0, logprobs: 1 });
    assert.equal(res.object, 'text_completion');
    assert.equal(res.choices.length, 1);
    const choice = res.choices[0];
    assert.ok(choice.text.length > 0, 'empty completion');
    assert.equal(choice.finish_reason, 'length');
    assert.equal(res.usage.completion_tokens, 20);
    assert.equal(res.usage.total_tokens, res.usage.prompt_tokens + 20);
    assert.equal(choice.logprobs.tokens.length, 20);
    assert.equal(choice.logprobs.tokens.join(''), choice.text);
    for (const lp of choice.logprobs.token_logprobs) assert.ok(lp <= 0, `log-probability ${lp}`);
    reference = choice.text;
  });

  test('openai: a streamed completion has the same text, a finish reason and usage', async () => {
    const stream = await openai.completions.create({
      model: 'parley', prompt: [PROMPT], max_tokens: 20, temperature: 0, stream: true,
      stream_options: { include_usage: true },
    });
    let text = '';
    let chunks = 0;
    let finish = null;
    let usage = null;
    for await (const chunk of stream) {
      assert.equal(chunk.object, 'text_completion');
      if (chunk.usage) usage = chunk.usage;
      const choice = chunk.choices[0];
      if (!choice) continue;
      if (choice.text) { text += choice.text; chunks++; }
      if (choice.finish_reason) finish = choice.finish_reason;
    }
    assert.ok(chunks >= 5, `${chunks} chunks: not streamed`);
    assert.equal(text, reference);
    assert.equal(finish, 'length');
    assert.equal(usage?.completion_tokens, 20);
  });

  test('openai: a stop string ends the completion', async () => {
    const stop = reference.slice(Math.floor(reference.length / 2));
    const res = await openai.completions.create({ model: 'parley', prompt: PROMPT, max_tokens: 20, temperature: 0, stop: [stop] });
    assert.equal(res.choices[0].finish_reason, 'stop');
    assert.equal(res.choices[0].text, reference.slice(0, reference.length - stop.length));
  });

  test('@huggingface/inference: endpoint(url).textGenerationStream and textGeneration', async () => {
    const hf = new InferenceClient(API_KEY).endpoint(base);
    const parameters = { max_new_tokens: 20, temperature: 0 };
    let text = '';
    let chunks = 0;
    for await (const chunk of hf.textGenerationStream({ inputs: PROMPT, parameters })) {
      const choice = chunk.choices?.[0];
      if (choice?.text) { text += choice.text; chunks++; }
    }
    assert.ok(chunks >= 5, `${chunks} chunks: not streamed`);
    assert.equal(text, reference);
    const out = await hf.textGeneration({ inputs: PROMPT, parameters });
    assert.equal(out.generated_text, reference);
  });
});
