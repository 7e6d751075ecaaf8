#!/usr/bin/env bash
# The GPU benchmark, for a person with an NVIDIA GPU: Parley against
# the raw decode of the llm package and against Ollama (same module version,
# same CGO flags, the same CUDA backend in lib/ollama), on a synthetic
# Llama-3.2-1B-shaped F16 model written by tools/mkgguf, at 1, 16 and 64
# concurrent sessions of 10 turns each. It runs tools/bench with GPU
# settings and rewrites the "gpu" section of BENCHMARKS.md (the CPU section is
# left alone).
#
# Usage: scripts/bench-gpu.sh [more tools/bench flags]
# Needs: `make cuda` first (lib/ollama/libggml-cuda.so), a GPU with about 10 GiB
# free, and Go; or prebuilt binaries (below) on a machine without Go.
# Environment:
#   MODEL        the GGUF to measure (default: written once to
#                ${XDG_CACHE_HOME:-~/.cache}/parley/models/synthetic-llama1b-f16.gguf, 1.9 GiB)
#   OUT          where BENCHMARKS.md is rewritten (default: the repository's)
#   BIN_DIR      prebuilt parley, bench, ollama and mkgguf (a folder named bin
#                whose ../lib/ollama holds the CUDA backend); default: build them
#   PARLEY_TEST_MODEL  the vocabulary donor (default ../shared/models/stories260K.gguf)
#   BENCH_FLAGS  replaces the default GPU workload flags below
# Takes about 5 minutes on an H100 (most of it Ollama's 64-session run).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${XDG_CACHE_HOME:-$HOME/.cache}/parley
model=${MODEL:-$cache/models/synthetic-llama1b-f16.gguf}

if [ -z "${BIN_DIR:-}" ]; then
	cd "$root"
	# shellcheck source=env.sh
	. scripts/env.sh
	[ -e lib/ollama/libggml-cuda.so ] || { echo "bench-gpu: lib/ollama/libggml-cuda.so missing: run make cuda" >&2; exit 2; }
	make build
	# The raw decode runs inside bench: it must sit in bin/ to find ../lib/ollama.
	go build -o bin/bench ./tools/bench
	go build -o bin/mkgguf ./tools/mkgguf
	ollama=$(scripts/build-ollama.sh | tail -1)
	# Ollama looks for its backends in ../lib/ollama beside its (real) executable.
	mkdir -p "$(dirname "$(dirname "$ollama")")/lib"
	ln -sfn "$root/lib/ollama" "$(dirname "$(dirname "$ollama")")/lib/ollama"
	ln -sf "$ollama" bin/ollama
	BIN_DIR=$root/bin
fi
# The donor of the vocabulary: the test model.
vocab=${PARLEY_TEST_MODEL:-$root/../shared/models/stories260K.gguf}

mkdir -p "$(dirname "$model")"
# Llama 3.2 1B's shape (16 blocks, dim 2048, 32 heads / 8 KV heads, FFN 8192)
# with the donor's 512-token vocabulary: 0.97 B parameters, 1.9 GiB in F16.
"$BIN_DIR/mkgguf" -o "$model" -vocab "$vocab" -name parley-synthetic-llama1b \
	-layers 16 -dim 2048 -heads 32 -kv-heads 8 -ffn 8192 -ctx 8192 -rope-theta 500000

# Every server and the raw decode: all layers on the GPU, flash attention on
# (Parley's --flash-attn auto resolves to on there; Ollama is told so), 64
# slots of 2048 tokens. Parley's per-address connection cap (64) is raised:
# every benchmark session comes from 127.0.0.1.
read -r -a flags <<<"${BENCH_FLAGS:--sessions 1,16,64 -turns 10 -reply-tokens 64 -stream-tokens 256 -repeats 3 -parallel 64 -ctx 2048 -flash-attn on -gpu-layers auto -timeout 14m -workload-timeout 4m}"
exec "$BIN_DIR/bench" -parley "$BIN_DIR/parley" -ollama "$BIN_DIR/ollama" -models "$model" \
	-section gpu -out "${OUT:-$root/BENCHMARKS.md}" "${flags[@]}" \
	-parley-args "--max-conns-per-ip 1024 --prompts-per-minute 1000" "$@"
