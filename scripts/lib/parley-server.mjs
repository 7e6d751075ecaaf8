// A real bin/parley for the node tests (browser/, node/): where the binary and
// the test model are, a free loopback port, and a server process that is
// started, waited for and always stopped. Not a test file itself.
//
//   PARLEY_BIN         the server binary (default <repo>/bin/parley; `make build` makes it)
//   PARLEY_TEST_MODEL  the GGUF it serves (default ../shared/models/stories260K.gguf beside the repo)
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { setTimeout as sleep } from 'node:timers/promises';

// repoRoot is the folder with go.mod at or above dir.
function repoRoot(dir) {
  for (let d = dir; ; d = path.dirname(d)) {
    if (existsSync(path.join(d, 'go.mod'))) return d;
    if (path.dirname(d) === d) throw new Error(`no go.mod above ${dir}`);
  }
}

export const ROOT = repoRoot(path.dirname(fileURLToPath(import.meta.url)));
export const BIN = process.env.PARLEY_BIN || path.join(ROOT, 'bin', 'parley');
export const MODEL = process.env.PARLEY_TEST_MODEL || path.resolve(ROOT, '..', 'shared', 'models', 'stories260K.gguf');

// Start-up covers loading the model: stories260K loads in well under a second.
export const START_MS = 120_000;

// assertBinaryAndModel fails with what to do when either file is missing.
export function assertBinaryAndModel() {
  assert.ok(existsSync(BIN), `no server binary at ${BIN}: run make build, or set PARLEY_BIN`);
  assert.ok(existsSync(MODEL), `no model at ${MODEL}: set PARLEY_TEST_MODEL`);
}

// freePort returns a loopback port that was free a moment ago.
export async function freePort() {
  const srv = net.createServer();
  await new Promise((resolve, reject) => srv.listen(0, '127.0.0.1', resolve).on('error', reject));
  const { port } = srv.address();
  await new Promise((resolve) => srv.close(resolve));
  return port;
}

// ParleyServer is one bin/parley on 127.0.0.1:port serving MODEL with one
// llama.cpp thread, plus the test's own flags (args) and environment (env).
// It can be stopped and started again on the same port. Its output is kept
// (the last 64 KiB) so a failure can show what the server said.
export class ParleyServer {
  constructor(port, { args = [], env = {} } = {}) {
    this.port = port;
    this.args = args;
    this.env = env;
    this.url = `http://127.0.0.1:${port}/`;
    this.output = '';
    this.proc = null;
    this.exited = null; // resolves to { code, signal } (and err when the spawn failed)
  }

  // start spawns the server and resolves once it is ready.
  async start() {
    // The child gets no PARLEY_* settings from the caller's environment (an
    // API key there would lock the tests out); what a test needs is explicit.
    const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('PARLEY_')));
    Object.assign(env, this.env);
    const args = ['--model', MODEL, '--addr', `127.0.0.1:${this.port}`,
      // One llama.cpp thread: on a machine shared with other jobs, threads
      // that wait for each other at every step stall for whole scheduler
      // slices (seconds per token measured with 2 threads on 2 busy cores).
      '--threads', '1', ...this.args];
    this.proc = spawn(BIN, args, { env, stdio: ['ignore', 'pipe', 'pipe'] });
    const keep = (chunk) => { this.output = (this.output + chunk).slice(-65536); };
    this.proc.stdout.on('data', keep);
    this.proc.stderr.on('data', keep);
    this.exited = new Promise((resolve) => {
      this.proc.on('exit', (code, signal) => resolve({ code, signal }));
      this.proc.on('error', (err) => resolve({ code: -1, signal: null, err }));
    });
    await this.waitReady();
  }

  // waitReady polls /health until it answers 200 (it is 503 while the model
  // loads); a server without /health is ready once it serves the page. A
  // server that is not ready by START_MS is killed.
  async waitReady() {
    const deadline = Date.now() + START_MS;
    let last = 'no answer';
    while (Date.now() < deadline) {
      const gone = await Promise.race([this.exited, sleep(100, null)]);
      if (gone) throw new Error(`parley exited (${JSON.stringify(gone)}) before it was ready:\n${this.output}`);
      try {
        const health = await fetch(new URL('health', this.url));
        if (health.status === 200) return;
        if (health.status === 404) {
          const page = await fetch(this.url);
          if (page.status === 200) return;
          last = `GET / -> ${page.status}`;
        } else {
          last = `GET /health -> ${health.status}`;
        }
      } catch (err) {
        last = err.cause?.code || err.message;
      }
    }
    this.proc.kill('SIGKILL');
    throw new Error(`parley not ready after ${START_MS} ms (${last}):\n${this.output}`);
  }

  // running reports whether the process is alive.
  running() {
    return this.proc !== null && this.proc.exitCode === null && this.proc.signalCode === null;
  }

  // stop asks for a graceful shutdown (SIGTERM) and resolves to the exit
  // ({ code, signal }), or to null when the process had to be killed after
  // the grace period. Safe to call twice, and before start.
  async stop(graceMs = 10_000) {
    if (!this.proc) return null;
    if (!this.running()) return this.exited;
    this.proc.kill('SIGTERM');
    // An unref'd timer: once the server has exited, nothing keeps node waiting for it.
    const done = await Promise.race([this.exited, sleep(graceMs, null, { ref: false })]);
    if (!done) {
      this.proc.kill('SIGKILL');
      await this.exited;
    }
    return done;
  }

  // killNow kills a running server at once, for a process 'exit' handler
  // (which cannot wait).
  killNow() {
    if (this.running()) this.proc.kill('SIGKILL');
  }

  // saveLog writes what the server printed to file, for a failure.
  async saveLog(file) {
    await mkdir(path.dirname(file), { recursive: true });
    await writeFile(file, this.output);
  }
}

// startAPIServer starts bin/parley for an HTTP API test: a free port, a
// fresh data folder (named after name), the given store, API key and JSON
// logs, and any more flags the test needs (args). It resolves to
// { server, port, dataDir }; give them to stopAPIServer in the test's after hook.
export async function startAPIServer(name, { store = 'memory', apiKey, args = [] } = {}) {
  assertBinaryAndModel();
  const dataDir = await mkdtemp(path.join(os.tmpdir(), `parley-${name}-`));
  const port = await freePort();
  const server = new ParleyServer(port, {
    args: ['--store', store, '--data-dir', dataDir, '--api-key', apiKey, '--log-format', 'json', ...args],
  });
  try {
    await server.start(); // a server that fails to start is already gone
  } catch (err) {
    await rm(dataDir, { recursive: true, force: true });
    throw err;
  }
  return { server, port, dataDir };
}

// stopAPIServer stops a server startAPIServer started (it must exit 0 after
// SIGTERM) and removes its data folder; either may be undefined.
export async function stopAPIServer(server, dataDir) {
  const done = await server?.stop(10_000);
  if (done) {
    assert.equal(done.code, 0, `parley exited with ${JSON.stringify(done)} after SIGTERM:\n${server.output}`);
  }
  if (dataDir) await rm(dataDir, { recursive: true, force: true });
}
