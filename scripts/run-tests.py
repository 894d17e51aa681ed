#!/usr/bin/env python3
"""Runs every test `cargo test --workspace --all-features` would run, several binaries at once.

cargo runs its test binaries one after another, and the long ones mostly wait: failover on its
leases, faults on its cut links, chaos on killed nodes. This builds them once (`cargo test
--no-run`, the same arguments, so the same artifacts), then runs each binary the way cargo does
(in its package's directory, with cargo's variables) on N workers, longest first, and the
doctests as one more job. Each binary's output goes to target/test-logs/<name>.log; a line is
printed as each ends, then a summary. Every failure is reported, not just the first, and the
exit status is 1 if any job failed.

The binaries cannot collide on machine-wide resources: network namespaces, tmpfs mounts and
FUSE mounts are named after the test process's pid, ports are picked free, and each binary's
`serial()` lock only orders the scenarios inside it. The binaries in ALONE run by themselves
at the end, because their scenarios time themselves against the clock.

A binary still running after TIMEOUT seconds has hung: it is killed with everything it started
(it runs in a process group of its own), and the run says which one and fails, rather than
waiting for CI's own limit.

  scripts/run-tests.py [--jobs N]    (default: WALSERVER_TEST_JOBS, else 2)
  WALSERVER_TEST_TIMEOUT=SECONDS     each binary's limit (default 900)

Two workers on the 2-core CI machine: the long binaries mostly sleep, so two at once nearly
halve the run; a third made the chaos scenarios miss their deadlines on a loaded machine.
"""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

CARGO = os.environ.get("CARGO", "cargo")
ARGS = ["--workspace", "--all-features"]

# The binaries that take longest (seconds on the 2-core CI machine, `cargo test` run alone,
# December 2026), started first so that the longest is not the last to begin. Keyed by
# package and target name; any binary not listed is short and runs after these, in cargo's
# order.
SLOW = {
    ("walserver", "failover"): 96,
    ("walserver", "faults"): 54,
    ("walserver", "node"): 31,
    ("walserver", "chaos"): 30,
    ("walserver", "cluster"): 24,
    ("walserver", "interop"): 19,
    ("failover-actor", "failover"): 19,
    ("wal-storage", "crash"): 18,
    ("wal-storage", "storage"): 14,
    ("pg-testkit", "pg_testkit"): 13,
}
# The binaries that run alone, after the others: their scenarios time themselves against the
# clock (the tiny soak takes a sample every 0.25 s for 3 s and counts them), and beside another
# binary's load on two cores they came up short.
ALONE = {("walserver", "chaos")}
# How long one binary may run. The slowest took 265 s on the 2-core CI machine beside another
# binary (chaos, December 2026) and 96 s alone; a hang is told apart from that by this much.
# A guess at several times the slowest, still far below CI's 90 minutes.
TIMEOUT = int(os.environ.get("WALSERVER_TEST_TIMEOUT", "900"))
# The doctests: rustdoc compiles each against the workspace before it runs, so the job is
# longer than its few tests suggest (257 s on a machine loaded by six builds; the weight is a
# guess at its place among the others on an idle one).
DOCTESTS_WEIGHT = 25


def build():
    """Builds every test binary; returns [(package, target, kind, src, executable, dir)]."""
    meta = json.loads(
        subprocess.run(
            [CARGO, "metadata", "--no-deps", "--format-version", "1"],
            check=True,
            stdout=subprocess.PIPE,
        ).stdout
    )
    packages = {p["manifest_path"]: p for p in meta["packages"]}
    root = meta["workspace_root"]
    proc = subprocess.Popen(
        [CARGO, "test", *ARGS, "--no-run", "--message-format=json-render-diagnostics"],
        stdout=subprocess.PIPE,
        text=True,
    )
    found = []
    for line in proc.stdout:
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if msg.get("reason") != "compiler-artifact":
            continue
        if not msg["profile"]["test"] or not msg.get("executable"):
            continue
        pkg = packages[msg["manifest_path"]]
        target = msg["target"]
        found.append(
            {
                "package": pkg["name"],
                "version": pkg["version"],
                "target": target["name"],
                "src": os.path.relpath(target["src_path"], root),
                "exe": msg["executable"],
                "dir": os.path.dirname(msg["manifest_path"]),
            }
        )
    if proc.wait() != 0:
        sys.exit("run-tests: the build failed")
    return root, found


def run_job(job, logdir, report):
    """Runs one job to its log file; returns (ok, seconds, summary of its result lines)."""
    log = os.path.join(logdir, job["log"])
    start = time.monotonic()
    with open(log, "w") as out:
        try:
            proc = subprocess.Popen(
                job["cmd"],
                cwd=job["dir"],
                env=job["env"],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as e:
            # A binary the build listed and that cannot be started (removed since) is a
            # failure of its job, reported with the others, not the end of the run.
            out.write(f"run-tests: cannot start {job['cmd'][0]}: {e}\n")
            proc = None
            rc = 1
        if proc is not None:
            try:
                rc = proc.wait(timeout=TIMEOUT)
            except subprocess.TimeoutExpired:
                # Its tests' children (nodes, etcd, PostgreSQL) share its process group
                # unless they made their own, and go with it.
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                rc = 1
                hung = f"run-tests: {job['name']} hung: still running after {TIMEOUT} s; killed"
                out.write(f"\n{hung}\n")
                print(hung, flush=True)
    secs = time.monotonic() - start
    passed = failed = 0
    with open(log, errors="replace") as f:
        for m in re.finditer(r"test result: \w+\. (\d+) passed; (\d+) failed", f.read()):
            passed += int(m.group(1))
            failed += int(m.group(2))
    ok = rc == 0
    report(job, ok, secs, passed, failed)
    return ok, secs, passed, failed


def main():
    jobs_n = int(os.environ.get("WALSERVER_TEST_JOBS", "2"))
    if len(sys.argv) == 3 and sys.argv[1] == "--jobs":
        jobs_n = int(sys.argv[2])
    elif len(sys.argv) != 1:
        sys.exit(__doc__)

    root, binaries = build()
    logdir = os.path.join(os.environ.get("CARGO_TARGET_DIR", os.path.join(root, "target")), "test-logs")
    os.makedirs(logdir, exist_ok=True)
    for old in os.listdir(logdir):
        os.remove(os.path.join(logdir, old))

    jobs = []
    for b in binaries:
        env = dict(os.environ)
        # What cargo sets for a test it runs (the tests' own compile-time env! aside).
        env.update(
            CARGO=CARGO,
            CARGO_MANIFEST_DIR=b["dir"],
            CARGO_PKG_NAME=b["package"],
            CARGO_PKG_VERSION=b["version"],
        )
        name = f"{b['package']} {b['src']}"
        jobs.append(
            {
                "name": name,
                "log": re.sub(r"[^A-Za-z0-9_.-]+", "_", name) + ".log",
                "cmd": [b["exe"]],
                "dir": b["dir"],
                "env": env,
                "weight": SLOW.get((b["package"], b["target"]), 0),
                "alone": (b["package"], b["target"]) in ALONE,
            }
        )
    jobs.append(
        {
            "name": "doctests",
            "log": "doctests.log",
            "cmd": [CARGO, "test", *ARGS, "--doc"],
            "dir": root,
            "env": dict(os.environ),
            "weight": DOCTESTS_WEIGHT,
            "alone": False,
        }
    )
    # Stable: the unlisted jobs keep cargo's order.
    jobs.sort(key=lambda j: -j["weight"])

    lock = threading.Lock()

    def report(job, ok, secs, passed, failed):
        with lock:
            state = "ok  " if ok else "FAIL"
            print(f"{state} {secs:6.1f} s  {passed:4} passed  {job['name']}", flush=True)

    print(f"run-tests: {len(jobs)} jobs on {jobs_n} workers; logs in {logdir}", flush=True)
    start = time.monotonic()
    shared = [j for j in jobs if not j["alone"]]
    alone = [j for j in jobs if j["alone"]]
    with ThreadPoolExecutor(max_workers=jobs_n) as pool:
        results = list(pool.map(lambda j: run_job(j, logdir, report), shared))
    results += [run_job(j, logdir, report) for j in alone]
    jobs = shared + alone
    wall = time.monotonic() - start

    failed_jobs = [(j, r) for j, r in zip(jobs, results) if not r[0]]
    for job, _ in failed_jobs:
        with open(os.path.join(logdir, job["log"]), errors="replace") as f:
            text = f.read()
        # libtest prints the failures' output and names after "failures:"; a binary that
        # died without that (a signal, a crash) shows its last lines instead.
        cut = text.find("\nfailures:\n")
        shown = text[cut:] if cut >= 0 else "\n".join(text.splitlines()[-60:])
        print(f"\n===== FAILED: {job['name']} (log: {os.path.join(logdir, job['log'])})")
        print(shown)
    total = sum(r[2] for r in results)
    cpu = sum(r[1] for r in results)
    print(
        f"\nrun-tests: {total} tests passed in {len(jobs)} jobs, {len(failed_jobs)} jobs failed; "
        f"{wall:.0f} s wall, {cpu:.0f} s summed over jobs"
    )
    for job, _ in failed_jobs:
        print(f"  FAILED: {job['name']}")
    return 1 if failed_jobs else 0


if __name__ == "__main__":
    sys.exit(main())
