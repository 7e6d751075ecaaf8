// What the image tests share (node/vision.test.mjs, browser/images.test.mjs): a synthetic vision model made by the
// project's own model tool, where the current engine's libmtmd is, and PNGs made here. Not a test file itself.
import { execFileSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import path from 'node:path';
import { deflateSync } from 'node:zlib';
import { ROOT } from './parley-server.mjs';

// VISION_LIB is the current engine's library folder the tests point the server at (the server gets no PARLEY_
// variables from the test's environment): PARLEY_ENGINE_LIB, else lib/llama-current.
export const VISION_LIB = process.env.PARLEY_ENGINE_LIB || path.join(ROOT, 'lib', 'llama-current');

// visionSkip is a suite's skip reason when the engine has no libmtmd (make setup-vision builds it), else false.
// In the suite (PARLEY_REQUIRE_VISION, set by scripts/test.sh) a missing libmtmd is an error, not a skip.
export const visionSkip = existsSync(path.join(VISION_LIB, 'libmtmd.so')) ? false : `no libmtmd.so in ${VISION_LIB} (make setup-vision)`;
if (visionSkip && process.env.PARLEY_REQUIRE_VISION) {
  throw new Error(`${visionSkip}: the suite requires it`);
}

// makeVisionModel writes a small synthetic model named "vision" and its projector into dir (go run ./tools/mkgguf
// -mmproj) and returns the server flags that serve them on the current engine.
export function makeVisionModel(dir) {
  const model = path.join(dir, 'vision.gguf');
  const mmproj = path.join(dir, 'mmproj-vision.gguf');
  execFileSync('go', ['run', './tools/mkgguf', '-o', model, '-mmproj', mmproj,
    '-name', 'vision', '-dim', '64', '-layers', '1', '-heads', '4', '-kv-heads', '4', '-ffn', '64'], { cwd: ROOT, stdio: 'ignore' });
  return ['--model', model, '--mmproj', mmproj, '--engine', 'current', '--engine-lib', VISION_LIB];
}

// crc32 of a PNG chunk's type and data.
function crc32(buf) {
  let c = ~0;
  for (const b of buf) {
    c ^= b;
    for (let k = 0; k < 8; k++) c = (c >>> 1) ^ (0xedb88320 & -(c & 1));
  }
  return ~c >>> 0;
}

// png is a w x h RGB PNG whose pixels depend on seed.
export function png(w, h, seed) {
  const chunk = (type, data) => {
    const len = Buffer.alloc(4); len.writeUInt32BE(data.length);
    const td = Buffer.concat([Buffer.from(type, 'latin1'), data]);
    const crc = Buffer.alloc(4); crc.writeUInt32BE(crc32(td));
    return Buffer.concat([len, td, crc]);
  };
  const ihdr = Buffer.alloc(13);
  ihdr.writeUInt32BE(w, 0); ihdr.writeUInt32BE(h, 4);
  ihdr[8] = 8; ihdr[9] = 2; // 8-bit RGB
  const raw = Buffer.alloc(h * (1 + 3 * w));
  for (let y = 0; y < h; y++) {
    for (let x = 0; x < w; x++) {
      const o = y * (1 + 3 * w) + 1 + 3 * x;
      raw[o] = (x * 7 + seed) & 255; raw[o + 1] = (y * 13) ^ seed; raw[o + 2] = (x * y + 3 * seed) & 255;
    }
  }
  return Buffer.concat([Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]),
    chunk('IHDR', ihdr), chunk('IDAT', deflateSync(raw)), chunk('IEND', Buffer.alloc(0))]);
}
