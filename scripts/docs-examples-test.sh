#!/usr/bin/env bash
# Every code block that README.md and docs/ mark as runnable (<!-- runnable --> before its fence) runs as written
# against a real bin/parley on stories260K (scripts/docs_examples.py), so an example cannot rot: the Python
# websockets client, wscat, curl on each wire, the npm SDKs.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/testlib.sh"

py=$(parley_python) || fail "python with websockets needed"
work=$(mktemp -d)
[ -n "${KEEP_WORK:-}" ] || parley_on_exit rm -rf "$work"

parley_start "$work/server.log" --store memory
cd "$here/.."
"$py" "$here/docs_examples.py" "$PARLEY_PORT" README.md docs/*.md
