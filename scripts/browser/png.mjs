// A minimal PNG decoder for checking screenshots in tests: 8-bit greyscale,
// grey+alpha, RGB and RGBA, not interlaced (what Chromium writes). It exists so
// the browser test can prove a screenshot has content without an image library.
import { inflateSync } from 'node:zlib';

const SIGNATURE = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);
const CHANNELS = { 0: 1, 2: 3, 4: 2, 6: 4 }; // colour type -> samples per pixel

/**
 * Decodes a PNG into raw pixels.
 * @param {Buffer} buf
 * @returns {{width: number, height: number, channels: number, pixels: Buffer}}
 */
export function decodePNG(buf) {
  if (buf.length < 8 || !buf.subarray(0, 8).equals(SIGNATURE)) throw new Error('png: bad signature');
  let off = 8;
  let width = 0, height = 0, channels = 0;
  const idat = [];
  while (off + 8 <= buf.length) {
    const len = buf.readUInt32BE(off);
    const type = buf.toString('latin1', off + 4, off + 8);
    const data = buf.subarray(off + 8, off + 8 + len);
    off += 12 + len; // length, type, data, crc
    if (type === 'IHDR') {
      width = data.readUInt32BE(0);
      height = data.readUInt32BE(4);
      const depth = data[8], colour = data[9], interlace = data[12];
      channels = CHANNELS[colour];
      if (depth !== 8 || !channels || interlace !== 0) {
        throw new Error(`png: unsupported depth ${depth} colour type ${colour} interlace ${interlace}`);
      }
    } else if (type === 'IDAT') {
      idat.push(data);
    } else if (type === 'IEND') {
      break;
    }
  }
  if (!width || !height) throw new Error('png: no IHDR');
  const raw = inflateSync(Buffer.concat(idat));
  const stride = width * channels;
  if (raw.length < height * (stride + 1)) throw new Error('png: truncated image data');
  const pixels = Buffer.alloc(height * stride);
  // Undo the per-row filters (PNG spec section 9); bpp is `channels` bytes at depth 8.
  for (let y = 0; y < height; y++) {
    const filter = raw[y * (stride + 1)];
    const src = raw.subarray(y * (stride + 1) + 1, (y + 1) * (stride + 1));
    const row = pixels.subarray(y * stride, (y + 1) * stride);
    const prev = y > 0 ? pixels.subarray((y - 1) * stride, y * stride) : null;
    for (let x = 0; x < stride; x++) {
      const a = x >= channels ? row[x - channels] : 0;
      const b = prev ? prev[x] : 0;
      const c = prev && x >= channels ? prev[x - channels] : 0;
      let v;
      switch (filter) {
        case 0: v = src[x]; break;
        case 1: v = src[x] + a; break;
        case 2: v = src[x] + b; break;
        case 3: v = src[x] + ((a + b) >> 1); break;
        case 4: {
          const p = a + b - c, pa = Math.abs(p - a), pb = Math.abs(p - b), pc = Math.abs(p - c);
          v = src[x] + (pa <= pb && pa <= pc ? a : pb <= pc ? b : c);
          break;
        }
        default: throw new Error(`png: bad filter ${filter} on row ${y}`);
      }
      row[x] = v & 0xff;
    }
  }
  return { width, height, channels, pixels };
}

/**
 * Counts distinct colours and the share of the most common one.
 * @returns {{colours: number, dominantShare: number}}
 */
export function colourStats({ width, height, channels, pixels }) {
  const counts = new Map();
  for (let i = 0; i < pixels.length; i += channels) {
    let key = 0;
    for (let k = 0; k < channels; k++) key = key * 256 + pixels[i + k];
    counts.set(key, (counts.get(key) || 0) + 1);
  }
  let max = 0;
  for (const n of counts.values()) if (n > max) max = n;
  return { colours: counts.size, dominantShare: max / (width * height) };
}
