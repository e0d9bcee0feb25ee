#!/bin/sh
# add-a-worker.sh: a provisioner command for `sluice server
# --provisioner-command` that starts one `sluice worker` on this machine
# for the kinds the server says are short of workers.
#
#   sluice server --provisioner-command examples/add-a-worker.sh
#
# The server runs it with `sh -c` (at most once per --provisioner-interval,
# 30s by default) while ready tasks wait with no free worker capacity for
# their kind, or wait for a kind no worker serves; the request is on stdin
# (and in $SLUICE_SHORTFALL):
#
#   {"at":"…","shortfall":[{"queue":"email","kind":"sleep","waiting":3}]}
#
# Each call starts at most one worker, for the built-in kinds of the
# shortfall that `sluice worker` can run (echo, http, sleep; never exec).
#
# Bounded: it never has more than SLUICE_ADD_WORKER_MAX (4) of its workers
# alive at once; at the bound it starts nothing and exits 1, which the
# server logs ("provisioner hook failed") with this script's message. Each
# worker exits by itself after SLUICE_ADD_WORKER_IDLE (5m) with no task
# (--max-idle), which makes room for the next, and gives up after a minute
# if it cannot register (--connect-timeout: a server that stopped while it
# started). The workers stay in the server's process group: `kill` of the
# server's job (the shell signals the whole group) stops them too,
# gracefully.
#
# The worker inherits the server's environment: it needs the worker token
# there (SLUICE_WORKER_TOKEN, as the README's tour exports it; a server
# given only --worker-token on its command line leaves the script none).
#
# Settings (environment variables, all optional):
#   SLUICE_BIN               the sluice binary (default: sluice on PATH)
#   SLUICE_SERVER            the server's URL for the worker (default:
#                            http://$SLUICE_ADDR, else http://127.0.0.1:8080)
#   SLUICE_ADD_WORKER_MAX    most workers of this script alive at once (4)
#   SLUICE_ADD_WORKER_SLOTS  slots of each worker (100)
#   SLUICE_ADD_WORKER_IDLE   each worker's --max-idle (5m)
#   SLUICE_ADD_WORKER_DIR    where pid files and worker logs go
#                            (${TMPDIR:-/tmp}/sluice-add-a-worker-UID)
#
# A real deployment would ask its platform for a machine or a pod here
# (or use --provisioner-url); the shape is the same: read the shortfall,
# start a bounded number of workers that exit when idle.
set -eu

me=add-a-worker.sh
sluice=${SLUICE_BIN:-sluice}
max=${SLUICE_ADD_WORKER_MAX:-4}
slots=${SLUICE_ADD_WORKER_SLOTS:-100}
idle=${SLUICE_ADD_WORKER_IDLE:-5m}
dir=${SLUICE_ADD_WORKER_DIR:-${TMPDIR:-/tmp}/sluice-add-a-worker-$(id -u)}
if [ -n "${SLUICE_SERVER:-}" ]; then
	server=$SLUICE_SERVER
else
	addr=${SLUICE_ADDR:-127.0.0.1:8080}
	case $addr in
	:*) addr=127.0.0.1$addr ;;
	0.0.0.0:*) addr=127.0.0.1:${addr#0.0.0.0:} ;;
	esac
	server=http://$addr
fi

# The request: stdin, or $SLUICE_SHORTFALL when run by hand without one.
if [ -t 0 ]; then request=${SLUICE_SHORTFALL:-}; else request=$(cat); fi
[ -n "$request" ] || request=${SLUICE_SHORTFALL:-}

# The kinds short of workers, once each, and those of them a built-in
# worker runs. (sed, not jq: the request is compact JSON from the server,
# and a kind name holds no quote.)
wanted=$(printf '%s\n' "$request" | grep -o '"kind":"[^"]*"' | sed 's/^"kind":"//; s/"$//' | sort -u)
kinds=
for k in $wanted; do
	case $k in
	echo | http | sleep) kinds=${kinds:+$kinds,}$k ;;
	*) echo "$me: kind \"$k\" is not a built-in kind sluice worker runs; left for your own workers" >&2 ;;
	esac
done
if [ -z "$kinds" ]; then
	echo "$me: no kind in the shortfall that sluice worker runs; started nothing" >&2
	exit 1
fi

mkdir -p "$dir"
# The workers of earlier calls that are still alive.
alive=0
n=0
for f in "$dir"/worker-*.pid; do
	[ -e "$f" ] || continue
	i=${f##*/worker-}
	i=${i%.pid}
	[ "$i" -gt "$n" ] && n=$i
	if kill -0 "$(cat "$f")" 2>/dev/null; then alive=$((alive + 1)); else rm -f "$f" "${f%.pid}.exit"; fi
done
if [ "$alive" -ge "$max" ]; then
	echo "$me: $alive of its workers alive, SLUICE_ADD_WORKER_MAX=$max: started nothing (kinds $kinds)" >&2
	exit 1
fi

n=$((n + 1))
name=provisioned-$n
log=$dir/worker-$n.log
# The subshell lives as long as the worker (its pid is what the next call
# counts) and leaves the worker's exit status behind. Its output goes to
# the log, not to this script's: the server reads this script's output
# until the last process holding it exits, and would wait for the worker.
rm -f "$dir/worker-$n.exit"
(
	# The server's metrics address: a worker that read it would try to
	# bind the same one.
	unset SLUICE_METRICS_ADDR
	status=0
	nohup "$sluice" worker --server "$server" --name "$name" --kinds "$kinds" \
		--slots "$slots" --max-idle "$idle" --connect-timeout 1m || status=$?
	echo "$status" >"$dir/worker-$n.exit"
) </dev/null >>"$log" 2>&1 &
pid=$!
echo "$pid" >"$dir/worker-$n.pid"

# A worker that cannot start (no token, a wrong one) exits at once: say so,
# so that the server logs it.
sleep 1
if [ -e "$dir/worker-$n.exit" ]; then
	rm -f "$dir/worker-$n.pid"
	echo "$me: worker $name exited at once; its log, $log:" >&2
	tail -n 5 "$log" >&2
	exit 1
fi
echo "$me: started worker $name (pid $pid, kinds $kinds, $slots slots, --max-idle $idle, log $log)"
