#!/usr/bin/env bash
# walserver and PostgreSQL 15 side by side, on this machine, in one run, with the same clients.
#
#   benches/compare-postgres.sh            # full: 1 GiB, 3 alternating runs per pair (13-19 min)
#   benches/compare-postgres.sh --quick    # 256 MiB, 1 run, short pgbench (for development)
#   benches/compare-postgres.sh --runs 5 --mib 2048 --pgbench-seconds 20 --fanout-mib 256 --live-mib 512
#   benches/compare-postgres.sh --only "a f"   # only sections (a) and (f); the others' rows say -
#
# It prints one table of medians (with the spread over the runs) and ratios walserver/PostgreSQL:
#   (a) catch-up of the same already-stored WAL into the same pg_receivewal (--synchronous,
#       and plain, writing to the same disk), through a physical slot made with RESERVE_WAL
#       before the WAL was generated; and into a plain protocol-codec client that discards it;
#       after one unrecorded warm-up pass of each system (the first pass after the load is slow);
#       with the sender's CPU per MB into each of the three (the same clients for both servers);
#   (b) catch-up into a standby (fsync on): a PostgreSQL standby from a base backup taken
#       before the load, and a walserver standby initialised before the load, each started
#       after the primary holds the WAL and timed until its flushed position (IDENTIFY_SYSTEM)
#       reaches the end; with the CPU per MB of the sender, of the receiving side and of both;
#       and the walserver standby with its data directory on tmpfs; and the disk's sequential
#       write + fdatasync bandwidth;
#   (c) synchronous commit with one synchronous standby, 1 and 16 clients: pgbench running a
#       one-row INSERT with synchronous_commit=on vs `walserver bench append --cluster 1
#       --durability on --size 100`; throughput and p50/p99 latency; and one client again with
#       each system's processes and threads, and its client, on one CPU (--pin-cpu N, the last
#       by default), where no hand-off waits for an idle CPU to wake; and the disk's latency
#       of one 8 KiB write + fdatasync, with the ceiling two of them in sequence put on one
#       client's commits; walserver's rows twice: as PostgreSQL commits (a standby is sent
#       only WAL its primary has flushed), and with the overlapped commit (`--commit-overlap`,
#       `synchronous_commit_overlap`: the standby is sent each batch once the primary has
#       written it, so the two flushes overlap), each with its ratio to PostgreSQL;
#   (d) fan-out: 16 and 64 pg_receivewal processes at once (PostgreSQL with max_wal_senders =
#       70), aggregate MB/s, memory per walsender, and the CPU per MB of the server and of the
#       receivers, after one unrecorded fan-out of each size of each system;
#   (e) live appends: pg_receivewal --synchronous, or the codec client, waits at the current
#       end of WAL while a load appends LIVE_MIB more (PostgreSQL: INSERTs of wide rows from
#       4 psql clients with synchronous_commit off; walserver: `walserver bench append --http
#       --durability local`, 8 KiB records, 4 writers); MB/s from the start of the load until
#       the receiver has it all, and how far behind the server it was at the end (ms);
#   (f) one client's synchronous commits (pg_receivewal --synchronous as the synchronous
#       standby, at the live end) while 64 pg_receivewal catch up from the server at once:
#       commits/s and p50/p99 latency;
#   (g) (c)'s 1 and 16 clients with each node on a disk of its own: every data directory on a
#       lossyfs mount whose fsyncs take --own-disk-ms (1 by default); needs root (FUSE); the
#       overlapped commit off and on, as in (c).
# `--only "c g"` runs the commit sections alone, without the 1 GiB fill the others stream.
# The sections run in the order a, b, e, c, g, d, f: the fan-outs last, since 64 receivers
# leave the load average high for minutes.
#
# A figure is only comparable from a quiet machine: the script refuses to start when the
# 1-minute load average is above 1 (wait, or pass --allow-busy, and the table says BUSY), and
# records the load average at the start of every section. Before each section it waits (at
# most --settle seconds, 90 by default, 0 with --quick) for the load the sections before it
# left to fall below 1 again. PostgreSQL runs without autovacuum and is checkpointed after the
# WAL is generated, so that no vacuum of the 1 GiB it inserted and no write-back of its
# buffers runs under the measurements (walserver has no background work of that kind).
# --bin PATH measures that walserver binary instead of building this tree's (for comparing
# builds; its `bench` loads run the walserver-bench beside it, or on PATH). On a VM that
# reports free memory to its host (virtio-balloon free page reporting), the script holds the
# reporting off for the run and touches the memory once before the sections, and puts the
# setting back at exit; --keep-page-reporting leaves it alone.
# --save DIR keeps the raw per-run values (results.tsv: measure, system, value, run, load
# average when the run started), the table (table.md) and the one-client commit latency
# distributions of (c) as files and as a plot (commit-latency-1-client.svg). Whole runs go
# under benches/runs/ (`--save benches/runs/2026-12-06-a`), which git ignores; the tables and
# plots that benches/README.md and benches/results/README.md cite are copies in
# benches/results/.
#
# PostgreSQL runs from $WALSERVER_PG_BIN or /usr/lib/postgresql/15/bin, as the postgres user
# (runuser) when this runs as root, on 127.0.0.1 only. Everything lives in one temporary
# directory on the disk (/var/tmp) and one on /dev/shm, removed with every server at exit.
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/vm-memory.sh

QUICK=0
RUNS=3
MIB=1024
PGBENCH_SECS=10
FANOUT_MIB=256
FANOUT_NS="16 64"
ALLOW_BUSY=0
SAVE=""
ONLY=""
LIVE_MIB=256
LIVE_CLIENTS=4
SETTLE=90
BIN=""
# (g)'s fsync latency per mount, ms.
OWN_DISK_MS=1
# The CPU of (c)'s one-CPU rows: the last one (here, the one the disk's interrupts go to).
PIN_CPU=$(( $(nproc) - 1 ))
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) QUICK=1; RUNS=1; MIB=256; PGBENCH_SECS=3; FANOUT_MIB=64; LIVE_MIB=64; SETTLE=0; shift ;;
        --settle) SETTLE="$2"; shift 2 ;;
        --runs) RUNS="$2"; shift 2 ;;
        --mib) MIB="$2"; shift 2 ;;
        --pgbench-seconds) PGBENCH_SECS="$2"; shift 2 ;;
        --fanout-mib) FANOUT_MIB="$2"; shift 2 ;;
        --live-mib) LIVE_MIB="$2"; shift 2 ;;
        --fanout) FANOUT_NS="$2"; shift 2 ;;
        --allow-busy) ALLOW_BUSY=1; shift ;;
        --save) SAVE="$2"; shift 2 ;;
        --only) ONLY="$2"; shift 2 ;;
        --pin-cpu) PIN_CPU="$2"; shift 2 ;;
        --bin) BIN="$2"; shift 2 ;;
        --own-disk-ms) OWN_DISK_MS="$2"; shift 2 ;;
        --keep-page-reporting) VM_MEMORY_KEEP=1; shift ;;
        -h|--help) sed -n '2,50p' "$0"; exit 0 ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done

PG_BIN="${WALSERVER_PG_BIN:-/usr/lib/postgresql/15/bin}"
for tool in initdb pg_ctl psql pg_receivewal pg_basebackup pgbench; do
    [ -x "$PG_BIN/$tool" ] || { echo "PostgreSQL 15's $tool is missing in $PG_BIN (apt-get install postgresql-15)" >&2; exit 1; }
done
for tool in jq curl dd awk; do
    command -v "$tool" >/dev/null || { echo "$tool is missing (apt-get install $tool)" >&2; exit 1; }
done

LOAD1=$(cut -d' ' -f1 /proc/loadavg)
if awk -v l="$LOAD1" 'BEGIN { exit !(l > 1) }'; then
    if [ "$ALLOW_BUSY" = 1 ]; then
        echo "warning: load average $LOAD1 > 1 at the start: the figures are flagged BUSY" >&2
    else
        echo "the 1-minute load average is $LOAD1 (> 1): the machine is not quiet enough to compare; wait, or pass --allow-busy" >&2
        exit 3
    fi
fi
FANOUT_MAX=0
for n in $FANOUT_NS; do [ "$n" -gt "$FANOUT_MAX" ] && FANOUT_MAX=$n; done
SENDERS=$(( FANOUT_MAX + 6 ))
[ "$SENDERS" -lt 48 ] && SENDERS=48

SECONDS=0
log() { printf '[%4ds] %s\n' "$SECONDS" "$*" >&2; }

# ---------------------------------------------------------------------------------------------
# Setup and cleanup
# ---------------------------------------------------------------------------------------------
WORK=$(mktemp -d /var/tmp/walbench.XXXXXX)
SHM=$(mktemp -d /dev/shm/walbench.XXXXXX)
chmod 755 "$WORK" "$SHM"
PG_DIRS=()
BG_PIDS=()
RES="$WORK/results.tsv"
: > "$RES"

# PIN, when set (only by (c)'s one-CPU rows), is a `taskset -c CPU` prefix for the clients
# these start, and for walserver's in-process cluster.
PIN=()
as_pg() {
    if [ "$(id -u)" = 0 ]; then "${PIN[@]}" runuser -u postgres -- "$@"; else "${PIN[@]}" "$@"; fi
}
own_pg() {
    if [ "$(id -u)" = 0 ]; then chown -R postgres:postgres "$@"; fi
}

cleanup() {
    set +e
    for p in "${BG_PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
    for p in "${BG_PIDS[@]}"; do wait "$p" 2>/dev/null; done
    for d in "${PG_DIRS[@]}"; do
        [ -f "$d/postmaster.pid" ] && as_pg "$PG_BIN/pg_ctl" -D "$d" -m immediate -w stop >/dev/null 2>&1
    done
    # (g)'s lossyfs mounts go after the servers on them: each unmounts when told to end.
    for p in "${G_MOUNTS[@]}"; do kill -TERM "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
    rm -rf "$WORK" "$SHM"
    vm_memory_release
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null \
        || echo $((20000 + RANDOM % 30000))
}

lsn2int() { local hi=${1%/*} lo=${1#*/}; echo $(( (16#$hi << 32) + 16#$lo )); }
int2lsn() { printf '%X/%X\n' $(( $1 >> 32 )) $(( $1 & 0xFFFFFFFF )); }
seg_start() { echo $(( $1 / (16 << 20) * (16 << 20) )); }

# A value of the current run: the table reads the first three columns; --save keeps all five.
RUN=0
RUN_LOAD=""
WARMUP=0
record() { [ "$WARMUP" = 1 ] || printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$RUN" "$RUN_LOAD" >> "$RES"; }
# Marks the start of run $1 of a section: the load average then goes with its values.
start_run() { RUN=$1; RUN_LOAD=$(cut -d' ' -f1 /proc/loadavg); }
# The load average at the start of each section, for the table's notes.
SECTION_LOADS=""
section() {
    if wanted "$1"; then settle; SECTION_LOADS="$SECTION_LOADS $1=$(cut -d' ' -f1 /proc/loadavg)"; log "$2"; else log "$2: left out (--only)"; fi
}
# Waits, at most $SETTLE seconds, until the 1-minute load average is below 1. The kernel
# announces no such event, so this looks every 5 seconds; it is the harness's wait, not a
# measurement.
settle() {
    local waited=0
    while [ "$waited" -lt "$SETTLE" ] && awk '{ exit !($1 >= 1) }' /proc/loadavg; do
        sleep 5; waited=$((waited + 5))
    done
    if [ "$waited" -gt 0 ]; then log "waited ${waited}s for the load average to settle ($(cut -d' ' -f1 /proc/loadavg))"; fi
}
# Whether --only keeps section $1 (every section without it), and the runs of that section.
wanted() { [ -z "$ONLY" ] || [[ " $ONLY " == *" $1 "* ]]; }
runs_of() { if wanted "$1"; then seq 1 "$RUNS"; fi; }
# Whether a section that reads the stored WAL runs: only (a), (b), (d), (e) and (f) need the
# slots and the MIB of WAL behind them. (c) and (g) need neither, so `--only "c g"` skips the
# fill, which takes minutes and leaves the load average high for the first section.
needs_fill() { wanted a || wanted b || wanted d || wanted e || wanted f; }

# CPU seconds (user + system) of a process so far, from /proc/PID/stat; with a second argument
# `children`, also those of the children it has waited for (PostgreSQL's postmaster reaps every
# walsender that ends, so the walsenders of a finished fan-out are counted then).
cpu_of() {
    local tck; tck=$(getconf CLK_TCK)
    awk -v t="$tck" -v c="${2:-}" '{ sub(/^.*\) /, ""); print ($12 + $13 + (c == "children" ? $14 + $15 : 0)) / t }' \
        "/proc/$1/stat" 2>/dev/null || echo 0
}
rss_kb() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status" 2>/dev/null || echo 0; }
pss_kb() { awk '/^Pss:/ { print $2 }' "/proc/$1/smaps_rollup" 2>/dev/null || echo 0; }

# pg_ctl starts PostgreSQL in a session of its own (setsid). With the kernel's autogroup
# scheduling on (kernel.sched_autogroup_enabled, recorded in the table's header), the processes
# of one session share the CPU as one group: PostgreSQL's as a whole would get half of a busy
# machine while a walserver started from this script shared its half with the script's own 64
# pg_receivewal, and a commit path through a few of its threads waited tens of milliseconds for
# each of them to be scheduled. So walserver's servers start in sessions of their own too
# (`setsid "$WS" run ... &`: setsid, not a process group leader here, execs walserver in the
# same process, so $! is walserver's pid).

if [ -n "$BIN" ]; then
    WS=$(realpath "$BIN")
    [ -x "$WS" ] || { echo "--bin $BIN is not an executable" >&2; exit 2; }
else
    log "building walserver (release)"
    cargo build --release -j2 --quiet --bin walserver --bin walserver-bench
    WS="$PWD/target/release/walserver"
fi

# ---------------------------------------------------------------------------------------------
# Machine
# ---------------------------------------------------------------------------------------------
MACHINE_DATE=$(date -u '+%Y-%m-%d %H:%M UTC')
MACHINE_CPU=$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)
MACHINE_NPROC=$(nproc)
# With its mount's `discard` named when it is on: blocks freed by the receivers' deleted output
# are then trimmed, and a later run's writes may land where the host must allocate again.
MACHINE_DISK=$(df --output=source,fstype,target "$WORK" | tail -1 | awk '{ print $1 " (" $2 ")"; print $3 }' | {
    read -r disk; read -r mnt
    if findmnt -n -o OPTIONS --target "$mnt" 2>/dev/null | tr ',' '\n' | grep -qx discard; then disk="$disk, mounted with discard"; fi
    echo "$disk"
})
LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
MACHINE_AUTOGROUP=$(cat /proc/sys/kernel/sched_autogroup_enabled 2>/dev/null || echo "?")
# How an idle CPU waits: a VM guest's haltpoll cpuidle driver polls up to guest_halt_poll_ns
# before it halts the vCPU (the kernel's default is 200 us; a host may set 0). A halted vCPU
# takes tens of microseconds to wake, and a synchronous commit wakes an idle CPU several times
# (benches/commit-path.md), so (c) and (f) depend on it.
MACHINE_IDLE=$(cat /sys/devices/system/cpu/cpuidle/current_driver 2>/dev/null || echo "no cpuidle driver")
if [ -r /sys/module/haltpoll/parameters/guest_halt_poll_ns ]; then
    MACHINE_IDLE="$MACHINE_IDLE, guest_halt_poll_ns $(cat /sys/module/haltpoll/parameters/guest_halt_poll_ns)"
fi
# Free page reporting (virtio-balloon): memory the host took back costs several times more on
# its first write, and the receivers of (a), (d) and (f) write gigabytes into new pages, so
# which server's run met such pages decided more than the servers did (benches/README.md,
# "The fan-out's receivers"). vm-memory.sh holds the reporting off for the run where it can,
# and the memory is touched once after the fill, below.
vm_memory_hold
MACHINE_REPORTING=$VM_MEMORY_STATE
# Proactive reclaim of the page cache by DAMON, when a kdamond runs (see warm_wal).
MACHINE_RECLAIM="no DAMON scheme"
for k in /sys/kernel/mm/damon/admin/kdamonds/*/; do
    [ "$(cat "${k}state" 2>/dev/null)" = on ] || continue
    for c in "${k}"contexts/*/; do
        for sc in "${c}"schemes/*/; do
            [ -r "${sc}action" ] || continue
            MACHINE_RECLAIM="DAMON $(cat "${sc}action") of pages idle for $(( $(cat "${sc}access_pattern/age/min") * $(cat "${c}monitoring_attrs/intervals/aggr_us") / 1000000 )) s"
        done
    done
done

# ---------------------------------------------------------------------------------------------
# The two primaries, each holding ~MIB of WAL behind physical slots made before it was written
# ---------------------------------------------------------------------------------------------
PG_PORT=$(free_port)
PGP="$WORK/pg-primary"
mkdir -p "$PGP"; own_pg "$WORK" "$SHM"
log "PostgreSQL primary on port $PG_PORT"
as_pg "$PG_BIN/initdb" -D "$PGP" -U postgres --auth=trust -E UTF8 --locale=C -N >/dev/null
PG_DIRS+=("$PGP")
cat >> "$PGP/postgresql.conf" <<EOF
port = $PG_PORT
listen_addresses = '127.0.0.1'
unix_socket_directories = ''
wal_level = replica
max_wal_senders = $SENDERS
max_replication_slots = $(( RUNS * (3 + 2 * FANOUT_MAX + ${FANOUT_NS// /+}) + ${FANOUT_NS// /+} + 10 ))
fsync = on
synchronous_commit = on
max_wal_size = '16GB'
checkpoint_timeout = '1h'
shared_buffers = '256MB'
max_connections = 64
autovacuum = off
EOF
cat > "$PGP/pg_hba.conf" <<EOF
host all all 127.0.0.1/32 trust
host replication all 127.0.0.1/32 trust
EOF
as_pg "$PG_BIN/pg_ctl" -D "$PGP" -l "$WORK/pg-primary.log" -w start >/dev/null
psql_pg() { "$PG_BIN/psql" -X -A -t -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "${PORT:-$PG_PORT}" -U postgres -d postgres -c "$1"; }

WS_PORT=$(free_port); WS_HTTP=$(free_port)
WSP="$WORK/ws-primary"
log "walserver primary on port $WS_PORT (admin API $WS_HTTP)"
"$WS" init --data-dir "$WSP" >/dev/null
setsid "$WS" run -c "data_dir=$WSP" -c "listen=127.0.0.1:$WS_PORT" -c "http_listen=127.0.0.1:$WS_HTTP" \
    -c "max_wal_senders=$SENDERS" -c "synchronous_standby_names=FIRST 1 (fan_sync)" \
    -c log_level=warn 2> "$WORK/ws-primary.log" &
WS_PID=$!
BG_PIDS+=("$WS_PID")
for _ in $(seq 1 500); do curl -sf "http://127.0.0.1:$WS_HTTP/status" >/dev/null && break; sleep 0.02; done
repl_ws() { "$PG_BIN/psql" -X -A -t -q -v ON_ERROR_STOP=1 "host=127.0.0.1 port=$WS_PORT user=postgres replication=true" -c "$1" >/dev/null; }

# Slots: one per pg_receivewal run (a), N per fan-out run (d) and 64 (the largest N) per run of
# (f), one per standby (b). walserver's primary names `fan_sync` its synchronous standby, which
# only (f) starts: every other section appends at durability local, which waits for no standby.
log "slots and standbys made before the load"
for r in $(seq 0 "$RUNS"); do
    # Run 0 is (a)'s warm-up, not recorded; (c) needs only run 1's PostgreSQL standby.
    if ! needs_fill; then
        [ "$r" = 1 ] || continue
        d="$WORK/pg-standby-$r"
        mkdir -p "$d"; own_pg "$d"; chmod 700 "$d"
        as_pg "$PG_BIN/pg_basebackup" -D "$d" -h 127.0.0.1 -p "$PG_PORT" -U postgres -X stream -R \
            -C -S "stby_$r" -c fast >/dev/null 2>&1
        PG_DIRS+=("$d")
        printf 'port = %s\ncluster_name = %s\n' "$(free_port)" "pgstby$r" >> "$d/postgresql.conf"
        continue
    fi
    for slot in recv plain; do
        psql_pg "SELECT pg_create_physical_replication_slot('${slot}_$r', true)" >/dev/null
        repl_ws "CREATE_REPLICATION_SLOT ${slot}_$r PHYSICAL RESERVE_WAL"
    done
    if [ "$r" = 0 ]; then
        # And (d)'s warm-ups: one fan-out of each size.
        for n in $FANOUT_NS; do
            for i in $(seq 1 "$n"); do
                psql_pg "SELECT pg_create_physical_replication_slot('fan_${n}_0_$i', true)" >/dev/null
                repl_ws "CREATE_REPLICATION_SLOT fan_${n}_0_$i PHYSICAL RESERVE_WAL"
            done
        done
        continue
    fi
    for n in $FANOUT_NS f; do
        count=$n; [ "$n" = f ] && count=$FANOUT_MAX
        for i in $(seq 1 "$count"); do
            psql_pg "SELECT pg_create_physical_replication_slot('fan_${n}_${r}_$i', true)" >/dev/null
            repl_ws "CREATE_REPLICATION_SLOT fan_${n}_${r}_$i PHYSICAL RESERVE_WAL"
        done
    done
    # A PostgreSQL standby per run from a base backup taken now, streaming through its slot.
    d="$WORK/pg-standby-$r"
    mkdir -p "$d"; own_pg "$d"; chmod 700 "$d"
    as_pg "$PG_BIN/pg_basebackup" -D "$d" -h 127.0.0.1 -p "$PG_PORT" -U postgres -X stream -R \
        -C -S "stby_$r" -c fast >/dev/null 2>&1
    PG_DIRS+=("$d")
    port=$(free_port)
    printf 'port = %s\ncluster_name = %s\n' "$port" "pgstby$r" >> "$d/postgresql.conf"
    echo "$port" > "$WORK/pg-standby-$r.port"
    # A walserver standby per run, on the disk and on tmpfs, each with its own slot.
    for where in disk shm; do
        repl_ws "CREATE_REPLICATION_SLOT stby_${where}_$r PHYSICAL RESERVE_WAL"
        base=$WORK; [ "$where" = shm ] && base=$SHM
        "$WS" init --standby --data-dir "$base/ws-standby-$r" \
            --primary-conninfo "host=127.0.0.1 port=$WS_PORT user=postgres application_name=wsstby_${where}_$r" \
            --primary-slot-name "stby_${where}_$r" >/dev/null
    done
done

if needs_fill; then
    log "generating ${MIB} MiB of WAL in PostgreSQL (INSERTs)"
    psql_pg "CREATE TABLE fill (id int, filler text)"
    PG_START=$(seg_start "$(lsn2int "$(psql_pg "SELECT restart_lsn FROM pg_replication_slots WHERE slot_name = 'recv_1'")")")
    target=$(( PG_START + (MIB << 20) ))
    n=0
    while [ "$(lsn2int "$(psql_pg "SELECT pg_current_wal_lsn()")")" -lt "$target" ]; do
        psql_pg "INSERT INTO fill SELECT g, repeat('y', 500) FROM generate_series($n, $n + 49999) g"
        n=$((n + 50000))
    done
    PG_END_LSN=$(psql_pg "SELECT pg_current_wal_flush_lsn()")
    PG_END=$(lsn2int "$PG_END_LSN")
    PG_BYTES=$(( PG_END - PG_START ))

    log "appending the same volume to walserver"
    WS_START=$(seg_start "$(lsn2int "$(curl -sf "http://127.0.0.1:$WS_HTTP/slots" | jq -r '.[] | select(.slot_name == "recv_1") | .restart_lsn')")")
    "$WS" bench append --http "127.0.0.1:$WS_HTTP" --durability local --size 8192 --batch 128 --writers 2 \
        --bytes "$PG_BYTES" --json > "$WORK/ws-fill.json"
    WS_END_LSN=$(curl -sf "http://127.0.0.1:$WS_HTTP/status" | jq -r .flush_lsn)
    WS_END=$(lsn2int "$WS_END_LSN")
    WS_BYTES=$(( WS_END - WS_START ))
    log "PostgreSQL: $(int2lsn "$PG_START") .. $PG_END_LSN ($PG_BYTES bytes); walserver: $(int2lsn "$WS_START") .. $WS_END_LSN ($WS_BYTES bytes)"
else
    PG_BYTES=0 WS_BYTES=0
    log "no WAL to fill: only sections that need none run (--only)"
fi
psql_pg "CHECKPOINT"
sync

vm_memory_touch "$SHM"

# ---------------------------------------------------------------------------------------------
# (a) catch-up into pg_receivewal and into a plain codec client
# ---------------------------------------------------------------------------------------------
# pg_receivewal stops once it has received WAL *past* --endpos (PostgreSQL 15 compares
# endpos < received), so the end it is given is one byte short of the last byte to receive.
# pg_receivewal PORT SLOT END(int) DIR [OPTION] -> "real user sys" of the process
run_receivewal() {
    mkdir -p "$4"
    local TIMEFORMAT='%R %U %S' out
    out=$( { time timeout 600 "$PG_BIN/pg_receivewal" -h 127.0.0.1 -p "$1" -U postgres -D "$4" --slot "$2" \
        ${5:-} --endpos "$(int2lsn $(( $3 - 1 )))" -n -w >/dev/null 2>"$4.err"; } 2>&1 ) \
        || { echo "pg_receivewal failed:" >&2; cat "$4.err" >&2; exit 1; }
    echo "$out"
}

# Every catch-up starts with the server's stored WAL in the page cache, read there first, and
# how much of it was still cached is recorded. This VM runs DAMON's proactive reclaim
# (a kdamond with a `pageout` scheme: page-cache pages not accessed for 60 s are written out
# and dropped, up to 128 MiB a second; see MACHINE_RECLAIM above), so WAL left alone between
# two runs can drift out of memory, and a run's speed would then depend on how long ago the
# same WAL was last read, that is on the order of the runs (in the run of 2026-12-02 19:06 UTC
# 85-100 % was still cached each time, benches/results/README.md). PostgreSQL's walsender and
# walserver's sendfile both read through the page cache, so both are measured from it.
wal_files() { # system: the paths of its segments from START to END, on timeline 1 (nothing here promotes)
    local dir start end n
    if [ "$1" = pg ]; then dir=$PGP start=$PG_START end=$PG_END; else dir=$WSP start=$WS_START end=$WS_END; fi
    for n in $(seq $(( start >> 24 )) $(( (end - 1) >> 24 ))); do
        printf '%s/pg_wal/00000001%08X%08X\n' "$dir" $(( n >> 8 )) $(( n & 255 ))
    done
}
warm_wal() { # system key: records KEY_cached_pct, then reads the WAL into the page cache
    local files
    mapfile -t files < <(wal_files "$1")
    record "$2_cached_pct" "$1" "$(fincore -n -b "${files[@]}" | awk '{ r += $1; s += $3 } END { printf "%.0f", s ? 100 * r / s : 0 }')"
    cat "${files[@]}" > /dev/null
}

# The sending side's CPU so far, in seconds: walserver's whole process; PostgreSQL's
# postmaster with the children it has reaped, so a walsender counts once it has ended (each
# of (a)'s clients has its own, which ends with it; no other child of the postmaster ends
# during (a)).
sender_cpu() { # system
    if [ "$1" = pg ]; then cpu_of "$(head -1 "$PGP/postmaster.pid")" children; else cpu_of "$WS_PID"; fi
}
# Waits (at most 10 s) until PostgreSQL has no walsender left and its postmaster has reaped
# every child that ended (a zombie's CPU is not yet in its parent's count, and a zombie no
# longer shows its "postgres: walsender" title), so that the walsenders' CPU is in the
# postmaster's; a no-op for walserver.
senders_reaped() { # system
    local k pm
    [ "$1" = pg ] || return 0
    pm=$(head -1 "$PGP/postmaster.pid")
    for k in $(seq 1 200); do
        if ! pgrep -f "postgres: walsender" >/dev/null && ! ps -o stat= --ppid "$pm" | grep -q '^Z'; then
            return 0
        fi
        sleep 0.05
    done
}
# Records KEY for SYSTEM: the sender's CPU between C0 and now, per MB of BYTES.
record_sender_cpu() { # key system c0 bytes
    local c1
    senders_reaped "$2"
    c1=$(sender_cpu "$2")
    record "$1" "$2" "$(awk -v a="$3" -v b="$c1" -v n="$4" 'BEGIN { printf "%.3f", (b - a) * 1000 / (n / 1e6) }')"
}

a_one() { # system run
    local sys=$1 r=$2 port start end bytes t c0
    if [ "$sys" = pg ]; then port=$PG_PORT start=$PG_START end=$PG_END bytes=$PG_BYTES
    else port=$WS_PORT start=$WS_START end=$WS_END bytes=$WS_BYTES; fi
    warm_wal "$sys" a
    c0=$(sender_cpu "$sys")
    t=$(run_receivewal "$port" "recv_$r" "$end" "$WORK/recv-$sys-$r" --synchronous)
    read -r real user sys_t <<< "$t"
    record a_recv_mbps "$sys" "$(awk -v b="$bytes" -v s="$real" 'BEGIN { printf "%.0f", b / s / 1e6 }')"
    record a_recv_client_cpu "$sys" "$(awk -v u="$user" -v s="$sys_t" -v r="$real" 'BEGIN { printf "%.2f", (u + s) / r }')"
    record_sender_cpu a_recv_sender_cpu_ms_per_mb "$sys" "$c0" "$bytes"
    rm -rf "$WORK/recv-$sys-$r"
    c0=$(sender_cpu "$sys")
    t=$(run_receivewal "$port" "plain_$r" "$end" "$WORK/recv-$sys-$r")
    read -r real user sys_t <<< "$t"
    record a_plain_mbps "$sys" "$(awk -v b="$bytes" -v s="$real" 'BEGIN { printf "%.0f", b / s / 1e6 }')"
    record_sender_cpu a_plain_sender_cpu_ms_per_mb "$sys" "$c0" "$bytes"
    rm -rf "$WORK/recv-$sys-$r"
    local j
    c0=$(sender_cpu "$sys")
    j=$(timeout 600 "$WS" bench catchup --port "$port" --user postgres --start "$(int2lsn "$start")" --end "$(int2lsn "$end")" --json)
    record a_codec_mbps "$sys" "$(jq -r '.mb_per_s | floor' <<< "$j")"
    record_sender_cpu a_codec_sender_cpu_ms_per_mb "$sys" "$c0" "$bytes"
}

section a "(a) catch-up into pg_receivewal --synchronous, $RUNS runs"
# The first pass after the load was the slowest of every run on 2026-12-02 (PostgreSQL's,
# which goes first in run 1: 115-149 MB/s into pg_receivewal --synchronous against 236-339 in
# its other runs), so one unrecorded pass of each system comes first.
if wanted a; then
    WARMUP=1; log "(a) warm-up, not recorded"; a_one pg 0; a_one ws 0; WARMUP=0
fi
for r in $(runs_of a); do
    start_run "$r"
    if [ $((r % 2)) = 1 ]; then a_one pg "$r"; a_one ws "$r"; else a_one ws "$r"; a_one pg "$r"; fi
done

# ---------------------------------------------------------------------------------------------
# (b) catch-up into a standby, fsync on; the disk's write + fdatasync bandwidth; tmpfs
# ---------------------------------------------------------------------------------------------
# The disk's sequential write + fdatasync bandwidth, in 16 MiB writes with O_DSYNC (write,
# then fdatasync, per write): into a new file (blocks allocated as it grows), then over the
# same file again (blocks already allocated, as a standby overwrites its pre-zeroed segments).
disk_bw() {
    local out bytes secs mode
    for mode in new overwrite; do
        if [ "$mode" = new ]; then rm -f "$WORK/dd.bin"; fi
        out=$(dd if=/dev/zero of="$WORK/dd.bin" bs=16M count=$((MIB / 16)) oflag=dsync conv=notrunc 2>&1 | tail -1)
        bytes=$(awk '{ print $1 }' <<< "$out"); secs=$(awk -F', ' '{ print $3 }' <<< "$out" | awk '{ print $1 }')
        record "disk_${mode}_mbps" disk "$(awk -v b="$bytes" -v s="$secs" 'BEGIN { printf "%.0f", b / s / 1e6 }')"
    done
    rm -f "$WORK/dd.bin"
}

# The CPU rows of (b), per MB (10^6 bytes) of the catch-up's window: the sender, the receiving
# side, and both. On loopback the two split the kernel's TCP work between them (a sender's
# transmit runs the receiver's TCP input unless the receiver holds its socket at that moment),
# so the sender's row alone moves with how its receiver reads; their sum does not.
b_cpu_rows() { # system sender-cpu receiver-cpu mb
    record b_sender_cpu_ms_per_mb "$1" "$(awk -v c="$2" -v m="$4" 'BEGIN { printf "%.3f", c * 1000 / m }')"
    record b_receiver_cpu_ms_per_mb "$1" "$(awk -v c="$3" -v m="$4" 'BEGIN { printf "%.3f", c * 1000 / m }')"
    record b_both_cpu_ms_per_mb "$1" "$(awk -v a="$2" -v b="$3" -v m="$4" 'BEGIN { printf "%.3f", (a + b) * 1000 / m }')"
}

b_pg() {
    local r=$1 d="$WORK/pg-standby-$1" port wj pid cpu rpid rcpu mb
    port=$(cat "$WORK/pg-standby-$r.port")
    warm_wal pg b_disk
    as_pg "$PG_BIN/pg_ctl" -D "$d" -l "$WORK/pg-standby-$r.log" start >/dev/null
    wj=$(timeout 900 "$WS" bench wait-lsn --port "$port" --user postgres --target "$PG_END_LSN" --interval-ms 2 --json)
    pid=$(psql_pg "SELECT active_pid FROM pg_replication_slots WHERE slot_name = 'stby_$r'")
    cpu=$(cpu_of "$pid")
    # The receiving side: the standby's walreceiver process (it reads, writes and flushes; the
    # standby's startup process, which replays, has no counterpart in walserver's standby).
    rpid=$(PORT=$port psql_pg "SELECT pid FROM pg_stat_wal_receiver")
    rcpu=$(cpu_of "$rpid")
    mb=$(jq -r '.window_bytes / 1e6' <<< "$wj")
    record b_standby_mbps pg "$(jq -r '.window_mb_per_s | floor' <<< "$wj")"
    b_cpu_rows pg "$cpu" "$rcpu" "$mb"
    as_pg "$PG_BIN/pg_ctl" -D "$d" -m fast -w stop >/dev/null
}

b_ws() { # run where(disk|shm)
    local r=$1 where=$2 base=$WORK port http pid cpu0 cpu1 rcpu wj mb
    [ "$where" = shm ] && base=$SHM
    port=$(free_port); http=$(free_port)
    warm_wal ws "b_$where"
    cpu0=$(cpu_of "$WS_PID")
    setsid "$WS" run -c "data_dir=$base/ws-standby-$r" -c "listen=127.0.0.1:$port" -c "http_listen=127.0.0.1:$http" \
        -c log_level=warn 2> "$WORK/ws-standby-$where-$r.log" &
    pid=$!
    BG_PIDS+=("$pid")
    wj=$(timeout 900 "$WS" bench wait-lsn --port "$port" --user postgres --target "$WS_END_LSN" --interval-ms 2 --json)
    cpu1=$(cpu_of "$WS_PID")
    # The receiving side: the whole standby process, from its start.
    rcpu=$(cpu_of "$pid")
    mb=$(jq -r '.window_bytes / 1e6' <<< "$wj")
    if [ "$where" = disk ]; then
        record b_standby_mbps ws "$(jq -r '.window_mb_per_s | floor' <<< "$wj")"
        b_cpu_rows ws "$(awk -v a="$cpu0" -v b="$cpu1" 'BEGIN { print b - a }')" "$rcpu" "$mb"
    else
        record b_tmpfs_mbps ws "$(jq -r '.window_mb_per_s | floor' <<< "$wj")"
    fi
    kill -TERM "$pid"; wait "$pid" 2>/dev/null || true
    rm -rf "$base/ws-standby-$r"
}

section b "(b) catch-up into a standby (fsync on), $RUNS runs, with the disk's write+fdatasync bandwidth"
for r in $(runs_of b); do
    start_run "$r"
    disk_bw
    if [ $((r % 2)) = 1 ]; then b_pg "$r"; b_ws "$r" disk; else b_ws "$r" disk; b_pg "$r"; fi
    b_ws "$r" shm
done

# ---------------------------------------------------------------------------------------------
# (e) live appends: the receiver waits at the end of WAL while a load appends LIVE_MIB more
# ---------------------------------------------------------------------------------------------
# One load per system, receiver and run. The receiver starts first: pg_receivewal (no slot, an
# empty directory: it starts at the segment holding the server's end, so it first fetches up
# to 16 MiB already stored) or the codec client (START_REPLICATION exactly at the end). Each
# gets a name of its own (application_name), and the server's view (pg_stat_replication, or
# /status) is polled until that connection is streaming and, for pg_receivewal, has flushed up
# to the end: only then does the clock start and the load run, until the WAL has passed
# TARGET = end + LIVE_MIB, the LSN where the receiver stops (--endpos is one byte short of it,
# as in (a)). `walserver bench wait-lsn` on the primary (IDENTIFY_SYSTEM every 5 ms: the
# flushed end, all a walsender may send, on both servers) marks when the server had TARGET
# durable. Subshells note the time each of the two processes exits.
#   MB/s: LIVE_MIB / (receiver had all up to TARGET - load started);
#   lag:  receiver had it all - server had it durable, in ms (to about 5 ms): how far behind
#         the receiver was when the load had written its volume;
#   load: LIVE_MIB / (server had it durable - load started), the most any receiver can reach.
# The load's clock starts before its client processes do, so their start-up is in it.
for i in $(seq 1 "$LIVE_CLIENTS"); do psql_pg "CREATE TABLE live_$i (id int, filler text)"; done

# The end of WAL now, as an integer: PostgreSQL's flushed end (what a walsender may send),
# walserver's durable end.
e_end_now() {
    if [ "$1" = pg ]; then lsn2int "$(psql_pg "SELECT pg_current_wal_flush_lsn()")"
    else lsn2int "$(curl -sf "http://127.0.0.1:$WS_HTTP/status" | jq -r .flush_lsn)"; fi
}

# "state flush_lsn" of the connection named APP, as the server shows it (nothing if absent).
e_repl_state() { # system app
    if [ "$1" = pg ]; then
        psql_pg "SELECT state || ' ' || coalesce(flush_lsn, '0/0') FROM pg_stat_replication WHERE application_name = '$2'"
    else
        curl -sf "http://127.0.0.1:$WS_HTTP/status" \
            | jq -r --arg a "$2" '.replication[] | select(.application_name == $a) | "\(.state) \(.flush_lsn // "0/0")"'
    fi
}

# Waits (up to 60 s) until APP streams and, unless MIN_FLUSH is 0, has flushed MIN_FLUSH.
e_wait_ready() { # system app min_flush(int)
    local st flush
    for _ in $(seq 1 3000); do
        read -r st flush <<< "$(e_repl_state "$1" "$2")"
        if [ "$st" = streaming ] && { [ "$3" = 0 ] || [ "$(lsn2int "$flush")" -ge "$3" ]; }; then return 0; fi
        sleep 0.02
    done
    echo "(e) $2 on $1 did not start streaming: state '${st:-}', flushed ${flush:-}" >&2
    exit 1
}

# The load: until PostgreSQL's WAL passes TARGET, each client inserts 100 rows of 1500 bytes
# per transaction into a table of its own (below the 2 kB at which PostgreSQL would compress
# or TOAST them), with synchronous_commit off; then one commit with it on, which flushes all
# the WAL the client wrote, so the load ends with the target durable, as walserver's does.
e_load_pg() { # target(int)
    local i pids=()
    for i in $(seq 1 "$LIVE_CLIENTS"); do
        PGOPTIONS='-c synchronous_commit=off' "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 \
            -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres \
            -c "DO \$\$ BEGIN LOOP
                    INSERT INTO live_$i SELECT g, repeat('z', 1500) FROM generate_series(1, 100) g;
                    COMMIT;
                    EXIT WHEN pg_current_wal_insert_lsn() >= '$(int2lsn "$1")';
                END LOOP; END \$\$" \
            -c "SET synchronous_commit = on" -c "INSERT INTO live_$i VALUES (0, '')" >/dev/null &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p"; done
}

# walserver: LIVE_CLIENTS writers of 16 records of 8 KiB per POST /wal, each waiting for the
# primary's fsync; at least LIVE_MIB of payload, so the WAL passes the target.
e_load_ws() {
    "$WS" bench append --http "127.0.0.1:$WS_HTTP" --durability local --size 8192 --batch 16 \
        --writers "$LIVE_CLIENTS" --bytes "$((LIVE_MIB << 20))" --json > "$WORK/live-load.json"
}

e_one() { # system receiver(recv|codec) run
    local sys=$1 kind=$2 r=$3 port start target app pid wpid t0 t1 t2
    if [ "$sys" = pg ]; then port=$PG_PORT; else port=$WS_PORT; fi
    start=$(e_end_now "$sys")
    target=$(( start + (LIVE_MIB << 20) ))
    app="live_${kind}_${sys}_$r"
    rm -f "$WORK/live-done" "$WORK/live-durable"
    if [ "$kind" = recv ]; then
        mkdir -p "$WORK/live-recv"
        ( timeout 600 "$PG_BIN/pg_receivewal" -d "host=127.0.0.1 port=$port user=postgres application_name=$app" \
            -D "$WORK/live-recv" --synchronous --endpos "$(int2lsn $(( target - 1 )))" -n -w \
            >/dev/null 2>"$WORK/live-recv.err" && date +%s.%N > "$WORK/live-done" ) &
        pid=$!; BG_PIDS+=("$pid")
        e_wait_ready "$sys" "$app" "$start"
    else
        ( timeout 600 "$WS" bench catchup --port "$port" --user postgres --application-name "$app" \
            --start "$(int2lsn "$start")" --end "$(int2lsn "$target")" --json \
            >/dev/null 2>"$WORK/live-recv.err" && date +%s.%N > "$WORK/live-done" ) &
        pid=$!; BG_PIDS+=("$pid")
        e_wait_ready "$sys" "$app" 0
    fi
    # Connects in a few ms; the load needs hundreds to reach the target.
    ( "$WS" bench wait-lsn --port "$port" --user postgres --target "$(int2lsn "$target")" \
        --interval-ms 5 --timeout 600 >/dev/null 2>"$WORK/live-wait.err" && date +%s.%N > "$WORK/live-durable" ) &
    wpid=$!; BG_PIDS+=("$wpid")
    t0=$(date +%s.%N)
    if [ "$sys" = pg ]; then e_load_pg "$target"; else e_load_ws; fi
    wait "$wpid" || { echo "(e) wait-lsn failed on $sys:" >&2; cat "$WORK/live-wait.err" >&2; exit 1; }
    wait "$pid" || { echo "(e) the $kind receiver failed on $sys:" >&2; cat "$WORK/live-recv.err" >&2; exit 1; }
    t1=$(cat "$WORK/live-durable")
    t2=$(cat "$WORK/live-done")
    record "e_${kind}_mbps" "$sys" "$(awk -v b=$(( target - start )) -v a="$t0" -v z="$t2" 'BEGIN { printf "%.0f", b / (z - a) / 1e6 }')"
    record "e_${kind}_lag_ms" "$sys" "$(awk -v a="$t1" -v z="$t2" 'BEGIN { l = (z - a) * 1000; printf "%.0f", (l > 0 ? l : 0) }')"
    record e_load_mbps "$sys" "$(awk -v b=$(( target - start )) -v a="$t0" -v z="$t1" 'BEGIN { printf "%.0f", b / (z - a) / 1e6 }')"
    rm -rf "$WORK/live-recv" "$WORK/live-done" "$WORK/live-durable"
    # The rows are not needed once their WAL is streamed: give their disk space back.
    if [ "$sys" = pg ]; then for i in $(seq 1 "$LIVE_CLIENTS"); do psql_pg "TRUNCATE live_$i"; done; fi
}

section e "(e) live appends of $LIVE_MIB MiB into pg_receivewal --synchronous and into the codec client, $RUNS runs"
for r in $(runs_of e); do
    start_run "$r"
    for kind in recv codec; do
        if [ $((r % 2)) = 1 ]; then e_one pg "$kind" "$r"; e_one ws "$kind" "$r"; else e_one ws "$kind" "$r"; e_one pg "$kind" "$r"; fi
    done
done

# ---------------------------------------------------------------------------------------------
# (c) synchronous commit with one synchronous standby, 1 and 16 clients
# ---------------------------------------------------------------------------------------------
log "(c) synchronous commit: PostgreSQL standby 1 as the synchronous standby"
SB1="$WORK/pg-standby-1"
as_pg "$PG_BIN/pg_ctl" -D "$SB1" -l "$WORK/pg-standby-1.log" -w start >/dev/null
psql_pg "ALTER SYSTEM SET synchronous_standby_names = 'FIRST 1 (pgstby1)'" >/dev/null
psql_pg "SELECT pg_reload_conf()" >/dev/null
psql_pg "CREATE TABLE sc (id int, v text)"
for _ in $(seq 1 500); do
    [ "$(psql_pg "SELECT sync_state FROM pg_stat_replication WHERE application_name = 'pgstby1'")" = sync ] && break
    sleep 0.05
done
echo "INSERT INTO sc VALUES (1, repeat('x', 100));" > "$WORK/insert.sql"
mkdir -p "$WORK/pgbench"; own_pg "$WORK/pgbench" "$WORK/insert.sql"

# c_pg and c_ws take the clients and the name their rows go under (c1, c16, c1pin).
c_pg() { # clients key
    local c=$1 key=$2 j=1 out
    [ "$c" -gt 1 ] && j=2
    rm -f "$WORK"/pgbench/log*
    out=$(cd "$WORK/pgbench" && as_pg "$PG_BIN/pgbench" -h 127.0.0.1 -p "$PG_PORT" -U postgres -n \
        -c "$c" -j "$j" -T "$PGBENCH_SECS" -f "$WORK/insert.sql" -l --log-prefix="$WORK/pgbench/log" postgres 2>&1)
    record "${key}_tps" pg "$(awk '/^tps = / { printf "%.0f", $3 }' <<< "$out")"
    # Per-transaction log: client, tx, latency (us), script, epoch, us.
    cat "$WORK"/pgbench/log* | awk '{ print $3 }' | sort -n > "$WORK/pgbench/lat"
    if [ "$key" = c1 ]; then cat "$WORK/pgbench/lat" >> "$WORK/c1-latency-pg.txt"; fi
    local n; n=$(wc -l < "$WORK/pgbench/lat")
    record "${key}_p50_ms" pg "$(awk -v k=$(( (n + 1) / 2 )) 'NR == k { printf "%.3f", $1 / 1000 }' "$WORK/pgbench/lat")"
    record "${key}_p99_ms" pg "$(awk -v k=$(( (n * 99 + 99) / 100 )) 'NR == k { printf "%.3f", $1 / 1000 }' "$WORK/pgbench/lat")"
}

# c_ws's system is ws (the overlapped commit off, today's rule) or wso (`--commit-overlap`:
# the primary sends each batch to its standby once written, while its own fdatasync runs).
c_ws() { # clients key system [directory of the cluster's data directories]
    local c=$1 key=$2 sys=$3 dir=${4:-$WORK} j flag=()
    [ "$sys" = wso ] && flag=(--commit-overlap)
    j=$("${PIN[@]}" "$WS" bench append --cluster 1 --durability on --size 100 --writers "$c" --seconds "$PGBENCH_SECS" \
        "${flag[@]}" --dir "$dir" --latency-out "$WORK/c-latency-ws.txt" --json)
    if [ "$key" = c1 ]; then cat "$WORK/c-latency-ws.txt" >> "$WORK/c1-latency-$sys.txt"; fi
    # A row that says overlap must have run it: only then is the standby told a commit point.
    if [ "$sys" = wso ] && [ "$(jq -r '.standby_told_commit_point' <<< "$j")" = null ]; then
        echo "($key) --commit-overlap ran without the overlapped commit: the standby was told no commit point" >&2
        exit 1
    fi
    record "${key}_tps" "$sys" "$(jq -r '.appends_per_s | floor' <<< "$j")"
    record "${key}_p50_ms" "$sys" "$(jq -r '.latency.p50_ms' <<< "$j")"
    record "${key}_p99_ms" "$sys" "$(jq -r '.latency.p99_ms' <<< "$j")"
}
# The three of a pair of (c) or (g): PostgreSQL first in odd runs, last in even ones.
c_three() { # run clients key [directory of walserver's cluster] (PG_PORT: PostgreSQL's primary)
    local r=$1 c=$2 key=$3 dir=${4:-$WORK}
    if [ $((r % 2)) = 1 ]; then
        c_pg "$c" "$key"; c_ws "$c" "$key" ws "$dir"; c_ws "$c" "$key" wso "$dir"
    else
        c_ws "$c" "$key" wso "$dir"; c_ws "$c" "$key" ws "$dir"; c_pg "$c" "$key"
    fi
}

# Every process of PostgreSQL's primary and standby 1 (postmasters and their children; later
# backends inherit the postmaster's mask) onto the CPUs given, as taskset's list.
pg_affinity() { # cpu-list
    local pm p
    for pm in "$(head -1 "$PGP/postmaster.pid")" "$(head -1 "$SB1/postmaster.pid")"; do
        for p in "$pm" $(pgrep -P "$pm"); do taskset -a -p -c "$1" "$p" >/dev/null; done
    done
}

# The floor under a synchronous commit on this disk: one 8 KiB write and its fdatasync, 2 000
# times in sequence over a file already allocated (as both servers overwrite pre-zeroed WAL
# segments), its median recorded. Both servers flush the commit's WAL on the primary and then
# on the standby, in that order (a standby is sent only WAL the primary has flushed), so no
# server doing so on this disk completes one client's commits faster than 1 / (2 × that).
flush_floor() {
    local p50
    p50=$(python3 - "$WORK/flush.bin" <<'PY'
import os, statistics, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
block, n = bytes(8192), 2000
os.pwrite(fd, bytes(n * 8192), 0)
os.fsync(fd)
lat = []
for i in range(n):
    t = time.perf_counter()
    os.pwrite(fd, block, i * 8192)
    os.fdatasync(fd)
    lat.append(time.perf_counter() - t)
os.close(fd)
os.unlink(sys.argv[1])
print(f"{statistics.median(lat) * 1000:.3f}")
PY
)
    record c_flush_p50_ms disk "$p50"
    record c_flush_ceiling_tps disk "$(awk -v f="$p50" 'BEGIN { printf "%.0f", 1000 / (2 * f) }')"
}

section c "(c) pgbench vs walserver bench append, ${PGBENCH_SECS}s each, $RUNS runs"
for r in $(runs_of c); do
    start_run "$r"
    flush_floor
    for c in 1 16; do c_three "$r" "$c" "c$c"; done
    # One client again with each system's every thread and process on one CPU (PIN_CPU), so
    # that no hand-off of the commit waits for an idle CPU to wake: the two servers' own costs
    # without the scheduler's placement (see benches/commit-path.md).
    PIN=(taskset -c "$PIN_CPU")
    pg_affinity "$PIN_CPU"
    c_three "$r" 1 c1pin
    pg_affinity "0-$(( $(nproc) - 1 ))"
    PIN=()
done

# The fan-outs come last: 64 pg_receivewal raise the load average to 30 and more, and it takes
# minutes to decay, so a section after them would not start on a quiet machine.
as_pg "$PG_BIN/pg_ctl" -D "$SB1" -m fast -w stop >/dev/null
psql_pg "ALTER SYSTEM RESET synchronous_standby_names" >/dev/null
psql_pg "SELECT pg_reload_conf()" >/dev/null

# ---------------------------------------------------------------------------------------------
# (g) synchronous commit with each node on a disk of its own
# ---------------------------------------------------------------------------------------------
# (c) again, with every data directory on a lossyfs mount (crates/lossyfs) whose every fsync
# and fdatasync takes --own-disk-ms (1 ms: a network-attached cloud volume) and runs beside the
# others, while writes go at the page cache's speed: PostgreSQL's primary and its synchronous
# standby each on a mount of its own, and walserver's in-process cluster (primary and standby)
# on a third. lossyfs serves each fsync on a thread of its own, so the two walserver nodes
# never wait for each other's flush, as on two disks. Both systems' data sit behind the same
# FUSE layer, so both pay its cost.
g_mount() { # name: mounts $WORK/disk-NAME, owned by postgres, until the section ends
    local b="$WORK/disk-$1.backing" m="$WORK/disk-$1" i
    mkdir -p "$b" "$m"; own_pg "$b"
    "$LOSSYFS" --sync-latency-ms "$OWN_DISK_MS" "$b" "$m" > "$WORK/disk-$1.out" 2>&1 &
    G_MOUNTS+=("$!")
    # lossyfs prints one line once the mount serves requests.
    for i in $(seq 1 200); do grep -q mounted "$WORK/disk-$1.out" && return 0; sleep 0.05; done
    echo "(g) lossyfs did not mount $m:" >&2; cat "$WORK/disk-$1.out" >&2; exit 1
}
G_MOUNTS=()
if wanted g; then
    log "building lossyfs"
    cargo build --release -j2 --quiet -p lossyfs --bin lossyfs
    LOSSYFS="$PWD/target/release/lossyfs"
    g_mount pgp; g_mount pgs; g_mount ws
    GP="$WORK/disk-pgp/data" GS="$WORK/disk-pgs/data"
    G_PORT=$(free_port) G_SPORT=$(free_port)
    as_pg "$PG_BIN/initdb" -D "$GP" -U postgres --auth=trust -E UTF8 --locale=C -N >/dev/null
    PG_DIRS+=("$GP")
    printf '%s\n' "port = $G_PORT" "listen_addresses = '127.0.0.1'" "unix_socket_directories = ''" \
        "wal_level = replica" "max_wal_senders = 8" "fsync = on" "synchronous_commit = on" \
        "synchronous_standby_names = 'FIRST 1 (pgstbyg)'" "shared_buffers = '256MB'" "autovacuum = off" \
        >> "$GP/postgresql.conf"
    cp "$PGP/pg_hba.conf" "$GP/pg_hba.conf"; own_pg "$GP/pg_hba.conf"
    as_pg "$PG_BIN/pg_ctl" -D "$GP" -l "$WORK/pg-g-primary.log" -w start >/dev/null
    as_pg "$PG_BIN/pg_basebackup" -D "$GS" -h 127.0.0.1 -p "$G_PORT" -U postgres -X stream -R -c fast -N >/dev/null 2>&1
    PG_DIRS+=("$GS")
    printf '%s\n' "port = $G_SPORT" "cluster_name = pgstbyg" >> "$GS/postgresql.conf"
    as_pg "$PG_BIN/pg_ctl" -D "$GS" -l "$WORK/pg-g-standby.log" -w start >/dev/null
    PORT=$G_PORT psql_pg "CREATE TABLE sc (id int, v text)"
    for _ in $(seq 1 500); do
        [ "$(PORT=$G_PORT psql_pg "SELECT sync_state FROM pg_stat_replication WHERE application_name = 'pgstbyg'")" = sync ] && break
        sleep 0.05
    done
    echo "INSERT INTO sc VALUES (1, repeat('x', 100));" > "$WORK/insert.sql"; own_pg "$WORK/insert.sql"
    mkdir -p "$WORK/pgbench"; own_pg "$WORK/pgbench"
fi
section g "(g) sync commit with each node on a disk of its own (lossyfs, ${OWN_DISK_MS} ms per fsync), $RUNS runs"
for r in $(runs_of g); do
    start_run "$r"
    for c in 1 16; do PG_PORT=$G_PORT c_three "$r" "$c" "g$c" "$WORK/disk-ws"; done
done
if wanted g; then
    as_pg "$PG_BIN/pg_ctl" -D "$GS" -m fast -w stop >/dev/null
    as_pg "$PG_BIN/pg_ctl" -D "$GP" -m fast -w stop >/dev/null
    for p in "${G_MOUNTS[@]}"; do kill -TERM "$p"; wait "$p"; done
    G_MOUNTS=()
fi

# ---------------------------------------------------------------------------------------------
# (d) fan-out: N pg_receivewal processes at once, for each N of --fanout
# ---------------------------------------------------------------------------------------------
# Starts N pg_receivewal processes from slots fan_TAG_RUN_i, each to receive FANOUT_MIB; their
# pids go to FAN_PIDS.
fan_start() { # system tag run n
    local sys=$1 tag=$2 r=$3 n=$4 port start endlsn i
    if [ "$sys" = pg ]; then port=$PG_PORT start=$PG_START; else port=$WS_PORT start=$WS_START; fi
    endlsn=$(int2lsn $(( start + (FANOUT_MIB << 20) - 1 )))
    FAN_PIDS=()
    for i in $(seq 1 "$n"); do
        mkdir -p "$SHM/fan-$sys-$i"
        timeout 600 "$PG_BIN/pg_receivewal" -h 127.0.0.1 -p "$port" -U postgres -D "$SHM/fan-$sys-$i" \
            --slot "fan_${tag}_${r}_$i" --endpos "$endlsn" -n -w >/dev/null 2>"$SHM/fan-$sys-$i.err" &
        FAN_PIDS+=($!)
    done
}
fan_wait() {
    local p
    for p in "${FAN_PIDS[@]}"; do wait "$p" || { cat "$SHM"/fan-*.err >&2; exit 1; }; done
}

d_one() { # system run n
    local sys=$1 r=$2 n=$3 t0 t1 peak=0 base_mem=0 sampler
    warm_wal "$sys" "d$n"
    [ "$sys" = ws ] && base_mem=$(rss_kb "$WS_PID")
    # Memory while streaming: walserver's whole process RSS (minus before); PostgreSQL's
    # walsender processes' PSS (their share of shared memory included).
    (
        peak=0
        while :; do
            if [ "$sys" = ws ]; then m=$(rss_kb "$WS_PID")
            else m=0; for p in $(pgrep -f "postgres: walsender" || true); do m=$((m + $(pss_kb "$p"))); done; fi
            [ "$m" -gt "$peak" ] && { peak=$m; echo "$peak" > "$WORK/fan-peak"; }
            sleep 0.05
        done
    ) &
    sampler=$!
    # The server's CPU over the fan-out (sender_cpu; PostgreSQL's walsenders are waited for
    # below, at most 10 s: they end with their clients).
    local c0 c1
    c0=$(sender_cpu "$sys")
    local TIMEFORMAT='%U %S' ct
    t0=$(date +%s.%N)
    # PERF_DIR=DIR records a profile of the whole machine over each fan-out (perf record -a).
    local perf=""
    if [ -n "${PERF_DIR:-}" ]; then
        mkdir -p "$PERF_DIR"
        perf record -q -a -e cpu-clock -F 1999 -o "$PERF_DIR/d$n-$sys-$r.data" 2>/dev/null &
        perf=$!
    fi
    # `time` reports into a file; the receivers' own errors still reach standard error.
    { time { fan_start "$sys" "$n" "$r" "$n"; fan_wait; } 2>&3 ; } 3>&2 2>"$WORK/fan-time"
    ct=$(cat "$WORK/fan-time")
    t1=$(date +%s.%N)
    if [ -n "$perf" ]; then kill -INT "$perf"; wait "$perf" || true; fi
    senders_reaped "$sys"
    c1=$(sender_cpu "$sys")
    kill "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null || true
    peak=$(cat "$WORK/fan-peak" 2>/dev/null || echo 0); rm -f "$WORK/fan-peak"
    record "d${n}_fanout_mbps" "$sys" "$(awk -v n="$n" -v b=$((FANOUT_MIB << 20)) -v a="$t0" -v z="$t1" 'BEGIN { printf "%.0f", n * b / (z - a) / 1e6 }')"
    record "d${n}_mem_per_walsender_kib" "$sys" "$(( (peak - base_mem) / n ))"
    local mb=$(( n * FANOUT_MIB * 1048576 / 1000000 ))
    record "d${n}_server_cpu_ms_per_mb" "$sys" "$(awk -v a="$c0" -v b="$c1" -v m="$mb" 'BEGIN { printf "%.3f", (b - a) * 1000 / m }')"
    record "d${n}_clients_cpu_ms_per_mb" "$sys" "$(awk -v c="$ct" -v m="$mb" 'BEGIN { split(c, x, " "); printf "%.3f", (x[1] + x[2]) * 1000 / m }')"
    rm -rf "$SHM"/fan-*
}

section d "(d) fan-out to $FANOUT_NS pg_receivewal, $FANOUT_MIB MiB each, $RUNS runs"
# The receivers write into tmpfs pages the kernel has to find first: the first fan-out after
# the setup was the slowest of every run (PostgreSQL's, first in run 1: 330-400 MB/s against
# 900-1 300 in its other runs, on 2026-12-04), since on this VM memory left free for a while
# has been handed back to the host (MACHINE_REPORTING) and costs a host fault per page when
# it is used again; the first fan-out to 64, which needs four times the memory, was the
# slowest of its size too. So each size's rounds run together, smallest first (a round of 16
# never follows one of 64), after one unrecorded fan-out of that size of each system.
for n in $FANOUT_NS; do
    if wanted d; then
        WARMUP=1; log "(d) warm-up for $n, not recorded"; d_one pg 0 "$n"; d_one ws 0 "$n"; WARMUP=0
    fi
    for r in $(runs_of d); do
        start_run "$r"
        if [ $((r % 2)) = 1 ]; then d_one pg "$r" "$n"; d_one ws "$r" "$n"; else d_one ws "$r" "$n"; d_one pg "$r" "$n"; fi
    done
done

# ---------------------------------------------------------------------------------------------
# (f) one client's synchronous commits while FANOUT_MAX pg_receivewal catch up at once
# ---------------------------------------------------------------------------------------------
# The synchronous standby is a pg_receivewal --synchronous named fan_sync, started without a
# slot in an empty directory (so at the segment of the server's end: it is live within 16 MiB)
# and waited for until the server shows it streaming and synchronous. Then the FANOUT_MAX
# receivers start from their slots and, at once, one client commits for PGBENCH_SECS seconds:
# pgbench's one-row INSERT with synchronous_commit on, or `walserver bench append --http
# --durability on --size 100`. The fan-out's own duration is recorded beside it, since the
# commits only overlap it while it lasts.
#
# The client and the synchronous receiver each run in a session of their own (setsid), as the
# servers do (see "pg_ctl starts PostgreSQL in a session of its own" above): the 64 receivers
# stand for standbys on other hosts, and with autogroup scheduling on they would otherwise share
# one group's CPU with the commit's two other parties. Measured on a 2-CPU host (walserver,
# 2026-12-02): in that shared group the client's next request reached the server 0.1-20 ms
# after the last answer (mean 14.7 ms) and the receiver's reply 0.1-11 ms after the WAL, for
# 61-142 commits/s; in sessions of their own, 362-451 commits/s.
f_sync_start() { # system
    local port st
    if [ "$1" = pg ]; then port=$PG_PORT; else port=$WS_PORT; fi
    rm -rf "$SHM/fan-sync"; mkdir -p "$SHM/fan-sync"
    setsid timeout 900 "$PG_BIN/pg_receivewal" -d "host=127.0.0.1 port=$port user=postgres application_name=fan_sync" \
        -D "$SHM/fan-sync" --synchronous -n -w >/dev/null 2>"$SHM/fan-sync.err" &
    F_SYNC_PID=$!; BG_PIDS+=("$F_SYNC_PID")
    for _ in $(seq 1 3000); do
        if [ "$1" = pg ]; then st=$(psql_pg "SELECT sync_state FROM pg_stat_replication WHERE application_name = 'fan_sync'")
        else st=$(curl -sf "http://127.0.0.1:$WS_HTTP/status" | jq -r '.replication[] | select(.application_name == "fan_sync") | .sync_state'); fi
        [ "$st" = sync ] && return 0
        sleep 0.02
    done
    echo "(f) fan_sync never became synchronous on $1 (state '${st:-}')" >&2; cat "$SHM/fan-sync.err" >&2; exit 1
}

f_one() { # system run
    local sys=$1 r=$2 t0 t1 out j n
    f_sync_start "$sys"
    warm_wal "$sys" f
    t0=$(date +%s.%N)
    fan_start "$sys" f "$r" "$FANOUT_MAX"
    if [ "$sys" = pg ]; then
        rm -f "$WORK"/pgbench/flog*
        out=$(cd "$WORK/pgbench" && as_pg setsid "$PG_BIN/pgbench" -h 127.0.0.1 -p "$PG_PORT" -U postgres -n \
            -c 1 -j 1 -T "$PGBENCH_SECS" -f "$WORK/finsert.sql" -l --log-prefix="$WORK/pgbench/flog" postgres 2>&1)
        record f_tps pg "$(awk '/^tps = / { printf "%.0f", $3 }' <<< "$out")"
        cat "$WORK"/pgbench/flog* | awk '{ print $3 }' | sort -n > "$WORK/pgbench/flat"
        n=$(wc -l < "$WORK/pgbench/flat")
        record f_p50_ms pg "$(awk -v k=$(( (n + 1) / 2 )) 'NR == k { printf "%.3f", $1 / 1000 }' "$WORK/pgbench/flat")"
        record f_p99_ms pg "$(awk -v k=$(( (n * 99 + 99) / 100 )) 'NR == k { printf "%.3f", $1 / 1000 }' "$WORK/pgbench/flat")"
    else
        j=$(setsid "$WS" bench append --http "127.0.0.1:$WS_HTTP" --durability on --size 100 --writers 1 \
            --seconds "$PGBENCH_SECS" --json)
        record f_tps ws "$(jq -r '.appends_per_s | floor' <<< "$j")"
        record f_p50_ms ws "$(jq -r '.latency.p50_ms' <<< "$j")"
        record f_p99_ms ws "$(jq -r '.latency.p99_ms' <<< "$j")"
    fi
    fan_wait
    t1=$(date +%s.%N)
    record f_fanout_seconds "$sys" "$(awk -v a="$t0" -v z="$t1" 'BEGIN { printf "%.1f", z - a }')"
    kill -TERM "$F_SYNC_PID" 2>/dev/null; wait "$F_SYNC_PID" 2>/dev/null || true
    rm -rf "$SHM"/fan-*
}

psql_pg "CREATE TABLE fsc (id int, v text)"
mkdir -p "$WORK/pgbench"; own_pg "$WORK/pgbench"
echo "INSERT INTO fsc VALUES (1, repeat('x', 100));" > "$WORK/finsert.sql"; own_pg "$WORK/finsert.sql"
psql_pg "ALTER SYSTEM SET synchronous_standby_names = 'FIRST 1 (fan_sync)'" >/dev/null
psql_pg "SELECT pg_reload_conf()" >/dev/null
section f "(f) one client's synchronous commits while $FANOUT_MAX pg_receivewal catch up, ${PGBENCH_SECS}s, $RUNS runs"
for r in $(runs_of f); do
    start_run "$r"
    if [ $((r % 2)) = 1 ]; then f_one pg "$r"; f_one ws "$r"; else f_one ws "$r"; f_one pg "$r"; fi
done
psql_pg "ALTER SYSTEM RESET synchronous_standby_names" >/dev/null
psql_pg "SELECT pg_reload_conf()" >/dev/null

LOAD_END=$(cut -d' ' -f1-3 /proc/loadavg)

# ---------------------------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------------------------
# BUSY: the machine was not quiet before the build (the run was let through by --allow-busy), or
# a section other than (f) started with the load average still above 1 after its settling wait.
# The load right after the build is shown in the header but decides nothing: the build's own
# load is what every section waits out. (f) starts after (d)'s fan-outs and always runs loaded.
BUSY=""
if awk -v l="$LOAD1" 'BEGIN { exit !(l > 1) }'; then BUSY=" — BUSY: load average above 1 at the start, not comparable"; fi
for sl in $SECTION_LOADS; do
    case "$sl" in f=*) continue ;; esac
    if awk -v l="${sl#*=}" 'BEGIN { exit !(l > 1) }'; then BUSY=" — BUSY: section ${sl%%=*} started at load average ${sl#*=}, not comparable"; fi
done
{
echo
echo "walserver vs PostgreSQL 15 — $MACHINE_DATE$BUSY"
echo "machine: $MACHINE_NPROC cores ($MACHINE_CPU), disk $MACHINE_DISK, sched_autogroup_enabled $MACHINE_AUTOGROUP, cpuidle $MACHINE_IDLE, page-cache reclaim: $MACHINE_RECLAIM, memory to the host: $MACHINE_REPORTING, load average $LOAD1 at the start, $LOAD_START once built, $LOAD_END at end"
echo "volume: $((PG_BYTES >> 20)) MiB (PostgreSQL) / $((WS_BYTES >> 20)) MiB (walserver) of WAL; $RUNS run(s) per pair, alternating; medians, [min..max]"
echo
awk -F'\t' -v fans="$FANOUT_NS" -v fmax="$FANOUT_MAX" 'BEGIN { nfan = split(fans, fan, " ") }
function median(key,    n, i, j, t, a) {
    n = split(vals[key], a, " ")
    for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] + 0 > t + 0; j--) a[j + 1] = a[j]; a[j + 1] = t }
    lo[key] = a[1]; hi[key] = a[n]
    return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
function cell(key,    m) {
    if (!(key in vals)) return "-"
    m = median(key)
    if (lo[key] == hi[key]) return sprintf("%g", m)
    return sprintf("%g [%g..%g]", m, lo[key], hi[key])
}
# sys is ws unless given: wso is walserver with the overlapped commit (--commit-overlap).
function row(label, key, better, sys,    w, p, r) {
    if (sys == "") sys = "ws"
    w = (key SUBSEP sys) in vals ? median(key SUBSEP sys) : ""
    p = (key SUBSEP "pg") in vals ? median(key SUBSEP "pg") : ""
    r = (w != "" && p != "" && p + 0 != 0) ? sprintf("%.2f", w / p) : "-"
    printf "| %-56s | %-22s | %-22s | %-6s | %s |\n", label, cell(key SUBSEP sys), cell(key SUBSEP "pg"), r, better
}
# A row of (c) or (g) twice: walserver as PostgreSQL commits (a standby gets only flushed WAL),
# then with the overlapped commit, each with its ratio to PostgreSQL.
function row2(label, key, better) {
    row(label, key, better)
    row(label ", overlap", key, better, "wso")
}
{ k = $1 SUBSEP $2; vals[k] = (k in vals) ? vals[k] " " $3 : $3 }
END {
    printf "| %-56s | %-22s | %-22s | %-6s | %s |\n", "measure", "walserver", "PostgreSQL 15", "ws/pg", "better"
    printf "|%s|%s|%s|%s|%s|\n", "----------------------------------------------------------", "------------------------", "------------------------", "--------", "--------"
    row("(a) catch-up into pg_receivewal --synchronous, MB/s", "a_recv_mbps", "higher")
    row("(a) pg_receivewal CPU, cores busy", "a_recv_client_cpu", "-")
    row("(a) catch-up into plain pg_receivewal, MB/s", "a_plain_mbps", "higher")
    row("(a) catch-up into a plain codec client, MB/s", "a_codec_mbps", "higher")
    row("(a) sender CPU per MB, pg_receivewal --synchronous, ms", "a_recv_sender_cpu_ms_per_mb", "lower")
    row("(a) sender CPU per MB, plain pg_receivewal, ms", "a_plain_sender_cpu_ms_per_mb", "lower")
    row("(a) sender CPU per MB, codec client, ms", "a_codec_sender_cpu_ms_per_mb", "lower")
    row("(b) catch-up into a standby, fsync on, MB/s", "b_standby_mbps", "higher")
    row("(b) sender CPU per MB sent, ms", "b_sender_cpu_ms_per_mb", "lower")
    row("(b) receiver CPU per MB (walreceiver / standby), ms", "b_receiver_cpu_ms_per_mb", "lower")
    row("(b) sender and receiver together per MB, ms", "b_both_cpu_ms_per_mb", "lower")
    row("(b) walserver standby on tmpfs, MB/s", "b_tmpfs_mbps", "higher")
    printf "| %-56s | %-22s | %-22s | %-6s | %s |\n", "(b) disk: 16 MiB write+fdatasync, new file, MB/s", cell("disk_new_mbps" SUBSEP "disk"), "", "", ""
    printf "| %-56s | %-22s | %-22s | %-6s | %s |\n", "(b) disk: 16 MiB write+fdatasync, overwrite, MB/s", cell("disk_overwrite_mbps" SUBSEP "disk"), "", "", ""
    printf "| %-56s | %-22s | %-22s | %-6s | %s |\n", "(c) disk: 8 KiB write+fdatasync, p50 ms", cell("c_flush_p50_ms" SUBSEP "disk"), "", "", ""
    printf "| %-56s | %-22s | %-22s | %-6s | %s |\n", "(c) ceiling at 1 client: 1 / two such flushes, commits/s", cell("c_flush_ceiling_tps" SUBSEP "disk"), "", "", ""
    row2("(c) sync commit, 1 client, commits/s", "c1_tps", "higher")
    row2("(c) sync commit, 1 client, p50 ms", "c1_p50_ms", "lower")
    row2("(c) sync commit, 1 client, p99 ms", "c1_p99_ms", "lower")
    row2("(c) sync commit, 1 client, all on one CPU, commits/s", "c1pin_tps", "higher")
    row2("(c) sync commit, 1 client, all on one CPU, p50 ms", "c1pin_p50_ms", "lower")
    row2("(c) sync commit, 1 client, all on one CPU, p99 ms", "c1pin_p99_ms", "lower")
    row2("(c) sync commit, 16 clients, commits/s", "c16_tps", "higher")
    row2("(c) sync commit, 16 clients, p50 ms", "c16_p50_ms", "lower")
    row2("(c) sync commit, 16 clients, p99 ms", "c16_p99_ms", "lower")
    row2("(g) own disks: sync commit, 1 client, commits/s", "g1_tps", "higher")
    row2("(g) own disks: sync commit, 1 client, p50 ms", "g1_p50_ms", "lower")
    row2("(g) own disks: sync commit, 1 client, p99 ms", "g1_p99_ms", "lower")
    row2("(g) own disks: sync commit, 16 clients, commits/s", "g16_tps", "higher")
    row2("(g) own disks: sync commit, 16 clients, p50 ms", "g16_p50_ms", "lower")
    row2("(g) own disks: sync commit, 16 clients, p99 ms", "g16_p99_ms", "lower")
    for (n = 1; n <= nfan; n++) {
        row(sprintf("(d) fan-out to %d pg_receivewal, aggregate MB/s", fan[n]), "d" fan[n] "_fanout_mbps", "higher")
        row(sprintf("(d) memory per walsender at %d, KiB", fan[n]), "d" fan[n] "_mem_per_walsender_kib", "lower")
        row(sprintf("(d) server CPU per MB sent at %d, ms", fan[n]), "d" fan[n] "_server_cpu_ms_per_mb", "lower")
        row(sprintf("(d) CPU per MB of the %d receivers, ms", fan[n]), "d" fan[n] "_clients_cpu_ms_per_mb", "-")
    }
    row("(e) live appends into pg_receivewal --synchronous, MB/s", "e_recv_mbps", "higher")
    row("(e) pg_receivewal behind the server at the end, ms", "e_recv_lag_ms", "lower")
    row("(e) live appends into a plain codec client, MB/s", "e_codec_mbps", "higher")
    row("(e) codec client behind the server at the end, ms", "e_codec_lag_ms", "lower")
    row("(e) the load: WAL durable on the server, MB/s", "e_load_mbps", "-")
    row(sprintf("(f) sync commit, 1 client, %d streaming, commits/s", fmax), "f_tps", "higher")
    row(sprintf("(f) sync commit, 1 client, %d streaming, p50 ms", fmax), "f_p50_ms", "lower")
    row(sprintf("(f) sync commit, 1 client, %d streaming, p99 ms", fmax), "f_p99_ms", "lower")
    row(sprintf("(f) the %d receivers catching up, seconds", fmax), "f_fanout_seconds", "-")
    row("(a) stored WAL in the page cache before warming it, %", "a_cached_pct", "-")
    row("(b) the same, before the standby on the disk, %", "b_disk_cached_pct", "-")
    row("(b) the same, before the standby on tmpfs, %", "b_shm_cached_pct", "-")
    for (n = 1; n <= nfan; n++) row(sprintf("(d) the same, before the fan-out to %d, %%", fan[n]), "d" fan[n] "_cached_pct", "-")
    row("(f) the same, before the fan-out, %", "f_cached_pct", "-")
}' "$RES"
echo
echo "(a) sender CPU: walserver's process; PostgreSQL's walsender (its postmaster's reaped children), in clock ticks"
echo "    of /proc (10 ms: about 0.01 ms per MB of (a)'s catch-up)."
echo "(b) standby rates are measured from the standby's first reported position to the end (start-up left out)."
echo "(d) memory: walserver = growth of its process RSS / N; PostgreSQL = PSS of the N walsender processes / N."
echo "(f) the commits overlap the fan-out only while it lasts (its row); PostgreSQL: max_wal_senders = $SENDERS."
echo "Every catch-up reads from the page cache: the server's stored WAL is read there before each run (the % rows: how much was still cached)."
echo "load average at the start of each section:$SECTION_LOADS"
} | tee "$WORK/table.md"
if [ -n "$SAVE" ]; then
    mkdir -p "$SAVE"
    { printf 'measure\tsystem\tvalue\trun\tload1\n'; cat "$RES"; } > "$SAVE/results.tsv"
    cp "$WORK/table.md" "$SAVE/table.md"
    if wanted c; then
        cp "$WORK/c1-latency-ws.txt" "$SAVE/c1-latency-walserver.txt"
        cp "$WORK/c1-latency-wso.txt" "$SAVE/c1-latency-walserver-overlap.txt"
        cp "$WORK/c1-latency-pg.txt" "$SAVE/c1-latency-postgresql.txt"
        "$WS" bench latency-plot --title "synchronous commit, 1 client, 1 synchronous standby — $MACHINE_DATE" \
            --series "walserver=$SAVE/c1-latency-walserver.txt" \
            --series "walserver (overlap)=$SAVE/c1-latency-walserver-overlap.txt" \
            --series "PostgreSQL 15=$SAVE/c1-latency-postgresql.txt" \
            --out "$SAVE/commit-latency-1-client.svg" >&2
    fi
    log "saved the raw values, the table and the latency plot in $SAVE"
fi
echo "(e) $LIVE_MIB MiB per load; MB/s from the load's start until the receiver has it all; behind = that moment - the"
echo "    moment the server had it durable; the load's row: until the server had it durable (both receivers' runs)."
log "done in ${SECONDS}s"
