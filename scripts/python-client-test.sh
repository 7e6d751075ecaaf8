#!/usr/bin/env bash
# The seed's Python client against a real bin/parley on stories260K: a two-turn conversation with the asyncio API
# of `websockets`, written exactly the seed's way (send, then recv until "<<Response Finished>>"). Asserts, per
# turn: text messages only, more than one piece, a non-empty reply, exactly one sentinel (a second sentinel would
# end the next turn at once with no pieces; after the last turn, nothing more may arrive). Then scripts/client.py,
# the client users run, holds the same conversation from argv and from stdin. The server must exit 0 on SIGTERM.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/testlib.sh"

py=$(parley_python) || fail "python with websockets needed"
work=$(mktemp -d)
[ -n "${KEEP_WORK:-}" ] || parley_on_exit rm -rf "$work"

parley_start "$work/server.log"

echo "--- two turns, the seed's way ($("$py" -c 'import websockets; print("websockets", websockets.__version__)'))"
set +e
"$py" - "$PARLEY_URL" <<'EOF'
import asyncio
import sys

import websockets

SENTINEL = "<<Response Finished>>"
PROMPTS = ["Once upon a time, there was a little dog named Max.", "What did Max do next?"]
TURN_TIMEOUT = 60  # seconds; a reply from stories260K takes well under one


async def turn(ws, prompt):
    # The seed's loop, unchanged: one prompt, then every message until the sentinel.
    await ws.send(prompt)
    pieces = []
    while True:
        msg = await ws.recv()
        if msg == "<<Response Finished>>":
            break
        pieces.append(msg)
    return pieces


async def main(uri):
    failures = []
    async with websockets.connect(uri) as ws:
        for i, prompt in enumerate(PROMPTS, 1):
            pieces = await asyncio.wait_for(turn(ws, prompt), TURN_TIMEOUT)
            text = "".join(p for p in pieces if isinstance(p, str))
            print(f"turn {i}: {len(pieces)} pieces, {len(text)} chars: {text[:120]!r}")
            if any(not isinstance(p, str) for p in pieces):
                failures.append(f"turn {i}: binary message in a text-mode reply")
            if len(pieces) < 2:
                failures.append(f"turn {i}: {len(pieces)} piece(s), want a streamed reply (> 1)")
            if not text.strip():
                failures.append(f"turn {i}: empty reply")
        # Exactly one sentinel for the last turn too: nothing else may follow it.
        try:
            extra = await asyncio.wait_for(ws.recv(), 1.0)
            failures.append(f"unexpected message after the last sentinel: {extra!r}")
        except asyncio.TimeoutError:
            pass
    for f in failures:
        print("FAIL:", f, file=sys.stderr)
    return 1 if failures else 0


sys.exit(asyncio.run(main(sys.argv[1])))
EOF
rc=$?
set -e
[ $rc -eq 0 ] || fail "two-turn conversation (see above)"
parley_check_history "$work/server.log"

echo "--- scripts/client.py, prompts from argv"
"$py" "$here/client.py" --url "$PARLEY_URL" "Once upon a time" "Then what happened?" >"$work/argv.out" ||
	fail "client.py (argv) exited with status $?"
head -c 300 "$work/argv.out"
echo
[ -n "$(tr -d '[:space:]' <"$work/argv.out")" ] || fail "client.py (argv) printed no reply"

echo "--- scripts/client.py, prompts from stdin"
printf 'Once upon a time\nThen what happened?\n' | PARLEY_URL=$PARLEY_URL "$py" "$here/client.py" >"$work/stdin.out" ||
	fail "client.py (stdin) exited with status $?"
head -c 300 "$work/stdin.out"
echo
[ -n "$(tr -d '[:space:]' <"$work/stdin.out")" ] || fail "client.py (stdin) printed no reply"

parley_stop
echo "python client test: ok"
