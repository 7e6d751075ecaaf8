# shellcheck shell=bash
# Helpers the client test scripts source: start bin/parley on a free loopback port with the test model, wait
# until it answers, stop it and report how it exited. Not a test by itself.
#
# After `parley_start LOG`: PARLEY_PID, PARLEY_PORT, PARLEY_URL (ws://127.0.0.1:PORT/) are set, and an EXIT trap
# kills the server (and anything registered with parley_on_exit) whatever way the script ends.

_parley_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PARLEY_BIN=${PARLEY_BIN:-$_parley_root/bin/parley}
PARLEY_TEST_MODEL=${PARLEY_TEST_MODEL:-$_parley_root/../shared/models/stories260K.gguf}
# Seconds to wait for the model to load and the port to answer; stories260K loads in well under a second. Like every
# wait of the suite it polls for the event, and its bound only catches a hang, on a busy machine too.
PARLEY_START_TIMEOUT=${PARLEY_START_TIMEOUT:-120}
# Seconds a SIGTERM'd server may take to drain and exit (a hang catcher as well).
PARLEY_STOP_TIMEOUT=${PARLEY_STOP_TIMEOUT:-60}
# llama.cpp threads for the test server. One: stories260K needs no more, and on a busy 2-core machine two
# spinning threads that lose their core stall each other (measured: 5 tokens/s instead of ~2000 under load).
PARLEY_TEST_THREADS=${PARLEY_TEST_THREADS:-1}

PARLEY_PID=
PARLEY_PORT=
PARLEY_URL=
export PARLEY_URL # for the scripts that source this file
_parley_cleanup=()

fail() {
	echo "FAIL: $*" >&2
	exit 1
}

# parley_on_exit CMD...: run CMD when the script exits (after the server is killed).
parley_on_exit() {
	_parley_cleanup+=("$*")
}

_parley_exit() {
	local rc=$?
	if [ -n "$PARLEY_PID" ] && kill -0 "$PARLEY_PID" 2>/dev/null; then
		kill -KILL "$PARLEY_PID" 2>/dev/null
		wait "$PARLEY_PID" 2>/dev/null || true
	fi
	local c
	for c in "${_parley_cleanup[@]}"; do eval "$c" || true; done
	return $rc
}
trap _parley_exit EXIT

# parley_python: print an interpreter that can import websockets (Debian's python3-websockets installs for
# /usr/bin/python3, which may not be the first python3 on PATH, e.g. under pyenv). PARLEY_PYTHON overrides.
parley_python() {
	local py
	for py in ${PARLEY_PYTHON:-} python3 /usr/bin/python3; do
		if command -v "$py" >/dev/null && "$py" -c 'import websockets' 2>/dev/null; then
			command -v "$py"
			return 0
		fi
	done
	echo "no python3 with the websockets module (apt-get install python3-websockets, or set PARLEY_PYTHON)" >&2
	return 1
}

# free_port: a loopback TCP port nobody listens on right now. The kernel picks it; another process could take it
# before the server binds, which the start timeout then reports.
free_port() {
	local py
	for py in python3 /usr/bin/python3; do
		if command -v "$py" >/dev/null; then
			"$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
			return
		fi
	done
	node -e 'const s = require("net").createServer().listen(0, "127.0.0.1", () => { console.log(s.address().port); s.close(); })'
}

# _http_status PORT PATH: the status code of a plain GET, or nothing if the port does not answer. Pure bash
# (/dev/tcp), because curl is not part of a fresh Debian. Call it in a subshell ($(...)): exec's redirections stick.
_http_status() {
	local fd line
	exec 2>/dev/null {fd}<>"/dev/tcp/127.0.0.1/$1" || return 1
	printf 'GET %s HTTP/1.1\r\nHost: 127.0.0.1:%s\r\nConnection: close\r\n\r\n' "$2" "$1" >&"$fd"
	IFS= read -r -t 5 line <&"$fd" || true
	exec {fd}>&-
	line=${line#HTTP/1.? }
	echo "${line%% *}"
}

# parley_start LOG [FLAG...]: start the server with the test model, logs (JSON) to LOG, sessions in a fresh data
# directory beside LOG, and wait until it serves: GET /health answers anything but 503 (a server without /health
# answers 404, which counts as up). The server gets none of the caller's PARLEY_* variables (each is a flag's
# default, e.g. PARLEY_API_KEY would lock the test out).
parley_start() {
	local log=$1
	shift
	[ -x "$PARLEY_BIN" ] || fail "$PARLEY_BIN not built (make build)"
	[ -f "$PARLEY_TEST_MODEL" ] || fail "test model $PARLEY_TEST_MODEL not found"
	PARLEY_PORT=$(free_port)
	PARLEY_URL="ws://127.0.0.1:$PARLEY_PORT/"
	local unset=() v
	for v in $(compgen -e); do
		case $v in PARLEY_*) unset+=(-u "$v") ;; esac
	done
	mkdir -p "$log.data"
	env "${unset[@]}" "$PARLEY_BIN" --model "$PARLEY_TEST_MODEL" --addr "127.0.0.1:$PARLEY_PORT" \
		--data-dir "$log.data" --threads "$PARLEY_TEST_THREADS" --log-format json "$@" </dev/null >"$log" 2>&1 &
	PARLEY_PID=$!
	local deadline=$((SECONDS + PARLEY_START_TIMEOUT)) status
	while :; do
		if ! kill -0 "$PARLEY_PID" 2>/dev/null; then
			local rc=0
			wait "$PARLEY_PID" || rc=$?
			PARLEY_PID=
			echo "--- server log ($log)" >&2
			tail -n 40 "$log" >&2
			fail "server exited with status $rc before serving"
		fi
		status=$(_http_status "$PARLEY_PORT" /health) || status=
		if [ -n "$status" ] && [ "$status" != 503 ]; then
			echo "server up: pid $PARLEY_PID on 127.0.0.1:$PARLEY_PORT (GET /health: $status)"
			return 0
		fi
		[ $SECONDS -lt $deadline ] || fail "server did not answer on 127.0.0.1:$PARLEY_PORT within ${PARLEY_START_TIMEOUT}s"
		sleep 0.1
	done
}

# parley_replies LOG: the server's per-reply log lines (JSON), one "prompt_tokens reply_tokens finish" line each,
# in order. The lead's log contract: msg "reply" with prompt_tokens, reply_tokens, finish.
parley_replies() {
	"$(command -v python3 || echo /usr/bin/python3)" - "$1" <<'PY'
import json, sys
for line in open(sys.argv[1], encoding="utf-8", errors="replace"):
    try:
        e = json.loads(line)
    except ValueError:
        continue
    if e.get("msg") == "reply":
        print(e.get("prompt_tokens", "?"), e.get("reply_tokens", "?"), e.get("finish", "?"))
PY
}

# parley_check_history LOG: the second reply's prompt must carry the first turn. Proof from the server's own
# counts: turn 2's prompt tokens exceed turn 1's prompt plus half its reply (re-tokenizing a reply may merge a few
# tokens, never half of them).
parley_check_history() {
	local replies p1 r1 p2
	replies=$(parley_replies "$1")
	echo "server replies (prompt_tokens reply_tokens finish): $(echo "$replies" | paste -sd ';' -)"
	[ "$(echo "$replies" | grep -c .)" -eq 2 ] || fail "server logged $(echo "$replies" | grep -c .) replies, want 2"
	{
		read -r p1 r1 _
		read -r p2 _
	} <<<"$replies"
	[[ $p1 =~ ^[0-9]+$ && $r1 =~ ^[0-9]+$ && $p2 =~ ^[0-9]+$ ]] || fail "reply log lines lack prompt_tokens/reply_tokens"
	[ "$p2" -gt $((p1 + r1 / 2)) ] ||
		fail "turn 2's prompt has $p2 tokens, not more than turn 1's $p1 + half its $r1-token reply: history lost?"
	echo "history: turn 2's prompt ($p2 tokens) carries turn 1 ($p1 + $r1 tokens)"
}

# parley_stop: SIGTERM the server and check the graceful shutdown the design promises: exit status 0 within
# PARLEY_STOP_TIMEOUT seconds.
parley_stop() {
	[ -n "$PARLEY_PID" ] || return 0
	kill -TERM "$PARLEY_PID" 2>/dev/null || true
	local deadline=$((SECONDS + PARLEY_STOP_TIMEOUT))
	while kill -0 "$PARLEY_PID" 2>/dev/null; do
		if [ $SECONDS -ge $deadline ]; then
			kill -KILL "$PARLEY_PID" 2>/dev/null
			wait "$PARLEY_PID" 2>/dev/null || true
			PARLEY_PID=
			fail "server did not exit within ${PARLEY_STOP_TIMEOUT}s of SIGTERM"
		fi
		sleep 0.1
	done
	local rc=0
	wait "$PARLEY_PID" || rc=$?
	PARLEY_PID=
	[ $rc -eq 0 ] || fail "server exited with status $rc after SIGTERM (want 0)"
	echo "server stopped: exit 0 after SIGTERM"
}
