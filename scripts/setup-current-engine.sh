#!/usr/bin/env bash
# Lays out the current engine's libraries (llm/current.go): every file of a pinned npm package of node-llama-cpp's
# prebuilt llama.cpp, plus the exact names yzma opens (libllama.so, libggml.so; the package ships versioned names).
#   scripts/setup-current-engine.sh        the CPU build, @node-llama-cpp/linux-x64 (scripts/engine, `npm ci` there),
#                                          with its prebuilt CPU variants, into lib/llama-current: for a machine
#                                          without a compiler (`make setup` builds the CPU backend from source
#                                          instead: scripts/build-current-backend.sh cpu)
#   scripts/setup-current-engine.sh cuda   the CUDA build, @node-llama-cpp/linux-x64-cuda (scripts/engine-cuda), into
#                                          lib/llama-current-cuda; run by `make setup-engine-cuda`. bin/parley takes
#                                          that folder over lib/llama-current when it is there.
# lib/ is git-ignored.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
variant=${1:-cpu}
case "$variant" in
cpu) pkg=engine; src="$root/scripts/engine/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64"
	dst="$root/lib/llama-current"; tag="" ;;
cuda) pkg=engine-cuda; src="$root/scripts/engine-cuda/node_modules/@node-llama-cpp/linux-x64-cuda/bins/linux-x64-cuda"
	dst="$root/lib/llama-current-cuda"; tag="cuda." ;;
*) echo "usage: $0 [cpu|cuda]" >&2; exit 2 ;;
esac
if [ "$(uname -sm)" != "Linux x86_64" ]; then
  echo "setup: the current engine's prebuilt libraries are for Linux x86-64; --engine current is unavailable here" >&2
  exit 0
fi
[ -d "$src" ] || { echo "setup: $src is missing (cd scripts/$pkg && npm ci)" >&2; exit 1; }
mkdir -p "$dst"
# A CPU backend that scripts/build-current-backend.sh compiled goes: ggml would load the variants anyway, and
# --engine auto takes a libggml-cpu.so here for that build (autoPrefersEmbedded, llm/backend.go).
rm -f "$dst/libggml-cpu.so"
for f in "$src"/*.so; do ln -sfn "$f" "$dst/$(basename "$f")"; done
ln -sfn "$src/libllama.${tag}v0.5.0.so" "$dst/libllama.so"
ln -sfn "$src/libggml.${tag}v0.5.0.so" "$dst/libggml.so"
echo "setup: the current engine's libraries are in $dst"
