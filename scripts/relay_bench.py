#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The central gnmrd's work with and without node relays (issue 64):
gnmr-sim jobs of R ranks in R/N nodes of N ranks, each rank 1024
unit-shards, each unit's N shards on the ranks of one node (tensor
parallelism within a node), one gnmr-sim process a node. Without relays
every rank reports to gnmrd; with them each node's ranks report to their
node's relay (gnmrd --relay-to), which reports once a node. For each:
gnmrd's CPU time per step (user + system, from /proc), the relays' CPU
time per step (all of them together), the round trip's p50 over the
nodes' simulators, and whether node 0's decisions CSV is the same with
relays as without (it must be: the same sums, bit for bit).

    scripts/relay_bench.py [--bin build/bin] [--steps 30] [--relays-only]
                           [R:N ...]

--relays-only runs each job with relays alone: on this 2-CPU VM a job of
1,024 ranks that each connect to gnmrd over TCP does not get past its
joins (2,048 agent threads on two CPUs finish their handshakes after
gnmrd's first_message_ms, which refuses them, and they reconnect), while
with relays gnmrd sees one connection a node.

Everything runs on this machine: the simulators' agents share its CPUs
with gnmrd and the relays, so the round trips are an upper bound; the
CPU times are each process's own.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

TICK = os.sysconf("SC_CLK_TCK")
WARM = 5  # steps left to the joins before the CPU times are read


def cpu_s(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime


def start_gnmrd(bin_dir, d):
    out = open(os.path.join(d, "gnmrd.out"), "w+")
    p = subprocess.Popen([os.path.join(bin_dir, "gnmrd"), "--data-dir",
                          os.path.join(d, "data"), "--agents",
                          "tcp://127.0.0.1:*", "--admin",
                          f"ipc://{d}/admin.sock"], stdout=out,
                         stderr=open(os.path.join(d, "gnmrd.err"), "w"))
    for _ in range(200):
        out.seek(0)
        m = re.search(r"agents (tcp://\S+)", out.read())
        if m:
            return p, m.group(1)
        time.sleep(0.05)
    raise SystemExit("gnmrd did not start")


def run(bin_dir, ranks, per, steps, relays):
    d = tempfile.mkdtemp(prefix="gnmr-relay-bench-")
    nodes, units = ranks // per, 1024 * ranks // per
    gnmrd, ep = start_gnmrd(bin_dir, d)
    rel = []
    if relays:
        for k in range(nodes):
            rel.append(subprocess.Popen(
                [os.path.join(bin_dir, "gnmrd"), "--relay-to", ep,
                 "--agents", f"ipc://{d}/node{k}.sock"],
                stderr=open(os.path.join(d, f"relay{k}.err"), "w")))
    sims = []
    for k in range(nodes):
        sims.append(subprocess.Popen(
            [os.path.join(bin_dir, "gnmr-sim"), "--agents",
             f"ipc://{d}/node{k}.sock" if relays else ep, "--job", "fanin",
             "--ranks", str(ranks), "--shards", str(per), "--node-ranks",
             str(per), "--units", str(units), "--steps", str(steps),
             "--barrier-ms", "120000", "--timeout-ms", "120000",
             "--local-ranks", f"{k * per}-{k * per + per - 1}"],
            stdout=open(os.path.join(d, f"sim{k}.csv"), "w"),
            stderr=open(os.path.join(d, f"sim{k}.err"), "w")))
    # the steady state: from the first decided step past the joins (every
    # rank's and observer's Hello) to the last
    first = 0
    while first < WARM and all(s.poll() is None for s in sims):
        time.sleep(0.05)
        st = subprocess.run([os.path.join(bin_dir, "gnmrctl"),
                             f"--admin=ipc://{d}/admin.sock", "status",
                             "fanin", "--json"], capture_output=True,
                            text=True)
        m = re.search(r'"step": (\d+)', st.stdout)
        first = int(m.group(1)) if st.returncode == 0 and m else 0
    g0, r0 = cpu_s(gnmrd.pid), sum(cpu_s(p.pid) for p in rel)
    codes = [s.wait(timeout=3600) for s in sims]
    g = cpu_s(gnmrd.pid) - g0
    r = sum(cpu_s(p.pid) for p in rel) - r0
    steps -= first
    for p in rel:
        p.terminate()
        p.wait(timeout=60)
    gnmrd.terminate()
    gnmrd.wait(timeout=60)
    p50 = []
    for k in range(nodes):
        with open(os.path.join(d, f"sim{k}.err")) as f:
            m = re.search(r"round trip p50 ([0-9.]+) us", f.read())
            p50.append(float(m.group(1)) if m else float("nan"))
    with open(os.path.join(d, "sim0.csv")) as f:
        csv = f.read()
    shutil.rmtree(d, ignore_errors=True)
    return {"gnmrd": g / steps, "relays": r / steps,
            "p50": sorted(p50)[len(p50) // 2], "csv": csv,
            "ok": all(c == 0 for c in codes)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/bin")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--relays-only", action="store_true")
    ap.add_argument("configs", nargs="*", default=["64:8", "256:8", "512:8"])
    a = ap.parse_args()
    print(f"relay_bench: gnmr-sim, 1024 unit-shards a rank, each unit's "
          f"shards on one node, {a.steps} steps; CPU ms a step")
    for c in a.configs:
        ranks, per = (int(x) for x in c.split(":"))
        relayed = run(a.bin, ranks, per, a.steps, True)
        if a.relays_only:
            print(f"relay_bench {ranks:5d} ranks in {ranks // per:3d} nodes: "
                  f"gnmrd {relayed['gnmrd'] * 1e3:7.2f} ms with relays "
                  f"(without: not run); the relays "
                  f"{relayed['relays'] * 1e3:7.2f} ms together; round trip "
                  f"p50 {relayed['p50'] / 1e3:.1f} ms with"
                  f"{'' if relayed['ok'] else '; a simulator FAILED'}",
                  flush=True)
            continue
        direct = run(a.bin, ranks, per, a.steps, False)
        same = direct["csv"] == relayed["csv"] and direct["csv"] != ""
        print(f"relay_bench {ranks:5d} ranks in {ranks // per:3d} nodes: "
              f"gnmrd {direct['gnmrd'] * 1e3:7.2f} ms without relays, "
              f"{relayed['gnmrd'] * 1e3:7.2f} ms with "
              f"({relayed['gnmrd'] / direct['gnmrd']:.2f}x); the relays "
              f"{relayed['relays'] * 1e3:7.2f} ms together; round trip p50 "
              f"{direct['p50'] / 1e3:.1f} ms without, "
              f"{relayed['p50'] / 1e3:.1f} ms with; decisions "
              f"{'the same' if same else 'DIFFER'}"
              f"{'' if direct['ok'] and relayed['ok'] else '; a simulator FAILED'}",
              flush=True)


if __name__ == "__main__":
    sys.exit(main())
