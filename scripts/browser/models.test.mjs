// The chat page's model picker against a real bin/parley that serves three
// models (stories260K, its --model and default, and two synthetic models
// written by tools/mkgguf), in Debian's chromium headless through
// playwright-core: the picker lists the models, picking one starts a new chat
// on it, a reload resumes the chat with its model picked.
import { describe, test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { chromium } from 'playwright-core';
import { ROOT, MODEL, ParleyServer, assertBinaryAndModel, freePort } from '../lib/parley-server.mjs';

const CHROMIUM = process.env.PARLEY_CHROMIUM || '/usr/bin/chromium';
const UI_MS = 60_000; // only catches a hang (a busy machine is slow, not broken)
const REPLY_MS = 120_000; // only catches a hang

function mkgguf(out, layers, dim) {
  execFileSync('go', ['run', './tools/mkgguf', '-o', out, '-vocab', MODEL, '-name', path.basename(out, '.gguf'),
    '-layers', String(layers), '-dim', String(dim), '-heads', '4', '-kv-heads', '2', '-ffn', String(2 * dim)],
  { cwd: ROOT, stdio: ['ignore', 'ignore', 'inherit'], timeout: 300_000 });
}

describe('chat page with several models', { timeout: 600_000 }, () => {
  let server;
  let context;
  let page;
  let dirs = [];

  before(async () => {
    assertBinaryAndModel();
    const models = await mkdtemp(path.join(os.tmpdir(), 'parley-ui-models-'));
    const data = await mkdtemp(path.join(os.tmpdir(), 'parley-ui-data-'));
    const profile = await mkdtemp(path.join(os.tmpdir(), 'parley-ui-chromium-'));
    dirs = [models, data, profile];
    mkgguf(path.join(models, 'wide.gguf'), 2, 256);
    mkgguf(path.join(models, 'deep.gguf'), 6, 64);
    server = new ParleyServer(await freePort(), {
      args: ['--models', models, '--keep-alive', '-1s', '--ctx', '512'], env: { PARLEY_DATA_DIR: data },
    });
    await server.start();
    context = await chromium.launchPersistentContext(profile, {
      executablePath: CHROMIUM, headless: true,
      args: ['--headless', '--no-sandbox', '--disable-gpu', '--no-first-run', '--disable-background-networking'],
    });
    page = context.pages()[0] || await context.newPage();
    page.setDefaultTimeout(UI_MS);
  });

  after(async () => {
    await context?.close().catch(() => {});
    await server?.stop();
    for (const d of dirs) await rm(d, { recursive: true, force: true });
  });

  const models = async () => (await (await fetch(new URL('v1/models', server.url))).json()).data;

  test('the picker lists the models; picking one starts a chat on it; a reload keeps it', async () => {
    const errors = [];
    page.on('pageerror', (err) => errors.push(err.message));
    await page.goto(server.url);
    await page.waitForSelector('#conn[data-state="connected"]');
    const picker = page.getByLabel('Model', { exact: true });
    await picker.waitFor({ state: 'visible' });
    assert.deepEqual((await picker.locator('option').allTextContents()).sort(), ['deep', 'stories260K', 'wide']);
    assert.equal(await picker.inputValue(), 'stories260K', 'the default model is picked');

    await picker.selectOption('wide');
    await page.waitForSelector('#conn[data-state="connected"]');
    await page.getByLabel('Message', { exact: true }).fill('Once upon a time');
    await page.getByLabel('Message', { exact: true }).press('Enter');
    await page.waitForSelector('#log .msg.assistant[data-state="done"]', { timeout: REPLY_MS });
    const state = Object.fromEntries((await models()).map((m) => [m.id, m.state]));
    assert.deepEqual(state, { deep: 'unloaded', 'stories260K': 'unloaded', wide: 'loaded' }, 'the reply ran on wide alone');

    await page.reload();
    await page.waitForSelector('#conn[data-state="connected"]');
    await page.waitForFunction(() => document.querySelectorAll('#log .msg').length === 2);
    assert.equal(await picker.inputValue(), 'wide', 'the resumed chat shows its model');
    assert.deepEqual(errors, []);
  });
});
