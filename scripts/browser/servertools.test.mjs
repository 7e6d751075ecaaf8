// The chat page with the server's own tools (MCP): with "Use the server's tools" set in the settings, a prompt enables
// every MCP server the user may use; the reply shows the server's tool call and its result collapsed above the answer,
// expandable, and the restored conversation shows them collapsed too. The MCP server is the reference one
// (@modelcontextprotocol/server-everything over stdio; PARLEY_MCP_EVERYTHING names its folder when it is not in
// scripts/node_modules); the model is a scripted synthetic one (tools/mkgguf -script) whose greedy reply calls
// get-sum(19, 23) and, once it reads the result, answers. It runs like chat.test.mjs: bin/parley on a free port,
// Debian's chromium headless through playwright-core.
import { describe, test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { chromium } from 'playwright-core';
import { ParleyServer, assertBinaryAndModel, freePort } from '../lib/parley-server.mjs';
import { ANSWER, EVERYTHING, writeEverythingConfig, writeToolCallingModel } from '../lib/mcp-fixture.mjs';

const CHROMIUM = process.env.PARLEY_CHROMIUM || '/usr/bin/chromium';

describe('chat page, tools on the server', { timeout: 600_000 }, () => {
  let dir;
  let server;
  let context;
  const pageErrors = [];
  const killOnExit = () => server?.killNow();

  before(async () => {
    assertBinaryAndModel();
    assert.ok(existsSync(EVERYTHING), `no ${EVERYTHING}: npm ci in scripts/, or set PARLEY_MCP_EVERYTHING`);
    process.on('exit', killOnExit);
    dir = await mkdtemp(path.join(os.tmpdir(), 'parley-ui-tools-'));
    const model = await writeToolCallingModel(dir);
    const config = await writeEverythingConfig(dir, ['get-sum']);
    server = new ParleyServer(await freePort(), {
      args: ['--model', model, '--temperature', '0', '--max-tokens', '200', '--mcp-config', config], env: { PARLEY_DATA_DIR: dir },
    });
    await server.start();
    context = await chromium.launchPersistentContext(path.join(dir, 'chromium'), {
      executablePath: CHROMIUM, headless: true, viewport: { width: 1024, height: 768 }, colorScheme: 'light',
      args: ['--headless', '--no-sandbox', '--disable-gpu', '--no-first-run', '--disable-background-networking'],
    });
  });

  after(async () => {
    await context?.close().catch(() => {});
    await server?.stop();
    process.off('exit', killOnExit);
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  test('the server tool\'s call and result show collapsed above the answer, and come back on reload', async () => {
    const page = context.pages()[0] || await context.newPage();
    page.setDefaultTimeout(60_000);
    page.on('pageerror', (err) => pageErrors.push(err.message));
    const sent = [];
    page.on('websocket', (ws) => ws.on('framesent', (f) => { try { sent.push(JSON.parse(f.payload)); } catch { /* not JSON */ } }));
    await page.goto(server.url);
    await page.waitForSelector('#conn[data-state="connected"]');
    await page.getByRole('button', { name: 'Settings' }).click();
    const dialog = page.getByRole('dialog', { name: 'Settings' });
    await dialog.waitFor();
    await dialog.getByLabel(/Use the server's tools/).check();
    await dialog.getByRole('button', { name: 'Save' }).click();
    await dialog.waitFor({ state: 'hidden' });

    await page.getByLabel('Message', { exact: true }).fill('What is 19 + 23?');
    await page.getByLabel('Message', { exact: true }).press('Enter');
    const reply = page.locator('#log .msg.assistant[data-state="done"]').last();
    await reply.waitFor({ timeout: 120_000 });
    const prompt = sent.filter((m) => m.type === 'prompt').at(-1);
    assert.deepEqual(prompt.params.tools, [{ type: 'mcp', server_label: '*' }], 'the prompt enables the server\'s tools');

    assert.equal((await reply.locator('.content').textContent()).trim(), ANSWER);
    const boxes = reply.locator('details.server-tool');
    assert.equal(await boxes.count(), 2, 'the call and its result');
    assert.equal(await boxes.nth(0).locator('summary').textContent(), 'Server tool call: everything/get-sum');
    assert.match(await boxes.nth(1).locator('summary').textContent(), /^Server tool result: everything\/get-sum \(\d+ characters\)$/);
    for (let i = 0; i < 2; i++) {
      assert.equal(await boxes.nth(i).evaluate((d) => d.open), false, 'collapsed');
      assert.equal(await boxes.nth(i).locator('pre').isVisible(), false);
    }
    await boxes.nth(1).locator('summary').click();
    assert.equal(await boxes.nth(1).locator('pre').isVisible(), true, 'a click expands the result');
    assert.match(await boxes.nth(1).locator('pre').textContent(), /42/);

    // Restored from the server: the call (collapsed in its assistant turn), the result (a collapsed tool message), the answer.
    await page.reload();
    await page.waitForSelector('#conn[data-state="connected"]');
    await page.locator('#log .msg.tool').waitFor();
    const call = page.locator('#log .msg.assistant details.tool').first();
    assert.match(await call.locator('summary').textContent(), /^Tool call: get-sum$/);
    assert.equal(await call.evaluate((d) => d.open), false);
    const result = page.locator('#log .msg.tool details.tool');
    assert.equal(await result.evaluate((d) => d.open), false);
    assert.match(await result.locator('pre').textContent(), /42/);
    assert.equal((await page.locator('#log .msg.assistant .content').last().textContent()).trim(), ANSWER);
    assert.deepEqual(pageErrors, []);
  });
});
