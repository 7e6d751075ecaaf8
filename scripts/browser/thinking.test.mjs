// The chat page with a reasoning model: the thought shows collapsed above the answer, with its length and time,
// expands on a click, and comes back collapsed when the conversation is restored. The model is a scripted synthetic
// one (tools/mkgguf -script: stories260K's vocabulary, a few small layers) carrying Qwen3's own chat template, whose
// greedy reply is a thought in <think> tags and then an answer. It runs like chat.test.mjs: bin/parley on a free
// port, Debian's chromium headless through playwright-core.
import { describe, test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { chromium } from 'playwright-core';
import { ROOT, MODEL, ParleyServer, assertBinaryAndModel, freePort } from '../lib/parley-server.mjs';

const CHROMIUM = process.env.PARLEY_CHROMIUM || '/usr/bin/chromium';
const THOUGHT = 'The user says hi. I should greet them.';
const ANSWER = 'Hello there, how are you today?';

describe('chat page, reasoning model', { timeout: 600_000 }, () => {
  let dir;
  let server;
  let context;
  const pageErrors = [];
  const killOnExit = () => server?.killNow();

  before(async () => {
    assertBinaryAndModel();
    process.on('exit', killOnExit);
    dir = await mkdtemp(path.join(os.tmpdir(), 'parley-ui-thinking-'));
    const template = await readFile(path.join(ROOT, 'chat', 'testdata', 'templates', 'Qwen-Qwen3-0.6B.jinja'), 'utf8');
    const script = path.join(dir, 'script.json');
    await writeFile(script, JSON.stringify({
      template, control: ['<|im_start|>', '<|im_end|>'], text: ['<think>', '</think>'], after: '\n',
      reply: `<think>${THOUGHT}</think>${ANSWER}<|im_end|>`,
    }));
    const model = path.join(dir, 'qwen3-scripted.gguf');
    execFileSync('go', ['run', './tools/mkgguf', '-script', script, '-o', model, '-vocab', MODEL, '-layers', '3', '-dim', '128',
      '-heads', '4', '-kv-heads', '2', '-ffn', '256', '-ctx', '2048'], { cwd: ROOT, stdio: ['ignore', 'ignore', 'inherit'] });
    server = new ParleyServer(await freePort(), { args: ['--model', model, '--temperature', '0'], env: { PARLEY_DATA_DIR: dir } });
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

  test('the thought is collapsed above the answer, expandable, and restored', async () => {
    const page = context.pages()[0] || await context.newPage();
    page.on('pageerror', (err) => pageErrors.push(err.message));
    const sent = []; // the prompts the page sends, as JSON
    page.on('websocket', (ws) => ws.on('framesent', (f) => { try { sent.push(JSON.parse(f.payload)); } catch { /* not JSON */ } }));
    await page.goto(server.url);
    await page.waitForSelector('#conn[data-state="connected"]');
    await page.getByLabel('Message', { exact: true }).fill('hi');
    await page.getByLabel('Message', { exact: true }).press('Enter');
    const reply = page.locator('#log .msg.assistant[data-state="done"]').last();
    await reply.waitFor({ timeout: 120_000 });

    assert.equal((await reply.locator('.content').textContent()).trim(), ANSWER, 'the answer alone in the content');
    const box = reply.locator('details.thought');
    assert.equal(await box.count(), 1, 'one thought box');
    assert.equal(await box.evaluate((d) => d.open), false, 'collapsed');
    assert.equal(await box.locator('.thought-text').textContent(), THOUGHT);
    assert.match(await box.locator('summary').textContent(), new RegExp(`^Thought( for [0-9.]+ s)? · ${THOUGHT.length} characters$`));
    assert.equal(await box.locator('.thought-text').isVisible(), false, 'the thought text is hidden while collapsed');
    await box.locator('summary').click();
    assert.equal(await box.evaluate((d) => d.open), true, 'a click expands it');
    assert.equal(await box.locator('.thought-text').isVisible(), true);

    await page.reload();
    await page.waitForSelector('#conn[data-state="connected"]');
    const restored = page.locator('#log .msg.assistant').last();
    await restored.waitFor();
    assert.equal((await restored.locator('.content').textContent()).trim(), ANSWER);
    assert.equal(await restored.locator('details.thought .thought-text').textContent(), THOUGHT, 'the stored thought, apart');
    assert.equal(await restored.locator('details.thought').evaluate((d) => d.open), false);

    // The thinking switch: shown for a model that thinks, on (the model's
    // default) until clicked; off, the next prompt asks for no thought; the
    // choice survives a reload.
    const sw = page.locator('#think');
    await sw.waitFor();
    assert.equal(await sw.getAttribute('aria-pressed'), 'true');
    assert.equal(sent.filter((m) => m.type === 'prompt').every((m) => !('think' in m.params)), true, 'untouched: the model decides');
    await sw.click();
    assert.equal(await sw.getAttribute('aria-pressed'), 'false');
    assert.equal(await sw.textContent(), 'Thinking off');
    await page.getByLabel('Message', { exact: true }).fill('hi again');
    await page.getByLabel('Message', { exact: true }).press('Enter');
    await page.locator('#log .msg.assistant[data-state="done"]').waitFor({ timeout: 120_000 }); // the restored reply has no state
    const prompt = sent.find((m) => m.type === 'prompt' && m.content === 'hi again');
    assert.equal(prompt.params.think, false);
    await page.reload();
    await page.waitForSelector('#conn[data-state="connected"]');
    assert.equal(await page.locator('#think').getAttribute('aria-pressed'), 'false', 'kept across a reload');
    assert.deepEqual(pageErrors, []);
  });
});
