// Tool calling with the official `openai` npm client against a real
// bin/parley and stories260K: a forced call (tool_choice required, so the
// tiny model, which knows nothing of tools, must call) comes back whole over
// chat completions, streamed and not, and over Responses; its arguments
// parse and hold what the schema requires; the call and its result go back
// in the history and the conversation continues.
import { describe, test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startAPIServer, stopAPIServer } from '../lib/parley-server.mjs';

const API_KEY = 'node-tools-key';

const parameters = {
  type: 'object', additionalProperties: false, required: ['city', 'unit'],
  properties: { city: { type: 'string', maxLength: 16 }, unit: { enum: ['c', 'f'] } },
};
const chatTools = [{ type: 'function', function: { name: 'get_weather', description: 'Weather in a city', parameters } }];
const responsesTools = [{ type: 'function', name: 'get_weather', description: 'Weather in a city', parameters, strict: true }];

function checkArgs(text) {
  const args = JSON.parse(text);
  assert.deepEqual(Object.keys(args).sort(), ['city', 'unit']);
  assert.equal(typeof args.city, 'string');
  assert.ok(args.city.length <= 16);
  assert.ok(['c', 'f'].includes(args.unit));
}

describe('openai npm client: tool calls', { timeout: 600_000 }, () => {
  let server;
  let dataDir;
  let client;
  const messages = [{ role: 'user', content: 'What is the weather in Paris?' }];

  before(async () => {
    let port;
    ({ server, port, dataDir } = await startAPIServer('tools', { apiKey: API_KEY }));
    client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: API_KEY, maxRetries: 0, timeout: 120_000 });
  });

  after(() => stopAPIServer(server, dataDir));

  let call;

  test('chat completions: a required call, then its result', async () => {
    const res = await client.chat.completions.create({
      model: 'parley', messages, tools: chatTools, tool_choice: 'required', max_tokens: 200, temperature: 0,
    });
    const choice = res.choices[0];
    assert.equal(choice.finish_reason, 'tool_calls');
    assert.equal(choice.message.tool_calls.length, 1);
    call = choice.message.tool_calls[0];
    assert.equal(call.type, 'function');
    assert.equal(call.function.name, 'get_weather');
    assert.match(call.id, /^call_/);
    checkArgs(call.function.arguments);

    const next = await client.chat.completions.create({
      model: 'parley', tools: chatTools, max_tokens: 8, temperature: 0,
      messages: [...messages, choice.message, { role: 'tool', tool_call_id: call.id, content: '{"temperature": 21}' }],
    });
    assert.notEqual(next.choices[0].finish_reason, 'tool_calls');
  });

  test('chat completions, streamed: the same call, its arguments over several chunks', async () => {
    const stream = await client.chat.completions.create({
      model: 'parley', messages, tools: chatTools, tool_choice: 'required', max_tokens: 200, temperature: 0, stream: true,
    });
    let id = null;
    let name = null;
    let args = '';
    let pieces = 0;
    let finish = null;
    for await (const chunk of stream) {
      const choice = chunk.choices[0];
      if (!choice) continue;
      for (const tc of choice.delta.tool_calls ?? []) {
        assert.equal(tc.index, 0);
        if (tc.id) ({ id } = tc);
        if (tc.function?.name) ({ name } = tc.function);
        if (tc.function?.arguments) {
          args += tc.function.arguments;
          pieces++;
        }
      }
      if (choice.finish_reason) finish = choice.finish_reason;
    }
    assert.equal(finish, 'tool_calls');
    assert.match(id, /^call_/);
    assert.equal(name, 'get_weather');
    assert.ok(pieces >= 3, `arguments in ${pieces} chunks`);
    assert.equal(args, call.function.arguments); // greedy: the same call
  });

  test('the client\'s stream helper assembles the call', async () => {
    const runner = client.chat.completions.stream({
      model: 'parley', messages, tools: chatTools, tool_choice: 'required', max_tokens: 200, temperature: 0,
    });
    const done = await runner.finalChatCompletion();
    const tc = done.choices[0].message.tool_calls[0];
    assert.equal(tc.function.name, 'get_weather');
    assert.equal(tc.function.arguments, call.function.arguments);
  });

  test('responses: a function_call item, then its output continues the response', async () => {
    const first = await client.responses.create({
      model: 'parley', input: 'What is the weather in Paris?', tools: responsesTools, tool_choice: 'required',
      max_output_tokens: 200, temperature: 0,
    });
    const fc = first.output.find((it) => it.type === 'function_call');
    assert.ok(fc, JSON.stringify(first.output));
    assert.equal(fc.name, 'get_weather');
    assert.match(fc.call_id, /^call_/);
    checkArgs(fc.arguments);

    const second = await client.responses.create({
      model: 'parley', previous_response_id: first.id, tools: responsesTools, max_output_tokens: 8, temperature: 0,
      input: [{ type: 'function_call_output', call_id: fc.call_id, output: '{"temperature": 21}' }],
    });
    assert.equal(second.output[0].type, 'message');
    const items = [];
    for await (const it of client.responses.inputItems.list(second.id)) items.push(it);
    assert.equal(items.length, 1);
    assert.equal(items[0].type, 'function_call_output');
    assert.equal(items[0].call_id, fc.call_id);
  });

  test('responses, streamed: function_call_arguments deltas add up to .done', async () => {
    const stream = await client.responses.create({
      model: 'parley', input: 'What is the weather in Paris?', tools: responsesTools, tool_choice: 'required',
      max_output_tokens: 200, temperature: 0, stream: true,
    });
    let deltas = '';
    let n = 0;
    let done = null;
    for await (const ev of stream) {
      if (ev.type === 'response.function_call_arguments.delta') {
        deltas += ev.delta;
        n++;
      } else if (ev.type === 'response.function_call_arguments.done') {
        done = ev.arguments;
      }
    }
    assert.ok(n >= 3, `arguments in ${n} deltas`);
    assert.equal(deltas, done);
    checkArgs(done);
  });
});
