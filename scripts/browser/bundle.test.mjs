// The committed Markdown bundle (web/ui/vendor/markdown.js) and its licence
// file must be what scripts/ui/build.mjs makes from the installed markdown-it:
// the Go binary embeds the committed file, so a stale one would ship silently.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { fileURLToPath } from 'node:url';
import path from 'node:path';

const build = fileURLToPath(new URL('../ui/build.mjs', import.meta.url));

test('web/ui/vendor is up to date with scripts/ui/build.mjs', async () => {
  try {
    await promisify(execFile)(process.execPath, [build, '--check'], { cwd: path.dirname(build) });
  } catch (err) {
    assert.fail(`${err.stderr || err.message}`);
  }
});
