#!/usr/bin/env bash
# The walsender's cost per MB sent, in figures that a busy machine moves little: CPU time,
# context switches and system calls of the sending process per MB of catch-up.
#
#   benches/send-path.sh                         # target/release/walserver, 256 MiB, 5 runs
#   benches/send-path.sh --bin PATH --mib 512 --runs 7 --strace --dir /dev/shm --pin
#   benches/send-path.sh --postgres              # the same client against PostgreSQL 15
#
# A walserver primary (`walserver run`, a child process, data directory under --dir, default
# /var/tmp, so the segments are real files in the page cache) is filled with --mib MiB of
# 64 KiB records through `POST /wal`; then `walserver bench catchup` (a plain protocol client
# in its own process that discards what it gets) streams all of it from the first segment,
# --runs times after one warm-up run. Around each run the script reads, for every thread of
# the server, its CPU time (`/proc/PID/task/TID/schedstat`, nanoseconds; cross-checked with
# utime + stime of `/proc/PID/stat`, which also counts threads that have ended) and its
# voluntary and involuntary context switches (`/proc/PID/task/TID/status`). With --strace,
# one more run under `strace -c -f` counts the server's system calls (strace slows the run;
# the counts, not the times, are the point).
#
# With --postgres the same client streams the same volume of WAL (INSERTs of 500-byte rows)
# from a PostgreSQL 15 primary; the walsender is a process of its own, found in
# pg_stat_replication while the client streams, and measured the same way.
#
# Prints one line per run and the medians; every figure is per MB (10^6 bytes) sent.
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=target/release/walserver
MIB=256
RUNS=5
STRACE=0
POSTGRES=0
DIR=/var/tmp
PIN=0
while [ $# -gt 0 ]; do
    case "$1" in
        --bin) BIN="$2"; shift 2 ;;
        --mib) MIB="$2"; shift 2 ;;
        --runs) RUNS="$2"; shift 2 ;;
        --strace) STRACE=1; shift ;;
        --postgres) POSTGRES=1; shift ;;
        --dir) DIR="$2"; shift 2 ;;
        --pin) PIN=1; shift ;;
        -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
# --pin: the server on CPU 0, the client on CPU 1, so that every run puts them on the same
# cores (the figures differ a lot between sharing a core and not).
SERVER_CPU=(); CLIENT_CPU=()
if [ "$PIN" = 1 ]; then SERVER_CPU=(taskset -c 0); CLIENT_CPU=(taskset -c 1); fi
[ -x "$BIN" ] || { echo "$BIN is missing: cargo build --release" >&2; exit 1; }
PG_BIN="${WALSERVER_PG_BIN:-/usr/lib/postgresql/15/bin}"

WORK=$(mktemp -d "$DIR/sendpath.XXXXXX")
chmod 755 "$WORK"
SERVER_PID=
PG_DATA=
cleanup() {
    if [ -n "$SERVER_PID" ]; then kill "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true; fi
    if [ -n "$PG_DATA" ]; then runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$PG_DATA" -m immediate stop >/dev/null 2>&1 || true; fi
    rm -rf "$WORK"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# Sums over the threads of process $1: "cpu_ns voluntary involuntary threads".
threads_snapshot() {
    local pid=$1 ns=0 vol=0 inv=0 n=0 t v i
    for t in /proc/"$pid"/task/*; do
        read -r v _ < "$t/schedstat" 2>/dev/null || continue
        ns=$((ns + v)); n=$((n + 1))
        v=$(awk '/^voluntary_ctxt_switches/ {print $2}' "$t/status" 2>/dev/null || echo 0)
        i=$(awk '/^nonvoluntary_ctxt_switches/ {print $2}' "$t/status" 2>/dev/null || echo 0)
        vol=$((vol + ${v:-0})); inv=$((inv + ${i:-0}))
    done
    echo "$ns $vol $inv $n"
}
# TCP segments sent by this machine so far (every connection; the catch-up is most of them).
out_segs() { awk '/^Tcp:/ { if (h) { for (i = 1; i <= NF; i++) if (n[i] == "OutSegs") print $i } else { h = 1; for (i = 1; i <= NF; i++) n[i] = $i } }' /proc/net/snmp; }
# utime + stime of the whole process in clock ticks (ended threads included).
proc_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

PORT=$(free_port)
if [ "$POSTGRES" = 1 ]; then
    PG_DATA="$WORK/pg"
    chown postgres "$WORK"
    runuser -u postgres -- "$PG_BIN/initdb" -D "$PG_DATA" -A trust -U postgres >/dev/null
    cat >> "$PG_DATA/postgresql.conf" <<EOF
port = $PORT
listen_addresses = '127.0.0.1'
unix_socket_directories = '$WORK'
wal_level = replica
max_wal_senders = 4
wal_keep_size = '$((MIB * 2))MB'
max_wal_size = '$((MIB * 4))MB'
fsync = off
synchronous_commit = off
EOF
    echo "host replication all 127.0.0.1/32 trust" >> "$PG_DATA/pg_hba.conf"
    "${SERVER_CPU[@]}" runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$PG_DATA" -l "$WORK/pg.log" -w start >/dev/null
    psql() { runuser -u postgres -- "$PG_BIN/psql" -h 127.0.0.1 -p "$PORT" -U postgres -Atq "$@"; }
    # Start at the start of the segment holding the current end, as catch-up clients ask.
    IFS=/ read -r hi lo <<< "$(psql -c "SELECT pg_current_wal_lsn()")"
    START=$(printf '%X/%X' $((16#$hi)) $((16#$lo & 0xFF000000)))
    psql -c "CREATE TABLE t (id int, v text)"
    rows=$((MIB * 1024 * 1024 / 620))
    psql -c "INSERT INTO t SELECT g, repeat('x', 500) FROM generate_series(1, $rows) g"
    psql -c "CHECKPOINT"
else
    HTTP=$(free_port)
    "$BIN" init --data-dir "$WORK/data" >/dev/null
    "${SERVER_CPU[@]}" "$BIN" run -c data_dir="$WORK/data" -c listen=127.0.0.1:$PORT -c http_listen=127.0.0.1:$HTTP \
        -c wal_keep_size=$((MIB * 2))MB -c max_wal_size=$((MIB * 4))MB -c log_level=warning \
        > "$WORK/server.log" 2>&1 &
    SERVER_PID=$!
    curl -sf --retry-connrefused --retry 100 --retry-delay 0 --retry-max-time 30 \
        "http://127.0.0.1:$HTTP/status" >/dev/null
    "$BIN" bench append --http 127.0.0.1:$HTTP --size 65536 --batch 4 --writers 2 \
        --durability local --bytes "$((MIB * 1024 * 1024))" >/dev/null
    START=0/1000000
fi

catchup() {
    "${CLIENT_CPU[@]}" "$BIN" bench catchup --port "$PORT" --start "$START" --json --application-name "sendpath$1"
}

# The process whose CPU is the sender's: walserver's server, or PostgreSQL's walsender for
# the connection named $1 (found while it streams).
measured_pid() {
    if [ "$POSTGRES" = 0 ]; then echo "$SERVER_PID"; return; fi
    local p i
    for i in $(seq 1 2000); do
        p=$(psql -c "SELECT pid FROM pg_stat_replication WHERE application_name = '$1'")
        [ -n "$p" ] && { echo "$p"; return; }
    done
    echo "the walsender of $1 never appeared" >&2; exit 1
}

load() { cut -d' ' -f1-3 /proc/loadavg; }
TICK=$(getconf CLK_TCK)
printf 'load average at start: %s; %s MiB per run\n' "$(load)" "$MIB"
catchup warmup >/dev/null
printf '%-4s %8s %10s %10s %10s %10s %10s %8s %s\n' run MB/s cpu_ms/MB ticks/MB vcsw/MB ivcsw/MB segs/MB threads load
RESULTS="$WORK/runs.tsv"
: > "$RESULTS"
for r in $(seq 1 "$RUNS"); do
    if [ "$POSTGRES" = 0 ]; then
        pid=$SERVER_PID
        a=$(threads_snapshot "$pid"); ta=$(proc_ticks "$pid"); sa=$(out_segs)
        out=$(catchup "$r")
        b=$(threads_snapshot "$pid"); tb=$(proc_ticks "$pid"); sb=$(out_segs)
    else
        # PostgreSQL's walsender is a new process per connection: measure it from its start
        # (its connection set-up included) to just before it exits.
        catchup "$r" > "$WORK/out" &
        cpid=$!
        pid=$(measured_pid "sendpath$r")
        a="0 0 0 1"; ta=0; sa=$(out_segs)
        # Sample until the client has everything; the last sample before it exits counts.
        b=$a; tb=0
        # Every 5 ms: at PostgreSQL's rate that leaves a few MB's worth unseen at the end, so
        # its figure is if anything too low.
        while kill -0 "$cpid" 2>/dev/null; do
            s=$(threads_snapshot "$pid" 2>/dev/null) && [ -n "$s" ] && [ "${s%% *}" != 0 ] && b=$s
            t=$(proc_ticks "$pid" 2>/dev/null) && tb=$t
            sleep 0.005
        done
        wait "$cpid"; out=$(cat "$WORK/out"); sb=$(out_segs)
    fi
    bytes=$(echo "$out" | sed 's/.*"bytes":\([0-9]*\).*/\1/')
    mbps=$(echo "$out" | sed 's/.*"mb_per_s":\([0-9.]*\).*/\1/')
    read -r ans avol ainv _ <<< "$a"
    read -r bns bvol binv bn <<< "$b"
    echo "$r $mbps $bytes $((bns - ans)) $((bvol - avol)) $((binv - ainv)) $((tb - ta)) $bn $((sb - sa))" |
        awk -v tick="$TICK" -v load="$(load)" '{
            mb = $3 / 1e6
            printf "%-4s %8.0f %10.4f %10.4f %10.2f %10.2f %10.2f %8d %s\n", $1, $2, $4 / 1e6 / mb, $7 * 1000 / tick / mb, $5 / mb, $6 / mb, $9 / mb, $8, load
        }' | tee -a "$RESULTS"
done
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
printf '%-4s' med
for c in 2 3 4 5 6 7; do printf ' %10s' "$(awk -v c=$c '{ print $c }' "$RESULTS" | median)"; done
echo

if [ "$STRACE" = 1 ] && [ "$POSTGRES" = 0 ]; then
    strace -c -f -q -p "$SERVER_PID" -o "$WORK/strace" &
    spid=$!
    # strace attaches before it prints anything; give it the moment it needs to attach to
    # every thread by waiting for its first output file, bounded.
    for i in $(seq 1 200); do [ -e "$WORK/strace" ] && break; sleep 0.01; done
    sleep 0.5
    out=$(catchup strace)
    kill -INT "$spid"; wait "$spid" || true
    bytes=$(echo "$out" | sed 's/.*"bytes":\([0-9]*\).*/\1/')
    echo "system calls of the server during one catch-up of $bytes bytes (strace -c -f):"
    awk -v mb="$(echo "$bytes / 1000000" | bc -l)" '
        /^-/ || /^%/ || /total/ || NF < 5 { next }
        { calls = $4; name = $NF; printf "  %-16s %8d  %8.2f per MB\n", name, calls, calls / mb }' "$WORK/strace" | sort -k2 -n -r
fi
