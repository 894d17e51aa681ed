#!/usr/bin/env bash
# Fuzzes protocol-codec: runs every cargo-fuzz target in fuzz/ for N seconds each (default
# 60), one after another, and fails on the first crash (the input is kept in
# fuzz/artifacts/<target>/).
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

for t in "${targets[@]}"; do
    mkdir -p "corpus/$t"
    echo "fuzz.sh: $t for ${secs}s" >&2
    # corpus/<t> grows (git-ignored); seeds/<t> holds the committed starting inputs.
    cargo fuzz run "$t" "corpus/$t" "seeds/$t" -- \
        -max_total_time="$secs" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1
done
echo "fuzz.sh: ${#targets[@]} targets, ${secs}s each, no crash" >&2
