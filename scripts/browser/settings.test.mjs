// The chat page obeys the server: its settings show the server's sampling defaults and limits (/info), a
// prompt carries only what the user changed (so the server's flags decide the rest), Defaults restores the server's
// values, Continue carries on a reply that stopped at its length; and a reply cut short by a crash (kill -9 mid-reply) is there after the restart, marked interrupted, with
// Regenerate. It runs like chat.test.mjs: bin/parley on a free loopback port with stories260K, Debian's chromium
// headless through playwright-core.
import { describe, test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { chromium } from 'playwright-core';
import { ParleyServer, assertBinaryAndModel, freePort } from '../lib/parley-server.mjs';

const CHROMIUM = process.env.PARLEY_CHROMIUM || '/usr/bin/chromium';
const REPLY_MS = 30_000;
const SERVER_MAX_TOKENS = 24;
const SERVER_LIMIT = 2000;

describe('chat page settings follow the server', { timeout: 240_000 }, () => {
  let dir;
  let server;
  let context;
  let page;
  let serverDown = false;
  const pageErrors = [];
  const prompts = []; // the prompt and regenerate messages the page sent, parsed
  const killOnExit = () => server?.killNow();

  before(async () => {
    assertBinaryAndModel();
    process.on('exit', killOnExit);
    dir = await mkdtemp(path.join(os.tmpdir(), 'parley-ui-settings-'));
    server = new ParleyServer(await freePort(), {
      args: ['--max-tokens', String(SERVER_MAX_TOKENS), '--temperature', '0', '--max-tokens-limit', String(SERVER_LIMIT)],
      env: { PARLEY_DATA_DIR: dir },
    });
    await server.start();
    context = await chromium.launchPersistentContext(path.join(dir, 'chromium'), {
      executablePath: CHROMIUM, headless: true, viewport: { width: 1024, height: 768 }, colorScheme: 'light',
      args: ['--headless', '--no-sandbox', '--disable-gpu', '--no-first-run', '--disable-background-networking'],
    });
    page = context.pages()[0] || await context.newPage();
    page.setDefaultTimeout(10_000);
    page.on('pageerror', (err) => pageErrors.push(`pageerror: ${err.message}`));
    page.on('console', (msg) => {
      if (msg.type() === 'error' && !(serverDown && /WebSocket|ERR_CONNECTION_REFUSED/.test(msg.text()))) pageErrors.push(msg.text());
    });
    page.on('websocket', (ws) => ws.on('framesent', (f) => {
      try {
        const m = JSON.parse(f.payload);
        if (m.type === 'prompt' || m.type === 'regenerate' || m.type === 'continue') prompts.push(m);
      } catch { /* not JSON */ }
    }));
  });

  after(async () => {
    await context?.close().catch(() => {});
    await server?.stop();
    process.off('exit', killOnExit);
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  const connected = () => page.waitForSelector('#conn[data-state="connected"]');
  const dialog = () => page.getByRole('dialog', { name: 'Settings' });
  const field = (label) => dialog().getByLabel(label, { exact: true });
  async function openSettings() {
    await page.getByRole('button', { name: 'Settings' }).click();
    await dialog().waitFor();
  }
  async function save() {
    await dialog().getByRole('button', { name: 'Save' }).click();
    await dialog().waitFor({ state: 'hidden' });
  }
  async function send(text) {
    await page.getByLabel('Message', { exact: true }).fill(text);
    await page.getByLabel('Message', { exact: true }).press('Enter');
  }
  async function lastReply() {
    const last = await page.waitForSelector('#log .msg.assistant:last-of-type[data-state="done"], #log .msg.error:last-of-type', { timeout: REPLY_MS });
    if (await last.evaluate((n) => n.classList.contains('error'))) assert.fail(`the page shows an error: ${await last.textContent()}`);
    return last.evaluate((n) => ({ finish: n.dataset.finish || '', meta: n.querySelector('.meta')?.textContent || '', text: n.querySelector('.content').textContent }));
  }

  test('the settings show the server\'s defaults and limits; a prompt sends only what the user changed', async () => {
    await page.goto(server.url);
    await connected();
    await openSettings();
    await page.waitForFunction(() => /Server defaults/.test(document.getElementById('s-server').textContent));
    assert.equal(await field('Temperature').inputValue(), '0', 'the server\'s temperature (--temperature 0)');
    assert.equal(await field('Max tokens').inputValue(), String(SERVER_MAX_TOKENS), 'the server\'s max tokens (--max-tokens)');
    const hint = await page.locator('#s-server').textContent();
    assert.match(hint, new RegExp(`max tokens ${SERVER_MAX_TOKENS}`), hint);
    assert.match(hint, new RegExp(`at most ${SERVER_LIMIT}`), hint);
    assert.equal(await field('Max tokens').getAttribute('max'), String(SERVER_LIMIT));
    await save(); // nothing changed: nothing is kept

    await send('Once upon a time');
    const reply = await lastReply();
    assert.deepEqual(prompts.at(-1).params, {}, 'a prompt with nothing changed carries no parameters');
    const tokens = Number(reply.meta.match(/(\d+) tokens?/)?.[1]);
    assert.ok(tokens <= SERVER_MAX_TOKENS, `the reply obeys --max-tokens ${SERVER_MAX_TOKENS}: ${reply.meta}`);
    if (reply.finish === 'length') assert.equal(tokens, SERVER_MAX_TOKENS, reply.meta);

    await openSettings();
    await field('Temperature').fill('0.5');
    await save();
    await send('And then?');
    await lastReply();
    assert.deepEqual(prompts.at(-1).params, { temperature: 0.5 }, 'only the changed setting is sent');

    await openSettings();
    assert.equal(await field('Temperature').inputValue(), '0.5', 'the user\'s value shows');
    await dialog().getByRole('button', { name: 'Defaults' }).click();
    assert.equal(await field('Temperature').inputValue(), '0', 'Defaults shows the server\'s temperature');
    assert.equal(await field('Max tokens').inputValue(), String(SERVER_MAX_TOKENS), 'Defaults shows the server\'s max tokens');
    await save();
    await send('What next?');
    await lastReply();
    assert.deepEqual(prompts.at(-1).params, {}, 'after Defaults the server decides again');
    assert.equal(await page.evaluate(() => localStorage.getItem('parley.overrides')), '{"system":""}');
  });

  test('Continue carries on a reply that stopped at its length', async () => {
    await page.getByRole('button', { name: 'New chat' }).click();
    await connected();
    await send('Once upon a time');
    const first = await lastReply();
    assert.equal(first.finish, 'length', `a reply at the server's ${SERVER_MAX_TOKENS} tokens: ${first.meta}`);
    const before = await page.locator('#log .msg.assistant').last().locator('.content').textContent();
    await page.getByRole('button', { name: 'Continue reply' }).click();
    const after = await lastReply();
    assert.equal(prompts.at(-1).type, 'continue');
    assert.deepEqual(prompts.at(-1).params, {});
    assert.equal(await page.locator('#log .msg.assistant').count(), 1, 'one reply, grown in place');
    assert.ok(after.text.length > before.length && after.text.startsWith(before.trimEnd().slice(0, 20)),
      `the reply grew from ${JSON.stringify(before)} to ${JSON.stringify(after.text)}`);
    await page.reload();
    await connected();
    const shown = await page.locator('#log .msg.assistant .content').allTextContents();
    assert.deepEqual(shown, [after.text], 'the stored reply is the continued one');
  });

  test('a reply cut short by kill -9 is there after the restart, interrupted, with Regenerate', async () => {
    await openSettings();
    await field('Max tokens').fill('1500');
    await save();
    await send('Tell me a long story');
    // Well past the reply's first checkpoints (16 and 32 tokens, session/pending.go).
    await page.waitForFunction(() => {
      const n = document.querySelector('#log .msg.assistant:last-of-type[data-state="streaming"] .content');
      return n && n.textContent.length > 300;
    }, null, { timeout: REPLY_MS });
    serverDown = true;
    server.killNow();
    await server.exited;
    await page.waitForSelector('#conn:not([data-state="connected"])');
    await server.start(); // same port, same data directory
    await connected();
    serverDown = false;
    const last = page.locator('#log .msg.assistant').last();
    await page.waitForSelector('#log .msg.assistant:last-of-type[data-finish="interrupted"]');
    assert.ok((await last.locator('.content').textContent()).length > 0, 'the partial reply is kept');
    const user = page.locator('#log .msg.user').last();
    assert.equal((await user.locator('.content').textContent()), 'Tell me a long story', 'the prompt is kept');
    const regen = last.getByRole('button', { name: 'Regenerate reply' });
    assert.equal(await regen.isVisible(), true, 'Regenerate is offered on the interrupted reply');

    await openSettings();
    await dialog().getByRole('button', { name: 'Defaults' }).click();
    await save();
    await regen.click();
    const again = await lastReply();
    assert.notEqual(again.finish, 'interrupted');
    assert.equal(prompts.at(-1).type, 'regenerate');
    await page.reload();
    await connected();
    assert.equal(await page.locator('#log .msg.assistant[data-finish="interrupted"]').count(), 0, 'the stored reply is the new one');
    assert.deepEqual(pageErrors, []);
  });
});
