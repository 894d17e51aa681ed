#!/usr/bin/env python3
"""What a receiver on loopback pays per MB when its sender uses sendfile, and when it copies.

    benches/loopback-sendfile.py                      # 512 MiB, 3 rounds
    benches/loopback-sendfile.py --mib 1024 --rounds 5 --dir /var/tmp --congestion cubic

No walserver and no PostgreSQL: a file of MIB MiB of random bytes is written under DIR (the
disk, /var/tmp, by default) and synced, and then, each round, one sender process streams it
over a TCP connection on 127.0.0.1 to one receiver process in 128 KiB frames, each behind a
29-byte header as an XLogData message has, in three ways, taking turns:

- sendfile: the header with send(), the frame's bytes with sendfile() from the file, as
  walserver's walsender does on a plain TCP connection;
- touched: the same, after reading the frame into a scratch buffer first, so that its bytes
  are in the CPU's caches when sendfile hands the pages over;
- copy: pread() into a buffer behind the header and one send() of both, as PostgreSQL's
  walsender does.

`--congestion NAME` gives the connection that TCP congestion control instead of the system's
(walserver's walsender gives its loopback connections CUBIC, which does not pace; on a host
whose default is BBR, pacing's timers would otherwise be most of the sender's cost).
`--hot-mib N` sends the file's first N MiB over and over instead (the same total), so that
the pages stay in the CPU's caches throughout. The receiver reads into a 256 KiB buffer and
drops what it reads. Printed per transfer: MB/s, and the CPU each side spent per MB (user and
system, from getrusage). On loopback the receiver's read copies straight out of the sender's
packets; after sendfile those are the file's page-cache pages, after a copy they are socket
memory the sender has just written, so the two ways differ in who first reads the bytes from
memory. Everything stays on 127.0.0.1; the file is removed at exit.
"""

import argparse
import os
import resource
import socket
import statistics
import struct
import sys
import tempfile
import time

FRAME = 128 * 1024
HEADER = b"d" + struct.pack(">i", FRAME + 4 + 25) + b"w" + bytes(24)


def cpu_seconds():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def receive(port, report):
    """The receiver (a forked child): reads until the sender closes, then reports its CPU."""
    conn = socket.create_connection(("127.0.0.1", port))
    buf = memoryview(bytearray(256 * 1024))
    c0 = cpu_seconds()
    got = 0
    while True:
        n = conn.recv_into(buf)
        if n == 0:
            break
        got += n
    os.write(report, struct.pack("dq", cpu_seconds() - c0, got))
    os._exit(0)


def send(way, sock, fd, total, region):
    """Sends `total` bytes of the file in frames, reading the file modulo `region`; returns
    the bytes sent, headers included."""
    scratch = memoryview(bytearray(len(HEADER) + FRAME))
    scratch[: len(HEADER)] = HEADER
    off = 0
    frames = 0
    while off < total:
        n = min(FRAME, total - off)
        at = off % region
        n = min(n, region - at)
        if way == "copy":
            got = os.preadv(fd, [scratch[len(HEADER) : len(HEADER) + n]], at)
            sock.sendall(scratch[: len(HEADER) + got])
            off += got
            frames += 1
            continue
        if way == "touched":
            os.preadv(fd, [scratch[len(HEADER) : len(HEADER) + n]], at)
        sock.sendall(HEADER)
        sent = 0
        while sent < n:
            sent += os.sendfile(sock.fileno(), fd, at + sent, n - sent)
        off += n
        frames += 1
    return total + frames * len(HEADER)


def transfer(way, path, total, region, congestion):
    """One transfer; returns (MB/s, sender ms/MB, receiver ms/MB)."""
    listener = socket.socket()
    if congestion:
        # Accepted connections take the listener's congestion control from their first packet.
        listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, congestion.encode())
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    rd, wr = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(rd)
        listener.close()
        receive(port, wr)
    os.close(wr)
    sock, _ = listener.accept()
    listener.close()
    fd = os.open(path, os.O_RDONLY)
    t0 = time.monotonic()
    c0 = cpu_seconds()
    wire = send(way, sock, fd, total, region)
    sock.close()
    sender_cpu = cpu_seconds() - c0
    os.waitpid(child, 0)
    elapsed = time.monotonic() - t0
    os.close(fd)
    recv_cpu, got = struct.unpack("dq", os.read(rd, 16))
    os.close(rd)
    if got != wire:
        sys.exit(f"the receiver got {got} bytes of {wire}")
    mb = total / 1e6
    return mb / elapsed, sender_cpu * 1000 / mb, recv_cpu * 1000 / mb


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--hot-mib", type=int, default=0)
    ap.add_argument("--congestion", default="", help="the sender's TCP congestion control (cubic, as walserver's loopback listener)")
    args = ap.parse_args()
    total = args.mib << 20
    region = (args.hot_mib << 20) if args.hot_mib else total
    ways = ["sendfile", "touched", "copy"]
    results = {w: [] for w in ways}
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="loopback-sendfile.") as d:
        path = os.path.join(d, "source")
        with open(path, "wb") as f:
            for _ in range(region >> 20):
                f.write(os.urandom(1 << 20))
            f.flush()
            os.fsync(f.fileno())
        print(f"{os.cpu_count()} CPUs; {args.mib} MiB per transfer from a file under {args.dir}"
              + (f", its first {args.hot_mib} MiB over and over" if args.hot_mib else "")
              + f"; load average {os.getloadavg()[0]:.2f}")
        for r in range(args.rounds):
            # Each round starts with the way the previous round ended with.
            order = ways[r % 3 :] + ways[: r % 3]
            for w in order:
                rate, s, rc = transfer(w, path, total, region, args.congestion)
                results[w].append((rate, s, rc))
                print(f"round {r + 1} {w:9s} {rate:6.0f} MB/s  sender {s:.3f} ms/MB  receiver {rc:.3f} ms/MB",
                      flush=True)
    print("medians:")
    for w in ways:
        rates, ss, rs = zip(*results[w])
        print(f"  {w:9s} {statistics.median(rates):6.0f} MB/s  sender {statistics.median(ss):.3f} ms/MB"
              f"  receiver {statistics.median(rs):.3f}  both {statistics.median([a + b for a, b in zip(ss, rs)]):.3f}")


if __name__ == "__main__":
    main()
