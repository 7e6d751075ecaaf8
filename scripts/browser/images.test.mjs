// The chat page with a vision model in real Chromium: `node --test browser/images.test.mjs` from scripts/.
//
// The server serves a synthetic vision model (lib/testimage.mjs; skipped without libmtmd). The page shows its
// image button because /info says the model sees images; an image attached through the file picker, and one
// pasted into the message box, go with the prompt, show in the conversation, get a reply, and are there again
// after a reload (the session resumes with its images from the store).
import { describe, test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { chromium } from 'playwright-core';
import { ParleyServer, freePort } from '../lib/parley-server.mjs';
import { makeVisionModel, png, visionSkip as skip } from '../lib/testimage.mjs';

const CHROMIUM = process.env.PARLEY_CHROMIUM || '/usr/bin/chromium';
const REPLY_MS = 120_000; // only catches a hang
const UI_MS = 60_000; // only catches a hang

describe('chat page with images', { timeout: 600_000, skip }, () => {
  let server, context, page, tmp;
  const pageErrors = [];

  before(async () => {
    tmp = await mkdtemp(path.join(os.tmpdir(), 'parley-ui-images-'));
    server = new ParleyServer(await freePort(), {
      args: [...makeVisionModel(tmp), '--data-dir', path.join(tmp, 'data'), '--temperature', '0', '--max-tokens', '8'],
    });
    await server.start();
    context = await chromium.launchPersistentContext(path.join(tmp, 'chromium'), {
      executablePath: CHROMIUM, headless: true,
      args: ['--headless', '--no-sandbox', '--disable-gpu', '--no-first-run', '--disable-background-networking'],
      viewport: { width: 1024, height: 768 },
    });
    page = context.pages()[0] || await context.newPage();
    page.setDefaultTimeout(UI_MS);
    page.on('pageerror', (err) => pageErrors.push(`pageerror: ${err.message}`));
    page.on('console', (msg) => { if (msg.type() === 'error') pageErrors.push(`console.error: ${msg.text()}`); });
  });

  after(async () => {
    await context?.close().catch(() => {});
    await server?.stop();
    if (tmp) await rm(tmp, { recursive: true, force: true });
  });

  const waitReplyDone = async (n) => {
    await page.waitForFunction((count) => {
      const done = document.querySelectorAll('#log .msg.assistant[data-state="done"]').length;
      const err = document.querySelector('#log .msg.error');
      return done >= count || err;
    }, n, { timeout: REPLY_MS });
    const err = await page.$('#log .msg.error');
    if (err) assert.fail(`the page shows an error: ${await err.textContent()}`);
  };
  const userImages = () => page.$$eval('#log .msg.user', (nodes) => nodes.map((n) => n.querySelectorAll('.images img').length));

  test('attach an image with the file picker, send it, and see it in the conversation', async () => {
    await page.goto(server.url);
    await page.waitForSelector('#conn[data-state="connected"]');
    await page.waitForSelector('#attach:not([hidden])');
    await page.setInputFiles('#attach-file', { name: 'one.png', mimeType: 'image/png', buffer: png(40, 32, 1) });
    await page.waitForSelector('#attachments img');
    await page.getByLabel('Message', { exact: true }).fill('What is in the picture?');
    await page.getByLabel('Message', { exact: true }).press('Enter');
    await waitReplyDone(1);
    assert.deepEqual(await userImages(), [1]);
    assert.equal(await page.$$eval('#attachments img', (n) => n.length), 0, 'the attachments are cleared once sent');
  });

  test('paste an image into the message box and send it alone', async () => {
    const b64 = png(24, 24, 200).toString('base64');
    await page.getByLabel('Message', { exact: true }).focus();
    await page.evaluate(async (data) => {
      const bytes = Uint8Array.from(atob(data), (c) => c.charCodeAt(0));
      const dt = new DataTransfer();
      dt.items.add(new File([bytes], 'pasted.png', { type: 'image/png' }));
      document.getElementById('input').dispatchEvent(new ClipboardEvent('paste', { clipboardData: dt, bubbles: true, cancelable: true }));
    }, b64);
    await page.waitForSelector('#attachments img');
    await page.getByRole('button', { name: 'Send' }).click();
    await waitReplyDone(2);
    assert.deepEqual(await userImages(), [1, 1]);
  });

  test('after a reload the conversation shows its images again', async () => {
    await page.reload();
    await page.waitForSelector('#conn[data-state="connected"]');
    await page.waitForFunction(() => document.querySelectorAll('#log .msg.user .images img').length >= 2, null, { timeout: UI_MS });
    assert.deepEqual(await userImages(), [1, 1]);
    const loaded = await page.$$eval('#log .msg.user .images img', (imgs) => imgs.every((i) => i.complete && i.naturalWidth > 0));
    assert.ok(loaded, 'the images render');
    assert.deepEqual(pageErrors, []);
  });
});
