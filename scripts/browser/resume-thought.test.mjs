// The chat page reloaded while a reasoning model is still thinking: the reply it resumes shows the thought so far
// (the server sends it in the session's history, web/chatsocket's reasoningOf) in the thought box at once, and the
// thought goes on growing there from the tokens that follow. The model is a scripted synthetic one (tools/mkgguf
// -script, Qwen3's own chat template, as in thinking.test.mjs) whose greedy thought is thousands of tokens long, and
// large enough (6 layers of 512) that writing it takes seconds even on a fast machine, so that a reload started at
// the first thought token lands while the thought streams; the test checks that it did (the server logs each resume)
// and stops the reply once it has seen what it needs, without waiting for the thought to end.
//
// The check counts events, not time: a script in the page records the thought box's text the first time a
// streaming reply's box appears after the reload (a MutationObserver: the page's whole session handler has run
// then). A page that leaves the box empty until the next thought token arrives records that token's text, which
// does not start with the thought's beginning.
import { describe, test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { chromium } from 'playwright-core';
import { ROOT, MODEL, ParleyServer, assertBinaryAndModel, freePort } from '../lib/parley-server.mjs';

const CHROMIUM = process.env.PARLEY_CHROMIUM || '/usr/bin/chromium';
const UI_MS = 120_000; // only catches a hang (a busy machine is slow, not broken)
// Numbered steps: no stretch of the thought repeats its beginning, so text that starts the thought came from it.
const THOUGHT = Array.from({ length: 2000 }, (_, i) => `Step ${i + 1}: I weigh option ${i + 1}.`).join(' ');
const ANSWER = 'Done thinking.';

describe('chat page, reload while the model thinks', { timeout: 900_000 }, () => {
  let dir;
  let server;
  let context;
  const killOnExit = () => server?.killNow();

  before(async () => {
    assertBinaryAndModel();
    process.on('exit', killOnExit);
    dir = await mkdtemp(path.join(os.tmpdir(), 'parley-ui-resume-thought-'));
    const template = await readFile(path.join(ROOT, 'chat', 'testdata', 'templates', 'Qwen-Qwen3-0.6B.jinja'), 'utf8');
    const script = path.join(dir, 'script.json');
    await writeFile(script, JSON.stringify({
      template, control: ['<|im_start|>', '<|im_end|>'], text: ['<think>', '</think>'], after: '\n',
      reply: `<think>${THOUGHT}</think>${ANSWER}<|im_end|>`,
    }));
    const model = path.join(dir, 'qwen3-long-thought.gguf');
    execFileSync('go', ['run', './tools/mkgguf', '-script', script, '-o', model, '-vocab', MODEL, '-layers', '6', '-dim', '512',
      '-heads', '8', '-kv-heads', '4', '-ffn', '1024', '-ctx', '8192'], { cwd: ROOT, stdio: ['ignore', 'ignore', 'inherit'] });
    // The thought is about 4,800 tokens: the server's default reply cap lets it run on.
    server = new ParleyServer(await freePort(), {
      args: ['--model', model, '--temperature', '0', '--ctx', '8192', '--max-tokens', '6000', '--max-tokens-limit', '6000',
        '--store', 'memory'],
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

  test('the resumed reply shows its thought so far at once, and the thought grows on', async () => {
    const page = context.pages()[0] || await context.newPage();
    const pageErrors = [];
    page.on('pageerror', (err) => pageErrors.push(err.message));
    // Runs in every document the page loads, before its own script: the first thought box of a streaming reply.
    await page.addInitScript(() => {
      window.__firstThought = null;
      new MutationObserver((_, obs) => {
        const box = document.querySelector('#log .msg.assistant[data-state="streaming"] details.thought .thought-text');
        if (!box) return;
        window.__firstThought = box.textContent;
        obs.disconnect();
      }).observe(document, { childList: true, subtree: true, characterData: true, attributes: true });
    });
    await page.goto(server.url);
    await page.waitForSelector('#conn[data-state="connected"]', { timeout: UI_MS });
    await page.getByLabel('Message', { exact: true }).fill('think it over');
    await page.getByLabel('Message', { exact: true }).press('Enter');

    // The first thought token is on screen: reload now, while the model thinks.
    const live = '#log .msg.assistant[data-state="streaming"] details.thought .thought-text';
    await page.waitForFunction((sel) => (document.querySelector(sel)?.textContent || '').length > 0, live, { timeout: UI_MS });
    const before = await page.locator(live).textContent();
    assert.ok(THOUGHT.startsWith(before), `the thought before the reload is the script's: ${JSON.stringify(before.slice(0, 80))}`);
    const resumes = (server.output.match(/resumed a reply in flight/g) || []).length;
    await page.reload();
    await page.waitForSelector('#conn[data-state="connected"]', { timeout: UI_MS });
    await page.waitForFunction(() => window.__firstThought !== null, null, { timeout: UI_MS });
    assert.equal((server.output.match(/resumed a reply in flight/g) || []).length, resumes + 1,
      'the reload landed while the reply was generating (else the thought is too short for this machine)');

    const first = await page.evaluate(() => window.__firstThought);
    assert.ok(first.startsWith(before),
      `right after the reload the thought box holds the thought so far (${before.length} characters before the reload), ` +
      `got ${JSON.stringify(first.slice(0, 80))}`);
    assert.ok(THOUGHT.startsWith(first), 'and only the thought, once');
    const reply = page.locator('#log .msg.assistant').last();
    assert.equal(await reply.getAttribute('data-state'), 'streaming');
    assert.equal((await reply.locator('.content').textContent()).trim(), '', 'no answer yet');
    assert.equal(await reply.locator('details.thought summary').textContent(), 'Thinking…');

    // The thought goes on from there: later tokens extend it, with nothing lost or doubled at the seam.
    await page.waitForFunction(({ sel, n }) => (document.querySelector(sel)?.textContent || '').length > n,
      { sel: live, n: first.length + 40 }, { timeout: UI_MS });
    const grown = await page.locator(live).textContent();
    assert.ok(THOUGHT.startsWith(grown), `the thought after the resume is the script's, in order: …${JSON.stringify(grown.slice(-80))}`);

    // Enough seen: stop the reply rather than wait out thousands of tokens.
    await page.locator('#stop').click();
    await page.locator('#log .msg.assistant[data-state="done"]').last().waitFor({ timeout: UI_MS });
    const stopped = await reply.locator('details.thought .thought-text').textContent();
    assert.ok(stopped.length >= grown.length && THOUGHT.startsWith(stopped), 'the stopped reply keeps its thought');
    assert.deepEqual(pageErrors, []);
  });
});
