#!/usr/bin/env bash
# Build the current engine's ggml backends from source and lay out its library folder: the pinned prebuilt
# libllama/libggml/libggml-base (node-llama-cpp 3.22.1, `npm ci` in scripts/engine) beside backend modules compiled
# here from the very source of those libraries (node-llama-cpp ships it as llama/gitRelease.bundle: llama.cpp
# de3ff815, ggml 0.25.1). ggml loads the modules at start; the rest of the engine is the prebuilt build.
#
#   cpu   the CPU backend, with the SIMD level of Parley's cgo build (scripts/ggml-simd.sh), into lib/llama-current
#         (what `make setup` runs). The prebuilt CPU variants are not used: their F16 matrix kernel took 2.3x the
#         embedded engine's time on a prompt (docs/notes/2026-11-27-cpu-backend-from-source.md), and this build does not.
#   cuda  the CPU backend and ggml's CUDA backend, for CUDA_ARCHITECTURES, into lib/llama-current-cuda (what
#         `make cuda-current` runs; bin/parley takes that folder first). The prebuilt CUDA package
#         (`make setup-engine-cuda`) holds machine code for sm_86, sm_89, sm_120 and sm_121 only, and CUDA 13.1 PTX
#         for the rest, which a driver for CUDA 13.0 or older (580, on an H100/H200) cannot load.
#   mtmd  llama.cpp's multimodal library (libmtmd: image projectors, "mmproj" files) from the same source, into the
#         CPU folder beside the prebuilt libllama it links to (all its llama_/ggml_/gguf_ imports are exported by
#         the pinned libraries); the current engine then runs vision models. It compiles libllama from the source
#         too (libmtmd links to it at build time; at run time RUNPATH $ORIGIN takes the prebuilt one): a few
#         minutes on 2 cores.
#
# Usage: scripts/build-current-backend.sh cpu|cuda|mtmd [OUT_DIR]
#        scripts/build-current-backend.sh -source DIR   only export the pinned source to DIR (for a machine
#                                                       without the npm registry: carry DIR there, set SOURCE)
# Environment:
#   PARLEY_MARCH          x86-64-v3 (default) or native, as for the cgo build
#   CUDA_ARCHITECTURES    cuda: CMAKE_CUDA_ARCHITECTURES, default "80;86;89;90"; "native" for this machine's GPUs
#   JOBS                  parallel compile jobs, default nproc
#   SOURCE                a llama.cpp source tree at the pinned commit (default: exported from the npm package)
#   CPU_LIBS              the pinned prebuilt libraries (default: scripts/engine/node_modules/..., `make setup-engine`)
#   BUILD_DIR             scratch folder, default ${XDG_CACHE_HOME:-~/.cache}/parley/current-<cpu|cuda>-build (kept:
#                         a second run only relinks)
#   CUDACXX               cuda: nvcc to use (default: cmake finds nvcc on PATH or /usr/local/cuda)
# Needs cmake and a C++ compiler; cuda also nvcc (NVIDIA's CUDA 12 or 13; not tried with Debian's 11.8).
# Time: cpu about 1 minute on 2 cores; the CUDA backend alone took 189 s for one architecture on 16 cores (nvcc
# 13.0, sm_90), and cuda builds the CPU backend beside it.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
pkg=node-llama-cpp@3.22.1
integrity=sha512-bltIipuWmc123H7tMIgDGKSsSrhmhlQYeVUC48XTjVW7XGJJiJJyCdlTMzQ/LiWoPkGDpcL4FviDpgw7qfTiDw==
commit=de3ff815ea7d559ee917f063901b8986f038abc6
me=build-current-backend

# export_source DIR: the pinned llama.cpp tree from the npm package's git bundle, checked against the pins.
export_source() {
	local dst=$1 tmp got
	tmp=$(mktemp -d)
	(cd "$tmp" && npm pack --silent "$pkg" >/dev/null)
	# npm's integrity string, computed by node (which npm brings).
	got=$(node -e 'const c = require("crypto"), fs = require("fs");
console.log("sha512-" + c.createHash("sha512").update(fs.readFileSync(process.argv[1])).digest("base64"))' "$tmp"/node-llama-cpp-*.tgz)
	[ "$got" = "$integrity" ] || { echo "$me: $pkg: integrity $got, pinned $integrity" >&2; exit 1; }
	tar -xzf "$tmp"/node-llama-cpp-*.tgz -C "$tmp" package/llama/gitRelease.bundle
	rm -rf "$dst"
	git -c advice.detachedHead=false clone -q "$tmp/package/llama/gitRelease.bundle" "$dst"
	rm -rf "$tmp"
	[ "$(git -C "$dst" rev-parse HEAD)" = "$commit" ] ||
		{ echo "$me: the bundle is at $(git -C "$dst" rev-parse HEAD), pinned $commit" >&2; exit 1; }
	echo "$me: llama.cpp $commit in $dst" >&2
}

case "${1:-}" in
-source)
	[ -n "${2:-}" ] || { echo "usage: $0 -source DIR" >&2; exit 2; }
	export_source "$2"
	exit 0
	;;
cpu) out=${2:-$root/lib/llama-current} targets=(ggml-cpu) cuda=OFF ;;
cuda) out=${2:-$root/lib/llama-current-cuda} targets=(ggml-cpu ggml-cuda) cuda=ON ;;
mtmd) out=${2:-$root/lib/llama-current} targets=(mtmd) cuda=OFF ;;
*)
	echo "usage: $0 cpu|cuda|mtmd [OUT_DIR] | -source DIR" >&2
	exit 2
	;;
esac
variant=$1
if [ "$(uname -sm)" != "Linux x86_64" ]; then
	echo "$me: the current engine's prebuilt libraries are for Linux x86-64; --engine current is unavailable here" >&2
	exit 0
fi
jobs=${JOBS:-$(nproc)}
# mtmd shares the cpu build's folder: its ggml is built there already.
scratch=${BUILD_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/parley/current-${variant/mtmd/cpu}-build}
cpu_libs=${CPU_LIBS:-$root/scripts/engine/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64}

command -v cmake >/dev/null || { echo "$me: cmake not found (Debian: apt-get install cmake)" >&2; exit 2; }
cuda_flags=()
if [ "$cuda" = ON ]; then
	if [ -z "${CUDACXX:-}" ] && ! command -v nvcc >/dev/null; then
		if [ -x /usr/local/cuda/bin/nvcc ]; then
			export CUDACXX=/usr/local/cuda/bin/nvcc
		else
			echo "$me: nvcc not found (install NVIDIA's CUDA toolkit 12 or 13, or set CUDACXX)" >&2
			exit 2
		fi
	fi
	cuda_flags=("-DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHITECTURES:-80;86;89;90}")
fi
[ -e "$cpu_libs/libggml-base.so" ] || { echo "$me: no prebuilt libraries in $cpu_libs (make setup-engine)" >&2; exit 2; }
# shellcheck source=ggml-simd.sh
. "$root/scripts/ggml-simd.sh"
ggml_simd || exit 2

src=${SOURCE:-$scratch/src}
if [ -z "${SOURCE:-}" ] && [ "$(git -C "$src" rev-parse HEAD 2>/dev/null)" != "$commit" ]; then
	export_source "$src"
fi
[ -f "$src/ggml/src/ggml-cpu/CMakeLists.txt" ] && [ -f "$src/CMakeLists.txt" ] ||
	{ echo "$me: $src is not a llama.cpp tree" >&2; exit 2; }

start=$(date +%s)
what="$variant, ${ggml_simd_flags[*]}${cuda_flags:+, ${cuda_flags[*]}}"
echo "$me: building ${targets[*]} ($what) with $jobs jobs" >&2
# ggml as node-llama-cpp builds it: shared, backends as modules (GGML_BACKEND_DL), unversioned sonames, so the
# modules need the libggml-base.so of the pinned package, which RPATH $ORIGIN finds beside them. No OpenMP: the
# engine runs its own persistent thread pool (llm/threadpool.go), as on the prebuilt libraries. The tree's top
# level (ggml's own CMakeLists.txt is incomplete there), with llama.cpp's programs off.
mkdir -p "$scratch"
cmake -S "$src" -B "$scratch/build" -DCMAKE_BUILD_TYPE=Release \
	-DBUILD_SHARED_LIBS=ON -DGGML_BACKEND_DL=ON -DCMAKE_PLATFORM_NO_VERSIONED_SONAME=ON -DGGML_OPENMP=OFF \
	"${ggml_simd_flags[@]}" "-DGGML_CUDA=$cuda" "${cuda_flags[@]}" \
	-DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
	-DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_MTMD=ON \
	-DCMAKE_BUILD_RPATH_USE_ORIGIN=ON >"$scratch/configure.log" 2>&1 ||
	{ tail -30 "$scratch/configure.log" >&2; exit 1; }
cmake --build "$scratch/build" --target "${targets[@]}" -j "$jobs" >"$scratch/build.log" 2>&1 ||
	{ tail -30 "$scratch/build.log" >&2; exit 1; }

mkdir -p "$out"
if [ "$variant" = mtmd ]; then
	# Beside the libraries the cpu variant laid out; nothing else there changes.
	[ -e "$out/libllama.so" ] || { echo "$me: no libllama.so in $out (build the cpu variant first)" >&2; exit 2; }
	lib=$(find "$scratch/build" -name libmtmd.so -print -quit)
	[ -n "$lib" ] || { echo "$me: no libmtmd.so in $scratch/build" >&2; exit 1; }
	cp -f "$lib" "$out/libmtmd.so"
	echo "$me: libmtmd in $out in $(($(date +%s) - start)) s" >&2
	echo "$out"
	exit 0
fi
# Replace every link (a folder laid out before, or by `make setup-engine-cuda`, links into a prebuilt package) and
# module: never write through a link.
find "$out" -maxdepth 1 \( -type l -o -name 'libggml-c*.so' \) -delete
for f in "$cpu_libs"/*.so; do
	case "$(basename "$f")" in
	libggml-cpu-*.so | libggml-cuda.so) ;; # the prebuilt backends: this build's replace them
	*) ln -sfn "$f" "$out/$(basename "$f")" ;;
	esac
done
ln -sfn "$cpu_libs/libllama.v0.5.0.so" "$out/libllama.so"
ln -sfn "$cpu_libs/libggml.v0.5.0.so" "$out/libggml.so"
for t in "${targets[@]}"; do
	lib=$(find "$scratch/build" -name "lib$t.so" -print -quit)
	[ -n "$lib" ] || { echo "$me: no lib$t.so in $scratch/build" >&2; exit 1; }
	cp -f "$lib" "$out/lib$t.so"
done
nvcc=""
if [ "$cuda" = ON ]; then
	nvcc=", nvcc $(${CUDACXX:-nvcc} --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
fi
printf 'llama.cpp %s, %s%s\n' "$commit" "$what" "$nvcc" >"$out/BUILT-FROM-SOURCE"
echo "$me: ${targets[*]} in $out in $(($(date +%s) - start)) s" >&2
echo "$out"
