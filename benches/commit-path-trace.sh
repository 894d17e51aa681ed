#!/bin/sh
# One synchronous commit's stages, from a recording of a 1-writer in-process cluster's
# system calls.
#
#   benches/commit-path-trace.sh [BIN] [extra `bench append` arguments, e.g. --dir /dev/shm]
#
# Runs `BIN bench append --cluster 1 --durability on --size 100 --writers 1 --seconds 9`
# (BIN defaults to target/release/walserver), records 3 s of it from its 3rd second with
# `perf record` of the system-call tracepoints (every call of the process: about forty per
# commit, each slowed by a microsecond or so), and prints the median and 10th/90th
# percentiles of each stage between the calls that mark them (pwritev, fdatasync, writev,
# sendto, recvfrom; benches/commit-path-trace.py), and the calls that mark hand-offs per commit.
# With --commit-overlap among the arguments the stages are those of the overlapped commit,
# with how often the standby's write began before the primary's fdatasync ended.
# PIN=CPU runs it on that one CPU (taskset). Needs perf and python3; see benches/commit-path.md
# (benches/commit-path-pg.sh traces PostgreSQL's commit the same way).
set -eu
bin=${1:-target/release/walserver}
[ $# -gt 0 ] && shift
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
pin=""
[ -n "${PIN:-}" ] && pin="taskset -c $PIN"
$pin "$bin" bench append --cluster 1 --durability on --size 100 --writers 1 --seconds 9 "$@" \
    > "$out/bench" 2>&1 &
b=$!
sleep 3
perf record -q -o "$out/perf.data" -e raw_syscalls:sys_enter -e raw_syscalls:sys_exit -p "$b" -- sleep 3 \
    2>/dev/null || true
wait "$b"
perf script -i "$out/perf.data" -F comm,tid,time,event,trace > "$out/trace" 2>/dev/null
mode=""
for a in "$@"; do [ "$a" = --commit-overlap ] && mode=--overlap; done
python3 "$(dirname "$0")/commit-path-trace.py" $mode "$out/trace"
grep -E 'throughput|latency' "$out/bench"
