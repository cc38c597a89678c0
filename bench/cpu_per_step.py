# SPDX-License-Identifier: MIT
"""bench/cpu_per_step.py — the CPU time each thread of gnmrd and of the
agent spends per step of a small job (13 units, one rank), paced like
training (one step every PACE ms, default 40) and back to back, from each
thread's /proc/PID/task/TID/schedstat (the scheduler's exact count).

    GNMR_AGENT_LIB=build/lib/libgnmr-agent.so GNMR_BIN_DIR=build/bin \\
        build/venv/bin/python bench/cpu_per_step.py [PACE_MS]

No limit to hold it against: it says where the CPU that runs beside a
training step goes (docs/benchmarks.md, "A loop that clips")."""
import os
import signal
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
from gnmr.agent import Agent  # noqa: E402
from benchlib import start_gnmrd  # noqa: E402

UNITS, STEPS, WARM = 13, 400, 20


def threads(pid):
    """{(tid, name): seconds on a CPU} of every thread of pid."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                out[(tid, name)] = int(f.read().split()[0]) / 1e9
        except OSError:  # ended meanwhile
            pass
    return out


def main():
    pace_ms = float(sys.argv[1]) if len(sys.argv) > 1 else 40.0
    if pace_ms < 0:
        sys.exit("usage: cpu_per_step.py [PACE_MS >= 0]")
    d, ep, tmp = start_gnmrd("cpu")
    agent = Agent(ep, "cpu-per-step", [f"u{i}" for i in range(UNITS)])
    deadline = time.monotonic() + 10
    while not agent.joined and time.monotonic() < deadline:
        time.sleep(0.01)
    t = 1
    for pace in (pace_ms / 1e3, 0.0):
        for s in range(WARM):  # warm, unmeasured
            agent.report_sums(t, [1.0 + t % 3] * UNITS)
            agent.wait(t, 1000)
            t += 1
        d0, a0 = threads(d.pid), threads(os.getpid())
        for s in range(STEPS):
            agent.report_sums(t, [1.0 + t % 3] * UNITS)
            agent.wait(t, 1000)
            t += 1
            if pace:
                time.sleep(pace)
        d1, a1 = threads(d.pid), threads(os.getpid())
        print(f"cpu_per_step {UNITS} units, "
              f"{'one step every %.0f ms' % (pace * 1e3) if pace else 'back to back'}"
              f", {STEPS} steps: CPU per step of each thread")
        for who, x0, x1 in (("gnmrd", d0, d1), ("agent's process", a0, a1)):
            for (tid, name) in sorted(x1, key=lambda k: k[1]):
                dv = x1[(tid, name)] - x0.get((tid, name), 0.0)
                if dv > 0:
                    print(f"cpu_per_step   {who:16s} {name:16s} "
                          f"{dv / STEPS * 1e3:.3f} ms")
    agent.close()
    d.send_signal(signal.SIGTERM)
    d.wait()
    d.stdout.close()


if __name__ == "__main__":
    main()
