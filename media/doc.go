// Package media owns the images that requests carry, from the request's text to the pixels the engine encodes:
//
//   - intake: a data: URL or bare base64 becomes bytes under a byte limit, checked before the base64 is decoded
//     (source.go);
//   - formats: the bytes are named by their magic number (PNG, JPEG, WebP, GIF accepted; BMP, TIFF, HEIC, AVIF,
//     SVG and others refused by name), and the width and height are read from the header alone, so that a
//     decompression bomb is refused before any pixel is decoded (format.go, limits.go);
//   - decoding: pixels are decoded in a child process that limits its own memory and runs on one thread, under a
//     time limit kept by the parent, and come back as canonical 8-bit RGB; a hostile file costs a child, never the
//     server (decoder.go, child.go);
//   - remote images: http(s) URLs are fetched only when a policy allows it, only from allowlisted hosts, never
//     from loopback, private, link-local or metadata addresses, checked on the resolved address of every
//     connection, redirects included (fetch.go, addr.go);
//   - cache keys: an image's sha256, and a key that joins it to the user, so that one user's cached image is never
//     another's (hash.go);
//   - settings: Config and its --image-* flags (config.go).
//
// The package knows nothing of HTTP APIs or of the engine: the web layer calls Intake (or a Batch) for each image
// part, and the engine takes Decoded pixels.
package media
