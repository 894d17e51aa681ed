#!/usr/bin/env bash
# What one pg_receivewal pays to receive the same WAL from walserver and from PostgreSQL 15.
#
#   benches/receivewal-cost.sh                       # 1 GiB, 6 runs of each, into /dev/shm
#   benches/receivewal-cost.sh --mib 512 --runs 2 --strace --dir /var/tmp
#   benches/receivewal-cost.sh --mib 512 --runs 2 --perf /tmp/receivewal-perf
#   benches/receivewal-cost.sh --mib 512 --runs 2 --dir /var/tmp --offcpu /tmp/receivewal-sched
#
# A PostgreSQL 15 primary is filled with MIB MiB of WAL (INSERTs of 500-byte rows) and a
# walserver primary (`walserver run`, release build) with as much (8 KiB records through
# `POST /wal`), each behind one physical slot per run made before the WAL. Then, RUNS times and
# alternating which server goes first, one plain pg_receivewal (`--no-loop`, `--endpos` one
# byte short of the end, writing into a new directory under DIR) catches up from each. Printed
# per catch-up: MB/s, and the client's CPU per MB (user and system, from `time`); with
# `--strace`, the client runs under `strace -c` and its system calls per MB follow (the counts
# are the point; strace slows the run, so its MB/s say nothing). `--synchronous` runs the
# client with `--synchronous`, which fsyncs each time it has drained the socket: how often
# that is depends on how the server's sends arrive, so there the fsync count is a server's
# doing. `--perf DIR` records each client run under `perf record` (cpu-clock, 4999 Hz) into
# DIR/SYSTEM-RUN.data and prints its ten busiest symbols: where the client's time goes when
# one server or the other feeds it (perf's own cost is in that run's CPU per MB). `--offcpu
# DIR` records the whole machine's scheduler switches and wake-ups with call chains while each
# client runs (DIR/SYSTEM-RUN.data) and prints where the client spent its time: running, and
# off the CPU waiting for data (in pselect), for its fsyncs and other disk I/O, or preempted
# while runnable; so whether a server keeps it waiting shows apart from its own work. perf's
# start and the writing of its file are in that run's MB/s: read the recorded time instead.
#
# pg_receivewal's work is the same whichever server feeds it when its system calls are (it
# copies what it receives into its own buffer and writes it to the segment files); if the
# counts match and the CPU per MB still differs, the difference is the client's machine, not
# the server.
#
# Everything runs on 127.0.0.1; the directories, servers and processes are removed at exit. On
# a VM that reports free memory to its host, the reporting is held off for the run and the
# memory touched once first (benches/vm-memory.sh; VM_MEMORY_KEEP=1 leaves the machine alone).
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/vm-memory.sh

MIB=1024 RUNS=6 STRACE=0 DIR=/dev/shm SYNC=() PERF_OUT="" OFFCPU_OUT=""
while [ $# -gt 0 ]; do
    case "$1" in
        --mib) MIB="$2"; shift 2 ;;
        --runs) RUNS="$2"; shift 2 ;;
        --strace) STRACE=1; shift ;;
        --perf) PERF_OUT="$2"; shift 2 ;;
        --offcpu) OFFCPU_OUT="$2"; shift 2 ;;
        --dir) DIR="$2"; shift 2 ;;
        --synchronous) SYNC=(--synchronous); shift ;;
        -h|--help) sed -n '2,35p' "$0"; exit 0 ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done

PG_BIN="${WALSERVER_PG_BIN:-/usr/lib/postgresql/15/bin}"
for tool in initdb pg_ctl psql pg_receivewal; do
    [ -x "$PG_BIN/$tool" ] || { echo "PostgreSQL 15's $tool is missing in $PG_BIN (apt-get install postgresql-15)" >&2; exit 1; }
done
for tool in jq curl python3; do
    command -v "$tool" >/dev/null || { echo "$tool is missing" >&2; exit 1; }
done
[ "$STRACE" = 0 ] || command -v strace >/dev/null || { echo "strace is missing (apt-get install strace)" >&2; exit 1; }
if [ -n "$PERF_OUT" ]; then
    [ "$STRACE" = 0 ] || { echo "--perf and --strace do not go together" >&2; exit 2; }
    command -v perf >/dev/null || { echo "perf is missing (apt-get install linux-perf)" >&2; exit 1; }
    mkdir -p "$PERF_OUT"
fi
if [ -n "$OFFCPU_OUT" ]; then
    [ "$STRACE" = 0 ] && [ -z "$PERF_OUT" ] || { echo "--offcpu goes with neither --perf nor --strace" >&2; exit 2; }
    command -v perf >/dev/null || { echo "perf is missing (apt-get install linux-perf)" >&2; exit 1; }
    mkdir -p "$OFFCPU_OUT"
fi

cargo build --release -j2 --quiet --bin walserver --bin walserver-bench
WS="$PWD/target/release/walserver"

WORK=$(mktemp -d /var/tmp/receivewal-cost.XXXXXX)
OUT=$(mktemp -d "$DIR/receivewal-cost.XXXXXX")
TOUCH=$(mktemp -d /dev/shm/receivewal-cost-touch.XXXXXX)
chmod 755 "$WORK" "$OUT"
PGP="$WORK/pg"
WS_PID=""
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
cleanup() {
    set +e
    [ -n "$WS_PID" ] && kill -TERM "$WS_PID" 2>/dev/null && wait "$WS_PID" 2>/dev/null
    [ -f "$PGP/postmaster.pid" ] && as_pg "$PG_BIN/pg_ctl" -D "$PGP" -m immediate -w stop >/dev/null 2>&1
    rm -rf "$WORK" "$OUT" "$TOUCH"
    vm_memory_release
}
trap cleanup EXIT
trap 'exit 130' INT TERM
vm_memory_hold
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
lsn2int() { local hi=${1%/*} lo=${1#*/}; echo $(( (16#$hi << 32) + 16#$lo )); }
int2lsn() { printf '%X/%X\n' $(( $1 >> 32 )) $(( $1 & 0xFFFFFFFF )); }
seg_start() { echo $(( $1 / (16 << 20) * (16 << 20) )); }

PG_PORT=$(free_port); WS_PORT=$(free_port); WS_HTTP=$(free_port)
mkdir -p "$PGP"
[ "$(id -u)" = 0 ] && chown -R postgres:postgres "$WORK" "$OUT"
as_pg "$PG_BIN/initdb" -D "$PGP" -U postgres --auth=trust -E UTF8 --locale=C -N >/dev/null
cat >> "$PGP/postgresql.conf" <<EOF
port = $PG_PORT
listen_addresses = '127.0.0.1'
unix_socket_directories = ''
wal_level = replica
max_wal_senders = 10
max_replication_slots = $(( RUNS + 10 ))
max_wal_size = '16GB'
checkpoint_timeout = '1h'
shared_buffers = '256MB'
autovacuum = off
EOF
printf 'host all all 127.0.0.1/32 trust\nhost replication all 127.0.0.1/32 trust\n' > "$PGP/pg_hba.conf"
as_pg "$PG_BIN/pg_ctl" -D "$PGP" -l "$WORK/pg.log" -w start >/dev/null
psql_pg() { "$PG_BIN/psql" -X -A -t -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres -c "$1"; }

"$WS" init --data-dir "$WORK/ws" >/dev/null
setsid "$WS" run -c "data_dir=$WORK/ws" -c "listen=127.0.0.1:$WS_PORT" -c "http_listen=127.0.0.1:$WS_HTTP" \
    -c log_level=warn 2> "$WORK/ws.log" &
WS_PID=$!
for _ in $(seq 1 500); do curl -sf "http://127.0.0.1:$WS_HTTP/status" >/dev/null && break; sleep 0.02; done

for i in $(seq 1 "$RUNS"); do
    psql_pg "SELECT pg_create_physical_replication_slot('s$i', true)" >/dev/null
    "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 "host=127.0.0.1 port=$WS_PORT user=postgres replication=true" \
        -c "CREATE_REPLICATION_SLOT s$i PHYSICAL RESERVE_WAL" >/dev/null
done

psql_pg "CREATE TABLE fill (id int, filler text)"
PG_START=$(seg_start "$(lsn2int "$(psql_pg "SELECT restart_lsn FROM pg_replication_slots WHERE slot_name = 's1'")")")
n=0
while [ "$(lsn2int "$(psql_pg "SELECT pg_current_wal_lsn()")")" -lt $(( PG_START + (MIB << 20) )) ]; do
    psql_pg "INSERT INTO fill SELECT g, repeat('y', 500) FROM generate_series($n, $n + 49999) g"
    n=$((n + 50000))
done
PG_END=$(lsn2int "$(psql_pg "SELECT pg_current_wal_flush_lsn()")")
WS_START=$(seg_start "$(lsn2int "$(curl -sf "http://127.0.0.1:$WS_HTTP/slots" | jq -r '.[] | select(.slot_name == "s1") | .restart_lsn')")")
"$WS" bench append --http "127.0.0.1:$WS_HTTP" --durability local --size 8192 --batch 128 --writers 2 \
    --bytes $(( PG_END - PG_START )) --json >/dev/null
WS_END=$(lsn2int "$(curl -sf "http://127.0.0.1:$WS_HTTP/status" | jq -r .flush_lsn)")
psql_pg "CHECKPOINT"
sync
vm_memory_touch "$TOUCH"
echo "$(date -u '+%Y-%m-%d %H:%M UTC'); $(nproc) CPUs, $(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo);" \
    "pg_receivewal into $(df --output=fstype "$OUT" | tail -1); load average $(cut -d' ' -f1-3 /proc/loadavg); memory: $VM_MEMORY_STATE"
echo "PostgreSQL: $(( PG_END - PG_START )) bytes; walserver: $(( WS_END - WS_START )) bytes"

# one SYSTEM RUN: one catch-up, one line.
# Where the client's time went, from a recording of the machine's scheduler switches with call
# chains: its time on a CPU, and each stretch off one from the moment it was switched out to the
# moment it ran again, classed by where it slept (the innermost recognisable kernel function).
offcpu() {
    perf script -i "$1" -F comm,tid,time,event,trace,ip,sym 2>/dev/null | awk '
    /sched:sched_switch/ {
        t = $3; sub(":", "", t); prev = ""; nxt = ""
        if (first == "") first = t
        last = t
        for (i = 4; i <= NF; i++) {
            if ($i ~ /^prev_pid=/) prev = substr($i, 10)
            if ($i ~ /^next_pid=/) nxt = substr($i, 10)
        }
        if (nxt in out) { off[cls[nxt]] += t - out[nxt]; n[cls[nxt]]++; delete out[nxt] }
        if ($0 ~ /next_comm=pg_receivewal /) on_at[nxt] = t
        grab = ($0 ~ /prev_comm=pg_receivewal /)
        if (grab) { pid = prev; at = t; c = ""; if (pid in on_at) run += t - on_at[pid] }
        next
    }
    /sched:sched_wakeup/ { grab = 0; next }
    grab && NF >= 2 && c == "" {
        if ($2 ~ /do_select|do_poll|poll_schedule/) c = "waiting for data"
        else if ($2 ~ /fsync|io_schedule|folio_wait|submit_bio|bit_wait|blkdev|balance_dirty/) c = "its fsyncs and disk I/O"
        else if ($2 ~ /exit_to_user|cond_resched|preempt/) c = "preempted, runnable"
    }
    /^$/ { if (grab) { out[pid] = at; cls[pid] = (c == "" ? "elsewhere" : c) } grab = 0 }
    END {
        printf "    recorded %27.1f ms (the MB/s above counts perf starting and stopping)\n", (last - first) * 1000
        printf "    on a CPU %27.1f ms\n", run * 1000
        for (k in off) printf "    off: %-24s %6.1f ms, %5d times\n", k, off[k] * 1000, n[k]
    }'
}

one() {
    local sys=$1 r=$2 port start end d="$OUT/$1-$2" st="$WORK/strace-$1-$2" t real user sysc mb
    if [ "$sys" = pg ]; then port=$PG_PORT start=$PG_START end=$PG_END; else port=$WS_PORT start=$WS_START end=$WS_END; fi
    mkdir -p "$d"
    local pre=()
    [ "$STRACE" = 1 ] && pre=(strace -c -o "$st")
    [ -n "$PERF_OUT" ] && pre=(perf record -q -e cpu-clock -F 4999 -o "$PERF_OUT/$sys-$r.data" --)
    [ -n "$OFFCPU_OUT" ] && pre=(perf record -q -a -g -e sched:sched_switch -e sched:sched_wakeup \
        -o "$OFFCPU_OUT/$sys-$r.data" --)
    local TIMEFORMAT='%R %U %S'
    t=$( { time "${pre[@]}" "$PG_BIN/pg_receivewal" -h 127.0.0.1 -p "$port" -U postgres -D "$d" --slot "s$r" \
        "${SYNC[@]}" --endpos "$(int2lsn $(( end - 1 )))" -n -w >/dev/null 2>"$d.err"; } 2>&1 ) \
        || { echo "pg_receivewal failed:" >&2; cat "$d.err" >&2; exit 1; }
    read -r real user sysc <<< "$t"
    mb=$(awk -v b=$(( end - start )) 'BEGIN { print b / 1e6 }')
    awk -v s="$sys" -v r="$r" -v mb="$mb" -v t="$real" -v u="$user" -v y="$sysc" 'BEGIN {
        printf "run %d %-10s %6.0f MB/s  client CPU %.3f ms/MB (user %.3f, system %.3f)\n",
            r, s == "pg" ? "PostgreSQL" : "walserver", mb / t, (u + y) * 1000 / mb, u * 1000 / mb, y * 1000 / mb }'
    if [ -n "$PERF_OUT" ]; then
        perf report -i "$PERF_OUT/$sys-$r.data" --no-children -n --sort sym 2>/dev/null \
            | awk '/^ *[0-9.]+%/ && n++ < 10 { printf "    %-8s %6d samples  %s\n", $1, $2, $4 }'
    fi
    [ -z "$OFFCPU_OUT" ] || offcpu "$OFFCPU_OUT/$sys-$r.data"
    if [ "$STRACE" = 1 ]; then
        # strace -c: "% time, seconds, usecs/call, calls, [errors,] syscall", busiest first.
        awk -v mb="$mb" '$1 ~ /^[0-9.]+$/ && NF >= 5 && $NF != "total" {
            printf "    %-12s %8.2f per MB\n", $NF, $4 / mb }' "$st" | head -8
    fi
    rm -rf "$d" "$d.err"
}

for r in $(seq 1 "$RUNS"); do
    if [ $((r % 2)) = 1 ]; then one pg "$r"; one ws "$r"; else one ws "$r"; one pg "$r"; fi
done
