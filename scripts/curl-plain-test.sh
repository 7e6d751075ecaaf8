#!/usr/bin/env bash
# The plain text stream (POST /?prompt=..., Ray Serve's Textbot convention) read with `curl -N` against a real
# bin/parley on stories260K. Asserts: 200 text/plain with Transfer-Encoding: chunked; with --raw, the chunk
# framing itself: the reply arrives as many chunks (one flush per token, not one buffered body) that join to
# the same text curl -N printed, then the trailers (finish reason, usage); the prompt as the request body
# gives the same greedy reply; max_tokens is exact (the trailer counts 24); a bad parameter is a 400 naming it.
# The server must exit 0 on SIGTERM.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/testlib.sh"

command -v curl >/dev/null || fail "curl is needed (apt-get install curl)"
py=$(command -v python3 || echo /usr/bin/python3)
work=$(mktemp -d)
[ -n "${KEEP_WORK:-}" ] || parley_on_exit rm -rf "$work"

parley_start "$work/server.log"
base="http://127.0.0.1:$PARLEY_PORT"
query="max_tokens=24&temperature=0"

echo "--- curl -N"
curl -sS -N -X POST -D "$work/headers" -o "$work/reply" "$base/?prompt=Once%20upon%20a%20time&$query" ||
	fail "curl exited with status $?"
tr -d '\r' <"$work/headers" >"$work/headers.txt"
cat "$work/headers.txt"
echo "reply: $(cat "$work/reply")"
head -n 1 "$work/headers.txt" | grep -q ' 200' || fail "status is not 200"
grep -qi '^content-type: text/plain' "$work/headers.txt" || fail "not text/plain"
grep -qi '^transfer-encoding: chunked' "$work/headers.txt" || fail "not chunked"
[ -n "$(tr -d '[:space:]' <"$work/reply")" ] || fail "empty reply"

echo "--- curl -N --raw: the chunks as the server framed them"
curl -sS -N --raw -X POST -o "$work/raw" "$base/?prompt=Once%20upon%20a%20time&$query" || fail "curl --raw exited with status $?"
"$py" - "$work/raw" "$work/reply" <<'EOF'
import sys

raw = open(sys.argv[1], "rb").read()
want = open(sys.argv[2], "rb").read()
pos, chunks = 0, []
while True:
    end = raw.index(b"\r\n", pos)
    size = int(raw[pos:end], 16)
    pos = end + 2
    if size == 0:
        break
    chunks.append(raw[pos:pos + size])
    if raw[pos + size:pos + size + 2] != b"\r\n":
        sys.exit(f"FAIL: chunk {len(chunks)} is not followed by CRLF")
    pos += size + 2
trailers = dict(
    (k.strip().lower(), v.strip())
    for k, _, v in (line.partition(":") for line in raw[pos:].decode().split("\r\n") if line)
)
print(f"{len(chunks)} chunks: {[c.decode('utf-8', 'replace') for c in chunks[:8]]} ...")
print("trailers:", trailers)
fails = []
if len(chunks) < 8:
    fails.append(f"{len(chunks)} chunks: the reply was not flushed token by token")
if b"".join(chunks) != want:
    fails.append(f"chunks join to {b''.join(chunks)!r}, curl -N printed {want!r}")
if trailers.get("x-parley-finish-reason") != "length" or "completion=24" not in trailers.get("x-parley-usage", ""):
    fails.append(f"trailers {trailers}: want finish length and completion=24")
for f in fails:
    print("FAIL:", f, file=sys.stderr)
sys.exit(1 if fails else 0)
EOF

echo "--- the prompt as the body"
curl -sS -N --data-binary 'Once upon a time' -o "$work/body-reply" "$base/?$query" || fail "curl (body) exited with status $?"
cmp -s "$work/reply" "$work/body-reply" || fail "body prompt gave $(cat "$work/body-reply"), query prompt $(cat "$work/reply")"

echo "--- a bad parameter"
status=$(curl -sS -o "$work/error.json" -w '%{http_code}' -X POST "$base/?prompt=Hi&temperature=hot")
cat "$work/error.json"
[ "$status" = 400 ] || fail "temperature=hot: status $status, want 400"
grep -q '"field":"temperature"' "$work/error.json" || fail "the error does not name temperature"

parley_stop
echo "curl plain stream test: ok"
