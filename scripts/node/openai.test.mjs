// The official `openai` npm client (v5) against a real bin/parley and the real
// tiny model: `node --test node/` from scripts/ (node 20).
//
// It starts bin/parley itself (env PARLEY_BIN, default <repo>/bin/parley; `make
// build` makes it) on a free loopback port with stories260K (env
// PARLEY_TEST_MODEL) and an API key, points the client's baseURL at its /v1,
// and always stops the server, also when a step fails. Replies are greedy
// (temperature 0), so the streamed and the non-streamed reply to the same
// conversation must be the same text.
import { describe, test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startAPIServer, stopAPIServer } from '../lib/parley-server.mjs';

const API_KEY = 'node-test-key';

describe('openai npm client', { timeout: 600_000 }, () => {
  let server;
  let dataDir;
  let client;
  const messages = [
    { role: 'system', content: 'You tell short stories.' },
    { role: 'user', content: 'Tell me about a dog named Max.' },
  ];

  before(async () => {
    let port;
    ({ server, port, dataDir } = await startAPIServer('openai', { apiKey: API_KEY }));
    client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: API_KEY, maxRetries: 0, timeout: 120_000 });
  });

  after(() => stopAPIServer(server, dataDir));

  let modelId;
  let streamed = '';

  test('models.list names the loaded model', async () => {
    const models = [];
    for await (const m of client.models.list()) models.push(m);
    assert.equal(models.length, 1);
    assert.equal(models[0].object, 'model');
    assert.ok(models[0].id.length > 0);
    modelId = models[0].id;
    const one = await client.models.retrieve(modelId);
    assert.equal(one.id, modelId);
  });

  test('a streamed chat completion arrives chunk by chunk, with usage at the end', async () => {
    const stream = await client.chat.completions.create({
      model: modelId, messages, stream: true, max_tokens: 24, temperature: 0,
      logprobs: true, stream_options: { include_usage: true },
    });
    let contentChunks = 0;
    let finish = null;
    let usage = null;
    let logprobs = 0;
    for await (const chunk of stream) {
      assert.equal(chunk.object, 'chat.completion.chunk');
      if (chunk.usage) usage = chunk.usage;
      const choice = chunk.choices[0];
      if (!choice) continue;
      if (choice.delta?.content) {
        contentChunks++;
        streamed += choice.delta.content;
      }
      if (choice.logprobs?.content) {
        for (const lp of choice.logprobs.content) {
          assert.ok(lp.logprob <= 0, `log-probability ${lp.logprob}`);
          logprobs++;
        }
      }
      if (choice.finish_reason) finish = choice.finish_reason;
    }
    assert.ok(contentChunks >= 8, `${contentChunks} content chunks: the reply was not streamed`);
    assert.ok(streamed.trim().length > 0, 'empty reply');
    assert.equal(finish, 'length');
    assert.ok(usage, 'no usage chunk with stream_options.include_usage');
    assert.equal(usage.completion_tokens, 24);
    assert.equal(usage.total_tokens, usage.prompt_tokens + 24);
    assert.equal(logprobs, 24, 'one log-probability per token');
  });

  test('a non-streamed completion has the same text and usage', async () => {
    const res = await client.chat.completions.create({ model: modelId, messages, max_tokens: 24, temperature: 0 });
    assert.equal(res.object, 'chat.completion');
    assert.equal(res.choices.length, 1);
    assert.equal(res.choices[0].message.role, 'assistant');
    assert.equal(res.choices[0].message.content, streamed);
    assert.equal(res.choices[0].finish_reason, 'length');
    assert.equal(res.usage.completion_tokens, 24);
    assert.ok(res.usage.prompt_tokens > 0);
    assert.equal(res.usage.total_tokens, res.usage.prompt_tokens + 24);
    // The same conversation again: its prompt is served from the KV cache.
    assert.ok(res.usage.prompt_tokens_details.cached_tokens > 0, JSON.stringify(res.usage));
  });

  test('response_format json_schema yields JSON matching the schema', async () => {
    const res = await client.chat.completions.create({
      model: modelId, messages, max_tokens: 80, temperature: 0,
      response_format: {
        type: 'json_schema',
        json_schema: {
          name: 'pet', strict: true,
          schema: {
            type: 'object', additionalProperties: false, required: ['kind', 'legs'],
            properties: { kind: { type: 'string', enum: ['dog', 'cat'] }, legs: { type: 'integer', minimum: 0, maximum: 4 } },
          },
        },
      },
    });
    const pet = JSON.parse(res.choices[0].message.content);
    assert.ok(['dog', 'cat'].includes(pet.kind), JSON.stringify(pet));
    assert.ok(Number.isInteger(pet.legs) && pet.legs >= 0 && pet.legs <= 4, JSON.stringify(pet));
  });

  test('a client that stops reading mid-stream does not hold the server', async () => {
    const stream = await client.chat.completions.create({ model: modelId, messages, stream: true, max_tokens: 400 });
    for await (const chunk of stream) {
      if (chunk.choices[0]?.delta?.content) break; // aborts the request
    }
    const res = await client.chat.completions.create({ model: modelId, messages, max_tokens: 3 });
    assert.equal(res.usage.completion_tokens, 3);
  });

  test('errors are the client\'s typed errors', async () => {
    await assert.rejects(
      client.chat.completions.create({ model: modelId, messages, temperature: -1 }),
      (err) => err instanceof OpenAI.BadRequestError && err.status === 400 && /temperature/.test(err.message),
    );
    await assert.rejects(
      client.chat.completions.create({ model: modelId, messages, stream: true, top_p: 7 }),
      (err) => err instanceof OpenAI.BadRequestError && /top_p/.test(err.message),
    );
    const wrongKey = new OpenAI({ baseURL: client.baseURL, apiKey: 'wrong', maxRetries: 0 });
    await assert.rejects(
      wrongKey.chat.completions.create({ model: modelId, messages }),
      (err) => err instanceof OpenAI.AuthenticationError && err.status === 401,
    );
  });
});
