# SPDX-License-Identifier: MIT
"""scripts/bench_summary.py (issue 64): every '(target ...)' a benchmark
prints is read with its value, and what falls short is listed; a run
with nothing short says so; an unreadable log is an error."""
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "scripts", "bench_summary.py")

LOG = """== build/bench/rtt
rtt protocol peers -> gnmrd: p50 479 us = 1.62x raw (target <= 2x); p99 1340 us = 1.34 ms (target <= 1 ms)
norm_cpu bf16 limit 3.1 ms (9.20 GB/s): 72% of limit (target >= 80%)
policy 10k-unit step: 0.412 ms = 41.2% of the 1 ms target
snapshot: snapshots add 2.9 ms (target < 2 ms)
norm_cuda f32 launches per report 1.00 (target 1); host enqueue 3 us (target: microseconds)
throughput gnmrd = 61% of raw bytes/s (target >= 50%)
"""


class BenchSummaryTest(unittest.TestCase):
    def run_on(self, text, *extra):
        with tempfile.TemporaryDirectory() as d:
            log = os.path.join(d, "bench.log")
            with open(log, "w") as f:
                f.write(text)
            out = os.path.join(d, "summary.txt")
            r = subprocess.run([sys.executable, SCRIPT, log, out] +
                               list(extra), capture_output=True, text=True)
            written = open(out).read() if os.path.exists(out) else ""
        return r, written

    def test_what_falls_short_is_listed_with_value_and_target(self):
        r, written = self.run_on(LOG)
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.splitlines()
        self.assertEqual(lines[0], "make bench: 6 figures with a target, "
                         "3 within it, 3 short of it")
        short = [ln for ln in lines if ln.startswith("  SHORT")]
        self.assertEqual([s.split(":")[0] for s in short],
                         ["  SHORT 1.34 (target <= 1)",
                          "  SHORT 72 (target >= 80)",
                          "  SHORT 2.9 (target < 2)"])
        self.assertIn(r.stdout.strip(), written)
        self.assertRegex(written.splitlines()[0], r"^\d{4}-\d\d-\d\d$")

    def test_the_figure_is_the_last_number_before_its_target(self):
        # each benchmark prints its figure last before "(target": a count
        # or a quartile there was read as the figure (a store run of 2
        # batches read as 2 events/s, a paired step's upper quartile
        # read as its median)
        r, _ = self.run_on(
            "store 5000 step records x 100 events, persisted in 2 batches: "
            "485918 events/s (target >= 200000); raw 562015 events/s\n"
            "torch_overhead paired (step(); two identical models, their "
            "steps alternated): median difference +1.15 ms of the 57.52 ms "
            "step = +2.00% (target <= 2%) (quartiles +0.90% .. +3.09%)\n")
        self.assertIn("2 figures with a target, 2 within it, 0 short",
                      r.stdout)

    def test_nothing_short_and_bad_input(self):
        r, _ = self.run_on("a = 1.0x raw (target <= 1.5x)\nno targets\n")
        self.assertIn("1 figures with a target, 1 within it, 0 short",
                      r.stdout)
        r = subprocess.run([sys.executable, SCRIPT, "/nonexistent/log"],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 1)
        self.assertIn("/nonexistent/log", r.stderr)
        r = subprocess.run([sys.executable, SCRIPT], capture_output=True,
                           text=True)
        self.assertEqual(r.returncode, 2)


if __name__ == "__main__":
    unittest.main()
