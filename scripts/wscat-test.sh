#!/usr/bin/env bash
# npm's wscat (scripts/node_modules/.bin/wscat) against a real bin/parley on stories260K, two ways:
#
# 1. Scripted: `wscat -c URL -x PROMPT1 -x PROMPT2 -w SECONDS`. wscat sends both prompts as soon as it connects,
#    so the server must queue the second behind the first reply (never interleave), and prints each message on its
#    own line. wscat exits as soon as its stdin closes, even with -x, so stdin is a FIFO held open meanwhile.
# 2. Interactive, as a person uses it: `wscat -c URL` on a pseudo-terminal (util-linux `script`); the test waits
#    for "Connected", types the first prompt, waits for the sentinel, types the second, then presses Ctrl+C. On a
#    terminal wscat starts every message with a line-clear escape, so the pieces can be counted exactly.
#
# Both assert, per turn: a non-empty reply, exactly one "<<Response Finished>>" and nothing after the last one;
# more than one piece (exact in 2; in 1 wscat's line-per-message output can only show more than one line).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/testlib.sh"

wscat=$here/node_modules/.bin/wscat
[ -x "$wscat" ] || fail "$wscat missing (cd scripts && npm ci)"
command -v script >/dev/null || fail "script (util-linux) missing"
py=$(command -v python3 || echo /usr/bin/python3)
SENTINEL='<<Response Finished>>'
PROMPT1='Once upon a time, there was a little cat named Tom.'
PROMPT2='What did Tom do next?'
# Seconds one reply may take; stories260K answers in well under one: the bound only catches a hang.
REPLY_TIMEOUT=${REPLY_TIMEOUT:-120}

work=$(mktemp -d)
[ -n "${KEEP_WORK:-}" ] || parley_on_exit rm -rf "$work"
child=
# shellcheck disable=SC2016 # expanded when the trap runs
parley_on_exit '[ -z "$child" ] || kill -KILL "$child" 2>/dev/null'

# count FILE: how many sentinels FILE holds so far.
count() { grep -o -F -- "$SENTINEL" "$1" | wc -l; }

# wait_sentinels FILE N: until FILE holds N sentinels; fails if the child exits first or time runs out.
wait_sentinels() {
	local deadline=$((SECONDS + REPLY_TIMEOUT))
	while [ "$(count "$1")" -lt "$2" ]; do
		kill -0 "$child" 2>/dev/null || { cat "$1" >&2; fail "wscat exited after $(count "$1") of $2 replies"; }
		[ $SECONDS -lt $deadline ] || { cat "$1" >&2; fail "no reply $2 within ${REPLY_TIMEOUT}s"; }
		sleep 0.05
	done
}

parley_start "$work/server.log"

echo "--- 1. wscat -x (both prompts at once; the server queues the second)"
mkfifo "$work/stdin1"
exec {hold}<>"$work/stdin1" # keeps wscat's stdin open; never written
"$wscat" -c "$PARLEY_URL" -x "$PROMPT1" -x "$PROMPT2" -w $((2 * REPLY_TIMEOUT)) <"$work/stdin1" >"$work/x.out" 2>"$work/x.err" &
child=$!
wait_sentinels "$work/x.out" 2
sleep 1 # room for anything that should not come
kill "$child" 2>/dev/null || true
wait "$child" 2>/dev/null || true
child=
exec {hold}>&-
[ ! -s "$work/x.err" ] || { cat "$work/x.err" >&2; fail "wscat -x wrote errors"; }
"$py" - "$work/x.out" "$SENTINEL" <<'EOF' || fail "wscat -x conversation (see above)"
import sys

out, sentinel = open(sys.argv[1], encoding="utf-8", newline="").read(), sys.argv[2]
# wscat (stdout not a terminal) writes each message then "\n": a sentinel is a line of its own.
lines = out.split("\n")
assert lines[-1] == "", "output does not end with a newline"
turns, cur = [], []
for line in lines[:-1]:
    if line == sentinel:
        turns.append(cur)
        cur = []
    else:
        cur.append(line)
failures = []
if cur:
    failures.append(f"{len(cur)} line(s) after the last sentinel: {cur[:3]!r}")
if len(turns) != 2:
    failures.append(f"{len(turns)} sentinels, want 2 (one per prompt)")
for i, t in enumerate(turns, 1):
    text = "\n".join(t)
    print(f"turn {i}: {len(t)} lines, {len(text)} chars (lines joined): {''.join(t)[:100]!r}")
    if len(t) < 2:
        failures.append(f"turn {i}: {len(t)} line(s), want a streamed reply (> 1 message)")
    if not text.strip():
        failures.append(f"turn {i}: empty reply")
for f in failures:
    print("FAIL:", f, file=sys.stderr)
sys.exit(1 if failures else 0)
EOF

parley_check_history "$work/server.log"

echo "--- 2. wscat interactive on a terminal (type, wait, type, Ctrl+C)"
mkfifo "$work/stdin2"
exec {keys}<>"$work/stdin2"
script -q -f -e -c "$(printf '%q ' "$wscat" --no-color -c "$PARLEY_URL")" /dev/null <"$work/stdin2" >"$work/tty.out" 2>&1 &
child=$!
deadline=$((SECONDS + REPLY_TIMEOUT))
until grep -q 'Connected (press CTRL+C to quit)' "$work/tty.out"; do
	kill -0 "$child" 2>/dev/null || { cat "$work/tty.out" >&2; fail "wscat exited before connecting"; }
	[ $SECONDS -lt $deadline ] || { cat "$work/tty.out" >&2; fail "wscat did not connect"; }
	sleep 0.05
done
printf '%s\r' "$PROMPT1" >&"$keys"
wait_sentinels "$work/tty.out" 1
printf '%s\r' "$PROMPT2" >&"$keys"
wait_sentinels "$work/tty.out" 2
sleep 1
printf '\003' >&"$keys" # Ctrl+C: wscat closes the socket and exits
deadline=$((SECONDS + REPLY_TIMEOUT))
while kill -0 "$child" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.05; done
kill -0 "$child" 2>/dev/null && fail "wscat did not exit on Ctrl+C"
wait "$child" 2>/dev/null || true
child=
exec {keys}>&-
"$py" - "$work/tty.out" "$SENTINEL" <<'EOF' || fail "interactive wscat conversation (see above)"
import re
import sys

raw, sentinel = open(sys.argv[1], encoding="utf-8", errors="replace", newline="").read(), sys.argv[2]
# On a terminal wscat prints an incoming message as CR, erase-line, cursor-back, "< ", the message, colour reset,
# newline (the pty turns "\n" into "\r\n", also inside a message).
msgs = [m.replace("\r\n", "\n") for m in re.findall(r"\r\x1b\[2K\x1b\[3D< (.*?)\x1b\[39m\r\n", raw, re.S)]
turns, cur = [], []
for m in msgs:
    if m == sentinel:
        turns.append(cur)
        cur = []
    else:
        cur.append(m)
failures = []
if cur:
    failures.append(f"{len(cur)} message(s) after the last sentinel: {cur[:3]!r}")
if len(turns) != 2:
    failures.append(f"{len(turns)} sentinels, want 2 (one per prompt)")
for i, t in enumerate(turns, 1):
    text = "".join(t)
    print(f"turn {i}: {len(t)} pieces, {len(text)} chars: {text[:120]!r}")
    if len(t) < 2:
        failures.append(f"turn {i}: {len(t)} piece(s), want a streamed reply (> 1)")
    if not text.strip():
        failures.append(f"turn {i}: empty reply")
if "Disconnected" in raw and "code: 1000" not in raw:
    failures.append("wscat reports an abnormal close: " + raw[raw.index("Disconnected"):][:80])
for f in failures:
    print("FAIL:", f, file=sys.stderr)
sys.exit(1 if failures else 0)
EOF

parley_stop
echo "wscat test: ok"
