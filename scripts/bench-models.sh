#!/usr/bin/env bash
# The benchmark's models: the synthetic SmolLM2-135M-shaped F16 model
# that tools/mkgguf writes, and its Q8_0 and Q4_0 copies made by llama.cpp's own
# llama-quantize (scripts/build-llama-server.sh builds it), so every engine and
# peer reads the same files a llama.cpp user would make.
#
# Usage: scripts/bench-models.sh [MODELS_DIR]
#   MODELS_DIR defaults to ${XDG_CACHE_HOME:-$HOME/.cache}/parley/models (never the repository).
# Environment: LLAMA_QUANTIZE (default: the one build-llama-server.sh put in
#   ${XDG_CACHE_HOME:-$HOME/.cache}/parley/llama-server/bin); VOCAB_SIZE pads the
#   vocabulary to a real model's (SmolLM2: 49152; mkgguf -vocab-size), so the
#   output layer and the sampler cost what they cost there: the files are then
#   named synthetic-smollm2-135m-vVOCAB_SIZE-*.gguf.
#   VOCAB_FROM takes the whole vocabulary of another GGUF instead, such as one of
#   llama.cpp's vocabulary-only files (models/ggml-vocab-llama-bpe.gguf: Llama 3's
#   128,256 tokens, in the tree scripts/build-current-backend.sh fetches): real
#   tokens, so grammars cost what they cost there (BenchmarkGrammar); the files
#   are then named synthetic-smollm2-135m-NAME-*.gguf for ggml-vocab-NAME.gguf.
# Prints the three model paths, F16 first.
#
# A quantized copy is remade when it is missing, older than the F16 file, or
# was not made by llama-quantize (its FILE.quantized-by note says what made it;
# copies that tools/decodebench -quantize wrote have none). The new file is
# renamed into place, so a process that has the old one open keeps reading it.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${XDG_CACHE_HOME:-$HOME/.cache}/parley
dir=${1:-$cache/models}
quantize=${LLAMA_QUANTIZE:-$cache/llama-server/bin/llama-quantize}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
case "$dir/" in
"$root"/*)
	echo "bench-models: refusing to write models into the repository ($dir)" >&2
	exit 2
	;;
esac
if [ ! -x "$quantize" ]; then
	echo "bench-models: no llama-quantize at $quantize (build it with scripts/build-llama-server.sh)" >&2
	exit 2
fi

name=synthetic-smollm2-135m
mkflags=()
if [ -n "${VOCAB_SIZE:-}" ]; then
	name+=-v$VOCAB_SIZE
	mkflags=(-vocab-size "$VOCAB_SIZE")
fi
if [ -n "${VOCAB_FROM:-}" ]; then
	base=$(basename "$VOCAB_FROM" .gguf)
	name+=-${base#ggml-vocab-}
	mkflags+=(-vocab "$VOCAB_FROM")
fi
f16=$dir/$name-f16.gguf
(cd "$root" && go run ./tools/mkgguf "${mkflags[@]}" -o "$f16") >&2 # leaves an up-to-date file alone

# llama-quantize has no --version; the llama-server built beside it from the same tree has.
version=$({ "$(dirname "$quantize")/llama-server" --version 2>&1 || true; } | sed -n 's/^version: //p' | head -1)
made_by="llama-quantize ${version:-unknown}"
for q in q8_0 q4_0; do
	out=$dir/$name-$q.gguf
	if [ -f "$out" ] && [ "$out" -nt "$f16" ] && [ "$(cat "$out.quantized-by" 2>/dev/null)" = "$made_by" ]; then
		continue
	fi
	echo "bench-models: $made_by $f16 -> $out" >&2
	tmp=$(mktemp "$out.XXXXXX")
	if ! "$quantize" "$f16" "$tmp" "${q^^}" >"$tmp.log" 2>&1; then
		tail -20 "$tmp.log" >&2
		rm -f "$tmp" "$tmp.log"
		exit 1
	fi
	rm -f "$tmp.log"
	chmod 0644 "$tmp"
	mv -f "$tmp" "$out"
	printf '%s\n' "$made_by" >"$out.quantized-by"
done
echo "$f16"
echo "$dir/$name-q8_0.gguf"
echo "$dir/$name-q4_0.gguf"
