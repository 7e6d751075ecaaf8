// The agent frameworks' newer clients, unchanged, on what they send
// broken: the AI SDK 7 (`ai` 7 with @ai-sdk/openai 4 on the Responses API,
// and @ai-sdk/anthropic 4 on the Messages API) and LangChain's ChatAnthropic,
// against a real bin/parley (PARLEY_BIN, PARLEY_TEST_MODEL), always stopped.
//
// - Structured output on the Messages API (output_config.format): the AI
//   SDK's Anthropic provider and ChatAnthropic's withStructuredOutput with
//   method jsonSchema get JSON that validates, from stories260K, which knows
//   no JSON: the schema's grammar forces it.
// - Multi-step tools on the Responses API: streamText with a tool that runs
//   and stopWhen, on a scripted synthetic model that says a sentence and
//   calls the tool, then answers once the result is in. The provider sends
//   the first step's output back as item_reference inputs (store: true).
//   The OpenAI Agents SDK runs the same agent loop over the Responses API
//   and over chat completions (tracing off: it would export to OpenAI).
import { describe, test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { generateText, Output, stepCountIs, streamText, tool } from 'ai7';
import { createOpenAI } from 'ai-sdk-openai-v4';
import { createAnthropic } from '@ai-sdk/anthropic';
import { ChatAnthropic } from '@langchain/anthropic';
import { Agent, OpenAIProvider, Runner, setTracingDisabled, tool as agentTool } from '@openai/agents';
import { z } from 'zod';
import { ROOT, MODEL, startAPIServer, stopAPIServer } from '../lib/parley-server.mjs';

const API_KEY = 'node-sdk7-key';

const weather = z.object({ city: z.string().max(12), unit: z.enum(['c', 'f']) });

// forecast is the structured output's schema: a boolean and an integer.
// (Anthropic's clients move string bounds and enums into descriptions, as
// Anthropic's structured outputs do not take them: a free string from
// stories260K runs on to max_tokens.)
const forecast = z.object({ sunny: z.boolean(), degrees: z.number().int() });

function checkForecast(obj) {
  assert.equal(typeof obj.sunny, 'boolean', JSON.stringify(obj));
  assert.ok(Number.isInteger(obj.degrees), JSON.stringify(obj));
  assert.deepEqual(Object.keys(obj).sort(), ['degrees', 'sunny']);
}

describe('structured output on the Messages API', { timeout: 180_000 }, () => {
  let server;
  let dataDir;
  let base;

  before(async () => {
    let port;
    ({ server, port, dataDir } = await startAPIServer('sdk7-anthropic', { apiKey: API_KEY }));
    base = `http://127.0.0.1:${port}`;
  });

  after(() => stopAPIServer(server, dataDir));

  test('AI SDK 7, @ai-sdk/anthropic: generateText with Output.object (output_config.format)', async () => {
    const anthropic = createAnthropic({ baseURL: `${base}/v1`, apiKey: API_KEY });
    const { output, text } = await generateText({
      model: anthropic('claude-sonnet-4-5'), prompt: 'Weather in Paris?', temperature: 0, maxOutputTokens: 120, maxRetries: 0,
      output: Output.object({ schema: forecast }),
      providerOptions: { anthropic: { structuredOutputMode: 'outputFormat' } },
    });
    checkForecast(output);
    assert.deepEqual(JSON.parse(text), output);
  });

  test('LangChain ChatAnthropic: withStructuredOutput, method jsonSchema', async () => {
    const model = new ChatAnthropic({ model: 'claude-sonnet-4-5', anthropicApiUrl: base, apiKey: API_KEY, temperature: 0, maxTokens: 120, maxRetries: 0 });
    const obj = await model.withStructuredOutput(forecast, { method: 'jsonSchema' }).invoke('Weather in Paris?');
    checkForecast(obj);
  });
});

describe('AI SDK 7 multi-step tools on the Responses API', { timeout: 600_000 }, () => {
  let tmp;
  let server;
  let dataDir;
  let baseURL;

  before(async () => {
    // The scripted model: after a user's turn, a sentence and a call of
    // get_weather; once a tool's result is in the conversation, the answer.
    tmp = await mkdtemp(path.join(os.tmpdir(), 'parley-sdk7-'));
    const script = {
      template: "{%- set ns = namespace(tool=false) -%}" +
        "{%- if tools %}<|im_start|>system\nTools:{% for t in tools %} {{ t.function.name }}{% endfor %}<|im_end|>\n{% endif -%}" +
        "{%- for m in messages -%}{%- if m.role == 'tool' %}{% set ns.tool = true %}{% endif -%}" +
        "<|im_start|>{{ m.role }}\n{{ m.content or '' }}<|im_end|>\n{% endfor -%}" +
        "{%- if add_generation_prompt %}<|im_start|>assistant{% if ns.tool %}<|answer|>{% else %}{{ '\\n' }}{% endif %}{% endif -%}",
      control: ['<|im_start|>', '<|im_end|>', '<|answer|>'],
      text: ['<tool_call>', '</tool_call>'],
      after: '\n',
      reply: 'Let me look that up.<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}</tool_call>',
      end: '<|im_end|>',
      then: [{ after: '<|answer|>', reply: 'It is 21 degrees in Paris.' }],
    };
    const file = path.join(tmp, 'weather.json');
    await writeFile(file, JSON.stringify(script));
    const model = path.join(tmp, 'weather.gguf');
    execFileSync('go', ['run', './tools/mkgguf', '-o', model, '-vocab', MODEL, '-name', 'weather', '-layers', '3', '-dim', '128',
      '-heads', '4', '-kv-heads', '2', '-ffn', '256', '-ctx', '4096', '-script', file], { cwd: ROOT, stdio: ['ignore', 'ignore', 'inherit'], timeout: 300_000 });
    let port;
    ({ server, port, dataDir } = await startAPIServer('sdk7-tools', { apiKey: API_KEY, args: ['--model', model, '--ctx', '4096', '--parallel', '1'] }));
    baseURL = `http://127.0.0.1:${port}/v1`;
  });

  after(async () => {
    await stopAPIServer(server, dataDir);
    if (tmp) await rm(tmp, { recursive: true, force: true });
  });

  for (const useResponses of [true, false]) {
    test(`Agents SDK: run() calls the tool and answers (${useResponses ? 'Responses API' : 'chat completions'})`, async () => {
      setTracingDisabled(true);
      const calls = [];
      const getWeather = agentTool({
        name: 'get_weather', description: 'Weather in a city', parameters: weather,
        execute: async (args) => { calls.push(args); return '{"temperature": 21}'; },
      });
      const agent = new Agent({ name: 'weather', instructions: 'You answer with the weather.', model: 'parley', tools: [getWeather] });
      const runner = new Runner({ modelProvider: new OpenAIProvider({ apiKey: API_KEY, baseURL, useResponses }), tracingDisabled: true });
      const result = await runner.run(agent, 'Weather in Paris?', { maxTurns: 4 });
      assert.deepEqual(calls, [{ city: 'Paris', unit: 'c' }]);
      assert.equal(result.finalOutput, 'It is 21 degrees in Paris.');
    });
  }

  test('streamText runs the tool and answers in a second step (item_reference inputs)', async () => {
    const bodies = []; // what the provider sent, request by request
    const openai = createOpenAI({ baseURL, apiKey: API_KEY, fetch: (url, init) => { bodies.push(JSON.parse(init.body)); return fetch(url, init); } });
    const calls = [];
    const result = streamText({
      model: openai('parley'), prompt: 'Weather in Paris?', maxRetries: 0, stopWhen: stepCountIs(4),
      tools: {
        get_weather: tool({
          description: 'Weather in a city', inputSchema: weather,
          execute: async (args) => { calls.push(args); return { temperature: 21 }; },
        }),
      },
    });
    const text = await result.text;
    const steps = await result.steps;
    assert.deepEqual(calls, [{ city: 'Paris', unit: 'c' }]);
    assert.equal(steps.length, 2, JSON.stringify(steps.map((s) => s.finishReason)));
    assert.equal(steps[0].finishReason, 'tool-calls');
    assert.equal(steps[0].text, 'Let me look that up.');
    assert.equal(text.endsWith('It is 21 degrees in Paris.'), true, text);
    // The second step sent the first one's message back by reference.
    assert.equal(bodies.length, 2);
    assert.ok(bodies[1].input.some((it) => it.type === 'item_reference'), JSON.stringify(bodies[1].input));
  });
});
