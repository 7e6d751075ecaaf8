#!/usr/bin/env bash
# scripts/build-current-backend.sh cuda (make cuda-current) on a machine without nvcc or a GPU (its cpu variant
# builds for real in `make setup`, and every current-engine test runs on what it built):
#   - its pins are right: -source brings node-llama-cpp's tarball from npm, checks its sha512, and the bundle's
#     commit is the one the prebuilt libraries were built from;
#   - the folder it lays out: with nvcc and cmake stood in for (the CUDA compile itself ran on a GPU machine, see
#     docs/notes/2026-11-27-gpu-h200-cuda-from-source.md), cmake is asked for ggml's CPU and CUDA backends as modules with unversioned sonames, the
#     modules land as files beside links to the pinned libraries (not to the prebuilt CPU variants), and a folder
#     that `make setup-engine-cuda` laid out before is replaced without writing through its links into the
#     prebuilt package;
#   - its mtmd variant: cmake is asked for libmtmd (LLAMA_BUILD_MTMD), which lands as a file beside the libllama it
#     links to, and a folder without that libllama is refused.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cpu=$root/scripts/engine/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64
[ -e "$cpu/libggml-base.so" ] || { echo "no CPU libraries in $cpu (make setup-engine)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$root/scripts/build-current-backend.sh" -source "$tmp/src" 2>"$tmp/source.log" || { cat "$tmp/source.log" >&2; fail "-source"; }
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
if [ "\$1" = --build ]; then
	mkdir -p "\$2/bin"
	for t in "\$@"; do case "\$t" in ggml-* | mtmd) echo "built \$t" >"\$2/bin/lib\$t.so" ;; esac; done
fi
EOF
chmod +x "$tmp/bin/nvcc" "$tmp/bin/cmake"

# A folder as `make setup-engine-cuda` leaves it: links into the prebuilt CUDA package.
mkdir -p "$tmp/prebuilt" "$tmp/out"
echo prebuilt >"$tmp/prebuilt/libggml-cuda.so"
echo prebuilt >"$tmp/prebuilt/libllama.cuda.v0.5.0.so"
ln -s "$tmp/prebuilt/libggml-cuda.so" "$tmp/out/libggml-cuda.so"
ln -s "$tmp/prebuilt/libllama.cuda.v0.5.0.so" "$tmp/out/libllama.cuda.v0.5.0.so"
ln -s "$tmp/prebuilt/libllama.cuda.v0.5.0.so" "$tmp/out/libllama.so"

PATH=$tmp/bin:$PATH SOURCE=$tmp/src BUILD_DIR=$tmp/build CUDA_ARCHITECTURES=90 JOBS=3 PARLEY_MARCH=x86-64-v3 \
	"$root/scripts/build-current-backend.sh" cuda "$tmp/out" >"$tmp/run.log" 2>&1 || { cat "$tmp/run.log" >&2; fail "build"; }

for a in -DGGML_CUDA=ON -DGGML_BACKEND_DL=ON -DBUILD_SHARED_LIBS=ON -DCMAKE_PLATFORM_NO_VERSIONED_SONAME=ON \
	-DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_BUILD_SERVER=OFF -DGGML_OPENMP=OFF -DGGML_NATIVE=OFF -DGGML_AVX2=ON; do
	grep -q -- "$a" "$tmp/cmake.args" || fail "cmake was not given $a: $(cat "$tmp/cmake.args")"
done
grep -q -- "--build $tmp/build/build --target ggml-cpu ggml-cuda -j 3" "$tmp/cmake.args" || fail "build step: $(cat "$tmp/cmake.args")"
[ "$(cat "$tmp/prebuilt/libggml-cuda.so")" = prebuilt ] || fail "wrote through the old link into the prebuilt package"
[ -f "$tmp/out/libggml-cuda.so" ] && [ ! -L "$tmp/out/libggml-cuda.so" ] || fail "libggml-cuda.so is not a file"
[ "$(cat "$tmp/out/libggml-cuda.so")" = "built ggml-cuda" ] || fail "libggml-cuda.so is not the build's"
[ -f "$tmp/out/libggml-cpu.so" ] && [ "$(cat "$tmp/out/libggml-cpu.so")" = "built ggml-cpu" ] || fail "libggml-cpu.so is not the build's"
[ ! -e "$tmp/out/libllama.cuda.v0.5.0.so" ] || fail "a link into the prebuilt package is left"
[ "$(readlink "$tmp/out/libllama.so")" = "$cpu/libllama.v0.5.0.so" ] || fail "libllama.so -> $(readlink "$tmp/out/libllama.so")"
[ "$(readlink "$tmp/out/libggml.so")" = "$cpu/libggml.v0.5.0.so" ] || fail "libggml.so -> $(readlink "$tmp/out/libggml.so")"
[ "$(readlink "$tmp/out/libggml-base.so")" = "$cpu/libggml-base.so" ] || fail "libggml-base.so -> $(readlink "$tmp/out/libggml-base.so")"
if ls "$tmp/out"/libggml-cpu-*.so >/dev/null 2>&1; then
	fail "prebuilt CPU variants are linked: $(ls "$tmp/out"/libggml-cpu-*.so)"
fi
grep -q "de3ff815ea7d559ee917f063901b8986f038abc6, cuda, .*-DGGML_AVX2=ON.*-DCMAKE_CUDA_ARCHITECTURES=90, nvcc 13.0" "$tmp/out/BUILT-FROM-SOURCE" ||
	fail "BUILT-FROM-SOURCE: $(cat "$tmp/out/BUILT-FROM-SOURCE")"
echo "ok: layout: the CPU and CUDA modules beside $(find "$tmp/out" -maxdepth 1 -type l | wc -l) links to the pinned libraries"

# The mtmd variant, into the folder just laid out (it holds libllama.so), then into one without it.
: >"$tmp/cmake.args"
PATH=$tmp/bin:$PATH SOURCE=$tmp/src BUILD_DIR=$tmp/build JOBS=3 PARLEY_MARCH=x86-64-v3 \
	"$root/scripts/build-current-backend.sh" mtmd "$tmp/out" >"$tmp/run.log" 2>&1 || { cat "$tmp/run.log" >&2; fail "mtmd build"; }
grep -q -- "-DLLAMA_BUILD_MTMD=ON" "$tmp/cmake.args" || fail "cmake was not given -DLLAMA_BUILD_MTMD=ON: $(cat "$tmp/cmake.args")"
grep -q -- "--build $tmp/build/build --target mtmd -j 3" "$tmp/cmake.args" || fail "mtmd build step: $(cat "$tmp/cmake.args")"
[ -f "$tmp/out/libmtmd.so" ] && [ ! -L "$tmp/out/libmtmd.so" ] && [ "$(cat "$tmp/out/libmtmd.so")" = "built mtmd" ] ||
	fail "libmtmd.so is not the build's"
[ "$(readlink "$tmp/out/libllama.so")" = "$cpu/libllama.v0.5.0.so" ] || fail "mtmd changed libllama.so -> $(readlink "$tmp/out/libllama.so")"
mkdir -p "$tmp/bare"
if PATH=$tmp/bin:$PATH SOURCE=$tmp/src BUILD_DIR=$tmp/build JOBS=3 "$root/scripts/build-current-backend.sh" mtmd "$tmp/bare" >"$tmp/run.log" 2>&1; then
	fail "mtmd into a folder without libllama.so succeeded"
fi
grep -q "no libllama.so in $tmp/bare" "$tmp/run.log" || fail "mtmd without libllama.so: $(cat "$tmp/run.log")"
echo "ok: mtmd: libmtmd beside the pinned libllama"
