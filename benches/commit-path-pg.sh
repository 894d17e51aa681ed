#!/usr/bin/env bash
# PostgreSQL 15's synchronous commit, stage by stage, as benches/commit-path-trace.sh does for
# walserver's: a primary and one synchronous standby (`FIRST 1 (pgstby1)`, fsync on, both on
# the disk under /var/tmp), pgbench with one client running the one-row INSERT of
# compare-postgres.sh (c) for 9 s, 3 s of it recorded from its 3rd second (`perf record` of
# the system-call tracepoints of the backend, the walsender, the walreceiver and pgbench),
# split by benches/commit-path-trace.py --postgres.
#
#   benches/commit-path-pg.sh            # PIN=CPU: every process on that one CPU (taskset)
#
# PostgreSQL from $WALSERVER_PG_BIN or /usr/lib/postgresql/15/bin, as the postgres user
# (runuser) when run as root, on 127.0.0.1 only; everything is removed at exit.
set -euo pipefail
bin=${WALSERVER_PG_BIN:-/usr/lib/postgresql/15/bin}
[ -x "$bin/pgbench" ] || { echo "PostgreSQL 15 is missing in $bin (apt-get install postgresql-15)" >&2; exit 1; }
pin=()
[ -n "${PIN:-}" ] && pin=(taskset -c "$PIN")
as_pg() { if [ "$(id -u)" = 0 ]; then "${pin[@]}" runuser -u postgres -- "$@"; else "${pin[@]}" "$@"; fi; }
w=$(mktemp -d /var/tmp/commit-path-pg.XXXXXX)
chmod 755 "$w"
[ "$(id -u)" = 0 ] && chown postgres "$w"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
port=$(free_port)
sport=$(free_port)
cleanup() {
    set +e
    for d in "$w/s" "$w/p"; do
        [ -f "$d/postmaster.pid" ] && as_pg "$bin/pg_ctl" -D "$d" -m immediate -w stop >/dev/null 2>&1
    done
    rm -rf "$w"
}
trap cleanup EXIT
psql_at() { as_pg "$bin/psql" -X -A -t -q -h 127.0.0.1 -p "$1" -U postgres -d postgres -c "$2"; }
as_pg "$bin/initdb" -D "$w/p" -U postgres --auth=trust -N >/dev/null
cat >> "$w/p/postgresql.conf" <<C
port = $port
listen_addresses = '127.0.0.1'
unix_socket_directories = ''
fsync = on
synchronous_commit = on
autovacuum = off
C
echo "host replication all 127.0.0.1/32 trust" >> "$w/p/pg_hba.conf"
as_pg "$bin/pg_ctl" -D "$w/p" -l "$w/p.log" -w start >/dev/null
as_pg "$bin/pg_basebackup" -h 127.0.0.1 -p "$port" -U postgres -D "$w/s" -R -X stream >/dev/null
sed -i "s/^primary_conninfo = '/primary_conninfo = 'application_name=pgstby1 /" "$w/s/postgresql.auto.conf"
echo "port = $sport" >> "$w/s/postgresql.conf"
as_pg "$bin/pg_ctl" -D "$w/s" -l "$w/s.log" -w start >/dev/null
psql_at "$port" "ALTER SYSTEM SET synchronous_standby_names = 'FIRST 1 (pgstby1)'"
psql_at "$port" "SELECT pg_reload_conf()" >/dev/null
psql_at "$port" "CREATE TABLE sc (id int, v text)"
for _ in $(seq 1 200); do
    [ "$(psql_at "$port" "SELECT sync_state FROM pg_stat_replication WHERE application_name = 'pgstby1'")" = sync ] && break
    sleep 0.05
done
echo "INSERT INTO sc VALUES (1, repeat('x', 100));" > "$w/insert.sql"
[ "$(id -u)" = 0 ] && chown postgres "$w/insert.sql"
( cd "$w" && as_pg "$bin/pgbench" -h 127.0.0.1 -p "$port" -U postgres -n -c 1 -T 9 -f "$w/insert.sql" postgres \
    > "$w/pgbench.out" 2>&1 ) &
b=$!
sleep 3
backend=$(psql_at "$port" "SELECT pid FROM pg_stat_activity WHERE application_name = 'pgbench'")
walsender=$(psql_at "$port" "SELECT pid FROM pg_stat_replication WHERE application_name = 'pgstby1'")
walreceiver=$(psql_at "$sport" "SELECT pid FROM pg_stat_wal_receiver")
client=$(pgrep -n -x pgbench)
# perf record of the raw system-call tracepoints costs each call far less than `perf trace`,
# whose per-call overhead stretched PostgreSQL's commits to milliseconds.
perf record -q -o "$w/perf.data" -e raw_syscalls:sys_enter -e raw_syscalls:sys_exit \
    -p "$backend,$walsender,$walreceiver,$client" -- sleep 3 2>/dev/null || true
wait "$b"
perf script -i "$w/perf.data" -F comm,tid,time,event,trace > "$w/trace" 2>/dev/null
python3 "$(dirname "$0")/commit-path-trace.py" --postgres "$w/trace" "$backend" "$walsender" "$walreceiver" "$client"
grep -E '^tps|latency average' "$w/pgbench.out"
