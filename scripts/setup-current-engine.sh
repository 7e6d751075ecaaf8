#!/usr/bin/env bash
# Lays out the current engine's libraries (llm/current.go) in lib/llama-current: every file of the pinned npm
# package @node-llama-cpp/linux-x64 (scripts/engine, installed by `npm ci` there), plus the exact names yzma opens
# (libllama.so, libggml.so; the package ships versioned names). Run by `make setup`; lib/ is git-ignored.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
src="$root/scripts/engine/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64"
dst="$root/lib/llama-current"
if [ "$(uname -sm)" != "Linux x86_64" ]; then
  echo "setup: the current engine's prebuilt libraries are for Linux x86-64; --engine current is unavailable here" >&2
  exit 0
fi
[ -d "$src" ] || { echo "setup: $src is missing (cd scripts/engine && npm ci)" >&2; exit 1; }
mkdir -p "$dst"
for f in "$src"/*.so; do ln -sfn "$f" "$dst/$(basename "$f")"; done
ln -sfn "$src/libllama.v0.5.0.so" "$dst/libllama.so"
ln -sfn "$src/libggml.v0.5.0.so" "$dst/libggml.so"
echo "setup: the current engine's libraries are in $dst"
