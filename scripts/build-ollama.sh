#!/usr/bin/env bash
# Build the peer that tools/bench measures Parley against: the `ollama` binary of
# the same module version Parley's llm package binds (github.com/ollama/ollama@v0.24.0),
# compiled with the same CGO flags as scripts/env.sh. Go's build cache is keyed on
# those flags and on the llama.cpp sources, so when Parley has been built the C++
# objects are reused and this takes well under a minute; cold it is ~3-4 minutes
# on 2 cores.
#
# Usage: scripts/build-ollama.sh [OUT_DIR]
#   OUT_DIR defaults to $PARLEY_OLLAMA_DIR, else ${XDG_CACHE_HOME:-$HOME/.cache}/parley/ollama
#   (where tools/bench looks by default; never inside the repo). The binary is
#   OUT_DIR/ollama; the script prints its path last.
# Environment: OLLAMA_VERSION (default v0.24.0), PARLEY_MARCH (as in scripts/env.sh).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
version=${OLLAMA_VERSION:-v0.24.0}
out=${1:-${PARLEY_OLLAMA_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/parley/ollama}}
mkdir -p "$out"
out=$(cd "$out" && pwd)
case "$out/" in
"$root"/*)
	echo "build-ollama: refusing to build into the repository ($out)" >&2
	exit 2
	;;
esac

# Same CGO_CPPFLAGS/CFLAGS/CXXFLAGS as every Parley build: the miniaudio shim and
# the SIMD level. A mismatch would rebuild llama.cpp and measure other kernels.
# shellcheck source=env.sh
. "$root/scripts/env.sh"

# `go install pkg@version` builds in module-aware mode from Ollama's own go.mod
# (it has no replace directives), so its dependency versions are exactly the
# release's, independent of Parley's go.mod. Run it from a scratch directory so
# no enclosing go.mod or go.work is consulted.
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cd "$scratch"
echo "build-ollama: go install github.com/ollama/ollama@$version -> $out (CGO_CFLAGS=$CGO_CFLAGS)" >&2
GOBIN="$out" GOWORK=off GOFLAGS=-buildvcs=false \
	go install -ldflags "-X github.com/ollama/ollama/version.Version=${version#v}" \
	"github.com/ollama/ollama@$version"

"$out/ollama" --help >/dev/null # it runs (--version would look for a server)
echo "$out/ollama"
