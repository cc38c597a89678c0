# SPDX-License-Identifier: MIT
"""The README's "PyTorch in 5 minutes", as pasted: its three Python
snippets (HF Trainer, Lightning, a loop of one's own) and its gnmrctl
commands, run in that order in a fresh directory with no gnmrd started
(XDG_RUNTIME_DIR of the test's own: nothing listens on the default
endpoint), so each snippet starts a private gnmrd and says so (issue 48).
The install line is test_wheel's. Each job's steps must be in its
history, read with gnmrctl --store, and the loop's gradient spike must
be decided: a unit on the recovery path."""
import os
import shutil
import re
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
BIN = os.environ.get("GNMR_BIN_DIR", os.path.join(ROOT, "build", "bin"))


def quickstart_blocks():
    """[(language, code)] of the README's quickstart section, in order."""
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    m = re.search(r"^## PyTorch in 5 minutes\n(.*?)^## ", text,
                  re.S | re.M)
    assert m, "the README has no 'PyTorch in 5 minutes' section"
    return re.findall(r"^```(\w+)\n(.*?)^```", m.group(1), re.S | re.M)


class QuickstartTest(unittest.TestCase):
    def test_the_snippets_run_as_pasted(self):
        blocks = quickstart_blocks()
        self.assertEqual([lang for lang, _ in blocks],
                         ["sh", "python", "python", "python", "sh"])
        # the wheel with the extras the snippets use, each one the wheel
        # declares (issue 63: torchao through its extra)
        m = re.search(r'pip install "\$\(ls dist/gnmr-\*\.whl\)\[([a-z,]+)\]"',
                      blocks[0][1])
        self.assertIsNotNone(m, blocks[0][1])
        extras = set(m.group(1).split(","))
        self.assertLessEqual({"hf", "lightning", "torchao"}, extras)
        with open(os.path.join(ROOT, "python", "pyproject.toml")) as f:
            declared = set(re.findall(r"^(\w+) = \[", f.read().split(
                "[project.optional-dependencies]", 1)[1].split("\n[", 1)[0],
                re.M))
        self.assertLessEqual(extras, declared)
        work = tempfile.mkdtemp(prefix="gnmr-quickstart-")
        self.addCleanup(shutil.rmtree, work, True)
        env = {k: v for k, v in os.environ.items()
               if k not in ("GNMR_ENDPOINT", "RUNTIME_DIRECTORY", "GNMR_JOB",
                            "GNMR_DATA_DIR")}
        # nothing listens on the default endpoint: each snippet starts
        # its own private gnmrd
        env.update(XDG_RUNTIME_DIR=work, OMP_NUM_THREADS="1",
                   PYTHONWARNINGS="ignore", HF_HUB_OFFLINE="1",
                   PYTHONPATH=os.path.join(ROOT, "python"),
                   GNMR_GNMRD=os.path.join(BIN, "gnmrd"),
                   GNMR_GNMRCTL=os.path.join(BIN, "gnmrctl"),
                   PATH=os.path.dirname(sys.executable) + os.pathsep +
                   env.get("PATH", ""))
        for i, (_, code) in enumerate(blocks[1:4]):
            p = subprocess.run([sys.executable, "-c", code], cwd=work,
                               env=env, capture_output=True, text=True,
                               timeout=300)
            self.assertEqual(p.returncode, 0,
                             f"snippet {i + 1}:\n{p.stderr[-4000:]}")
            said = re.findall(r"started a private gnmrd for job '([^']+)'",
                              p.stderr)
            self.assertEqual(len(said), 1, p.stderr[-4000:])
        # the loop's own output: 40 steps with their active units
        lines = re.findall(r"^(\d+) (\[.*\])$", p.stdout, re.M)
        self.assertEqual([int(s) for s, _ in lines], list(range(1, 41)))
        # the spike at 30 and 31 is decided: a unit on the recovery path
        self.assertIn("model.layers.0.self_attn.q_proj", dict(lines)["31"])
        p = subprocess.run(["bash", "-c", blocks[4][1]], cwd=work,
                           env=env, capture_output=True, text=True,
                           timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        for job in ("quickstart-lightning", "quickstart-loop"):
            self.assertRegex(p.stdout, job + r"\s+finished")
        self.assertRegex(p.stdout, r"model\.layers\.0\.self_attn\.q_proj")
        for job, store, n in (("quickstart-hf", "out-hf/gnmr", 20),
                              ("quickstart-lightning", "gnmr", 20),
                              ("quickstart-loop", "gnmr", 40)):
            d = subprocess.run([os.path.join(BIN, "gnmrctl"), "--store",
                                store, "decisions", job, "--csv"], cwd=work,
                               env=env, capture_output=True, text=True,
                               timeout=60, check=True).stdout
            rows = [line.split(",") for line in d.splitlines()[1:]]
            self.assertEqual([int(r[0]) for r in rows], list(range(1, n + 1)),
                             job)
            if job == "quickstart-loop":  # some step decided a unit
                self.assertTrue(any(r[1] for r in rows), d)
            else:  # the trainers' clean runs: nothing after the warm-up
                self.assertFalse(any(r[1] for r in rows), d)
        self.assertTrue(os.path.isdir(os.path.join(work, "out-hf")))
        # every private gnmrd stopped with its job, its sockets gone
        self.assertEqual([n for n in os.listdir(work)
                          if n.startswith("gnmr-")], [])


if __name__ == "__main__":
    unittest.main()
