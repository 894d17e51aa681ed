#!/usr/bin/env bash
# Runs every walserver test: unit, integration, fault-injection and the interop tests against
# real PostgreSQL 15. Installs PostgreSQL 15 first if this machine lacks it, because the interop
# tests fail (never skip) without it, and nftables likewise for the network fault tests (which,
# like CI, run as root).
set -euo pipefail
cd "$(dirname "$0")/.."

PG_BIN="${WALSERVER_PG_BIN:-/usr/lib/postgresql/15/bin}"
if [ ! -x "$PG_BIN/postgres" ] || [ ! -x "$PG_BIN/pg_receivewal" ]; then
    echo "scripts/test.sh: PostgreSQL 15 not found in $PG_BIN; installing postgresql-15" >&2
    if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq postgresql-15 >/dev/null
fi

# The fault tests (tests/faults, crates/fault-harness) build networks of namespaces with ip and
# cut, drop and shape their links with nft and tc: they fail, never skip, without them.
if ! command -v nft >/dev/null || ! command -v tc >/dev/null || ! command -v ip >/dev/null; then
    echo "scripts/test.sh: nft, tc or ip not found; installing nftables and iproute2" >&2
    if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq nftables iproute2 >/dev/null
fi

cargo test --workspace --all-features "$@"
