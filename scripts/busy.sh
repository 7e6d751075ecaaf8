#!/usr/bin/env bash
# Runs a command while a CPU hog keeps every core busy, the way a shared CI runner is: `make test-busy`
# runs scripts/test.sh under it, and `scripts/busy.sh go test -race -run TestX ./web/` checks one test.
#
#   scripts/busy.sh CMD [ARG...]
#
# The hog is twice as many busy threads as cores (BUSY_THREADS to change it): Debian's stress-ng when it is installed,
# else plain shell busy loops. It is bounded twice: stopped when CMD ends (or this script is interrupted), and in any
# case after BUSY_LIMIT (default 120m), so that a killed run never leaves it behind. The exit status is CMD's.
set -uo pipefail
[ $# -gt 0 ] || { echo "usage: scripts/busy.sh CMD [ARG...]" >&2; exit 2; }

threads=${BUSY_THREADS:-$((2 * $(nproc)))}
limit=${BUSY_LIMIT:-120m}
hogs=()

stop_hog() {
	local p
	for p in "${hogs[@]}"; do kill "$p" 2>/dev/null; done
	for p in "${hogs[@]}"; do wait "$p" 2>/dev/null; done
	hogs=()
}
trap stop_hog EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

if command -v stress-ng >/dev/null; then
	echo "busy: stress-ng --cpu $threads --timeout $limit"
	stress-ng --cpu "$threads" --timeout "$limit" --quiet &
	hogs+=($!)
else
	echo "busy: $threads shell busy loops (at most $limit)"
	for _ in $(seq "$threads"); do
		timeout "$limit" bash -c 'while :; do :; done' &
		hogs+=($!)
	done
fi

"$@"
rc=$?
stop_hog
exit $rc
