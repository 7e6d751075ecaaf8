#!/usr/bin/env bash
# scripts/build-cuda-current.sh (make cuda-current) on a machine without nvcc or a GPU:
#   - its pins are right: -source brings node-llama-cpp's tarball from npm, checks its sha512, and the bundle's
#     commit is the one the CPU libraries were built from;
#   - the folder it lays out: with nvcc and cmake stood in for (the compile itself ran on a GPU machine, see
#     BENCHMARKS.md), cmake is asked for ggml's CUDA backend as a module with unversioned sonames, the module lands
#     as a file beside links to the pinned CPU libraries, and a folder that `make setup-engine-cuda` laid out before
#     is replaced without writing through its links into the prebuilt package.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cpu=$root/scripts/engine/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64
[ -e "$cpu/libggml-base.so" ] || { echo "no CPU libraries in $cpu (make setup-engine)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$root/scripts/build-cuda-current.sh" -source "$tmp/src" 2>"$tmp/source.log" || { cat "$tmp/source.log" >&2; fail "-source"; }
head=$(git -C "$tmp/src" rev-parse HEAD)
[ "$head" = de3ff815ea7d559ee917f063901b8986f038abc6 ] || fail "bundle at $head"
[ -f "$tmp/src/ggml/src/ggml-cuda/CMakeLists.txt" ] || fail "no ggml-cuda source in the bundle"
[ "$(sed -n 's/^set(GGML_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\))$/\2/p' "$tmp/src/ggml/CMakeLists.txt" | paste -sd.)" = 0.25.1 ] ||
	fail "the bundle's ggml is not 0.25.1"
echo "ok: -source: node-llama-cpp 3.22.1 (sha512 checked), llama.cpp $head, ggml 0.25.1"

mkdir -p "$tmp/bin"
cat >"$tmp/bin/nvcc" <<'EOF'
#!/bin/sh
echo "Cuda compilation tools, release 13.0, V13.0.88"
EOF
cat >"$tmp/bin/cmake" <<EOF
#!/bin/sh
echo "\$@" >>"$tmp/cmake.args"
if [ "\$1" = --build ]; then mkdir -p "\$2/bin" && echo built >"\$2/bin/libggml-cuda.so"; fi
EOF
chmod +x "$tmp/bin/nvcc" "$tmp/bin/cmake"

# A folder as `make setup-engine-cuda` leaves it: links into the prebuilt CUDA package.
mkdir -p "$tmp/prebuilt" "$tmp/out"
echo prebuilt >"$tmp/prebuilt/libggml-cuda.so"
echo prebuilt >"$tmp/prebuilt/libllama.cuda.v0.5.0.so"
ln -s "$tmp/prebuilt/libggml-cuda.so" "$tmp/out/libggml-cuda.so"
ln -s "$tmp/prebuilt/libllama.cuda.v0.5.0.so" "$tmp/out/libllama.cuda.v0.5.0.so"
ln -s "$tmp/prebuilt/libllama.cuda.v0.5.0.so" "$tmp/out/libllama.so"

PATH=$tmp/bin:$PATH SOURCE=$tmp/src CUDA_BUILD_DIR=$tmp/build CUDA_ARCHITECTURES=90 JOBS=3 \
	"$root/scripts/build-cuda-current.sh" "$tmp/out" >"$tmp/run.log" 2>&1 || { cat "$tmp/run.log" >&2; fail "build"; }

for a in -DGGML_CUDA=ON -DGGML_BACKEND_DL=ON -DBUILD_SHARED_LIBS=ON -DCMAKE_PLATFORM_NO_VERSIONED_SONAME=ON \
	-DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_BUILD_SERVER=OFF; do
	grep -q -- "$a" "$tmp/cmake.args" || fail "cmake was not given $a: $(cat "$tmp/cmake.args")"
done
grep -q -- "--build $tmp/build/build --target ggml-cuda -j 3" "$tmp/cmake.args" || fail "build step: $(cat "$tmp/cmake.args")"
[ "$(cat "$tmp/prebuilt/libggml-cuda.so")" = prebuilt ] || fail "wrote through the old link into the prebuilt package"
[ -f "$tmp/out/libggml-cuda.so" ] && [ ! -L "$tmp/out/libggml-cuda.so" ] || fail "libggml-cuda.so is not a file"
[ "$(cat "$tmp/out/libggml-cuda.so")" = built ] || fail "libggml-cuda.so is not the build's"
[ ! -e "$tmp/out/libllama.cuda.v0.5.0.so" ] || fail "a link into the prebuilt package is left"
[ "$(readlink "$tmp/out/libllama.so")" = "$cpu/libllama.v0.5.0.so" ] || fail "libllama.so -> $(readlink "$tmp/out/libllama.so")"
[ "$(readlink "$tmp/out/libggml.so")" = "$cpu/libggml.v0.5.0.so" ] || fail "libggml.so -> $(readlink "$tmp/out/libggml.so")"
[ "$(readlink "$tmp/out/libggml-base.so")" = "$cpu/libggml-base.so" ] || fail "libggml-base.so -> $(readlink "$tmp/out/libggml-base.so")"
for f in "$cpu"/libggml-cpu-*.so; do
	[ -L "$tmp/out/$(basename "$f")" ] || fail "no $(basename "$f")"
done
grep -q "de3ff815ea7d559ee917f063901b8986f038abc6, CMAKE_CUDA_ARCHITECTURES=90, nvcc 13.0" "$tmp/out/BUILT-FROM-SOURCE" ||
	fail "BUILT-FROM-SOURCE: $(cat "$tmp/out/BUILT-FROM-SOURCE")"
echo "ok: layout: the module beside $(find "$tmp/out" -maxdepth 1 -type l | wc -l) links to the pinned CPU libraries"
