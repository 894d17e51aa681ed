#!/bin/sh
# One synchronous commit's stages, from a light `perf trace` of a 1-writer in-process cluster.
#
#   benches/commit-path-trace.sh [BIN] [extra `bench append` arguments, e.g. --dir /dev/shm]
#
# Runs `BIN bench append --cluster 1 --durability on --size 100 --writers 1 --seconds 9`
# (BIN defaults to target/release/walserver), traces 3 s of it from its 3rd second with only
# the system calls that mark the stages (pwritev, fdatasync, writev, sendto, recvfrom: about
# ten per commit, so the trace slows each commit by tens of microseconds, not by a factor),
# and prints each stage's median and 10th/90th percentiles (benches/commit-path-trace.py).
# Needs perf and python3; see benches/commit-path.md.
set -eu
bin=${1:-target/release/walserver}
[ $# -gt 0 ] && shift
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$bin" bench append --cluster 1 --durability on --size 100 --writers 1 --seconds 9 "$@" \
    > "$out/bench" 2>&1 &
b=$!
sleep 3
perf trace -o "$out/trace" -p "$b" -e 'fdatasync,pwritev,writev,sendto,recvfrom' -- sleep 3 \
    2>/dev/null || true
wait "$b"
python3 "$(dirname "$0")/commit-path-trace.py" "$out/trace"
grep -E 'throughput|latency' "$out/bench"
