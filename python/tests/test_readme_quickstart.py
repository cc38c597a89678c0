# SPDX-License-Identifier: MIT
"""The README's "PyTorch in 5 minutes", as pasted: its gnmrd command, its
three Python snippets (HF Trainer, Lightning, a loop of one's own) and
its gnmrctl commands, run in that order in a fresh directory with gnmrd
on its default endpoint (XDG_RUNTIME_DIR of the test's own). The install
line is test_wheel's. Each job's 20 steps must be in gnmrd's history."""
import os
import shutil
import re
import signal
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
                         ["sh", "sh", "python", "python", "python", "sh"])
        self.assertIn("pip install dist/gnmr-", blocks[0][1])
        work = tempfile.mkdtemp(prefix="gnmr-quickstart-")
        self.addCleanup(shutil.rmtree, work, True)
        env = {k: v for k, v in os.environ.items()
               if k not in ("GNMR_ENDPOINT", "RUNTIME_DIRECTORY", "GNMR_JOB")}
        env.update(XDG_RUNTIME_DIR=work, OMP_NUM_THREADS="1",
                   PYTHONWARNINGS="ignore", HF_HUB_OFFLINE="1",
                   PYTHONPATH=os.path.join(ROOT, "python"),
                   GNMR_GNMRD=os.path.join(BIN, "gnmrd"),
                   GNMR_GNMRCTL=os.path.join(BIN, "gnmrctl"),
                   PATH=os.path.dirname(sys.executable) + os.pathsep +
                   env.get("PATH", ""))
        daemon = subprocess.Popen(["bash", "-c", blocks[1][1] + "wait\n"],
                                  cwd=work, env=env, start_new_session=True,
                                  stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        try:
            sock = os.path.join(work, "gnmr", "agents.sock")
            deadline = time.monotonic() + 30
            while not os.path.exists(sock) and time.monotonic() < deadline:
                time.sleep(0.05)
            self.assertTrue(os.path.exists(sock), "gnmrd did not start")
            for i, (_, code) in enumerate(blocks[2:5]):
                p = subprocess.run([sys.executable, "-c", code], cwd=work,
                                   env=env, capture_output=True, text=True,
                                   timeout=300)
                self.assertEqual(p.returncode, 0,
                                 f"snippet {i + 1}:\n{p.stderr[-4000:]}")
            # the loop's own output: 20 steps with their active units
            self.assertEqual(len(re.findall(r"^\d+ \[", p.stdout, re.M)), 20)
            p = subprocess.run(["bash", "-c", blocks[5][1]], cwd=work,
                               env=env, capture_output=True, text=True,
                               timeout=60)
            self.assertEqual(p.returncode, 0, p.stderr)
            for job in ("quickstart-hf", "quickstart-lightning",
                        "quickstart-loop"):
                self.assertIn(job, p.stdout)
            for job in ("quickstart-hf", "quickstart-lightning",
                        "quickstart-loop"):
                d = subprocess.run([os.path.join(BIN, "gnmrctl"), "decisions",
                                    job, "--csv"], cwd=work, env=env,
                                   capture_output=True, text=True,
                                   timeout=60, check=True).stdout
                steps = [int(line.split(",")[0])
                         for line in d.splitlines()[1:]]
                self.assertEqual(steps, list(range(1, 21)), job)
            self.assertTrue(os.path.isdir(os.path.join(work, "out-hf")))
        finally:
            os.killpg(daemon.pid, signal.SIGTERM)
            daemon.wait(timeout=30)


if __name__ == "__main__":
    unittest.main()
