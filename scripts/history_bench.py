#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""How long `gnmrctl history JOB` (default limit 1000) and `decisions`
take on a large history: one run of 100k units x 1000 steps with 2M
policy events (2% of unit-steps), written straight into gnmrd's database,
then queried through a running gnmrd. Usage:
  GNMR_BIN_DIR=build/bin build/venv/bin/python scripts/history_bench.py
"""
import os
import random
import sqlite3
import subprocess
import tempfile
import time

BIN = os.environ.get("GNMR_BIN_DIR", "build/bin")
UNITS, STEPS, EVENTS = 100_000, 1000, 2_000_000


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
                       list(args) + ["--timeout-ms", "60000"],
                       capture_output=True, text=True)
    return time.perf_counter() - t0, r


def main():
    with tempfile.TemporaryDirectory() as d:
        p = start(d)  # creates the schema
        p.terminate()
        p.wait()
        db = sqlite3.connect(f"{d}/data/gnmr.db")
        db.execute("INSERT INTO jobs(run, name, reporters, barrier_ms, state,"
                   " pass, last_step, created_at, updated_at) VALUES(1,"
                   " 'big', 1, 1000, 'finished', 1, ?, 0, 0)", (STEPS,))
        db.executemany("INSERT INTO units(job, run, id, name) VALUES('big',"
                       " 1, ?, ?)", ((u, f"layer.{u}") for u in
                                     range(UNITS)))
        rnd = random.Random(1)
        rows = sorted((rnd.randrange(1, STEPS + 1), rnd.randrange(UNITS))
                      for _ in range(EVENTS))
        db.executemany("INSERT INTO events(job, run, pass, step, kind, unit,"
                       " outcome, norm, g, d, s, count, at) VALUES('big', 1,"
                       " 1, ?, 'exceed', ?, 'dropped', 1, 3, 3, 3, 0, 0)",
                       rows)
        db.executemany("INSERT INTO steps(job, run, pass, step, reports,"
                       " risky, pool, n_active, active, missing,"
                       " by_deadline, latency_us, at) VALUES('big', 1, 1,"
                       " ?, 1, 0, 0, 0, '', 0, 0, 0, 0)",
                       ((s,) for s in range(1, STEPS + 1)))
        db.commit()
        db.close()
        p = start(d)
        try:
            for args in (("history", "big", "--csv"),
                         ("history", "big", "--unit", "layer.77", "--csv"),
                         ("history", "big", "--from", "900", "--csv"),
                         ("decisions", "big", "--csv")):
                took, r = ctl(d, *args)
                lines = r.stdout.count("\n") - 1
                print(f"history_bench {UNITS} units x {STEPS} steps, "
                      f"{EVENTS} events: gnmrctl {' '.join(args)}: "
                      f"{took * 1e3:.0f} ms, {lines} rows, exit "
                      f"{r.returncode}")
        finally:
            p.terminate()
            p.wait()


if __name__ == "__main__":
    main()
