#!/usr/bin/env bash
# Fuzzes protocol-codec: runs every cargo-fuzz target in fuzz/ for N seconds each (default
# 60), as many at once as there are CPUs (each fuzzer is one process on one core, so each
# target still gets its N seconds of a core), and fails if any target crashed (the input is
# kept in fuzz/artifacts/<target>/, the output in fuzz/logs/<target>.log and printed).
#
# Usage: scripts/fuzz.sh [seconds-per-target] [target...]
#   scripts/fuzz.sh 30              # every target, 30 s each (what CI should run)
#   scripts/fuzz.sh 600 command     # one target, 10 minutes
#
# Toolchain: cargo-fuzz needs nightly-only compiler flags (-Zsanitizer=address and the
# sanitizer-coverage options). This script runs them on the stable toolchain with
# RUSTC_BOOTSTRAP=1, which is what every machine here has; `cargo +nightly fuzz run <target>`
# works as well where a nightly toolchain is installed. cargo-fuzz itself is installed with
# `cargo install cargo-fuzz --locked` if missing.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

secs="${1:-60}"
shift || true

if ! command -v cargo-fuzz >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi
export RUSTC_BOOTSTRAP=1
export CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-2}"

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    mapfile -t targets < <(cargo fuzz list)
fi

# One build for every target, with the flags `cargo fuzz run` uses, so that the runs below
# only start their fuzzers.
cargo fuzz build
mkdir -p logs
parallel="${FUZZ_JOBS:-$(nproc)}"
pids=()
names=()
failed=()
# An interrupted run leaves no fuzzer behind.
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
# Waits for the oldest running target and records whether it crashed.
reap() {
    if ! wait "${pids[0]}"; then failed+=("${names[0]}"); fi
    echo "fuzz.sh: ${names[0]} done" >&2
    pids=("${pids[@]:1}")
    names=("${names[@]:1}")
}
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t"
    [ ${#pids[@]} -ge "$parallel" ] && reap
    echo "fuzz.sh: $t for ${secs}s" >&2
    # corpus/<t> grows (git-ignored); seeds/<t> holds the committed starting inputs.
    cargo fuzz run "$t" "corpus/$t" "seeds/$t" -- \
        -max_total_time="$secs" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
        >"logs/$t.log" 2>&1 &
    pids+=($!)
    names+=("$t")
done
while [ ${#pids[@]} -gt 0 ]; do reap; done
for t in "${failed[@]}"; do
    echo "===== fuzz.sh: $t FAILED (fuzz/logs/$t.log):" >&2
    tail -60 "logs/$t.log" >&2
done
if [ ${#failed[@]} -gt 0 ]; then
    echo "fuzz.sh: ${#failed[@]} of ${#targets[@]} targets failed: ${failed[*]}" >&2
    exit 1
fi
echo "fuzz.sh: ${#targets[@]} targets, ${secs}s each, no crash" >&2
