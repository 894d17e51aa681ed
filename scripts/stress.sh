#!/usr/bin/env bash
# Runs tests again and again beside CPU hogs, the way a busy CI machine runs them, and reports
# every round that failed. Timing faults hide on a quiet machine: a message that overtakes a
# notification, a forked child that has not exec'd yet, a loop that does less work between
# kills. Each was found this way and not by a plain run.
#
#   scripts/stress.sh [-r ROUNDS] [-H HOGS] [-- CARGO TEST ARGS...]
#
# ROUNDS (default 3) runs of `cargo test ARGS` (default: the integration tiers, `--test node
# --test syncrep --test cluster --test interop --test pgrelay`), each beside HOGS (default: the
# number of CPUs) busy loops at normal priority (as other builds on a shared machine would
# be; at nice 19 they hardly delay anything), started before the round and stopped after it,
# also on failure or interrupt. The output of a failed
# round is kept in target/stress/round-N.log. Exits 1 if any round failed.
#
# The tests build first, without hogs, so that the rounds time only the tests. Root-only
# scenarios (--test faults --test chaos --test failover) run as root, as in CI.
set -euo pipefail
cd "$(dirname "$0")/.."

rounds=3
hogs=$(nproc)
while [ $# -gt 0 ]; do
    case "$1" in
        -r) rounds="$2"; shift 2 ;;
        -H) hogs="$2"; shift 2 ;;
        --) shift; break ;;
        *) echo "usage: $0 [-r ROUNDS] [-H HOGS] [-- CARGO TEST ARGS...]" >&2; exit 2 ;;
    esac
done
args=("$@")
if [ ${#args[@]} -eq 0 ]; then
    args=(--test node --test syncrep --test cluster --test interop --test pgrelay)
fi

hog_pids=()
stop_hogs() {
    for p in "${hog_pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${hog_pids[@]}"; do wait "$p" 2>/dev/null || true; done
    hog_pids=()
}
trap stop_hogs EXIT INT TERM

# Build with the arguments meant for cargo (those before a second `--`, which go to the tests).
build_args=()
for a in "${args[@]}"; do
    [ "$a" = "--" ] && break
    build_args+=("$a")
done
cargo test --no-run "${build_args[@]}"
mkdir -p target/stress
failed=0
for r in $(seq 1 "$rounds"); do
    for _ in $(seq 1 "$hogs"); do
        sh -c 'while :; do :; done' &
        hog_pids+=($!)
    done
    log="target/stress/round-$r.log"
    start=$(date +%s)
    if cargo test "${args[@]}" >"$log" 2>&1; then
        echo "round $r: passed in $(( $(date +%s) - start )) s"
        rm -f "$log"
    else
        failed=$((failed + 1))
        echo "round $r: FAILED after $(( $(date +%s) - start )) s (log: $log)"
        grep -E "^test .* FAILED|panicked at" "$log" | head -20 || true
    fi
    stop_hogs
done
echo "$failed of $rounds rounds failed"
[ "$failed" -eq 0 ]
