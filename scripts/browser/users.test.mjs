// The chat page's conversation list with named users, in a real browser
// against the real server (bin/parley --user NAME:KEY) and the real tiny
// model: `node --test browser/users.test.mjs` from scripts/ (see
// chat.test.mjs for what it needs). Two users each see only their own
// conversations; rename, delete and search survive a reload and a server
// restart; regenerate replaces the last reply in the stored session; an
// edited prompt forks the conversation and keeps the original. It also takes
// the README's screenshots (test-results/users-desktop.png, users-phone.png).
import { describe, test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtemp, mkdir, readFile, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { chromium } from 'playwright-core';
import { ROOT, ParleyServer, assertBinaryAndModel, freePort } from '../lib/parley-server.mjs';

const RESULTS = path.join(ROOT, 'test-results');
const CHROMIUM = process.env.PARLEY_CHROMIUM || '/usr/bin/chromium';
const REPLY_MS = 120_000; // only catches a hang
const UI_MS = 60_000; // only catches a hang (a busy machine is slow, not broken)
const ALICE = 'alice-key-5e1d';
const BOB = 'bob-key-93ac';

async function launch(dir) {
  const context = await chromium.launchPersistentContext(dir, {
    executablePath: CHROMIUM,
    headless: true,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
    viewport: { width: 1024, height: 768 },
    colorScheme: 'dark',
  });
  await context.grantPermissions(['clipboard-read', 'clipboard-write']);
  return context;
}

// A browser of one person: its own profile (localStorage), one page, and
// helpers over it.
class Person {
  constructor(name) { this.name = name; this.errors = []; }

  async open(url) {
    this.dir = await mkdtemp(path.join(os.tmpdir(), `parley-ui-${this.name}-`));
    this.context = await launch(this.dir);
    this.page = this.context.pages()[0] || await this.context.newPage();
    this.page.setDefaultTimeout(UI_MS);
    this.page.on('pageerror', (err) => this.errors.push(`pageerror: ${err.message}`));
    await this.page.goto(url);
  }

  async close() {
    await this.context?.close().catch(() => {});
    if (this.dir) await rm(this.dir, { recursive: true, force: true });
  }

  async giveKey(key) {
    const dialog = this.page.getByRole('dialog', { name: 'API key' });
    await dialog.waitFor();
    await dialog.getByLabel('API key', { exact: true }).fill(key);
    await dialog.getByRole('button', { name: 'Use this key' }).click();
    await this.connected();
  }

  connected() { return this.page.waitForSelector('#conn[data-state="connected"]', { timeout: UI_MS }); }

  async send(text) {
    await this.page.getByLabel('Message', { exact: true }).fill(text);
    await this.page.getByLabel('Message', { exact: true }).press('Enter');
    return this.replyDone();
  }

  // replyDone waits for the last reply to end and returns its text.
  async replyDone() {
    const last = await this.page.waitForSelector(
      '#log .msg.assistant:last-of-type[data-state="done"], #log .msg.error:last-of-type', { timeout: REPLY_MS });
    if (await last.evaluate((n) => n.classList.contains('error'))) assert.fail(`the page shows an error: ${await last.textContent()}`);
    return last.evaluate((n) => n.querySelector('.content').textContent);
  }

  // titles is the conversation list as shown, once it shows want (when given).
  async titles(want) {
    if (want) {
      await this.page.waitForFunction((w) => JSON.stringify([...document.querySelectorAll('#conv-list .conv-name')]
        .map((b) => b.textContent)) === JSON.stringify(w), want, { timeout: UI_MS }).catch(() => {});
    }
    return this.page.$$eval('#conv-list .conv-name', (bs) => bs.map((b) => b.textContent));
  }

  async sessionId() { return (await this.page.locator('#session-id').textContent()).trim(); }

  // items is the stored conversation as the server holds it: [role, text].
  async items(sid, key) {
    return this.page.evaluate(async ([sid, key]) => {
      const res = await fetch(`v1/conversations/conv_${sid}/items?order=asc`, { headers: { Authorization: `Bearer ${key}` } });
      if (!res.ok) return res.status;
      const l = await res.json();
      return l.data.map((it) => [it.role, it.content.map((c) => c.text).join('')]);
    }, [sid, key]);
  }
}

describe('conversation list with named users', { timeout: 600_000 }, () => {
  let server;
  let dataDir;
  const alice = new Person('alice');
  const alice2 = new Person('alice2'); // Alice's other browser
  const bob = new Person('bob');
  const killOnExit = () => server?.killNow();
  let aliceStory = ''; // the session id of Alice's "second tale"

  before(async () => {
    assertBinaryAndModel();
    process.on('exit', killOnExit);
    dataDir = await mkdtemp(path.join(os.tmpdir(), 'parley-ui-users-'));
    server = new ParleyServer(await freePort(), {
      args: ['--user', `alice:${ALICE}`, '--user', `bob:${BOB}`, '--max-tokens', '24'],
      env: { PARLEY_DATA_DIR: dataDir },
    });
    await server.start();
  });

  after(async () => {
    for (const p of [alice, alice2, bob]) await p.close();
    await server?.stop();
    await server?.saveLog(path.join(RESULTS, 'parley-server-users.log'));
    process.off('exit', killOnExit);
    if (dataDir) await rm(dataDir, { recursive: true, force: true });
  });

  test('the page asks for the key once; conversations are listed newest first', async () => {
    await alice.open(server.url);
    await alice.giveKey(ALICE);
    await alice.send('Alice first story');
    await alice.page.getByRole('button', { name: 'New chat', exact: true }).click();
    await alice.connected();
    await alice.send('Alice second tale');
    aliceStory = await alice.sessionId();
    assert.deepEqual(await alice.titles(['Alice second tale', 'Alice first story']), ['Alice second tale', 'Alice first story']);
    assert.equal(await alice.page.locator('#conv-list .conv[aria-current="true"] .conv-name').textContent(), 'Alice second tale');
    // Each conversation says when it last changed: today, so a time of day.
    const dates = await alice.page.$$eval('#conv-list .conv-date', (ts) => ts.map((t) => [t.textContent, t.dateTime]));
    assert.equal(dates.length, 2);
    for (const [text, iso] of dates) {
      assert.match(text, /\d:\d\d/, `today's conversations show a time: ${text}`);
      assert.ok(Math.abs(Date.now() - Date.parse(iso)) < 86_400_000, `dated today: ${iso}`);
    }
  });

  test('rename and search', async () => {
    const { page } = alice;
    await page.getByRole('button', { name: 'Rename “Alice first story”' }).click();
    const input = page.getByLabel('New title');
    await input.fill('Renamed by Alice');
    await input.press('Enter');
    // A rename is a change: the renamed conversation comes first.
    assert.deepEqual(await alice.titles(['Renamed by Alice', 'Alice second tale']), ['Renamed by Alice', 'Alice second tale']);
    await page.getByLabel('Search conversations by title').fill('RENAMED');
    assert.deepEqual(await alice.titles(['Renamed by Alice']), ['Renamed by Alice']);
    await page.getByLabel('Search conversations by title').fill('');
    assert.deepEqual(await alice.titles(['Renamed by Alice', 'Alice second tale']), ['Renamed by Alice', 'Alice second tale']);
  });

  test('open switches conversations; copy copies a reply', async () => {
    const { page } = alice;
    await page.getByRole('button', { name: 'Renamed by Alice', exact: true }).click();
    await page.waitForFunction(() => document.querySelector('#log .msg.user .content')?.textContent === 'Alice first story');
    await alice.connected();
    const stored = await alice.items(await alice.sessionId(), ALICE);
    await page.getByRole('button', { name: 'Copy reply' }).first().click();
    assert.equal(await page.evaluate(() => navigator.clipboard.readText()), stored[1][1], 'the reply as stored (its Markdown source)');
    await page.getByRole('button', { name: 'Alice second tale', exact: true }).click();
    await page.waitForFunction(() => document.querySelector('#log .msg.user .content')?.textContent === 'Alice second tale');
    await alice.connected();
  });

  test('regenerate replaces the last reply in the stored session', async () => {
    const { page } = alice;
    // A sampled reply, so that the new one differs from the greedy first.
    await page.evaluate(() => localStorage.setItem('parley.overrides', JSON.stringify({ temperature: 1.5, max_tokens: 24, top_p: 1, top_k: 0, system: '' })));
    await page.reload();
    await alice.connected();
    const before = await alice.items(aliceStory, ALICE);
    assert.equal(before.length, 2);
    await page.getByRole('button', { name: 'Regenerate reply' }).click();
    await alice.replyDone();
    // The reply as the page holds it: its Markdown source, which Copy gives.
    // The shown text is rendered Markdown (a sampled " \n" shows as "\n").
    await page.getByRole('button', { name: 'Copy reply' }).first().click();
    const text = await page.evaluate(() => navigator.clipboard.readText());
    const after = await alice.items(aliceStory, ALICE);
    assert.deepEqual(after.map(([role, t]) => [role, t.trim()]), [['user', 'Alice second tale'], ['assistant', text.trim()]],
      'one prompt and the new reply');
    assert.notEqual(after[1][1], before[1][1], 'the reply changed');
    assert.equal(await page.locator('#log .msg.assistant').count(), 1);

    // The replaced reply is a click away: ‹ shows it, marked as not in the
    // conversation; › comes back to the conversation's own.
    const shown = (t) => page.evaluate((src) => {
      const d = document.createElement('div');
      d.innerHTML = window.ParleyMarkdown.render(src);
      return d.textContent;
    }, t);
    const reply = page.locator('#log .msg.assistant');
    assert.equal(await reply.locator('.pager-at').textContent(), '2/2');
    await reply.getByRole('button', { name: 'Previous version of this reply' }).click();
    await page.waitForSelector('#log .msg.assistant.earlier');
    assert.equal(await reply.locator('.pager-at').textContent(), '1/2');
    assert.equal(await reply.locator('.content').textContent(), await shown(before[1][1]));
    await reply.getByRole('button', { name: 'Next version of this reply' }).click();
    await page.waitForSelector('#log .msg.assistant:not(.earlier)');
    assert.equal(await reply.locator('.content').textContent(), await shown(after[1][1]));
    assert.equal(await page.locator('#log .msg.assistant').count(), 1);
  });

  test('edit and resend forks the conversation and keeps the original', async () => {
    const { page } = alice;
    await page.getByRole('button', { name: 'Edit prompt' }).click();
    await page.getByLabel('Edited prompt').fill('Alice edited tale');
    await page.getByRole('button', { name: 'Save & send' }).click();
    await page.waitForFunction(() => document.querySelector('#log .msg.user .content')?.textContent === 'Alice edited tale');
    await alice.replyDone();
    const fork = await alice.sessionId();
    assert.notEqual(fork, aliceStory);
    assert.deepEqual(await alice.titles(['Alice edited tale', 'Alice second tale', 'Renamed by Alice']),
      ['Alice edited tale', 'Alice second tale', 'Renamed by Alice']);
    assert.equal((await alice.items(aliceStory, ALICE))[0][1], 'Alice second tale', 'the original is kept');
    assert.equal((await alice.items(fork, ALICE))[0][1], 'Alice edited tale');

    // The two versions of the prompt are siblings: ‹ opens the original, › the fork.
    const prompt = page.locator('#log .msg.user').first();
    assert.equal(await prompt.locator('.pager-at').textContent(), '2/2');
    await prompt.getByRole('button', { name: 'Previous version of this prompt' }).click();
    await page.waitForFunction(() => document.querySelector('#log .msg.user .content')?.textContent === 'Alice second tale');
    await alice.connected();
    assert.equal(await alice.sessionId(), aliceStory);
    await page.waitForFunction(() => document.querySelector('#log .msg.user .pager-at')?.textContent === '1/2');
    await page.locator('#log .msg.user').first().getByRole('button', { name: 'Next version of this prompt' }).click();
    await page.waitForFunction(() => document.querySelector('#log .msg.user .content')?.textContent === 'Alice edited tale');
    await alice.connected();
    assert.equal(await alice.sessionId(), fork);
  });

  test('Esc stops a reply', async () => {
    const { page } = alice;
    await page.evaluate(() => localStorage.setItem('parley.overrides', JSON.stringify({ temperature: 0.8, max_tokens: 1500, top_p: 1, top_k: 0, system: '' })));
    await page.reload();
    await alice.connected();
    await page.getByLabel('Message', { exact: true }).fill('A very long story');
    await page.getByLabel('Message', { exact: true }).press('Enter');
    await page.waitForSelector('#log .msg.assistant[data-state="streaming"]');
    await page.keyboard.press('Escape');
    await page.waitForSelector('#log .msg.assistant:last-of-type[data-state="done"]', { timeout: REPLY_MS });
    assert.equal(await page.locator('#log .msg.assistant').last().getAttribute('data-finish'), 'cancelled');
    await page.evaluate(() => localStorage.setItem('parley.overrides', JSON.stringify({ temperature: 0, max_tokens: 24, top_p: 1, top_k: 0, system: '' })));
  });

  test('delete removes a conversation from the list and the server', async () => {
    const { page } = alice;
    const fork = await alice.sessionId();
    page.once('dialog', (d) => d.accept());
    await page.getByRole('button', { name: 'Delete “Alice edited tale”' }).click();
    assert.deepEqual(await alice.titles(['Alice second tale', 'Renamed by Alice']), ['Alice second tale', 'Renamed by Alice']);
    assert.equal(await alice.items(fork, ALICE), 404);
    await alice.connected();
    assert.notEqual(await alice.sessionId(), fork, 'deleting the open conversation starts a new one');
  });

  test('the same list in another browser of the same user; another user sees none of it', async () => {
    await alice2.open(`${server.url}?key=${ALICE}`);
    await alice2.connected();
    assert.deepEqual(await alice2.titles(['Alice second tale', 'Renamed by Alice']), ['Alice second tale', 'Renamed by Alice']);

    await bob.open(server.url);
    await bob.giveKey(BOB);
    await bob.send('Bob only story');
    assert.deepEqual(await bob.titles(['Bob only story']), ['Bob only story']);
    // Alice's id opens nothing of hers for Bob: the page starts a fresh chat.
    await bob.page.evaluate((sid) => localStorage.setItem('parley.session', sid), aliceStory);
    await bob.page.reload();
    await bob.connected();
    assert.notEqual(await bob.sessionId(), aliceStory);
    assert.equal(await bob.page.locator('#log .msg.user').count(), 0);
    assert.equal(await bob.items(aliceStory, BOB), 404);
    assert.deepEqual(await alice.titles(['Alice second tale', 'Renamed by Alice']), ['Alice second tale', 'Renamed by Alice']);
  });

  test('the list survives a reload and a server restart', async () => {
    await alice.page.reload();
    await alice.connected();
    assert.deepEqual(await alice.titles(['Alice second tale', 'Renamed by Alice']), ['Alice second tale', 'Renamed by Alice']);
    await server.stop();
    await server.start();
    await alice.page.reload();
    await alice.connected();
    assert.deepEqual(await alice.titles(['Alice second tale', 'Renamed by Alice']), ['Alice second tale', 'Renamed by Alice']);
    await bob.page.reload();
    await bob.connected();
    assert.deepEqual(await bob.titles(['Bob only story']), ['Bob only story']);
  });

  test('export as JSON and Markdown; import brings a conversation back, tools collapsed, code highlighted', async () => {
    const { page } = bob;
    await page.getByRole('button', { name: 'Bob only story', exact: true }).click();
    await page.waitForFunction(() => document.querySelector('#log .msg.user .content')?.textContent === 'Bob only story');
    await bob.connected();
    const sid = await bob.sessionId();
    const stored = await bob.items(sid, BOB);
    const download = async (name) => {
      const [file] = await Promise.all([page.waitForEvent('download'), page.getByRole('button', { name, exact: true }).click()]);
      return { name: file.suggestedFilename(), text: await readFile(await file.path(), 'utf8') };
    };
    const json = await download('Export JSON');
    assert.equal(json.name, 'Bob only story.json');
    const data = JSON.parse(json.text);
    assert.equal(data.format, 'parley.conversation');
    assert.equal(data.title, 'Bob only story');
    assert.deepEqual(data.messages.map((m) => [m.role, m.content]), stored);
    const md = await download('Export Markdown');
    assert.equal(md.name, 'Bob only story.md');
    assert.ok(md.text.startsWith('# Bob only story\n\n## You\n\nBob only story\n'), md.text.slice(0, 80));
    assert.ok(md.text.includes(stored[1][1]), 'the reply is in the Markdown');

    // An export with a tool call, its result and a reply with Go code.
    const crafted = {
      format: 'parley.conversation', version: 1, title: 'Imported with tools',
      messages: [
        { role: 'user', content: 'What is the weather in Oslo?' },
        { role: 'assistant', content: '', tool_calls: [{ id: 'call_1', name: 'get_weather', arguments: '{"city":"Oslo"}' }] },
        { role: 'tool', tool_call_id: 'call_1', content: '{"temp_c": 3}\nand a long second line of the result' },
        { role: 'assistant', content: 'Three degrees. In Go:\n\n```go\nfunc main() { println("cold") }\n```\n' },
      ],
    };
    await page.locator('#import-file').setInputFiles({ name: 'tools.json', mimeType: 'application/json', buffer: Buffer.from(JSON.stringify(crafted)) });
    await page.waitForFunction(() => document.querySelector('#log .msg.user .content')?.textContent === 'What is the weather in Oslo?');
    await bob.connected();
    assert.deepEqual(await bob.titles(['Imported with tools', 'Bob only story']), ['Imported with tools', 'Bob only story']);
    const imported = await page.evaluate(async ([sid, key]) => {
      const res = await fetch(`v1/conversations/conv_${sid}/items?order=asc`, { headers: { Authorization: `Bearer ${key}` } });
      return (await res.json()).data.map((it) => [it.type, it.role || it.name || '', (it.content || []).map((c) => c.text).join('') || it.output || it.arguments]);
    }, [await bob.sessionId(), BOB]);
    assert.deepEqual(imported, [
      ['message', 'user', 'What is the weather in Oslo?'],
      ['function_call', 'get_weather', '{"city":"Oslo"}'],
      ['function_call_output', '', crafted.messages[2].content],
      ['message', 'assistant', crafted.messages[3].content],
    ]);
    const tool = page.locator('#log .msg.tool details.tool');
    assert.equal(await tool.count(), 1, 'the tool result is collapsed');
    assert.equal(await tool.evaluate((d) => d.open), false);
    assert.match(await tool.locator('summary').textContent(), /^\{"temp_c": 3\} \(\d+ characters\)$/);
    assert.equal(await page.locator('#log details.tool summary', { hasText: 'Tool call: get_weather' }).count(), 1);
    const block = page.locator('#log .msg.assistant .code-block').last();
    assert.equal(await block.locator('.lang').textContent(), 'Go');
    assert.equal(await block.locator('.hljs-keyword').first().textContent(), 'func');

    // A file that is not an export is refused with a notice, and nothing is made.
    await page.locator('#import-file').setInputFiles({ name: 'bad.json', mimeType: 'application/json', buffer: Buffer.from('{"not": "an export"}') });
    await page.waitForFunction(() => /Could not import bad\.json: no messages/.test(document.getElementById('log').textContent));
    assert.deepEqual(await bob.titles(), ['Imported with tools', 'Bob only story']);
  });

  test('settings change or forget the key; the key field is not red before anything is typed', async () => {
    const { page } = alice2;
    await alice2.connected();
    await page.getByRole('button', { name: 'Settings', exact: true }).click();
    const settings = page.getByRole('dialog', { name: 'Settings' });
    assert.match(await settings.textContent(), /This browser keeps an API key/);
    // Change it to Bob's: the page reconnects as Bob and lists his conversations.
    await settings.getByRole('button', { name: 'Change key…' }).click();
    const dialog = page.getByRole('dialog', { name: 'API key' });
    await dialog.waitFor();
    const border = () => page.locator('#key-input').evaluate((e) => getComputedStyle(e).borderTopColor);
    const danger = await page.evaluate(() => getComputedStyle(document.documentElement).getPropertyValue('--danger').trim());
    const untouched = await border();
    assert.notEqual(untouched, await page.evaluate((c) => { const d = document.createElement('div'); d.style.color = c; document.body.append(d); const v = getComputedStyle(d).color; d.remove(); return v; }, danger),
      'not red before anything is typed');
    await dialog.getByLabel('API key', { exact: true }).fill(BOB);
    await dialog.getByRole('button', { name: 'Use this key' }).click();
    await alice2.connected();
    assert.deepEqual(await alice2.titles(['Imported with tools', 'Bob only story']), ['Imported with tools', 'Bob only story']);
    // Forget it (sign out): the page starts over and asks for a key.
    await page.getByRole('button', { name: 'Settings', exact: true }).click();
    await settings.getByRole('button', { name: 'Forget key (sign out)' }).click();
    await dialog.waitFor();
    assert.equal(await page.evaluate(() => localStorage.getItem('parley.key')), null);
    await dialog.getByRole('button', { name: 'Cancel' }).click();
    assert.equal(await dialog.isVisible(), false);
    assert.equal(await page.locator('#conv-list .conv').count(), 0, 'nothing of Bob\'s is listed without a key');
  });

  test('screenshots: desktop, and a phone at 375 px with the list open', async () => {
    const { page } = alice;
    await page.getByRole('button', { name: 'Alice second tale', exact: true }).click();
    await page.waitForFunction(() => document.querySelector('#log .msg.user .content')?.textContent === 'Alice second tale');
    await alice.connected();
    await mkdir(RESULTS, { recursive: true });
    await writeFile(path.join(RESULTS, 'users-desktop.png'), await page.screenshot());
    await page.setViewportSize({ width: 375, height: 740 });
    const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
    assert.ok(overflow <= 0, `no horizontal scrolling at 375 px (overflow ${overflow} px)`);
    assert.equal(await page.locator('#sidebar').isVisible(), false, 'the list is a closed drawer on a phone');
    await page.getByRole('button', { name: 'Conversations', exact: true }).click();
    await page.waitForFunction(() => document.getElementById('sidebar').getBoundingClientRect().left >= 0);
    assert.notEqual(await page.evaluate(() => document.activeElement?.id), 'search', 'search is not focused (no keyboard popping up)');
    assert.equal(await page.locator('#scrim').isVisible(), true, 'a scrim covers the chat');
    for (const name of ['Alice second tale', 'Renamed by Alice']) {
      const box = await page.getByRole('button', { name, exact: true }).boundingBox();
      assert.ok(box && box.x >= 0 && box.x + box.width <= 375, `${name} is on screen: ${JSON.stringify(box)}`);
    }
    await writeFile(path.join(RESULTS, 'users-phone.png'), await page.screenshot());
    await page.locator('#scrim').click({ position: { x: 360, y: 400 } });
    await page.waitForFunction(() => !document.getElementById('sidebar').classList.contains('open'));
    assert.equal(await page.locator('#scrim').isVisible(), false, 'a tap on the scrim closes the list');
    await page.setViewportSize({ width: 1024, height: 768 });
  });

  test('no page errors', () => {
    assert.deepEqual([...alice.errors, ...alice2.errors, ...bob.errors], []);
  });
});
