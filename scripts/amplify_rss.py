#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""What one small Hello can make gnmrd hold (issue 13's amplification).

Starts gnmrd (GNMR_BIN_DIR) with its default [limits], then opens agents
with 2 units each that ask for unit ids far apart, and prints gnmrd's RSS
after each: units are kept in id order, sparsely, so each costs what 2
units cost whatever their ids. Usage:
  GNMR_AGENT_LIB=build/lib/libgnmr-agent.so GNMR_BIN_DIR=build/bin \\
    build/venv/bin/python scripts/amplify_rss.py
"""
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
import gnmr  # noqa: E402


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def main():
    bindir = os.environ.get("GNMR_BIN_DIR", "build/bin")
    with tempfile.TemporaryDirectory() as d:
        p = subprocess.Popen([f"{bindir}/gnmrd", "--data-dir", f"{d}/data",
                              "--agents", "tcp://127.0.0.1:*", "--admin",
                              f"ipc://{d}/admin.sock", "--log-level",
                              "error"], stdout=subprocess.PIPE, text=True)
        ep = None
        for _ in range(3):
            line = p.stdout.readline()
            if line.startswith("gnmrd: agents "):
                ep = line.split()[2]
        try:
            time.sleep(0.3)
            print(f"amplify gnmrd idle: RSS {rss_mb(p.pid):.1f} MB")
            for job, ids in (("far", [(1 << 24) - 1, 0]),
                             ("farthest", [(1 << 32) - 2, 0]),
                             ("small", [1, 0])):
                a = gnmr.Agent(ep, job, ["a", "b"], unit_ids=ids)
                for _ in range(200):
                    if a.joined or a.stats()["errors"]:
                        break
                    time.sleep(0.01)
                time.sleep(0.3)
                joined = a.joined
                print(f"amplify Hello of 2 units asking for id {ids[0]}: "
                      f"{'joined' if joined else 'refused'}; "
                      f"gnmrd RSS {rss_mb(p.pid):.1f} MB")
                if joined:  # steps touch every unit's state
                    t0 = time.perf_counter()
                    for step in range(1, 11):
                        a.report_sums(step, [1.0, 2.0])
                        a.wait(step, 5000)
                    ms = (time.perf_counter() - t0) * 100
                    print(f"amplify   after 10 steps: {ms:.1f} ms/step, "
                          f"gnmrd RSS {rss_mb(p.pid):.1f} MB")
                a.close()
                time.sleep(0.2)
        finally:
            p.terminate()
            p.wait()


if __name__ == "__main__":
    main()
