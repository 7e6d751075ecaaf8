#!/usr/bin/env bash
# Parley's full test suite: what `make test` and CI (.ci/run) run. Stops at the first failing suite.
#
#   gofmt check, go vet, build bin/parley, go test -race (every package, real model), a short fuzz run of every
#   Fuzz target, the Python websockets client, wscat, the SageMaker-style Python client and curl -N on the HTTP
#   streams, the node tests (browser; the openai and ollama npm clients; the AI SDK and LangChain; Claude Code, Codex and
#   opencode as coding agents; the MCP conformance suite's client scenarios against package mcp), the Dockerfile check.
#
# Needs what `make setup` installs. Environment:
#   PARLEY_TEST_MODEL  GGUF for every test (default ../shared/models/stories260K.gguf beside the repo); exported as
#                      an absolute path, with PARLEY_BIN (this tree's bin/parley), to every suite.
#   PARLEY_MARCH       SIMD level for the cgo build (scripts/env.sh; default x86-64-v3).
#   FUZZTIME           time per fuzz target (default 10s).
#   GO_TEST_FLAGS      extra flags for go test (e.g. -v, -run=X).
#   PARLEY_ENGINE_LIB  the current engine's libraries (default lib/llama-current, from make setup);
#                      PARLEY_SKIP_CURRENT_ENGINE=1 tests the embedded engine only.
# The last line is "N passed, 0 failed" (N suites), or "N passed, 1 failed" naming the suite that failed.
#
#   scripts/test.sh [PATTERN...]   run only the suites whose name matches one of the extended regexps
#                                  (e.g. scripts/test.sh wscat python); the others are counted as skipped.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

# The model path, absolute (resolved before the cd, so a relative PARLEY_TEST_MODEL means the caller's directory).
model=${PARLEY_TEST_MODEL:-$root/../shared/models/stories260K.gguf}
if [ ! -f "$model" ]; then
	echo "test model not found: $model (the repo expects ../shared/models beside it, or set PARLEY_TEST_MODEL)" >&2
	echo "0 passed, 1 failed"
	exit 1
fi
PARLEY_TEST_MODEL=$(cd "$(dirname "$model")" && pwd)/$(basename "$model")
export PARLEY_TEST_MODEL

cd "$root" || exit 1
# shellcheck source=env.sh
. scripts/env.sh
export PARLEY_BIN=$root/bin/parley
# The chat-template goldens compare with python3-jinja2 (make setup installs it): in the suite its absence fails.
export PARLEY_REQUIRE_JINJA2=1
# The image tests need libmtmd beside the current engine (make setup builds it): in the suite its absence fails.
if [ "${PARLEY_SKIP_CURRENT_ENGINE:-}" != 1 ]; then export PARLEY_REQUIRE_VISION=1; fi
# The current engine's libraries (make setup): the llm conformance suite runs both engines, and the web suite runs
# once more on the current engine below.
export PARLEY_ENGINE_LIB=${PARLEY_ENGINE_LIB:-$root/lib/llama-current}
# Embedded only: bin/parley's default engine (auto) would otherwise still take the current one where it is installed.
if [ "${PARLEY_SKIP_CURRENT_ENGINE:-}" = 1 ]; then export PARLEY_ENGINE=embedded; fi
FUZZTIME=${FUZZTIME:-10s}
read -r -a go_test_flags <<<"${GO_TEST_FLAGS:-}"

passed=()
skipped=()
only=("$@")

summary() {
	echo
	echo "=== summary ($((SECONDS / 60))m$((SECONDS % 60))s)"
	local s
	for s in "${passed[@]}"; do echo "  ok    $s"; done
	for s in "${skipped[@]}"; do echo "  skip  $s"; done
}

# The closing line: suites passed and failed, and skipped ones if a pattern left some out.
tally() {
	local line="${#passed[@]} passed, $1 failed"
	[ ${#skipped[@]} -eq 0 ] || line+=", ${#skipped[@]} skipped"
	echo "$line"
}

# suite NAME CMD...: run one suite; on failure print the summary and stop.
suite() {
	local name=$1 start=$SECONDS rc=0 p
	shift
	if [ ${#only[@]} -gt 0 ]; then
		for p in "${only[@]}"; do
			[[ $name =~ $p ]] && break
			p=
		done
		if [ -z "$p" ]; then
			skipped+=("$name")
			return 0
		fi
	fi
	echo
	echo "=== $name"
	"$@" || rc=$?
	if [ $rc -ne 0 ]; then
		summary
		echo "  FAIL  $name (exit status $rc, $((SECONDS - start))s)"
		tally 1
		exit 1
	fi
	passed+=("$name ($((SECONDS - start))s)")
}

# Go sources of the project: everything but npm's tree.
go_files() {
	find . -name '*.go' -not -path './scripts/node_modules/*' -not -path './.git/*' -print
}

gofmt_check() {
	local bad
	bad=$(go_files | xargs -r gofmt -l) || return 1
	if [ -n "$bad" ]; then
		echo "gofmt would change (run make fmt):"
		echo "$bad"
		return 1
	fi
	echo "$(go_files | wc -l) files formatted"
}

# fuzz_one DIR TARGET: a short fuzz run of one target (go test fuzzes one target of one package at a time).
# A failing input is saved under DIR/testdata/fuzz/TARGET, where the next go test replays it.
# A run that fails with only "context deadline exceeded" and writes no failing input is Go's own fuzzing coordinator
# racing its -fuzztime deadline (golang/go#75804, fixed in Go 1.27, not in 1.26.x): it is said, not failed.
fuzz_one() {
	local corpus="$1/testdata/fuzz/$2" before after out rc=0
	before=$(ls "$corpus" 2>/dev/null | wc -l)
	out=$(go test -run='^$' -fuzz="^$2\$" -fuzztime="$FUZZTIME" "./$1" 2>&1) || rc=$?
	echo "$out"
	[ $rc -eq 0 ] && return 0
	after=$(ls "$corpus" 2>/dev/null | wc -l)
	if [ "$after" = "$before" ] && grep -q '^    context deadline exceeded$' <<<"$out" && ! grep -q -e 'panic:' -e 'Failing input written' <<<"$out"; then
		echo "fuzz $1 $2: Go's fuzzing coordinator missed its own -fuzztime deadline (golang/go#75804); no failing input, not a failure"
		return 0
	fi
	return $rc
}

node_tests() {
	node --test "$@"
}

suite "gofmt" gofmt_check
suite "go vet" go vet ./...
suite "build bin/parley" go build -o bin/parley ./cmd/parley
# The Ollama peer (same module version, same CGO flags: llama.cpp's objects come from the build cache), so that
# llm/source's ollama:// test resolves a store made by a real `ollama create` instead of skipping.
build_ollama() {
	local bin
	bin=$(scripts/build-ollama.sh | tail -n 1) || return 1
	[ -x "$bin" ] || { echo "build-ollama: no binary at $bin" >&2; return 1; }
	export PARLEY_OLLAMA_BIN=$bin
	echo "PARLEY_OLLAMA_BIN=$bin"
}
suite "build ollama (peer for ollama:// tests)" build_ollama
suite "go test -race" go test -race -count=1 -timeout=60m "${go_test_flags[@]}" ./...
if [ "${PARLEY_SKIP_CURRENT_ENGINE:-}" != 1 ]; then
	suite "go test ./web on the current engine" env PARLEY_TEST_ENGINE=current go test -count=1 -timeout=60m "${go_test_flags[@]}" ./web/
	# bin/parley's --engine is auto (the current engine, whose libraries make setup installs): the binary's own tests
	# ran on it above; once more on the embedded engine (PARLEY_ENGINE, as every flag has its variable).
	suite "go test ./cmd/parley on the embedded engine" env PARLEY_ENGINE=embedded go test -count=1 -timeout=60m "${go_test_flags[@]}" ./cmd/parley/
fi

# Every `func FuzzX(` in a _test.go file, package by package ("DIR:TARGET" lines).
mapfile -t fuzz_targets < <(grep -rEo --include='*_test.go' --exclude-dir=node_modules --exclude-dir=.git \
	'^func Fuzz[A-Za-z0-9_]*' . | sed -e 's|^\./||' -e 's|/[^/:]*:func |:|' -e 's|^[^/:]*:func |.:|' | sort -u)
for t in "${fuzz_targets[@]}"; do
	suite "fuzz ${t%%:*} ${t#*:} -fuzztime=$FUZZTIME" fuzz_one "${t%%:*}" "${t#*:}"
done

suite "python websockets client" scripts/python-client-test.sh
suite "wscat" scripts/wscat-test.sh
suite "sagemaker client (python, /invocations stream)" scripts/sagemaker-client-test.sh
suite "curl -N plain stream" scripts/curl-plain-test.sh
suite "docs: every runnable example of README.md and docs/" scripts/docs-examples-test.sh

node_dirs=()
for d in scripts/browser scripts/node; do
	[ -d "$d" ] && node_dirs+=("$d/")
done
if [ ${#node_dirs[@]} -gt 0 ]; then
	suite "node --test ${node_dirs[*]}" node_tests "${node_dirs[@]}"
fi

suite "make cuda-current: pins and layout (no nvcc)" scripts/build-current-backend-test.sh
suite "Dockerfile check" scripts/dockerfile-check.sh
suite "Dockerfile.cuda check" scripts/dockerfile-check.sh "$root/Dockerfile.cuda"

summary
tally 0
