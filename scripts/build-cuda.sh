#!/usr/bin/env bash
# Build ggml's CUDA backend (libggml-cuda.so and the libggml-base.so it links)
# from the pinned Ollama module, into the folder the binding searches beside
# the executable: bin/parley looks in bin/../lib/ollama, so by default the
# libraries land in lib/ollama at the repository root and Parley finds them
# with no environment variable (OLLAMA_LIBRARY_PATH overrides the search).
#
# Usage: scripts/build-cuda.sh [OUT_DIR]          (what `make cuda` runs)
#   OUT_DIR               default: lib/ollama in the repository
# Environment:
#   CUDA_ARCHITECTURES    CMAKE_CUDA_ARCHITECTURES, default "80;86;89;90"
#                         (Ampere A100/A10/RTX 30, Ada L4/L40/RTX 40, Hopper H100/H200);
#                         "native" builds for the GPUs of this machine only
#   JOBS                  parallel compile jobs, default nproc
#   OLLAMA_SRC            the module's source root (default: the Go module cache's
#                         github.com/ollama/ollama@v0.24.0); only CMakeLists.txt,
#                         CMakePresets.json and ml/backend/ggml/ggml are read
#   CUDA_BUILD_DIR        scratch folder, default ${XDG_CACHE_HOME:-~/.cache}/parley/cuda-build
#                         (kept: a second run with the same settings only relinks)
#   CUDACXX               nvcc to use (default: cmake finds nvcc on PATH or /usr/local/cuda)
#
# Time: nvcc compiles every kernel once per architecture. Measured: 17 minutes
# for one architecture on 2 cores (Debian's CUDA 11.8), about 3 minutes for one
# on 16 cores (CUDA 13); the default four architectures take about four times as
# long. Works with Debian's nvidia-cuda-toolkit (11.8) and NVIDIA's CUDA 12 and 13.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
version=${OLLAMA_VERSION:-v0.24.0}
archs=${CUDA_ARCHITECTURES:-80;86;89;90}
jobs=${JOBS:-$(nproc)}
out=${1:-$root/lib/ollama}
scratch=${CUDA_BUILD_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/parley/cuda-build}

if [ -z "${OLLAMA_SRC:-}" ]; then
	command -v go >/dev/null || { echo "build-cuda: set OLLAMA_SRC (no go to find the module cache)" >&2; exit 2; }
	(cd "$root" && go mod download "github.com/ollama/ollama@$version")
	OLLAMA_SRC=$(go env GOMODCACHE)/github.com/ollama/ollama@$version
fi
for f in CMakeLists.txt CMakePresets.json ml/backend/ggml/ggml/src/ggml-cuda; do
	[ -e "$OLLAMA_SRC/$f" ] || { echo "build-cuda: $OLLAMA_SRC/$f missing" >&2; exit 2; }
done
command -v cmake >/dev/null || { echo "build-cuda: cmake not found" >&2; exit 2; }
if [ -z "${CUDACXX:-}" ] && ! command -v nvcc >/dev/null; then
	if [ -x /usr/local/cuda/bin/nvcc ]; then
		export CUDACXX=/usr/local/cuda/bin/nvcc
	else
		echo "build-cuda: nvcc not found (install nvidia-cuda-toolkit, or put CUDA's bin on PATH, or set CUDACXX)" >&2
		exit 2
	fi
fi

# The module cache is read-only: build from a writable copy of the three
# things the top-level CMakeLists.txt reads.
src=$scratch/src
rm -rf "$src"
mkdir -p "$src/ml/backend/ggml"
cp "$OLLAMA_SRC/CMakeLists.txt" "$OLLAMA_SRC/CMakePresets.json" "$src/"
cp -r "$OLLAMA_SRC/ml/backend/ggml/ggml" "$src/ml/backend/ggml/"
chmod -R u+w "$src"

start=$(date +%s)
echo "build-cuda: CMAKE_CUDA_ARCHITECTURES=$archs, $jobs jobs, nvcc $(${CUDACXX:-nvcc} --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')" >&2
# RPATH $ORIGIN: libggml-cuda.so finds libggml-base.so beside itself wherever
# the folder is copied.
cmake -S "$src" -B "$scratch/build" -DCMAKE_BUILD_TYPE=Release \
	"-DCMAKE_CUDA_ARCHITECTURES=$archs" -DCMAKE_BUILD_RPATH_USE_ORIGIN=ON >"$scratch/configure.log" 2>&1 ||
	{ tail -30 "$scratch/configure.log" >&2; exit 1; }
grep -q 'CUDA' "$scratch/build/CMakeCache.txt" && grep -q '^CMAKE_CUDA_COMPILER:' "$scratch/build/CMakeCache.txt" ||
	{ echo "build-cuda: cmake found no CUDA compiler; see $scratch/configure.log" >&2; exit 1; }
cmake --build "$scratch/build" --target ggml-cuda -j "$jobs"

mkdir -p "$out"
cp -a "$scratch/build/lib/ollama/"libggml-base.so* "$scratch/build/lib/ollama/libggml-cuda.so" "$out/"
echo "build-cuda: $out/libggml-cuda.so in $(($(date +%s) - start)) s" >&2
echo "$out"
