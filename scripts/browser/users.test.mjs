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
import { mkdtemp, mkdir, rm, writeFile } from 'node:fs/promises';
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
      await this.page.waitForFunction((w) => JSON.stringify([...document.querySelectorAll('#conv-list .conv-open')]
        .map((b) => b.textContent)) === JSON.stringify(w), want, { timeout: UI_MS }).catch(() => {});
    }
    return this.page.$$eval('#conv-list .conv-open', (bs) => bs.map((b) => b.textContent));
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
    assert.equal(await alice.page.locator('#conv-list .conv[aria-current="true"] .conv-open').textContent(), 'Alice second tale');
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
    for (const name of ['Alice second tale', 'Renamed by Alice']) {
      const box = await page.getByRole('button', { name, exact: true }).boundingBox();
      assert.ok(box && box.x >= 0 && box.x + box.width <= 375, `${name} is on screen: ${JSON.stringify(box)}`);
    }
    await writeFile(path.join(RESULTS, 'users-phone.png'), await page.screenshot());
    await page.keyboard.press('Escape');
    await page.waitForFunction(() => !document.getElementById('sidebar').classList.contains('open'));
    await page.setViewportSize({ width: 1024, height: 768 });
  });

  test('no page errors', () => {
    assert.deepEqual([...alice.errors, ...alice2.errors, ...bob.errors], []);
  });
});
