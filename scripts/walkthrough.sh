#!/usr/bin/env bash
# The README's "A three-member cluster, step by step", run as it is written: three etcd
# members on loopback, three walserver members from configs/cluster/ as shipped, appends, a
# kill -9 of the leader, a new leader within the ttl, and the old leader back as a follower of
# it with nothing acknowledged lost. CI runs it after the tests; it stops at the first step
# that does not do what the README says, and removes every process and directory it made.
#
#   scripts/walkthrough.sh            (WALSERVER_BIN: the walserver to run, default
#                                      $CARGO_TARGET_DIR or target, then debug/walserver,
#                                      built if missing)
set -euo pipefail
cd "$(dirname "$0")/.."

W=${WALSERVER_BIN:-${CARGO_TARGET_DIR:-target}/debug/walserver}
if [ ! -x "$W" ]; then cargo build -q --bin walserver; fi
command -v etcd >/dev/null || { echo "walkthrough: etcd not found; scripts/test.sh installs it" >&2; exit 1; }
for n in 1 2 3; do
    if [ -e "data/node$n" ]; then
        echo "walkthrough: data/node$n exists; it is not mine to remove, so I stop" >&2
        exit 1
    fi
done

work=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf data/node1 data/node2 data/node3 "$work"
    rmdir data 2>/dev/null || true
}
trap cleanup EXIT
fail() {
    echo "walkthrough: $*" >&2
    for f in "$work"/*.log; do echo "--- $f (last lines)" >&2; tail -n 20 "$f" >&2; done
    exit 1
}

# Waits, up to $2 seconds, for the command after them to succeed: the bounded wait of a test
# for a state it cannot be told of (the cluster's view through its admin API).
wait_for() {
    local what=$1 secs=$2
    shift 2
    local end=$((SECONDS + secs))
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < end)) || fail "$what did not happen within ${secs}s"
        sleep 0.2
    done
}

# The member `cluster list --json` names as leader, asked of the member at $1.
leader_of() {
    "$W" cluster list --http "$1" --json | python3 -c '
import json, sys
c = json.load(sys.stdin)
leader = (c.get("leader") or {}).get("name")
if not leader:
    sys.exit(1)
print(leader)'
}
# Succeeds when the member at $1 sees leader $2 and every other member streaming from it.
all_follow() {
    "$W" cluster list --http "$1" --json | python3 -c '
import json, sys
c, leader = json.load(sys.stdin), sys.argv[1]
assert (c.get("leader") or {}).get("name") == leader
members = c["members"]
assert len(members) == 3, members
for m in members:
    if m["name"] != leader:
        assert m["role"] == "standby" and m["streaming"], m
' "$2"
}

# Step 1: etcd, three members on loopback (etcd 3.4's own local-cluster example).
cluster="e1=http://127.0.0.1:2380,e2=http://127.0.0.1:22380,e3=http://127.0.0.1:32380"
for e in 1 2 3; do
    port=$([ "$e" = 1 ] && echo 2379 || echo "${e}2379")
    peer=$([ "$e" = 1 ] && echo 2380 || echo "${e}2380")
    etcd --name "e$e" --data-dir "$work/e$e" \
        --listen-client-urls "http://127.0.0.1:$port" --advertise-client-urls "http://127.0.0.1:$port" \
        --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
        --initial-cluster "$cluster" --initial-cluster-token walkthrough --initial-cluster-state new \
        >"$work/etcd$e.log" 2>&1 &
    pids+=($!)
done
for port in 2379 22379 32379; do
    wait_for "etcd on port $port becoming healthy" 30 \
        sh -c "curl -sf http://127.0.0.1:$port/health | grep -q '\"health\":\"true\"'"
done
echo "walkthrough: etcd is up"

# Step 2: the data directories: node1 a primary, node2 and node3 standbys made from it.
"$W" init --data-dir data/node1 >"$work/init.log"
"$W" run --config configs/cluster/node1.toml >"$work/node1.log" 2>&1 &
pids+=($!)
node1=$!
wait_for "node1 leading" 30 leader_of 127.0.0.1:8433
for n in 2 3; do
    "$W" init --standby --data-dir "data/node$n" \
        --primary-conninfo 'host=127.0.0.1 port=5433 user=walserver' >>"$work/init.log"
    "$W" run --config "configs/cluster/node$n.toml" >"$work/node$n.log" 2>&1 &
    pids+=($!)
done
wait_for "node2 and node3 streaming from node1" 60 all_follow 127.0.0.1:8433 node1
"$W" cluster list --http 127.0.0.1:8433
echo "walkthrough: three members, node1 leading"

# Step 3: appends at durability on (the synchronous standby confirms each), then the leader
# killed without warning.
"$W" append --http 127.0.0.1:8433 --count 1000 --size 100 --durability on
before=$("$W" status --http 127.0.0.1:8433 --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["flush_lsn"])')
killed_at=$(date +%s.%N)
kill -9 "$node1"
wait "$node1" 2>/dev/null || true
echo "walkthrough: node1 killed at $before"
wait_for "a new leader after node1's lease ran out" 40 \
    sh -c "'$W' cluster list --http 127.0.0.1:8434 --json | python3 -c 'import json,sys; c=json.load(sys.stdin); sys.exit((c.get(\"leader\") or {}).get(\"name\") in (None, \"node1\"))'"
new=$(leader_of 127.0.0.1:8434)
echo "walkthrough: $new took the leader key $(python3 -c "import sys; print(round(float(sys.argv[2]) - float(sys.argv[1]), 1))" "$killed_at" "$(date +%s.%N)") s after the kill"
case "$new" in node2) http=127.0.0.1:8434 ;; node3) http=127.0.0.1:8435 ;; *) fail "unexpected leader $new" ;; esac
"$W" cluster list --http "$http"
echo "walkthrough: $new leads"
"$W" append --http "$http" --count 100 --size 100 --durability on

# Step 4: node1 back, with the same command: it finds the key taken and follows the leader.
"$W" run --config configs/cluster/node1.toml >>"$work/node1.log" 2>&1 &
pids+=($!)
wait_for "node1 following $new" 60 all_follow "$http" "$new"
"$W" cluster list --http "$http"
"$W" cluster history --http "$http"

# Nothing acknowledged was lost: the new leader holds every record appended before the kill
# (on timeline 1, up to the old leader's end) and the ones appended to it since, each once.
curl -sf "http://$http/wal?from=earliest" | python3 -c '
import json, sys
def lsn(t):
    hi, lo = t.split("/")
    return (int(hi, 16) << 32) | int(lo, 16)
before = lsn(sys.argv[1])
lines = [json.loads(l) for l in sys.stdin if l.strip()]
records = [l for l in lines if "data" in l]
old = [r for r in records if r["timeline"] == 1 and lsn(r["end"]) <= before]
assert len(old) == 1000, ("records from before the kill", len(old))
assert len(records) == 1100, ("records in all", len(records))
assert any("timeline_switch" in l for l in lines), "no timeline switch"
' "$before" || fail "the new leader does not hold exactly what was acknowledged"
echo "walkthrough: done; node1 follows $new, nothing acknowledged was lost"
