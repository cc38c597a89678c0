#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""How `gnmrctl decisions JOB` grows with the length of a run: runs of
5000, 10000 and 20000 steps (a second pass from the middle, as a rewind
makes), written straight into gnmrd's database, then queried through a
running gnmrd, as CSV and as JSON. Before schema version 5 each step's
latest pass was found by scanning the run's rows (quadratic).
Usage:
  GNMR_BIN_DIR=build/bin build/venv/bin/python scripts/decisions_bench.py
"""
import os
import sqlite3
import subprocess
import tempfile
import time

BIN = os.environ.get("GNMR_BIN_DIR", "build/bin")


def start(d):
    p = subprocess.Popen([f"{BIN}/gnmrd", "--data-dir", f"{d}/data",
                          "--agents", "tcp://127.0.0.1:*", "--admin",
                          f"ipc://{d}/admin.sock", "--log-level", "error"],
                         stdout=subprocess.PIPE, text=True)
    for line in p.stdout:
        if line.startswith("gnmrd: admin"):
            break
    return p


def ctl(d, *args):
    t0 = time.perf_counter()
    r = subprocess.run([f"{BIN}/gnmrctl", f"--admin=ipc://{d}/admin.sock"] +
                       list(args) + ["--timeout-ms", "120000"],
                       capture_output=True, text=True)
    return time.perf_counter() - t0, r


def main():
    for steps in (5000, 10000, 20000):
        with tempfile.TemporaryDirectory() as d:
            p = start(d)  # the schema
            p.terminate()
            p.wait()
            db = sqlite3.connect(f"{d}/data/gnmr.db")
            db.execute("INSERT INTO jobs(run, name, reporters, barrier_ms, "
                       "state, pass, last_step) VALUES(1, 'long', 1, 1000, "
                       "'finished', 2, ?)", (steps,))
            db.executemany("INSERT INTO units VALUES('long', 1, ?, ?)",
                           [(u, f"layer.{u}") for u in range(64)])
            rows = [(1, s) for s in range(1, steps + 1)]
            rows += [(2, s) for s in range(steps // 2, steps + 1)]
            db.executemany("INSERT INTO steps(job, run, pass, step, reports,"
                           " risky, pool, n_active, active, missing, "
                           "by_deadline, latency_us, at) VALUES('long', 1, "
                           "?, ?, 1, 0, 0, 3, '1 5 9', 0, 0, 100, 0)", rows)
            db.commit()
            db.close()
            p = start(d)
            try:
                for fmt in ("--csv", "--json"):
                    dt, r = ctl(d, "decisions", "long", fmt)
                    n = (r.stdout.count("\n") - 1 if fmt == "--csv"
                         else r.stdout.count('"step"'))
                    print(f"decisions_bench {steps} steps (pass 2 from "
                          f"{steps // 2}): gnmrctl decisions long {fmt}: "
                          f"{dt * 1000:.0f} ms, {n} steps, exit "
                          f"{r.returncode}", flush=True)
            finally:
                p.terminate()
                p.wait()


if __name__ == "__main__":
    main()
