#!/usr/bin/env bash
# SageMaker-style streaming against a real bin/parley on stories260K: scripts/sagemaker_client.py reads
# POST /invocations {"inputs", "parameters", "stream": true} by splitting the byte stream on newlines and
# parsing each `data:` line, as SageMaker's response-stream examples do. Asserts, with the body cut into
# 7-byte pieces (lines and UTF-8 characters split across pieces): TGI's framing byte for byte (each data line
# followed by exactly one empty line), one event per token with increasing index, token.text pieces that make
# the final generated_text, max_new_tokens honoured exactly, the same text as the non-streamed form, a 400
# naming the field for a bad parameter, and the client's command line. The server must exit 0 on SIGTERM.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/testlib.sh"

py=$(command -v python3 || echo /usr/bin/python3)
work=$(mktemp -d)
[ -n "${KEEP_WORK:-}" ] || parley_on_exit rm -rf "$work"

parley_start "$work/server.log"
url="http://127.0.0.1:$PARLEY_PORT/invocations"

echo "--- streamed events, read through the newline iterator"
PYTHONPATH=$here "$py" - "$url" <<'EOF'
import sys

import sagemaker_client as sm

url = sys.argv[1]
params = {"max_new_tokens": 24, "do_sample": False}
failures = []

evs = list(sm.stream(url, "Once upon a time", params, chunk_size=7, strict=True))
*toks, last = evs
text = "".join(e["token"]["text"] for e in evs if not e["token"]["special"])
print(f"{len(evs)} events; text {text!r}")
print("last event:", {k: last[k] for k in ("generated_text", "details")})
if [e["index"] for e in evs] != list(range(1, len(evs) + 1)):
    failures.append(f"indexes {[e['index'] for e in evs]}")
if any(e["generated_text"] is not None or e["details"] is not None for e in toks):
    failures.append("an event before the last carries generated_text or details")
if last["generated_text"] != text:
    failures.append(f"generated_text {last['generated_text']!r} is not the tokens' text {text!r}")
if len(evs) != 24 or last["details"]["generated_tokens"] != 24 or last["details"]["finish_reason"] != "length":
    failures.append(f"max_new_tokens 24: {len(evs)} events, details {last['details']}")
if len(toks) < 2 or not text.strip():
    failures.append("the reply was not streamed in pieces")

pieces = list(sm.tokens(url, "Once upon a time", params, chunk_size=3))
if "".join(pieces) != text:
    failures.append(f"tokens() with 3-byte chunks gave {''.join(pieces)!r}")

whole = sm.invoke(url, "Once upon a time", params)
if whole != [{"generated_text": text}]:
    failures.append(f"stream: false gave {whole!r}, want [{{'generated_text': {text!r}}}]")

try:
    list(sm.stream(url, "Once upon a time", {"temperature": "hot"}))
    failures.append("a bad temperature was accepted")
except sm.StreamError as e:
    print("bad parameter refused:", e)
    if "HTTP 400" not in str(e) or "temperature" not in str(e):
        failures.append(f"bad temperature: {e}")

for f in failures:
    print("FAIL:", f, file=sys.stderr)
sys.exit(1 if failures else 0)
EOF

echo "--- the command line"
"$py" "$here/sagemaker_client.py" --url "$url" --max-new-tokens 16 --param temperature=0 Once upon a time >"$work/cli.out" ||
	fail "sagemaker_client.py exited with status $?"
cat "$work/cli.out"
[ -n "$(tr -d '[:space:]' <"$work/cli.out")" ] || fail "sagemaker_client.py printed no reply"

parley_stop
echo "sagemaker client test: ok"
