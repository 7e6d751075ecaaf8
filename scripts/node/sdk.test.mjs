// The SDKs chat apps are built on, unchanged, against a real bin/parley and
// the real tiny model: the Vercel AI SDK (`ai` 6) with @ai-sdk/openai (the
// Responses API, what `openai(id)` means) and @ai-sdk/openai-compatible
// (chat completions), and LangChain's ChatOpenAI in chat-completions mode
// and with useResponsesApi, with zod 4 schemas for structured output.
// `node --test node/` from scripts/ (node 20); like openai.test.mjs it
// starts bin/parley itself (PARLEY_BIN, PARLEY_TEST_MODEL) and always stops it.
//
// Replies are greedy (temperature 0), so a streamed reply must equal the
// whole one. stories260K has no chat template and knows no JSON: structured
// output comes out valid only because the schema's grammar forces it, which
// is what these tests check. The snippets in README's "Using Parley from the
// AI SDK and LangChain" are this code.
import { describe, test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { APICallError, generateObject, generateText, Output, streamText } from 'ai';
import { createOpenAI } from '@ai-sdk/openai';
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import { ChatOpenAI } from '@langchain/openai';
import { z } from 'zod';
import { startAPIServer, stopAPIServer } from '../lib/parley-server.mjs';

const API_KEY = 'node-sdk-key';
const PROMPT = 'Tell me about a dog named Max.';

// person is a zod schema with what schema generators write for it: any
// integer (zod 4: minimum -(2^53-1), maximum 2^53-1), a nonnegative one
// (minimum 0, maximum 2^53-1), an enum, an array and a nested object. The
// string and array bounds keep the reply short for the tiny model.
const person = z.object({
  name: z.string().max(10),
  age: z.number().int().nonnegative(),
  mood: z.enum(['happy', 'sad']),
  tags: z.array(z.string().max(6)).max(2),
  pet: z.object({ kind: z.string().max(6), legs: z.number().int() }),
});

// checkPerson checks what the SDK parsed (its own zod validation passed).
function checkPerson(obj) {
  assert.equal(typeof obj.name, 'string');
  assert.ok(Number.isInteger(obj.age) && obj.age >= 0, JSON.stringify(obj));
  assert.ok(['happy', 'sad'].includes(obj.mood), JSON.stringify(obj));
  assert.ok(Array.isArray(obj.tags) && obj.tags.length <= 2, JSON.stringify(obj));
  assert.ok(Number.isInteger(obj.pet.legs), JSON.stringify(obj));
}

describe('AI SDK and LangChain', { timeout: 600_000 }, () => {
  let server;
  let dataDir;
  let baseURL;

  before(async () => {
    let port;
    ({ server, port, dataDir } = await startAPIServer('sdk', { apiKey: API_KEY }));
    baseURL = `http://127.0.0.1:${port}/v1`;
  });

  after(() => stopAPIServer(server, dataDir));

  describe('AI SDK, @ai-sdk/openai (Responses API)', () => {
    const model = () => createOpenAI({ baseURL, apiKey: API_KEY })('parley');

    test('generateText, and streamText gives the same greedy reply', async () => {
      const whole = await generateText({ model: model(), prompt: PROMPT, maxOutputTokens: 24, temperature: 0, maxRetries: 0 });
      assert.ok(whole.text.length > 0, 'empty reply');
      assert.equal(whole.usage.outputTokens, 24);
      assert.ok(whole.usage.inputTokens > 0);
      assert.equal(whole.finishReason, 'length');

      const result = streamText({ model: model(), prompt: PROMPT, maxOutputTokens: 24, temperature: 0, maxRetries: 0 });
      let streamed = '';
      for await (const delta of result.textStream) streamed += delta;
      assert.equal(streamed, whole.text);
      assert.equal((await result.usage).outputTokens, 24);
    });

    test('structured output from a zod schema (generateText with Output.object, and generateObject)', async () => {
      const { output } = await generateText({
        model: model(), prompt: 'Describe a person.', output: Output.object({ schema: person }),
        maxOutputTokens: 400, temperature: 0, maxRetries: 0,
      });
      checkPerson(output);
      const { object } = await generateObject({
        model: model(), schema: person, prompt: 'Describe a person.', maxOutputTokens: 400, temperature: 0, maxRetries: 0,
      });
      checkPerson(object);
    });

    test('an error surfaces with the param the request named', async () => {
      await assert.rejects(
        generateText({ model: model(), prompt: PROMPT, maxOutputTokens: 8, temperature: 50, maxRetries: 0 }),
        (err) => {
          assert.ok(APICallError.isInstance(err), String(err));
          assert.equal(err.statusCode, 400);
          const body = JSON.parse(err.responseBody);
          assert.equal(body.error.param, 'temperature');
          assert.equal(body.error.type, 'invalid_request_error');
          assert.match(err.message, /temperature/);
          return true;
        });
    });
  });

  describe('AI SDK, @ai-sdk/openai-compatible (chat completions)', () => {
    const model = () => createOpenAICompatible({
      name: 'parley', baseURL, apiKey: API_KEY, supportsStructuredOutputs: true, includeUsage: true,
    })('parley');

    test('generateText, and streamText gives the same greedy reply', async () => {
      const messages = [{ role: 'system', content: 'You tell short stories.' }, { role: 'user', content: PROMPT }];
      const whole = await generateText({ model: model(), messages, maxOutputTokens: 24, temperature: 0, maxRetries: 0 });
      assert.ok(whole.text.length > 0, 'empty reply');
      assert.equal(whole.usage.outputTokens, 24);
      const result = streamText({ model: model(), messages, maxOutputTokens: 24, temperature: 0, maxRetries: 0 });
      let streamed = '';
      for await (const delta of result.textStream) streamed += delta;
      assert.equal(streamed, whole.text);
      assert.equal((await result.usage).outputTokens, 24);
    });

    test('structured output from a zod schema', async () => {
      const { object } = await generateObject({
        model: model(), schema: person, prompt: 'Describe a person.', maxOutputTokens: 400, temperature: 0, maxRetries: 0,
      });
      checkPerson(object);
    });

    test('an error surfaces with the param the request named', async () => {
      await assert.rejects(
        generateText({ model: model(), prompt: PROMPT, maxOutputTokens: 8, temperature: 50, maxRetries: 0 }),
        (err) => {
          assert.ok(APICallError.isInstance(err), String(err));
          assert.equal(err.statusCode, 400);
          assert.equal(err.data?.error?.param, 'temperature');
          return true;
        });
    });
  });

  for (const useResponsesApi of [false, true]) {
    describe(`LangChain ChatOpenAI${useResponsesApi ? ' with useResponsesApi' : ' (chat completions)'}`, () => {
      const chat = (opts = {}) => new ChatOpenAI({
        model: 'parley', apiKey: API_KEY, configuration: { baseURL }, useResponsesApi,
        temperature: 0, maxTokens: 24, maxRetries: 0, ...opts,
      });

      test('invoke, and stream gives the same greedy reply', async () => {
        const messages = [['system', 'You tell short stories.'], ['human', PROMPT]];
        const whole = await chat().invoke(messages);
        assert.ok(whole.text.length > 0, 'empty reply');
        assert.equal(whole.usage_metadata.output_tokens, 24);
        let streamed = '';
        for await (const chunk of await chat({ streamUsage: true }).stream(messages)) streamed += chunk.text;
        assert.equal(streamed, whole.text);
      });

      test('withStructuredOutput from a zod schema', async () => {
        const structured = chat({ maxTokens: 400 }).withStructuredOutput(person, { name: 'person' });
        checkPerson(await structured.invoke('Describe a person.'));
      });

      test('an error surfaces with the param the request named', async () => {
        await assert.rejects(chat({ temperature: 50 }).invoke(PROMPT), (err) => {
          assert.equal(err.status, 400, String(err));
          assert.equal(err.param ?? err.error?.param, 'temperature', JSON.stringify(err.error ?? err));
          return true;
        });
      });
    });
  }
});
