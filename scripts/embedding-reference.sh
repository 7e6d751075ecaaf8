#!/usr/bin/env bash
# Write llm/testdata/embedding-reference.json: the vectors and scores that llama.cpp's own embedding tool
# (examples/embedding, llama-embedding) computes on the synthetic embedding models and reranker that tools/mkgguf makes,
# for the inputs below. llm's embedding test compares Parley's outputs on both engines with them.
#
# The tool is compiled from the pinned llama.cpp source of the current engine (scripts/build-current-backend.sh
# -source exports it) and linked against the current engine's own libraries (lib/llama-current: libllama,
# libllama-common, the ggml libraries), so it runs the very code the current engine runs. One C++ file: seconds.
#
# Usage: scripts/embedding-reference.sh [OUT.json]
# Environment:
#   SOURCE     the pinned llama.cpp tree (default ${XDG_CACHE_HOME:-~/.cache}/parley/current-cpu-build/src, where
#              build-current-backend.sh leaves it)
#   ENGINE_LIB the current engine's libraries (default lib/llama-current)
#   TOOL_DIR   where the tool is built (default ${XDG_CACHE_HOME:-~/.cache}/parley/llama-embedding)
#   VOCAB      the vocabulary donor (default $PARLEY_TEST_MODEL)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${XDG_CACHE_HOME:-$HOME/.cache}/parley
src=${SOURCE:-$cache/current-cpu-build/src}
lib=$(cd "${ENGINE_LIB:-$root/lib/llama-current}" && pwd)
tool_dir=${TOOL_DIR:-$cache/llama-embedding}
vocab=${VOCAB:-${PARLEY_TEST_MODEL:?set PARLEY_TEST_MODEL or VOCAB to the vocabulary donor GGUF}}
out=${1:-$root/llm/testdata/embedding-reference.json}
me=embedding-reference

[ -f "$src/examples/embedding/embedding.cpp" ] ||
	{ echo "$me: no llama.cpp source in $src (scripts/build-current-backend.sh -source DIR exports it; set SOURCE)" >&2; exit 1; }
mkdir -p "$tool_dir"
tool=$tool_dir/llama-embedding
if [ ! -x "$tool" ] || [ "$src/examples/embedding/embedding.cpp" -nt "$tool" ]; then
	echo "$me: compiling $tool" >&2
	g++ -std=c++17 -O2 -I"$src/include" -I"$src/ggml/include" -I"$src/common" -I"$src/vendor" \
		"$src/examples/embedding/embedding.cpp" -o "$tool" \
		-L"$lib" -l:libllama-common.so -l:libllama.so -l:libggml.so -l:libggml-base.so -Wl,-rpath,"$lib"
fi
# ggml loads its CPU backend from beside the executable.
ln -sf "$lib/libggml-cpu.so" "$tool_dir/libggml-cpu.so"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The shapes llm/embed_test.go writes with internal/synth (it checks their descriptions against this file's).
shape=(-layers 2 -dim 64 -heads 4 -ffn 128 -ctx 512 -std 0.2 -resid-std 0.2 -type f32 -vocab "$vocab")
mk() { (cd "$root" && go run ./tools/mkgguf -force -o "$tmp/$1.gguf" -name "$1" "${@:2}" "${shape[@]}" >/dev/null); }
mk bert-mean -arch bert -kv-heads 4 -pooling mean
mk bert-cls -arch bert -kv-heads 4 -pooling cls
mk bert-rank -arch bert -kv-heads 4 -pooling rank
mk llama-last -kv-heads 2 -pooling last

inputs=$'hello world\nOnce upon a time there was a little cat.\na\nThe quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog.'
query='what is a cat?'
docs=('A cat is a small animal.' 'The sun is hot.' 'Cats like fish and milk.')
pairs=$(for d in "${docs[@]}"; do printf '%s\t%s\n' "$query" "$d"; done)
pairs=${pairs%$'\n'}

# Flash attention off, as Parley runs on a CPU: ggml's CPU flash attention rounds K and V to F16, which moves the
# vectors by about 1e-3. The tool prints through llama.cpp's asynchronous log, which now and then loses the end of its output at exit: a
# run whose output is not a whole JSON array is run again.
run() {
	local try
	for try in 1 2 3 4 5; do
		"$tool" -t 2 -fa off --embd-output-format array "$@" >"$tmp/run" 2>"$tmp/log" || { cat "$tmp/log" >&2; exit 1; }
		if python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$tmp/run" 2>/dev/null; then
			cat "$tmp/run"
			return
		fi
	done
	echo "$me: the tool's output was cut short 5 times" >&2
	exit 1
}
desc() { python3 - "$1" <<'PY'
import struct, sys
# general.description of a GGUF (the first string value of that key), without numpy or gguf-py.
f = open(sys.argv[1], 'rb'); f.read(4); f.read(4); nt, nkv = struct.unpack('<QQ', f.read(16))
def s(): n, = struct.unpack('<Q', f.read(8)); return f.read(n).decode()
sizes = {0:1,1:1,2:2,3:2,4:4,5:4,6:4,7:1,10:8,11:8,12:8}
def skip(t):
    if t == 8: s()
    elif t == 9:
        et, n = struct.unpack('<IQ', f.read(12))
        for _ in range(n): skip(et)
    else: f.read(sizes[t])
for _ in range(nkv):
    k = s(); t, = struct.unpack('<I', f.read(4))
    if k == 'general.description' and t == 8: print(s()); break
    skip(t)
PY
}
{
	echo '{'
	echo '  "tool": "llama.cpp examples/embedding at '"$(git -C "$src" rev-parse HEAD 2>/dev/null || echo unknown)"'",'
	echo '  "inputs": '"$(python3 -c 'import json,sys; print(json.dumps(sys.argv[1].split("\n")))' "$inputs")"','
	echo '  "query": '"$(python3 -c 'import json,sys; print(json.dumps(sys.argv[1]))' "$query")"','
	echo '  "documents": '"$(python3 -c 'import json,sys; print(json.dumps(sys.argv[1:]))' "${docs[@]}")"','
	echo '  "models": {'
	first=1
	for m in bert-mean bert-cls llama-last; do
		[ $first = 1 ] || echo ','
		first=0
		printf '    "%s": {"description": "%s", "raw": %s, "l2": %s}' "$m" "$(desc "$tmp/$m.gguf")" \
			"$(run -m "$tmp/$m.gguf" --embd-normalize -1 -p "$inputs")" "$(run -m "$tmp/$m.gguf" --embd-normalize 2 -p "$inputs")"
	done
	# A reranker's score is its first output (the tool prints n_embd columns; the rest is not the model's).
	scores=$(run -m "$tmp/bert-rank.gguf" --pooling rank --embd-normalize -1 -p "$pairs" | python3 -c 'import json,sys; print(json.dumps([r[0] for r in json.load(sys.stdin)]))')
	printf ',\n    "%s": {"description": "%s", "scores": %s}\n' bert-rank "$(desc "$tmp/bert-rank.gguf")" "$scores"
	echo '  }'
	echo '}'
} >"$tmp/out.json"
python3 -m json.tool "$tmp/out.json" >/dev/null
mkdir -p "$(dirname "$out")"
cp "$tmp/out.json" "$out"
echo "$me: wrote $out" >&2
