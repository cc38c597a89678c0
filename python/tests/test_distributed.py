# SPDX-License-Identifier: MIT
"""Distributed training reports the right norms: DDP, FSDP2 (fully_shard),
HSDP, tensor parallelism (DTensor) and Megatron-style main_grad, each with
real gloo process groups launched by torchrun against a real gnmrd, and a
torch.compile'd model.

For each, gnmrd's per-unit statistics (the mean of the norms it received,
the last GNMR) equal those of the full, unsharded gradients' fp64 norms
that the ranks gathered for the test, and gnmrd's decisions equal
`gnmrctl replay` of that reference trace; every rank got the same routes
and the same job-wide non-finite units (a NaN in one rank's shard skips
the step on every rank).
"""
import csv
import io
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from test_gnmr import BIN, Daemon  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS = 12
PARAMS = ["--warmup-steps", "2", "--max-active", "1", "--lock-steps", "1",
          "--alpha", "1.3", "--beta", "1.3"]


def gnmrctl(d, *args):
    return subprocess.run([os.path.join(BIN, "gnmrctl"), "--admin",
                           f"ipc://{d.dir}/admin.sock", *args],
                          capture_output=True, text=True, timeout=60,
                          check=True).stdout


def live_and_replayed(d, job, trace, params=PARAMS):
    """([(step, sorted active unit ids)] that gnmrd decided for job, the
    same of `gnmrctl replay` of trace)."""
    replay = subprocess.run(
        [os.path.join(BIN, "gnmrctl"), "replay", *params, trace],
        capture_output=True, text=True, timeout=60, check=True).stdout
    live = gnmrctl(d, "decisions", job, "--csv")
    want = [(int(r["step"]), sorted(int(x) for x in r["active"].split()))
            for r in csv.DictReader(io.StringIO(replay))]
    got = [(int(r["step"]), sorted(int(x) for x in
                                   (r.get("active") or "").split()))
           for r in csv.DictReader(io.StringIO(live))]
    return got, want


class DistributedTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.d = Daemon()

    @classmethod
    def tearDownClass(cls):
        cls.d.stop()

    def run_job(self, kind, nproc):
        out = tempfile.mkdtemp(prefix=f"gnmr-{kind}-")
        self.addCleanup(shutil.rmtree, out, True)
        job = f"dist-{kind}"
        cmd = [sys.executable, "-m", "torch.distributed.run",
               "--standalone", f"--nproc-per-node={nproc}",
               "--monitor-interval=0.2",
               os.path.join(HERE, "dist_worker.py"), kind, self.d.agents, job,
               out, str(STEPS)]
        if nproc == 1:
            cmd = [sys.executable, os.path.join(HERE, "dist_worker.py"), kind,
                   self.d.agents, job, out, str(STEPS)]
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore",
                   TMPDIR=out)  # torchelastic's files go with out
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                           env=env)
        self.assertEqual(p.returncode, 0, p.stdout[-3000:] + p.stderr[-6000:])
        ranks = []
        for r in range(nproc):
            with open(os.path.join(out, f"rank{r}.jsonl")) as f:
                ranks.append([json.loads(line) for line in f])
        with open(os.path.join(out, "reference.csv")) as f:
            ref = list(csv.DictReader(f))
        return job, out, ranks, ref

    def check(self, kind, nproc, kept=None):
        """kept: the ranks whose report reads the kept table (issue 49: no
        walk over the parameters a step), by default every rank."""
        job, out, ranks, ref = self.run_job(kind, nproc)
        for r in (range(nproc) if kept is None else kept):
            self.assertEqual(ranks[r][-1]["walks"], 0,
                             f"{kind}: rank {r} walked its parameters")
        # every rank: the same routes, the same non-finite units, on time
        for r, res in enumerate(ranks):
            self.assertEqual(len(res), STEPS)
            self.assertTrue(all(x["on_time"] for x in res), (r, res))
            self.assertEqual([(x["active"], x["nonfinite"]) for x in res],
                             [(x["active"], x["nonfinite"])
                              for x in ranks[0]], f"rank {r} differs")
        nan_steps = [x["step"] for x in ranks[0] if x["nonfinite"]]
        self.assertEqual(nan_steps, [9])
        self.assertEqual(ranks[0][8]["nonfinite"], ["down"])
        # gnmrd's statistics are those of the full gradients' norms
        norms = {}
        for row in ref:
            n = float(row["norm"])
            if math.isfinite(n) and n > 0:
                norms.setdefault(int(row["unit"]), []).append(n)
        self.assertTrue(any(not math.isfinite(float(r["norm"]))
                            for r in ref), "the NaN reached the reference")
        units = json.loads(gnmrctl(self.d, "units", job, "--json"))
        units = units["units"] if isinstance(units, dict) else units
        self.assertEqual(len(units), 4)
        for u in units:
            got = norms[u["id"]]
            self.assertEqual(u["reports"], len(got), u)
            want = sum(got) / len(got)
            self.assertAlmostEqual(u["mean"] / want, 1.0, delta=1e-12,
                                   msg=f"{kind} unit {u['name']}")
        # the decisions are those of the reference trace, replayed
        got, want = live_and_replayed(self.d, job,
                                      os.path.join(out, "reference.csv"))
        self.assertEqual(got, want)
        self.assertTrue(any(a for _, a in want), "no unit was ever active")
        # and the ranks applied them: unit ids -> names
        names = ["up", "down", "norm", "head"]
        self.assertEqual([sorted(x["active"]) for x in ranks[0]],
                         [sorted(names[i] for i in a) for _, a in want])

    def test_ddp(self):
        self.check("ddp", 2)

    def test_fsdp2_fully_shard(self):
        self.check("fsdp2", 2)

    def test_hsdp_replicate_dimension_observes(self):
        self.check("hsdp", 4)

    def test_tensor_parallel_dtensor(self):
        # the norm and head are plain tensors on both ranks, the bias of
        # "down" replicated: walked
        self.check("tp", 2, kept=())

    def test_megatron_main_grad(self):
        # rank 1 skips the parameters rank 0 counts: walked
        self.check("megatron", 2, kept=(0,))

    def test_compiled_model_keeps_its_unit_names(self):
        self.check("compile", 1)


if __name__ == "__main__":
    unittest.main()
