#!/usr/bin/env bash
# Catch-up of a new walserver standby on tmpfs (or the disk), alternating walserver builds.
#
#   benches/standby-catchup.sh MIB ROUNDS BIN [BIN...]
#   STANDBY_DIR=/var/tmp benches/standby-catchup.sh MIB ROUNDS BIN [BIN...]
#
# One walserver primary (the first BIN, data directory on the disk under /var/tmp) holds MIB
# MiB of 8 KiB records behind one physical slot per standby. Then, ROUNDS times, each BIN in
# turn starts a new standby under STANDBY_DIR (/dev/shm unless set; /var/tmp puts it on the
# disk, fsync on) (`walserver init --standby` through its slot) and is
# timed by `walserver bench wait-lsn` from the first position it reports to the primary's
# end. Printed per run: MB/s, the CPU ticks the primary spent over the catch-up and the
# standby's whole CPU ticks (both from /proc/PID/stat), the 1-minute load average. Set PERF=1
# to record a `perf record -g` profile of each standby in /tmp/perf.stN.data; PERF_ARGS
# replaces perf's target (`-p STANDBY_PID` by default): `PERF_ARGS=-a` samples the whole
# machine, primary and standby together, which on a VM whose per-process sampling yields only
# a few hundred samples a run is the only way to see where the catch-up's CPU goes.
#
# Everything is on 127.0.0.1; the directories and processes are removed at exit. On a VM
# that reports free memory to its host, the reporting is held off for the run and the memory
# touched once first (benches/vm-memory.sh; VM_MEMORY_KEEP=1 leaves the machine alone).
set -euo pipefail
. "$(dirname "$0")/vm-memory.sh"
MIB=$1; ROUNDS=$2; shift 2; BINS=("$@")
W=$(mktemp -d /var/tmp/standby-catchup.XXXXXX); S=$(mktemp -d "${STANDBY_DIR:-/dev/shm}/standby-catchup.XXXXXX")
PIDS=()
cleanup() { set +e; for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done; wait 2>/dev/null; rm -rf "$W" "$S"; vm_memory_release; }
trap cleanup EXIT
vm_memory_hold
echo "memory: $VM_MEMORY_STATE"
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
ticks() { awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$1/stat"; }
WS=${BINS[0]}; P=$(free_port); H=$(free_port)
"$WS" init --data-dir "$W/primary" >/dev/null
setsid "$WS" run -c "data_dir=$W/primary" -c "listen=127.0.0.1:$P" -c "http_listen=127.0.0.1:$H" \
    -c log_level=warn 2> "$W/primary.log" &
PRIMARY=$!; PIDS+=("$PRIMARY")
for _ in $(seq 1 500); do curl -sf "http://127.0.0.1:$H/status" >/dev/null && break; sleep 0.02; done
N=$((ROUNDS * ${#BINS[@]}))
for i in $(seq 1 "$N"); do
    psql -X -Atq "host=127.0.0.1 port=$P user=postgres replication=true" \
        -c "CREATE_REPLICATION_SLOT s$i PHYSICAL RESERVE_WAL" >/dev/null
done
"$WS" bench append --http "127.0.0.1:$H" --durability local --size 8192 --batch 128 --writers 2 \
    --bytes $((MIB << 20)) --json >/dev/null
END=$(curl -sf "http://127.0.0.1:$H/status" | jq -r .flush_lsn); sync
vm_memory_touch /dev/shm
# Touching the memory pushed the primary's WAL out of the page cache; read it back, so that
# every round (the first too) sends from the page cache.
find "$W/primary/pg_wal" -type f -exec cat {} + > /dev/null
i=0
for r in $(seq 1 "$ROUNDS"); do
    for b in "${BINS[@]}"; do
        i=$((i + 1))
        "$b" init --standby --data-dir "$S/st$i" --primary-slot-name "s$i" \
            --primary-conninfo "host=127.0.0.1 port=$P user=postgres application_name=st$i" >/dev/null
        sp=$(free_port); sh=$(free_port); c0=$(ticks "$PRIMARY")
        setsid "$b" run -c "data_dir=$S/st$i" -c "listen=127.0.0.1:$sp" -c "http_listen=127.0.0.1:$sh" \
            -c log_level=warn 2> "$W/st$i.log" &
        spid=$!; PIDS+=("$spid")
        if [ -n "${PERF:-}" ]; then perf record -F 999 -g ${PERF_ARGS:--p "$spid"} -o "/tmp/perf.st$i.data" 2>/dev/null & pp=$!; fi
        wj=$(timeout 300 "$b" bench wait-lsn --port "$sp" --user postgres --target "$END" --interval-ms 2 --json)
        if [ -n "${PERF:-}" ]; then kill -INT "$pp"; wait "$pp" 2>/dev/null || true; fi
        c1=$(ticks "$PRIMARY"); sc=$(ticks "$spid")
        echo "round $r $(basename "$b"): $(jq -r '.window_mb_per_s | floor' <<< "$wj") MB/s  primary ticks $((c1 - c0))  standby ticks $sc  load $(cut -d' ' -f1 /proc/loadavg)"
        kill -TERM "$spid"; wait "$spid" 2>/dev/null || true; rm -rf "${S:?}/st$i"
    done
done
