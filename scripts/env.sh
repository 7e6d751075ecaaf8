# Source this file to build Parley's cgo code by hand: `. scripts/env.sh; go test ./...`.
# The Makefile sets the same variables; keep the two in step (the Go build cache
# is keyed on them, so a mismatch rebuilds llama.cpp, about 3 minutes).
# SIMD: x86-64-v3 (AVX2/FMA/F16C) by default; PARLEY_MARCH=native for this machine's best.
_parley_root=$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")/.." && pwd)
export CGO_ENABLED=1
# PARLEY_NATIVE_INCLUDE points several checkouts (git worktrees) at one copy of llm/native so they share the cache.
export CGO_CPPFLAGS="-I${PARLEY_NATIVE_INCLUDE:-${_parley_root}/llm/native}"
export CGO_CFLAGS="-O3 -march=${PARLEY_MARCH:-x86-64-v3}"
export CGO_CXXFLAGS="-O3 -march=${PARLEY_MARCH:-x86-64-v3}"
unset _parley_root
