#!/usr/bin/env bash
# Build the second peer that tools/bench measures Parley against: llama.cpp's own
# `llama-server` (and `llama-quantize`, which makes the Q8_0/Q4_0 copies of the
# synthetic benchmark model) from a public llama.cpp snapshot, with the same SIMD
# level as Parley's build (scripts/env.sh: x86-64-v3 unless PARLEY_MARCH=native)
# and upstream's defaults otherwise (OpenMP on, through libgomp).
#
# Usage: scripts/build-llama-server.sh [SNAPSHOT [OUT_DIR]]
#   SNAPSHOT  a llama.cpp git directory (bare or not), or a plain source tree with
#             CMakeLists.txt. Default: $PARLEY_LLAMA_CPP_SRC; one of the two is
#             required (a clone of https://github.com/ggml-org/llama.cpp, or a
#             snapshot of a fork that follows it).
#   OUT_DIR   default $PARLEY_LLAMA_SERVER_DIR, else
#             ${XDG_CACHE_HOME:-$HOME/.cache}/parley/llama-server (where tools/bench
#             looks by default; never inside the repository). The binaries are
#             OUT_DIR/bin/llama-server and OUT_DIR/bin/llama-quantize; the script
#             prints what it built last. A second run with the same snapshot and
#             flags only re-links (the CMake build directory OUT_DIR/build is kept).
# Environment: PARLEY_MARCH (as in scripts/env.sh), JOBS (default 2), CMAKE (default cmake).
#   LLAMA_SERVER_MODULES=1  shared libraries, with ggml's backends as modules loaded at run time from the
#             binary's folder (GGML_BACKEND_DL; unversioned names, as node-llama-cpp's build has): the libraries
#             land in OUT_DIR/bin beside llama-server, and a CUDA backend built from the same source
#             (scripts/build-current-backend.sh cuda) can be dropped there. Built from the current engine's pinned
#             source (scripts/build-current-backend.sh -source DIR exports it), llama-server then runs the same kernels
#             as Parley's current engine, on the CPU or a GPU.
#
# Needs cmake (Debian: apt-get install cmake), a C/C++ compiler and git. Cold, it
# takes 15-30 minutes on 2 cores. The benchmark is not part of CI, so neither is this.
#
# A snapshot may lack large files (the `fetch` tool leaves out files of 4 MiB and
# more, and Git LFS content; in ggml-llama.cpp that is models/ggml-vocab-*.gguf,
# test vocabularies the two targets do not use): the export skips every blob the
# git directory does not hold. The server's web UI is not built (no npm, no
# network): a placeholder page is embedded in its place; the benchmark uses only
# the HTTP API.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
src=${1:-${PARLEY_LLAMA_CPP_SRC:-}}
if [ -z "$src" ]; then
	echo "build-llama-server: name a llama.cpp checkout: scripts/build-llama-server.sh DIR, or PARLEY_LLAMA_CPP_SRC=DIR" >&2
	exit 2
fi
out=${2:-${PARLEY_LLAMA_SERVER_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/parley/llama-server}}
jobs=${JOBS:-2}
cmake=${CMAKE:-cmake}

if ! command -v "$cmake" >/dev/null; then
	echo "build-llama-server: $cmake not found (Debian: apt-get install cmake)" >&2
	exit 2
fi
if [ ! -e "$src" ]; then
	echo "build-llama-server: no llama.cpp snapshot at $src; bring one with the fetch tool" \
		"(fetch github:Raudbjorn/ggml-llama.cpp) or pass a llama.cpp clone as the first argument" >&2
	exit 2
fi
mkdir -p "$out"
out=$(cd "$out" && pwd)
case "$out/" in
"$root"/*)
	echo "build-llama-server: refusing to build into the repository ($out)" >&2
	exit 2
	;;
esac

# missing_blobs GITDIR prints the path of every file in HEAD whose blob GITDIR lacks.
missing_blobs() {
	local tree
	tree=$(git --git-dir="$1" -c core.quotePath=false ls-tree -r HEAD | awk -F'\t' '{split($1, m, " "); if (m[2] == "blob") print m[3] "\t" $2}')
	# cat-file answers "SHA missing" for an absent object, in input order.
	paste <(printf '%s\n' "$tree" | cut -f1 | git --git-dir="$1" cat-file --batch-check='%(objectname)') \
		<(printf '%s\n' "$tree" | cut -f2-) |
		awk -F'\t' '$1 ~ / missing$/ {print $2}'
}

# Export the snapshot's HEAD into OUT_DIR/src, once per commit.
srcdir=$out/src
commit=
if gitdir=$(git -C "$src" rev-parse --absolute-git-dir 2>/dev/null) ||
	{ [ -f "$src/HEAD" ] && [ -d "$src/objects" ] && gitdir=$(cd "$src" && pwd); }; then
	commit=$(git --git-dir="$gitdir" rev-parse HEAD)
	if [ "$(cat "$srcdir/.parley-commit" 2>/dev/null)" != "$commit" ]; then
		echo "build-llama-server: exporting $gitdir at $commit -> $srcdir" >&2
		rm -rf "$srcdir"
		mkdir -p "$srcdir"
		# Blobs the snapshot does not hold (large files, LFS) are left out of the
		# export: a scratch index holds HEAD less those paths, and its tree (written
		# to a scratch object directory, the snapshot's objects as alternates, so the
		# snapshot is never written to) is what gets archived.
		scratch=$(mktemp -d)
		missing=()
		while IFS= read -r path; do
			missing+=("$path")
		done < <(missing_blobs "$gitdir")
		if [ ${#missing[@]} -gt 0 ]; then
			echo "build-llama-server: ${#missing[@]} file(s) absent from the snapshot are left out: ${missing[*]}" >&2
		fi
		tree=$(
			export GIT_INDEX_FILE="$scratch/index" GIT_OBJECT_DIRECTORY="$scratch/objects" \
				GIT_ALTERNATE_OBJECT_DIRECTORIES="$gitdir/objects"
			mkdir -p "$scratch/objects"
			git --git-dir="$gitdir" read-tree HEAD
			if [ ${#missing[@]} -gt 0 ]; then
				git --git-dir="$gitdir" update-index --force-remove -- "${missing[@]}"
			fi
			git --git-dir="$gitdir" write-tree
		)
		GIT_OBJECT_DIRECTORY="$scratch/objects" GIT_ALTERNATE_OBJECT_DIRECTORIES="$gitdir/objects" \
			git --git-dir="$gitdir" archive --format=tar "$tree" | tar -x -C "$srcdir"
		rm -rf "$scratch"
		echo "$commit" >"$srcdir/.parley-commit"
	fi
elif [ -f "$src/CMakeLists.txt" ]; then
	srcdir=$(cd "$src" && pwd)
else
	echo "build-llama-server: $src is neither a git directory nor a llama.cpp source tree" >&2
	exit 2
fi

# The web UI: tools/ui (newer trees) embeds tools/ui/dist when it has an index.html,
# else builds it with npm or downloads it. Give it a placeholder so neither runs.
# Older trees (tools/server/public with index.html.gz + loading.html, turned into
# headers with xxd-like CMake) get placeholders of those instead.
# tools/ui/embed.cpp refuses a dist folder that lacks any of the assets the
# server serves (index.html, loading.html, the PWA files, the bundles), so each
# gets a placeholder; tools/ui/static/loading.html is the real loading page.
placeholder='<!doctype html><title>llama-server</title><p>Web UI not built (Parley benchmark build); use the HTTP API.</p>'
if [ -d "$srcdir/tools/ui" ]; then
	dist=$srcdir/tools/ui/dist
	mkdir -p "$dist"
	put() { [ -f "$dist/$1" ] || printf '%s\n' "$2" >"$dist/$1"; }
	put index.html "$placeholder"
	if [ -f "$srcdir/tools/ui/static/loading.html" ] && [ ! -f "$dist/loading.html" ]; then
		cp "$srcdir/tools/ui/static/loading.html" "$dist/loading.html"
	fi
	put loading.html '<!doctype html><title>loading</title><p>Loading model</p>'
	put manifest.webmanifest '{"name":"llama-server","start_url":"/","display":"standalone"}'
	put sw.js '// placeholder: no web UI'
	put build.json '{"placeholder":true}'
	put version.json '{"version":"placeholder"}'
	put bundle.placeholder.js '// placeholder: no web UI'
	put bundle.placeholder.css '/* placeholder: no web UI */'
	put workbox.placeholder.js '// placeholder: no web UI'
fi
for pub in "$srcdir/tools/server/public" "$srcdir/examples/server/public"; do
	grep -qs 'index.html.gz' "$(dirname "$pub")/CMakeLists.txt" || continue
	mkdir -p "$pub"
	[ -f "$pub/index.html.gz" ] || printf '%s\n' "$placeholder" | gzip -9 >"$pub/index.html.gz"
	[ -f "$pub/loading.html" ] || printf '%s\n' '<!doctype html><title>loading</title><p>Loading model</p>' >"$pub/loading.html"
done

# SIMD as Parley's cgo build.
# shellcheck source=ggml-simd.sh
. "$root/scripts/ggml-simd.sh"
ggml_simd || exit 2
simd=("${ggml_simd_flags[@]}")

modules=()
if [ "${LLAMA_SERVER_MODULES:-0}" = 1 ]; then
	modules=(-DBUILD_SHARED_LIBS=ON -DGGML_BACKEND_DL=ON -DCMAKE_PLATFORM_NO_VERSIONED_SONAME=ON -DCMAKE_BUILD_RPATH_USE_ORIGIN=ON)
fi

build=$out/build
echo "build-llama-server: configuring $srcdir -> $build (${simd[*]})" >&2
"$cmake" -S "$srcdir" -B "$build" \
	-DCMAKE_BUILD_TYPE=Release \
	-DBUILD_SHARED_LIBS=OFF \
	-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON \
	-DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
	-DLLAMA_OPENSSL=OFF \
	${commit:+-DLLAMA_BUILD_COMMIT=${commit:0:10}} \
	-DGGML_OPENMP=ON \
	"${simd[@]}" "${modules[@]}" >"$out/configure.log" 2>&1 || {
	tail -40 "$out/configure.log" >&2
	exit 1
}
echo "build-llama-server: building llama-server llama-quantize with -j$jobs (log: $out/build.log)" >&2
"$cmake" --build "$build" --config Release --target llama-server llama-quantize -j"$jobs" >"$out/build.log" 2>&1 || {
	tail -40 "$out/build.log" >&2
	exit 1
}

mkdir -p "$out/bin"
for t in llama-server llama-quantize; do
	cp -f "$build/bin/$t" "$out/bin/$t"
done
if [ ${#modules[@]} -gt 0 ]; then
	cp -f "$build"/bin/*.so "$out/bin/"
fi
"$out/bin/llama-server" --version 2>&1 | sed 's/^/build-llama-server: /' >&2 || true
echo "$out/bin/llama-server"
echo "$out/bin/llama-quantize"
