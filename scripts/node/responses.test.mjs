// The official `openai` npm client's Responses and Conversations APIs, and
// the Responses WebSocket mode (with `ws`), against a real bin/parley and the
// real tiny model: `node --test node/` from scripts/ (node 20). Like
// openai.test.mjs it starts bin/parley itself (PARLEY_BIN, PARLEY_TEST_MODEL)
// and always stops it.
import { describe, test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import WebSocket from 'ws';
import { startAPIServer, stopAPIServer } from '../lib/parley-server.mjs';

const API_KEY = 'node-responses-key';

describe('openai npm client: responses and conversations', { timeout: 600_000 }, () => {
  let server;
  let dataDir;
  let client;
  let port;

  before(async () => {
    ({ server, port, dataDir } = await startAPIServer('responses', { store: 'bolt', apiKey: API_KEY }));
    client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: API_KEY, maxRetries: 0, timeout: 120_000 });
  });

  after(() => stopAPIServer(server, dataDir));

  let first;

  test('responses.create, then previous_response_id evaluates only the new tokens', async () => {
    first = await client.responses.create({
      model: 'parley', instructions: 'You tell short stories.', input: 'Tell me about a dog named Max.',
      max_output_tokens: 16, temperature: 0,
    });
    assert.equal(first.object, 'response');
    assert.ok(first.id.startsWith('resp_'));
    assert.ok(first.output_text.length > 0, 'empty reply');
    assert.equal(first.instructions, 'You tell short stories.');
    assert.equal(first.usage.output_tokens, 16);

    const second = await client.responses.create({
      model: 'parley', input: 'What did Max do next?', previous_response_id: first.id,
      max_output_tokens: 8, temperature: 0,
    });
    assert.equal(second.previous_response_id, first.id);
    const u = second.usage;
    assert.ok(u.input_tokens_details.cached_tokens >= first.usage.input_tokens, JSON.stringify(u));
    assert.ok(u.input_tokens_details.cached_tokens < u.input_tokens, JSON.stringify(u));

    const got = await client.responses.retrieve(second.id);
    assert.equal(got.output_text, second.output_text);
    const items = [];
    for await (const it of client.responses.inputItems.list(second.id)) items.push(it);
    assert.equal(items.length, 1);
    assert.equal(items[0].content[0].text, 'What did Max do next?');
  });

  test('a streamed response yields the documented events in order', async () => {
    const stream = await client.responses.create({
      model: 'parley', input: 'Once upon a time', stream: true, max_output_tokens: 12, temperature: 0,
    });
    const types = [];
    let text = '';
    let done;
    for await (const ev of stream) {
      types.push(ev.type);
      assert.equal(ev.sequence_number, types.length - 1);
      if (ev.type === 'response.output_text.delta') text += ev.delta;
      if (ev.type === 'response.completed' || ev.type === 'response.incomplete') done = ev.response;
    }
    assert.deepEqual(types.slice(0, 4), ['response.created', 'response.in_progress',
      'response.output_item.added', 'response.content_part.added']);
    assert.deepEqual(types.slice(-4, -1), ['response.output_text.done', 'response.content_part.done',
      'response.output_item.done']);
    assert.ok(types.filter((t) => t === 'response.output_text.delta').length >= 4, types.join(' '));
    assert.ok(done, 'no final event');
    assert.equal(done.output[0].content[0].text, text);
    await client.responses.delete(done.id);
    await assert.rejects(client.responses.retrieve(done.id), (e) => e.status === 404);
  });

  test('background: retrieve while in progress, resume the stream after a sequence number, cancel', async () => {
    // A grammar keeps the tiny model busy long enough to look at it running.
    const slow = { grammar: 'root ::= [a-z ]{300,}' };
    const bg = await client.responses.create({
      model: 'parley', input: 'Tell me everything', background: true, max_output_tokens: 300, temperature: 0, ...slow,
    });
    assert.equal(bg.status, 'in_progress');
    assert.equal(bg.background, true);
    assert.equal((await client.responses.retrieve(bg.id)).status, 'in_progress');

    // Events 0-3 open the response (no text); resuming after 3 gets every delta.
    const stream = await client.responses.retrieve(bg.id, { stream: true, starting_after: 3 });
    let seq = 3;
    let text = '';
    let done;
    for await (const ev of stream) {
      assert.equal(ev.sequence_number, seq + 1, `${ev.type} after ${seq}`);
      seq = ev.sequence_number;
      if (ev.type === 'response.output_text.delta') text += ev.delta;
      if (ev.type === 'response.completed' || ev.type === 'response.incomplete') done = ev.response;
    }
    assert.ok(done, 'no final event');
    assert.ok(text.length > 0);
    const after = await client.responses.retrieve(bg.id);
    assert.notEqual(after.status, 'in_progress');
    assert.equal(after.output_text, text);

    const bg2 = await client.responses.create({
      model: 'parley', input: 'Tell me more', background: true, max_output_tokens: 400, temperature: 0, ...slow,
    });
    const cancelled = await client.responses.cancel(bg2.id);
    assert.equal(cancelled.status, 'cancelled');
    assert.equal((await client.responses.retrieve(bg2.id)).status, 'cancelled');
  });

  test('conversations CRUD and items, continued by responses.create', async () => {
    const conv = await client.conversations.create({
      metadata: { topic: 'dogs' },
      items: [{ type: 'message', role: 'user', content: 'Tell me about a dog.' }],
    });
    assert.ok(conv.id.startsWith('conv_'));
    assert.equal(conv.metadata.topic, 'dogs');
    const updated = await client.conversations.update(conv.id, { metadata: { topic: 'cats' } });
    assert.equal(updated.metadata.topic, 'cats');
    assert.equal((await client.conversations.retrieve(conv.id)).metadata.topic, 'cats');

    await client.conversations.items.create(conv.id, {
      items: [{ type: 'message', role: 'assistant', content: 'The dog ran.' }],
    });
    const r = await client.responses.create({
      model: 'parley', conversation: conv.id, input: 'And then?', max_output_tokens: 6, temperature: 0,
    });
    assert.equal(r.conversation.id, conv.id);
    const items = [];
    for await (const it of client.conversations.items.list(conv.id, { order: 'asc' })) items.push(it);
    assert.deepEqual(items.map((i) => i.role), ['user', 'assistant', 'user', 'assistant']);
    assert.equal(items[3].content[0].text, r.output_text);
    const one = await client.conversations.items.retrieve(items[1].id, { conversation_id: conv.id });
    assert.equal(one.content[0].text, 'The dog ran.');
    await client.conversations.items.delete(items[1].id, { conversation_id: conv.id });
    const left = [];
    for await (const it of client.conversations.items.list(conv.id)) left.push(it);
    assert.equal(left.length, 3);

    const del = await client.conversations.delete(conv.id);
    assert.equal(del.deleted, true);
    await assert.rejects(client.conversations.retrieve(conv.id), (e) => e.status === 404);
  });

  test('the WebSocket mode chains responses on one socket', async () => {
    const ws = new WebSocket(`ws://127.0.0.1:${port}/v1/responses`, { headers: { Authorization: `Bearer ${API_KEY}` } });
    await new Promise((resolve, reject) => { ws.once('open', resolve); ws.once('error', reject); });
    const events = [];
    const waiters = [];
    ws.on('message', (data) => {
      const ev = JSON.parse(data.toString());
      events.push(ev);
      if (['response.completed', 'response.incomplete', 'response.failed', 'error'].includes(ev.type)) {
        waiters.shift()?.(ev);
      }
    });
    const create = (body) => new Promise((resolve) => {
      waiters.push(resolve);
      ws.send(JSON.stringify({ type: 'response.create', model: 'parley', ...body }));
    });
    try {
      const a = await create({ input: 'Once upon a time', max_output_tokens: 6, temperature: 0 });
      assert.ok(['response.completed', 'response.incomplete'].includes(a.type), JSON.stringify(a));
      const bad = await create({ input: 5 });
      assert.equal(bad.type, 'error');
      const b = await create({ input: 'Then?', previous_response_id: a.response.id, max_output_tokens: 6, temperature: 0 });
      assert.equal(b.response.previous_response_id, a.response.id);
      assert.ok(b.response.usage.input_tokens_details.cached_tokens > 0, JSON.stringify(b.response.usage));
      assert.ok(events.some((e) => e.type === 'response.output_text.delta'));
      // Stored like any response: the HTTP API sees it.
      assert.equal((await client.responses.retrieve(b.response.id)).id, b.response.id);
    } finally {
      ws.close();
    }
  });
});
