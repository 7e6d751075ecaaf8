#!/usr/bin/env bash
# Build the current engine's CUDA backend from source, for the GPUs and the CUDA toolkit at hand, into
# lib/llama-current-cuda (where bin/parley looks first). The prebuilt CUDA package (`make setup-engine-cuda`)
# needs a driver for CUDA 13.1 or later on most cards: it holds machine code for sm_86, sm_89, sm_120 and sm_121
# only, and CUDA 13.1 PTX for the rest, which an older driver (580, CUDA 13.0, on an H100/H200) cannot compile.
# This script compiles ggml's CUDA backend from the very source of the pinned libraries (node-llama-cpp 3.22.1
# ships it as llama/gitRelease.bundle: llama.cpp de3ff815, ggml 0.25.1) as a loadable backend module, and lays
# it beside the pinned CPU libraries of `make setup`: ggml loads it at start, and the rest of the engine is the
# one CI tests.
#
# Usage: scripts/build-cuda-current.sh [OUT_DIR]        (what `make cuda-current` runs)
#        scripts/build-cuda-current.sh -source DIR      only export the pinned source to DIR (for a machine
#                                                       without the npm registry: carry DIR there, set SOURCE)
#   OUT_DIR               default: lib/llama-current-cuda in the repository
# Environment:
#   CUDA_ARCHITECTURES    CMAKE_CUDA_ARCHITECTURES, default "80;86;89;90"; "native" for this machine's GPUs
#   JOBS                  parallel compile jobs, default nproc
#   SOURCE                a llama.cpp source tree at the pinned commit (default: exported from the npm package)
#   CPU_LIBS              the pinned CPU libraries (default: scripts/engine/node_modules/..., `make setup-engine`)
#   CUDA_BUILD_DIR        scratch folder, default ${XDG_CACHE_HOME:-~/.cache}/parley/cuda-current-build
#   CUDACXX               nvcc to use (default: cmake finds nvcc on PATH or /usr/local/cuda)
# Needs cmake, a C++ compiler and nvcc (NVIDIA's CUDA 12 or 13; not tried with Debian's 11.8).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
pkg=node-llama-cpp@3.22.1
integrity=sha512-bltIipuWmc123H7tMIgDGKSsSrhmhlQYeVUC48XTjVW7XGJJiJJyCdlTMzQ/LiWoPkGDpcL4FviDpgw7qfTiDw==
commit=de3ff815ea7d559ee917f063901b8986f038abc6
archs=${CUDA_ARCHITECTURES:-80;86;89;90}
jobs=${JOBS:-$(nproc)}
scratch=${CUDA_BUILD_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/parley/cuda-current-build}
cpu_libs=${CPU_LIBS:-$root/scripts/engine/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64}

# export_source DIR: the pinned llama.cpp tree from the npm package's git bundle, checked against the pins.
export_source() {
	local dst=$1 tmp
	tmp=$(mktemp -d)
	(cd "$tmp" && npm pack --silent "$pkg" >/dev/null)
	local got
	# npm's integrity string, computed by node (which npm brings).
	got=$(node -e 'const c = require("crypto"), fs = require("fs");
console.log("sha512-" + c.createHash("sha512").update(fs.readFileSync(process.argv[1])).digest("base64"))' "$tmp"/node-llama-cpp-*.tgz)
	[ "$got" = "$integrity" ] || { echo "build-cuda-current: $pkg: integrity $got, pinned $integrity" >&2; exit 1; }
	tar -xzf "$tmp"/node-llama-cpp-*.tgz -C "$tmp" package/llama/gitRelease.bundle
	rm -rf "$dst"
	git -c advice.detachedHead=false clone -q "$tmp/package/llama/gitRelease.bundle" "$dst"
	rm -rf "$tmp"
	[ "$(git -C "$dst" rev-parse HEAD)" = "$commit" ] ||
		{ echo "build-cuda-current: the bundle is at $(git -C "$dst" rev-parse HEAD), pinned $commit" >&2; exit 1; }
	echo "build-cuda-current: llama.cpp $commit in $dst" >&2
}

if [ "${1:-}" = -source ]; then
	[ -n "${2:-}" ] || { echo "usage: $0 -source DIR" >&2; exit 2; }
	export_source "$2"
	exit 0
fi
out=${1:-$root/lib/llama-current-cuda}

command -v cmake >/dev/null || { echo "build-cuda-current: cmake not found" >&2; exit 2; }
if [ -z "${CUDACXX:-}" ] && ! command -v nvcc >/dev/null; then
	if [ -x /usr/local/cuda/bin/nvcc ]; then
		export CUDACXX=/usr/local/cuda/bin/nvcc
	else
		echo "build-cuda-current: nvcc not found (install NVIDIA's CUDA toolkit 12 or 13, or set CUDACXX)" >&2
		exit 2
	fi
fi
[ -e "$cpu_libs/libggml-base.so" ] || { echo "build-cuda-current: no CPU libraries in $cpu_libs (make setup-engine)" >&2; exit 2; }

src=${SOURCE:-$scratch/src}
if [ -z "${SOURCE:-}" ] && [ "$(git -C "$src" rev-parse HEAD 2>/dev/null)" != "$commit" ]; then
	export_source "$src"
fi
[ -f "$src/ggml/src/ggml-cuda/CMakeLists.txt" ] && [ -f "$src/CMakeLists.txt" ] || { echo "build-cuda-current: $src is not a llama.cpp tree" >&2; exit 2; }

start=$(date +%s)
nvcc=${CUDACXX:-nvcc}
echo "build-cuda-current: CMAKE_CUDA_ARCHITECTURES=$archs, $jobs jobs, nvcc $($nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')" >&2
# ggml as node-llama-cpp builds it: shared, backends as modules (GGML_BACKEND_DL), unversioned sonames, so
# libggml-cuda.so needs the libggml-base.so of the pinned CPU package; RPATH $ORIGIN finds it beside itself.
# The tree's top level (ggml's own CMakeLists.txt is incomplete there), with llama.cpp's programs off.
mkdir -p "$scratch"
cmake -S "$src" -B "$scratch/build" -DCMAKE_BUILD_TYPE=Release \
	-DBUILD_SHARED_LIBS=ON -DGGML_BACKEND_DL=ON -DCMAKE_PLATFORM_NO_VERSIONED_SONAME=ON \
	-DGGML_NATIVE=OFF -DGGML_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=$archs" \
	-DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
	-DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF \
	-DCMAKE_BUILD_RPATH_USE_ORIGIN=ON -DCMAKE_BUILD_RPATH='$ORIGIN' >"$scratch/configure.log" 2>&1 ||
	{ tail -30 "$scratch/configure.log" >&2; exit 1; }
cmake --build "$scratch/build" --target ggml-cuda -j "$jobs" >"$scratch/build.log" 2>&1 ||
	{ tail -30 "$scratch/build.log" >&2; exit 1; }
lib=$(find "$scratch/build" -name libggml-cuda.so -print -quit)
[ -n "$lib" ] || { echo "build-cuda-current: no libggml-cuda.so in $scratch/build" >&2; exit 1; }

mkdir -p "$out"
# A folder that `make setup-engine-cuda` laid out holds links into the prebuilt CUDA package: replace them all.
find "$out" -maxdepth 1 -type l -delete
rm -f "$out/libggml-cuda.so"
for f in "$cpu_libs"/*.so; do
	[ "$(basename "$f")" = libggml-cuda.so ] || ln -sfn "$f" "$out/$(basename "$f")"
done
ln -sfn "$cpu_libs/libllama.v0.5.0.so" "$out/libllama.so"
ln -sfn "$cpu_libs/libggml.v0.5.0.so" "$out/libggml.so"
cp -f "$lib" "$out/libggml-cuda.so"
printf 'llama.cpp %s, CMAKE_CUDA_ARCHITECTURES=%s, nvcc %s\n' "$commit" "$archs" \
	"$($nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')" >"$out/BUILT-FROM-SOURCE"
echo "build-cuda-current: $out/libggml-cuda.so in $(($(date +%s) - start)) s" >&2
echo "$out"
