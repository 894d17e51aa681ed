#!/usr/bin/env python3
"""Stages of one synchronous commit from a light `perf trace` (fdatasync, pwritev, writev,
sendto, recvfrom only) of `walserver bench append --cluster 1 --writers 1`; run by
benches/commit-path-trace.sh.

Threads: `bench-primary` and `bench-s1` run each node's actors (supervisor, registry,
walsender; walreceiver), the two `wal-writer`s are the nodes' storage writer threads (the
primary's started first, so it has the lower thread id). One commit is the sequence of
SEQ below; a sequence interrupted by the next commit's pwritev is skipped."""
import re, statistics, sys
from collections import defaultdict
LINE = re.compile(r"^\s*(?P<ts>\d+\.\d+)\s+\(\s*(?P<dur>[\d.]+|\?) ms\):\s+(?P<comm>[^/]+)/(?P<tid>\d+)\s+(?P<call>\w+)\(")
ev = []
comms = {}
for line in open(sys.argv[1], errors="replace"):
    m = LINE.match(line)
    if not m:
        continue
    ts = float(m["ts"]) * 1000
    dur = 0.0 if m["dur"] == "?" else float(m["dur"]) * 1000
    tid = int(m["tid"]); comms[tid] = m["comm"].strip()
    ev.append((ts, ts + dur, tid, m["call"]))
ev.sort()
ww = sorted(t for t, c in comms.items() if c.startswith("wal-writer"))
pw, sw = ww[0], ww[1]
prim = [t for t, c in comms.items() if c.startswith("bench-primary")][0]
stby = [t for t, c in comms.items() if c.startswith("bench-s1")][0]
role = {pw: "PW", sw: "SW", prim: "P", stby: "S"}
# SEQ: the expected order of one commit's events: (thread, call, 0 = its start, 1 = its end).
seq = [("PW", "pwritev", 0), ("PW", "fdatasync", 0), ("PW", "fdatasync", 1), ("P", "writev", 1),
       ("S", "recvfrom", 0), ("SW", "pwritev", 0), ("SW", "fdatasync", 0), ("SW", "fdatasync", 1),
       ("S", "sendto", 1), ("P", "recvfrom", 0)]
names = ["primary: pwritev -> fdatasync starts", "primary fdatasync",
         "primary: publish, wake, walsender, writev done",
         "loopback, standby thread wakes, recvfrom",
         "standby: parse, hand to storage, writer wakes",
         "standby: pwritev -> fdatasync starts", "standby fdatasync",
         "standby: publish, wake, status update, sendto done",
         "loopback, primary thread wakes, recvfrom",
         "primary: release, answer, bench, next append to storage"]
mine = [(t0, t1, role[tid], call) for t0, t1, tid, call in ev if tid in role]
stages = defaultdict(list); cycles = []
i = 0
marks_prev = None
while i < len(mine):
    e = mine[i]
    if not (e[2] == "PW" and e[3] == "pwritev"):
        i += 1; continue
    marks = [e[0]]; j = i + 1; k = 1
    while k < len(seq) and j < len(mine):
        r, c, end = seq[k]
        f = mine[j]
        if f[2] == r and f[3] == c:
            marks.append(f[1] if end else f[0]); k += 1
            if k < len(seq) and seq[k][:2] == seq[k-1][:2]:
                marks.append(f[1]); k += 1
        elif f[2] == "PW" and f[3] == "pwritev":
            break  # another commit began before this one was seen whole
        j += 1
    if k == len(seq):
        if marks_prev is not None and e[0] - marks_prev[0] < 5000:
            # The last stage runs from this commit's reply to the next commit's pwritev.
            stages[names[-1]].append(e[0] - marks_prev[-1])
            cycles.append(e[0] - marks_prev[0])
        for n, a, b in zip(names, marks, marks[1:]):
            stages[n].append(b - a)
        marks_prev = marks
    else:
        marks_prev = None
    i = j if j > i else i + 1
def q(v, p): return v[min(len(v) - 1, int(p * len(v)))]
print(f"commits seen whole: {len(stages[names[0]])}, consecutive pairs: {len(cycles)}")
print(f"{'stage':58} {'p50 us':>7} {'p10':>7} {'p90':>7}")
for n in names:
    v = sorted(stages[n])
    if v: print(f"{n:58} {statistics.median(v):7.1f} {q(v,.1):7.1f} {q(v,.9):7.1f}")
v = sorted(cycles)
if v: print(f"{'one commit (pwritev to next pwritev)':58} {statistics.median(v):7.1f} {q(v,.1):7.1f} {q(v,.9):7.1f}")
