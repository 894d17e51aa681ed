#!/usr/bin/env python3
"""Stages of one synchronous commit from a recording of its system calls: `perf script` of a
raw_syscalls recording (what both scripts below make), or a `perf trace` of the calls named.

    commit-path-trace.py TRACE                 # walserver: `bench append --cluster 1 --writers 1`
    commit-path-trace.py --overlap TRACE       # the same with `--commit-overlap`
    commit-path-trace.py --postgres TRACE BACKEND WALSENDER WALRECEIVER PGBENCH

walserver (run by benches/commit-path-trace.sh; fdatasync, pwritev, writev, sendto, recvfrom):
`bench-primary` and `bench-s1` run each node's actors (supervisor, registry, walsender;
walreceiver), the two `wal-writer`s are the nodes' storage writer threads (the primary's
started first, so it has the lower thread id).

PostgreSQL 15 (run by benches/commit-path-pg.sh; fdatasync, pwrite64, sendto, recvfrom):
pgbench sends a one-row INSERT to its backend, which writes and fdatasyncs its WAL itself and
wakes the walsender; the standby's walreceiver writes and fdatasyncs what it receives itself
and replies; the walsender releases the backend, which answers pgbench. The four are told
apart by process id (every PostgreSQL process is called `postgres`).

One commit is the sequence of calls below, in order; a sequence interrupted by the next
commit's first call is skipped. A non-blocking `recvfrom` that finds nothing comes before
the data's wake-up, not after it, so the first one after the sender's call is the one that
reads.

With --overlap (the overlapped commit: the primary's walsender sends a batch once it is
written, while the primary's fdatasync runs) the chain is the same without the primary's
fdatasync in it, which runs beside the send, the standby's write and part of its flush; where
that fdatasync ends is reported apart: how often the standby's pwritev started before it
ended (the two nodes' work overlapped), and the time from its end to the standby's reply.

For walserver both modes also count, per commit (per fdatasync of the primary's writer),
the calls of each thread that mark a hand-off: an `epoll_wait` or `epoll_pwait` that returns
is a wake-up of a node thread, a `futex` a wait or wake on a storage writer's channel, a
`write` of 8 bytes most often an eventfd that wakes another thread."""
import re, statistics, sys
from collections import defaultdict

LINE = re.compile(r"^\s*(?P<ts>\d+\.\d+)\s+\(\s*(?P<dur>[\d.]+|\?) ms\):\s+(?P<comm>[^/]+)/(?P<tid>\d+)\s+(?P<call>\w+)\(")

# Each mode: the sequence of one commit's events (role, call, 0 = its start, 1 = its end) and
# the names of the stages between consecutive events; the last stage runs from the last event
# to the next commit's first.
WALSERVER = (
    [("PW", "pwritev", 0), ("PW", "fdatasync", 0), ("PW", "fdatasync", 1), ("P", "writev", 1),
     ("S", "recvfrom", 0), ("SW", "pwritev", 0), ("SW", "fdatasync", 0), ("SW", "fdatasync", 1),
     ("S", "sendto", 1), ("P", "recvfrom", 0)],
    ["primary: pwritev -> fdatasync starts", "primary fdatasync",
     "primary: publish, wake, walsender, writev done",
     "loopback, standby thread wakes, recvfrom",
     "standby: parse, hand to storage, writer wakes",
     "standby: pwritev -> fdatasync starts", "standby fdatasync",
     "standby: publish, wake, status update, sendto done",
     "loopback, primary thread wakes, recvfrom",
     "primary: release, answer, bench, next append to storage"],
)
WALSERVER_OVERLAP = (
    [("PW", "pwritev", 0), ("P", "writev", 1), ("S", "recvfrom", 0), ("SW", "pwritev", 0),
     ("SW", "fdatasync", 0), ("SW", "fdatasync", 1), ("S", "sendto", 1), ("P", "recvfrom", 0)],
    ["primary: pwritev, early publish, wake, walsender, writev done",
     "loopback, standby thread wakes, recvfrom",
     "standby: parse, hand to storage, writer wakes",
     "standby: pwritev -> fdatasync starts", "standby fdatasync",
     "standby: publish, wake, status update, sendto done",
     "loopback, primary thread wakes, recvfrom",
     "primary: (own flush,) release, answer, bench, next append to storage"],
)
POSTGRES = (
    [("C", "sendto", 0), ("B", "recvfrom", 1), ("B", "pwrite64", 0), ("B", "fdatasync", 0),
     ("B", "fdatasync", 1), ("WS", "sendto", 1), ("WR", "recvfrom", 0), ("WR", "pwrite64", 0),
     ("WR", "fdatasync", 0), ("WR", "fdatasync", 1), ("WR", "sendto", 1), ("WS", "recvfrom", 0),
     ("B", "sendto", 1)],
    ["pgbench sends, backend wakes, recvfrom done",
     "backend: parse, plan, insert, commit record, pwrite starts",
     "backend: pwrite -> fdatasync starts", "backend fdatasync",
     "backend wakes walsender, it reads WAL, sendto done",
     "loopback, walreceiver wakes, recvfrom",
     "walreceiver: parse, pwrite starts",
     "standby: pwrite -> fdatasync starts", "standby fdatasync",
     "walreceiver: reply, sendto done",
     "loopback, walsender wakes, recvfrom",
     "walsender releases backend, it answers, sendto done",
     "pgbench wakes, sends the next INSERT"],
)


# `perf script -F comm,tid,time,event,trace` of raw_syscalls:sys_enter/sys_exit (x86-64
# numbers), the recording both scripts make; LINE above is `perf trace`'s format.
SCRIPT = re.compile(r"^\s*(?P<comm>.+?)\s+(?P<tid>\d+)\s+(?P<ts>\d+\.\d+):\s+raw_syscalls:sys_(?P<dir>enter|exit):\s+NR (?P<nr>\d+)")
CALLS = {18: "pwrite64", 20: "writev", 44: "sendto", 45: "recvfrom", 75: "fdatasync", 296: "pwritev"}
# Calls only counted, per thread: the hand-offs.
COUNTED = {1: "write", 202: "futex", 232: "epoll_wait", 281: "epoll_pwait"}


def read(path, counts=None):
    ev, comms, entered = [], {}, {}
    for line in open(path, errors="replace"):
        m = SCRIPT.match(line)
        if m:
            tid, nr, ts = int(m["tid"]), int(m["nr"]), float(m["ts"]) * 1e6
            comms[tid] = m["comm"].strip()
            if m["dir"] == "enter":
                entered[tid] = (ts, nr)
            elif tid in entered and entered[tid][1] == nr and nr in CALLS:
                ev.append((entered.pop(tid)[0], ts, tid, CALLS[nr]))
            elif counts is not None and tid in entered and entered[tid][1] == nr and nr in COUNTED:
                entered.pop(tid)
                counts[(tid, COUNTED[nr])] += 1
            continue
        m = LINE.match(line)
        if not m:
            continue
        ts = float(m["ts"]) * 1000
        dur = 0.0 if m["dur"] == "?" else float(m["dur"]) * 1000
        tid = int(m["tid"])
        comms[tid] = m["comm"].strip()
        ev.append((ts, ts + dur, tid, m["call"]))
    ev.sort()
    return ev, comms


def stages_of(mine, seq, names):
    """Splits role-tagged events (start, end, role, call) into the stages of whole commits."""
    first = seq[0][:2]
    stages = defaultdict(list)
    cycles, whole = [], []
    i = 0
    marks_prev = None
    while i < len(mine):
        e = mine[i]
        if (e[2], e[3]) != first:
            i += 1
            continue
        marks = [e[1] if seq[0][2] else e[0]]
        j, k = i + 1, 1
        while k < len(seq) and j < len(mine):
            r, c, end = seq[k]
            f = mine[j]
            if f[2] == r and f[3] == c:
                marks.append(f[1] if end else f[0])
                k += 1
                if k < len(seq) and seq[k][:2] == seq[k - 1][:2]:
                    marks.append(f[1])
                    k += 1
            elif (f[2], f[3]) == first:
                break  # another commit began before this one was seen whole
            j += 1
        if k == len(seq):
            whole.append(marks)
            if marks_prev is not None and marks[0] - marks_prev[0] < 5000:
                stages[names[-1]].append(marks[0] - marks_prev[-1])
                cycles.append(marks[0] - marks_prev[0])
            for n, a, b in zip(names, marks, marks[1:]):
                stages[n].append(b - a)
            marks_prev = marks
        else:
            marks_prev = None
        i = j if j > i else i + 1
    return stages, cycles, whole


def main(argv):
    if argv[:1] == ["--postgres"]:
        path, pids = argv[1], [int(p) for p in argv[2:6]]
        ev, _ = read(path)
        role = dict(zip(pids, ["B", "WS", "WR", "C"]))
        seq, names = POSTGRES
    else:
        overlap = argv[:1] == ["--overlap"]
        path = argv[1] if overlap else argv[0]
        counts = defaultdict(int)
        ev, comms = read(path, counts)
        ww = sorted(t for t, c in comms.items() if c.startswith("wal-writer"))
        prim = [t for t, c in comms.items() if c.startswith("bench-primary")][0]
        stby = [t for t, c in comms.items() if c.startswith("bench-s1")][0]
        role = {ww[0]: "PW", ww[1]: "SW", prim: "P", stby: "S"}
        seq, names = WALSERVER_OVERLAP if overlap else WALSERVER
    mine = [(t0, t1, role[tid], call) for t0, t1, tid, call in ev if tid in role]
    stages, cycles, whole = stages_of(mine, seq, names)

    def q(v, p):
        return v[min(len(v) - 1, int(p * len(v)))]

    print(f"commits seen whole: {len(stages[names[0]])}, consecutive pairs: {len(cycles)}")
    print(f"{'stage':58} {'p50 us':>7} {'p10':>7} {'p90':>7}")
    for n in names:
        v = sorted(stages[n])
        if v:
            print(f"{n:58} {statistics.median(v):7.1f} {q(v, .1):7.1f} {q(v, .9):7.1f}")
    v = sorted(cycles)
    if v:
        print(f"{'one commit (first call to the next commit first call)':58} {statistics.median(v):7.1f} {q(v, .1):7.1f} {q(v, .9):7.1f}")
    if argv[:1] == ["--postgres"]:
        return
    if overlap:
        overlapped(mine, whole, q)
    # Hand-offs per commit: every call of its kind in the recording over the primary's
    # fdatasyncs in it (one per commit with one writer).
    syncs = sum(1 for e in mine if e[2] == "PW" and e[3] == "fdatasync")
    if syncs:
        names = {"P": "bench-primary", "S": "bench-s1", "PW": "primary wal-writer",
                 "SW": "standby wal-writer"}
        print(f"calls per commit ({syncs} primary fdatasyncs): " + "; ".join(
            f"{names[r]} " + " ".join(
                f"{c} {sum(n for (t, cc), n in counts.items() if role.get(t) == r and cc == c) / syncs:.2f}"
                for c in ("epoll_wait", "epoll_pwait", "futex", "write")
                if any(role.get(t) == r and cc == c for (t, cc) in counts))
            for r in ("P", "S", "PW", "SW")))


def overlapped(mine, whole, q):
    """Where the primary's fdatasync of each whole commit ended: the first one that started
    after the commit's pwritev."""
    syncs = [(e[0], e[1]) for e in mine if e[2] == "PW" and e[3] == "fdatasync"]
    before, after_reply, i = 0, [], 0
    for marks in whole:
        while i < len(syncs) and syncs[i][0] < marks[0]:
            i += 1
        if i == len(syncs):
            break
        end = syncs[i][1]
        # marks[3]: the standby's pwritev starts; marks[6]: its reply is sent.
        if marks[3] < end:
            before += 1
        after_reply.append(marks[6] - end)
    if not after_reply:
        return
    v = sorted(after_reply)
    print(f"standby pwritev started before the primary's fdatasync ended: {before} of {len(v)} commits")
    print(f"{'primary fdatasync ends -> standby reply sent (us; < 0: before)':58} {statistics.median(v):7.1f} {q(v, .1):7.1f} {q(v, .9):7.1f}")


main(sys.argv[1:])
