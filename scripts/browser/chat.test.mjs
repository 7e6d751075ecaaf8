// End-to-end test of the chat page in a real browser against the real server
// and the real tiny model: `node --test browser/` from scripts/ (node 20).
//
// It starts bin/parley itself (env PARLEY_BIN, default <repo>/bin/parley; `make
// build` makes it) on a free loopback port with stories260K (env
// PARLEY_TEST_MODEL), drives Debian's chromium headless through
// playwright-core, and always stops both, also when a step fails. The steps
// share one page and run in order: each starts from the state the previous one
// left, the way a person uses the page.
//
// stories260K has no chat template and writes a children's story for any
// prompt; the test checks the page's behaviour, never the model's words.
import { describe, test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtemp, mkdir, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { chromium } from 'playwright-core';
import WebSocket from 'ws';
import { decodePNG, colourStats } from './png.mjs';
import { ROOT, ParleyServer, assertBinaryAndModel, freePort } from '../lib/parley-server.mjs';

const RESULTS = path.join(ROOT, 'test-results');
const CHROMIUM = process.env.PARLEY_CHROMIUM || '/usr/bin/chromium';

// Timeouts in ms. A reply of a few thousand tokens from stories260K takes
// well under a second, so REPLY is generous.
const REPLY_MS = 120_000; // only catches a hang
const UI_MS = 60_000; // only catches a hang (a busy machine is slow, not broken)

// A reply long enough to stop half way. stories260K has no end-of-text habit
// at these lengths (replies end at the cap) and the engine caps each session's
// context at the model's training context, 2048 tokens; 1500 tokens take
// seconds through the server, far longer than a click.
const LONG_MAX_TOKENS = 1500;

// newServer is a bin/parley for the page, its sessions in dataDir (never in
// the user's data directory).
const newServer = async (dataDir, args = []) => new ParleyServer(await freePort(), { args, env: { PARLEY_DATA_DIR: dataDir } });

// Console messages chromium itself logs while the server is deliberately down
// (the reconnect step); anything else on the console is a page error.
const EXPECTED_WHILE_DOWN = /WebSocket connection to .* failed|ERR_CONNECTION_REFUSED/;

async function launchBrowser(userDataDir) {
  return chromium.launchPersistentContext(userDataDir, {
    executablePath: CHROMIUM,
    headless: true,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
    viewport: { width: 1024, height: 768 },
    colorScheme: 'light',
  });
}

describe('chat page', { timeout: 600_000 }, () => {
  let server;
  let context;
  let page;
  let userDataDir;
  let dataDir;
  let serverDown = false;
  const pageErrors = [];

  // Kill the server even if the runner dies before `after` runs.
  const killOnExit = () => server?.killNow();

  before(async () => {
    assertBinaryAndModel();
    process.on('exit', killOnExit);
    dataDir = await mkdtemp(path.join(os.tmpdir(), 'parley-ui-data-'));
    userDataDir = await mkdtemp(path.join(os.tmpdir(), 'parley-ui-chromium-'));
    server = await newServer(dataDir);
    await server.start();

    context = await launchBrowser(userDataDir);
    page = context.pages()[0] || await context.newPage();
    page.setDefaultTimeout(UI_MS);
    page.on('pageerror', (err) => pageErrors.push(`pageerror: ${err.message}`));
    page.on('console', (msg) => {
      if (msg.type() !== 'error') return;
      if (serverDown && EXPECTED_WHILE_DOWN.test(msg.text())) return;
      pageErrors.push(`console.error: ${msg.text()}`);
    });
    page.on('response', (res) => {
      if (res.status() >= 400) pageErrors.push(`HTTP ${res.status()} ${res.url()}`);
    });
    page.on('requestfailed', (req) => {
      if (serverDown) return;
      pageErrors.push(`request failed: ${req.url()} ${req.failure()?.errorText}`);
    });
    // Records the lengths the streaming reply's text goes through, as the DOM
    // shows them: the proof that a reply grows on screen instead of appearing
    // whole. One entry per reply, reset by the test.
    await page.addInitScript(() => {
      window.__parleyLengths = [];
      const watch = () => {
        new MutationObserver(() => {
          const node = document.querySelector('.msg.assistant[data-state="streaming"] .content');
          if (!node) return;
          const n = node.textContent.length;
          const seen = window.__parleyLengths;
          if (n > 0 && seen[seen.length - 1] !== n) seen.push(n);
        }).observe(document.documentElement, { childList: true, subtree: true, characterData: true, attributes: true });
      };
      if (document.documentElement) watch();
      else document.addEventListener('DOMContentLoaded', watch);
    });
  });

  after(async () => {
    await context?.close().catch(() => {});
    await server?.stop();
    await server?.saveLog(path.join(RESULTS, 'parley-server.log'));
    process.off('exit', killOnExit);
    if (userDataDir) await rm(userDataDir, { recursive: true, force: true });
    if (dataDir) await rm(dataDir, { recursive: true, force: true });
  });

  // ---------- helpers over the page ----------

  const connected = () => page.waitForSelector('#conn[data-state="connected"]', { timeout: UI_MS });
  const sessionId = () => page.locator('#session-id').textContent();
  const messages = () => page.$$eval('#log .msg', (nodes) => nodes.map((n) => ({
    role: n.dataset.role,
    text: n.querySelector('.content').textContent,
    state: n.dataset.state || '',
    finish: n.dataset.finish || '',
    meta: n.querySelector('.meta')?.textContent || '',
  })));
  // turns lists the (prompt, reply) pairs the server should have committed:
  // all but failed replies and replies stopped before any text. Restored
  // messages have no finish mark and always count.
  const turns = (ms) => {
    const out = [];
    for (let i = 0; i + 1 < ms.length; i++) {
      const [u, a] = [ms[i], ms[i + 1]];
      if (u.role !== 'user' || a.role !== 'assistant') continue;
      if (a.finish === 'error' || (a.finish === 'cancelled' && a.text === '')) continue;
      out.push([u.text, a.text]);
    }
    return out;
  };

  async function setSettings(values) {
    await page.getByRole('button', { name: 'Settings' }).click();
    const dialog = page.getByRole('dialog', { name: 'Settings' });
    await dialog.waitFor();
    for (const [label, value] of Object.entries(values)) await dialog.getByLabel(label, { exact: true }).fill(String(value));
    await dialog.getByRole('button', { name: 'Save' }).click();
    await dialog.waitFor({ state: 'hidden' });
  }

  async function send(text) {
    await page.getByLabel('Message', { exact: true }).fill(text);
    await page.getByLabel('Message', { exact: true }).press('Enter');
  }

  // waitReplyDone waits for the reply to the last prompt; an error the page
  // shows instead (a refused prompt has no reply) fails at once with its text.
  async function waitReplyDone() {
    const last = await page.waitForSelector(
      '#log .msg.assistant:last-of-type[data-state="done"], #log .msg.error:last-of-type', { timeout: REPLY_MS });
    if (await last.evaluate((n) => n.classList.contains('error'))) assert.fail(`the page shows an error: ${await last.textContent()}`);
    return (await messages()).filter((m) => m.role === 'assistant').at(-1);
  }

  // ---------- steps ----------

  let firstId = '';

  test('opens, connects and shows a session id', async () => {
    await page.goto(server.url);
    await connected();
    firstId = (await sessionId()).trim();
    assert.match(firstId, /\S{4,}/, 'session id shown');
    assert.equal(await page.evaluate(() => localStorage.getItem('parley.session')), firstId, 'session id stored');
    assert.equal(await page.locator('#log .msg').count(), 0, 'fresh session has no messages');
    assert.equal(await page.getByRole('button', { name: 'Send' }).isDisabled(), true, 'Send is disabled with nothing typed');

    // A reload before any reply: the server stored the session when it
    // was created, so the page resumes it quietly (no notice, nothing in it).
    await page.reload();
    await connected();
    const again = (await sessionId()).trim();
    assert.equal(again, firstId, 'the new (stored) session is resumed after the reload');
    assert.equal(await page.locator('#log .msg').count(), 0, 'no notice, no messages');
    assert.doesNotMatch(await page.locator('#log').textContent(), /expired/);
    firstId = again;
  });

  test('a prompt streams a reply that grows token by token', async () => {
    await setSettings({ 'Max tokens': 300, Temperature: 0.8 });
    const input = page.getByLabel('Message', { exact: true });
    await input.fill('Once upon a time');
    await input.press('Shift+Enter');
    await input.pressSequentially('there was a dog');
    assert.equal(await input.inputValue(), 'Once upon a time\nthere was a dog', 'Shift+Enter adds a newline');
    assert.equal(await page.locator('#log .msg').count(), 0, 'Shift+Enter does not send');

    await page.evaluate(() => { window.__parleyLengths = []; });
    await input.press('Enter');
    assert.equal(await input.inputValue(), '', 'input cleared on send');
    const reply = await waitReplyDone();
    const lengths = await page.evaluate(() => window.__parleyLengths);
    const all = await messages();

    assert.deepEqual(all.map((m) => m.role), ['user', 'assistant']);
    assert.equal(all[0].text, 'Once upon a time\nthere was a dog', 'the prompt is shown as typed');
    assert.ok(reply.text.trim().length > 0, 'reply has text');
    assert.ok(new Set(lengths).size >= 2, `reply grew on screen through >= 2 lengths, saw ${JSON.stringify(lengths)}`);
    assert.ok(lengths.every((n) => n > 0));
    assert.ok(['eos', 'length', 'stop'].includes(reply.finish), `finished normally, got ${reply.finish}`);
    assert.match(reply.meta, /\d+ tokens?/, 'token count shown');
    assert.match(reply.meta, /[\d.]+ tok\/s/, 'tokens per second shown');
    assert.match(reply.meta, /TTFT [\d.]+ ms/, 'time to first token shown');
    assert.equal(await page.getByRole('button', { name: 'Stop' }).isVisible(), false, 'Stop hidden when idle');
  });

  test('the model\'s facts and how much of the context the conversation fills', async () => {
    const info = await page.evaluate(async () => (await fetch('info')).json());
    await page.waitForSelector('#facts:not([hidden])');
    const facts = await page.locator('#facts-text').textContent();
    assert.ok(facts.includes(info.quantization), `facts name the quantization ${info.quantization}: ${facts}`);
    const ctx = await page.locator('#ctx-text').textContent();
    const m = /^context (\d+) \/ (\d+) \(\d+%\)$/.exec(ctx);
    assert.ok(m, `the meter says what the last reply left: ${ctx}`);
    assert.equal(Number(m[2]), info.limits.context_length);
    assert.ok(Number(m[1]) > 0);
    assert.equal(await page.locator('#ctx-meter').evaluate((e) => e.value), Number(m[1]));
    assert.equal(await page.locator('#think').isVisible(), false, 'no thinking switch for a model that does not think');
  });

  test('Stop cancels a reply mid-stream', async () => {
    await setSettings({ 'Max tokens': LONG_MAX_TOKENS, Temperature: 1 });
    // A reply can still end by itself (end of story) before the click lands;
    // then try again. Cancelling must work within a few tries.
    let stopped = null;
    const tried = [];
    for (let attempt = 0; attempt < 5 && !stopped; attempt++) {
      await send(`Tell me a long story, part ${attempt + 1}`);
      const stop = page.getByRole('button', { name: 'Stop' });
      await page.waitForSelector('#log .msg.assistant:last-of-type:is([data-state="streaming"], [data-state="done"]), #log .msg.error:last-of-type', { timeout: REPLY_MS });
      if (await stop.isEnabled().catch(() => false)) await stop.click().catch(() => {});
      const reply = await waitReplyDone();
      tried.push(reply.finish);
      if (reply.finish === 'cancelled') stopped = reply;
    }
    assert.ok(stopped, `no reply was cancelled in 5 tries (finish reasons: ${tried})`);
    assert.match(stopped.meta, /stopped/, 'the reply is marked stopped');
    const tokens = Number(stopped.meta.match(/(\d+) tokens?/)?.[1]);
    assert.ok(tokens < LONG_MAX_TOKENS, `stopped before the cap (${tokens} tokens)`);
    assert.equal(await page.getByRole('button', { name: 'Send' }).isVisible(), true, 'Send is back after stopping');
    // The conversation goes on after a stop.
    await setSettings({ 'Max tokens': 64 });
    await send('And then?');
    const next = await waitReplyDone();
    assert.ok(['eos', 'length', 'stop'].includes(next.finish), `reply after stop finished with ${next.finish}`);
  });

  let beforeReload;

  test('reload resumes the same session with its history', async () => {
    beforeReload = await messages();
    const id = (await sessionId()).trim();
    assert.equal(id, firstId);
    await page.reload();
    await connected();
    assert.equal((await sessionId()).trim(), id, 'same session id after reload');
    const after = await messages();
    assert.ok(turns(beforeReload).length >= 3, `at least three committed turns before reload, got ${turns(beforeReload).length}`);
    assert.deepEqual(turns(after), turns(beforeReload), 'every committed turn restored word for word, in order');
    assert.deepEqual(after.map((m) => m.role), turns(after).flatMap(() => ['user', 'assistant']), 'nothing else shown');
    assert.equal(await page.getByLabel('Message', { exact: true }).isEnabled(), true);
    // The sampling settings are kept too (the last step set 64 max tokens).
    await page.getByRole('button', { name: 'Settings' }).click();
    const dialog = page.getByRole('dialog', { name: 'Settings' });
    assert.equal(await dialog.getByLabel('Max tokens', { exact: true }).inputValue(), '64');
    assert.equal(await dialog.getByLabel('Temperature', { exact: true }).inputValue(), '1');
    await dialog.getByRole('button', { name: 'Cancel' }).click();
    await dialog.waitFor({ state: 'hidden' });
  });

  // storedSession reads the session as the server holds it, over a socket
  // of its own (JSON mode, ?session=).
  async function storedSession(id) {
    const ws = new WebSocket(`${server.url.replace('http', 'ws')}ws?format=json&session=${id}`);
    try {
      return await new Promise((resolve, reject) => {
        ws.on('message', (data) => resolve(JSON.parse(String(data))));
        ws.on('error', reject);
      });
    } finally {
      ws.close();
    }
  }

  test('a reload mid-reply picks the reply back up', async () => {
    await setSettings({ 'Max tokens': LONG_MAX_TOKENS, Temperature: 1 });
    const id = (await sessionId()).trim();
    // The reply may end before the reload lands (end of story): then try
    // again. It must resume within a few tries.
    let resumed = false;
    const tried = [];
    for (let attempt = 0; attempt < 5 && !resumed; attempt++) {
      const seen = (server.output.match(/resumed a reply in flight/g) || []).length;
      await send(`Tell me a long story, chapter ${attempt + 1}`);
      await page.waitForSelector('#log .msg.assistant:last-of-type[data-state="streaming"], #log .msg.assistant:last-of-type[data-state="done"]', { timeout: REPLY_MS });
      await page.reload();
      await connected();
      const reply = await waitReplyDone();
      tried.push(reply.finish);
      resumed = (server.output.match(/resumed a reply in flight/g) || []).length > seen;
      if (!resumed) continue;
      assert.ok(['eos', 'length', 'stop'].includes(reply.finish), `the resumed reply finished with ${reply.finish}`);
      assert.ok((await page.evaluate(() => window.__parleyLengths)).length > 0, 'the reply went on streaming after the reload');
      const stored = await storedSession(id);
      const norm = (t) => t.replace(/\s+/g, ' ').trim();
      const last = stored.messages.at(-1);
      assert.equal(last.role, 'assistant');
      assert.ok(!last.interrupted, 'the resumed reply is stored whole');
      assert.equal(norm(reply.text), norm(last.content), 'the page shows the whole stored reply');
      assert.equal(stored.messages.filter((m) => m.content === last.content).length, 1, 'exactly one stored copy of the reply');
      assert.deepEqual(turns(await messages()).length, stored.messages.length / 2, 'the page shows every stored turn');
    }
    assert.ok(resumed, `no reload landed mid-reply in 5 tries (finish reasons: ${tried})`);
    beforeReload = await messages(); // the history the restart step expects back
  });

  test('reconnects by itself after the server restarts', async () => {
    const id = (await sessionId()).trim();
    serverDown = true;
    await server.stop();
    await page.waitForSelector('#conn:not([data-state="connected"])', { timeout: UI_MS });
    assert.equal(await page.getByRole('button', { name: 'Send' }).isDisabled(), true, 'cannot send while disconnected');
    await server.start(); // same port, same data directory
    await connected();
    serverDown = false;
    // The notices about the lost connection go once it is back, and none
    // mentions a key on a server that asks for none.
    assert.equal(await page.locator('#log .msg[data-transient]').count(), 0, 'no stale connection notice');
    const notices = await page.$$eval('#log .msg.note .content, #log .msg.error .content', (ns) => ns.map((n) => n.textContent).join('\n'));
    assert.doesNotMatch(notices, /\?key=|API key/, 'no notice mentions a key');
    const now = (await sessionId()).trim();
    if (now === id) {
      // A durable store: the conversation survived the restart.
      assert.deepEqual(turns(await messages()), turns(beforeReload), 'history restored after restart');
    } else {
      // A memory store: the old session is gone (not_found), and the page
      // started a fresh one and said so instead of failing.
      assert.match(await page.locator('#log').textContent(), /expired/, 'the page says the session expired');
      assert.equal(await page.evaluate(() => localStorage.getItem('parley.session')), now);
    }
    await send('Hello again');
    const reply = await waitReplyDone();
    assert.ok(['eos', 'length', 'stop'].includes(reply.finish), `reply after reconnect finished with ${reply.finish}`);
  });

  test('new chat starts a new conversation; reload restores only it', async () => {
    assert.ok(await page.locator('#log .msg').count() > 0);
    await page.getByRole('button', { name: 'New chat' }).click();
    await page.waitForFunction(() => document.querySelectorAll('#log .msg').length === 0);
    await connected();
    assert.equal(await page.locator('#empty').isVisible(), true, 'empty-state hint shown');
    await send('A new story');
    const reply = await waitReplyDone();
    assert.ok(reply.text.length > 0);
    await page.reload();
    await connected();
    const restored = await messages();
    assert.deepEqual(restored.map((m) => m.role), ['user', 'assistant'], 'only the new conversation is restored');
    assert.deepEqual(turns(restored), [['A new story', reply.text]]);
  });

  test('theme toggle switches and is remembered', async () => {
    const bg = () => page.evaluate(() => getComputedStyle(document.body).backgroundColor);
    const light = await bg();
    await page.getByRole('button', { name: 'Switch to dark theme' }).click();
    assert.equal(await page.evaluate(() => document.documentElement.dataset.theme), 'dark');
    const dark = await bg();
    assert.notEqual(dark, light, 'background changes');
    await page.reload();
    await connected();
    assert.equal(await bg(), dark, 'dark theme kept after reload');
    await page.getByRole('button', { name: 'Switch to light theme' }).click();
    assert.equal(await bg(), light);
    // With no choice stored, the page follows the system's preference.
    await page.evaluate(() => localStorage.removeItem('parley.theme'));
    await page.emulateMedia({ colorScheme: 'dark' });
    await page.reload();
    await connected();
    assert.equal(await bg(), dark, 'prefers-color-scheme: dark is followed');
    await page.getByRole('button', { name: 'Switch to light theme' }).click();
    await page.emulateMedia({ colorScheme: 'light' });
    assert.equal(await bg(), light);
  });

  test('usable at 375 px wide; screenshot is not blank', async () => {
    await page.setViewportSize({ width: 375, height: 740 });
    await setSettings({ 'Max tokens': 200 });
    await send('Tell me about `code` and **bold**');
    await waitReplyDone();
    const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
    assert.ok(overflow <= 0, `no horizontal scrolling at 375 px (overflow ${overflow} px)`);
    // The header is one row: every control in it shares a line, the session id gives way.
    const rows = await page.$$eval('.bar > *', (ns) => ns.filter((n) => n.getBoundingClientRect().height > 0)
      .map((n) => Math.round(n.getBoundingClientRect().top + n.getBoundingClientRect().height / 2)));
    assert.ok(Math.max(...rows) - Math.min(...rows) <= 6, `header items on one row: centres ${rows}`);
    assert.equal(await page.locator('#session-id').isVisible(), false, 'no raw session id on a phone');
    for (const name of ['New chat', 'Settings', 'Switch to dark theme', 'Send']) {
      const box = await page.getByRole('button', { name, exact: true }).boundingBox();
      assert.ok(box && box.x >= 0 && box.x + box.width <= 375 && box.y >= 0 && box.y + box.height <= 740,
        `${name} is on screen: ${JSON.stringify(box)}`);
    }
    await mkdir(RESULTS, { recursive: true });
    const png = await page.screenshot();
    const file = path.join(RESULTS, 'chat-375.png');
    await writeFile(file, png);
    const img = decodePNG(png);
    assert.equal(img.width, 375);
    const { colours, dominantShare } = colourStats(img);
    assert.ok(colours > 16, `screenshot has ${colours} colours`);
    assert.ok(dominantShare < 0.97, `one colour covers ${(dominantShare * 100).toFixed(1)}% of the screenshot`);
    await page.setViewportSize({ width: 1024, height: 768 });
  });

  test('Markdown renders code blocks and never raw HTML', async () => {
    const out = await page.evaluate(() => ({
      code: window.ParleyMarkdown.render('Run:\n\n```sh\necho "<b>hi</b>"\n```\n'),
      html: window.ParleyMarkdown.render('<img src=x onerror="window.__xss=1"> <script>window.__xss=2</script>'),
      link: window.ParleyMarkdown.render('see https://example.com and [x](javascript:alert(1)) ![i](http://example.com/p.png)'),
    }));
    // Highlighting wraps words in spans; the text itself stays escaped.
    assert.match(out.code, /^<p>Run:<\/p>\n<pre><code class="language-sh">/);
    assert.equal(out.code.replace(/<p>Run:<\/p>\n/, '').replace(/<[^>]+>/g, ''), 'echo &quot;&lt;b&gt;hi&lt;/b&gt;&quot;\n\n');
    assert.doesNotMatch(out.html, /<img|<script/, 'HTML in model output is escaped');
    assert.match(out.html, /&lt;img/);
    assert.match(out.link, /<a href="https:\/\/example.com" target="_blank" rel="noopener noreferrer nofollow">/, 'linkify');
    assert.doesNotMatch(out.link, /href="javascript:/i, 'no javascript: links');
    assert.doesNotMatch(out.link, /<img/, 'no remote images');
    assert.equal(await page.evaluate(() => window.__xss), undefined);
  });

  test('code blocks are highlighted with a language label; unknown languages stay plain', async () => {
    const out = await page.evaluate(() => ({
      go: window.ParleyMarkdown.render('```go\nfunc main() { return "x" }\n```\n'),
      unknown: window.ParleyMarkdown.render('```brainfudge\n+++ <b>\n```\n'),
      names: ['js', 'py', 'go', 'sh', 'nope'].map((l) => window.ParleyMarkdown.languageName(l)),
    }));
    assert.match(out.go, /<span class="hljs-keyword">func<\/span>/);
    assert.match(out.go, /<span class="hljs-string">&quot;x&quot;<\/span>/);
    assert.doesNotMatch(out.unknown, /hljs/);
    assert.match(out.unknown, /&lt;b&gt;/);
    assert.deepEqual(out.names, ['JavaScript', 'Python', 'Go', 'Bash', 'nope']);
  });

  test('no page errors, console errors or failed requests', () => {
    assert.deepEqual(pageErrors, []);
  });
});

// With --api-key the page cannot send a header on its WebSocket; it takes
// ?key= from its own address (or asks for the key when the server refuses
// it), drops it from the address bar, keeps it in localStorage, and offers it
// as the WebSocket subprotocol parley.key.KEY beside parley.v1+json (and as
// Authorization on its HTTP calls).
describe('chat page on a server with an API key', { timeout: 600_000 }, () => {
  const KEY = 'ui-test-key-7f3a';
  let server;
  let context;
  let userDataDir;
  let dataDir;
  const killOnExit = () => server?.killNow();

  before(async () => {
    process.on('exit', killOnExit);
    dataDir = await mkdtemp(path.join(os.tmpdir(), 'parley-ui-data-'));
    userDataDir = await mkdtemp(path.join(os.tmpdir(), 'parley-ui-chromium-'));
    server = await newServer(dataDir, ['--api-key', KEY]);
    await server.start();
    context = await launchBrowser(userDataDir);
  });

  after(async () => {
    await context?.close().catch(() => {});
    await server?.stop();
    await server?.saveLog(path.join(RESULTS, 'parley-server-api-key.log'));
    process.off('exit', killOnExit);
    if (userDataDir) await rm(userDataDir, { recursive: true, force: true });
    if (dataDir) await rm(dataDir, { recursive: true, force: true });
  });

  test('?key= opens the chat, leaves the address bar, survives a reload', async () => {
    const page = await context.newPage();
    const errors = [];
    page.on('pageerror', (err) => errors.push(err.message));
    page.on('console', (msg) => { if (msg.type() === 'error') errors.push(msg.text()); });
    await page.goto(`${server.url}?key=${KEY}`);
    await page.waitForSelector('#conn[data-state="connected"]', { timeout: UI_MS });
    assert.equal(new URL(page.url()).search, '', 'the key is gone from the address');
    await page.reload();
    await page.waitForSelector('#conn[data-state="connected"]', { timeout: UI_MS });
    await page.getByLabel('Message', { exact: true }).fill('Hello');
    await page.getByLabel('Message', { exact: true }).press('Enter');
    await page.waitForSelector('#log .msg.assistant[data-state="done"]', { timeout: REPLY_MS });
    assert.ok(['eos', 'length', 'stop'].includes(await page.locator('#log .msg.assistant').getAttribute('data-finish')));
    assert.deepEqual(errors, []);
    await page.close();
  });

  test('without the key the page asks for it once, then keeps it', async () => {
    const page = await context.newPage(); // a new tab of the same browser: the key from ?key= is kept
    const errors = [];
    page.on('pageerror', (err) => errors.push(err.message));
    await page.goto(server.url);
    await page.waitForSelector('#conn[data-state="connected"]', { timeout: UI_MS });
    assert.equal(await page.locator('#key-dialog').isVisible(), false, 'a kept key is not asked for again');
    // Forget it: the page asks, and a wrong key is asked for again.
    await page.evaluate(() => localStorage.removeItem('parley.key'));
    await page.reload();
    const dialog = page.getByRole('dialog', { name: 'API key' });
    await dialog.waitFor();
    assert.notEqual(await page.locator('#conn').getAttribute('data-state'), 'connected');
    await dialog.getByLabel('API key', { exact: true }).fill('wrong-key');
    await dialog.getByRole('button', { name: 'Use this key' }).click();
    await page.reload();
    await dialog.waitFor();
    assert.match(await dialog.textContent(), /refused/);
    await dialog.getByLabel('API key', { exact: true }).fill(KEY);
    await dialog.getByRole('button', { name: 'Use this key' }).click();
    await page.waitForSelector('#conn[data-state="connected"]', { timeout: UI_MS });
    await page.reload();
    await page.waitForSelector('#conn[data-state="connected"]', { timeout: UI_MS });
    assert.equal(await page.locator('#key-dialog').isVisible(), false, 'asked once');
    assert.deepEqual(errors, [], 'no uncaught errors');
    await page.close();
  });
});
