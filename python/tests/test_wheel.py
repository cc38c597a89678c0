# SPDX-License-Identifier: MIT
"""The wheel is enough: `scripts/wheel.sh` (make wheel) builds it, it
installs in a fresh virtual environment with no network, and there, with no
checkout on sys.path and no GNMR_* variable, `python -m gnmr.daemon` starts
the bundled gnmrd and a small training loop attaches to it and gets its
decisions from the bundled libgnmr-agent.

torch comes into that environment through a .pth line to the build's venv
(installing it again would copy gigabytes); gnmr comes only from the
wheel, which the test checks.
"""
import glob
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
import unittest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.environ.get("GNMR_BUILD", "build")

LOOP = textwrap.dedent("""
    import os, re, socket, subprocess, sys, tempfile, time
    import torch
    import gnmr
    from gnmr.pytorch import Controller
    from gnmr.agent import lib
    assert gnmr.__file__.startswith(sys.prefix), gnmr.__file__
    assert lib()._name.startswith(os.path.dirname(gnmr.__file__)), lib()._name
    d = tempfile.mkdtemp()
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
    s.close()
    ep = f"tcp://127.0.0.1:{port}"
    daemon = subprocess.Popen(
        [sys.executable, "-m", "gnmr.daemon", "--data-dir", d + "/data",
         "--agents", ep, "--admin", f"ipc://{d}/admin.sock"],
        stdout=subprocess.PIPE, text=True)
    for line in daemon.stdout:
        if line.startswith("gnmrd: admin"):
            break
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    on_time = 0
    with Controller(model, ep, "wheel-job",
                    params=gnmr.default_params(warmup_steps=0),
                    wait_ms=5000) as ctl:
        for step in range(1, 6):
            model(torch.randn(4, 8)).pow(2).mean().backward()
            res = ctl.step(step)
            on_time += bool(res.on_time)
            opt.step(); opt.zero_grad()
    out = subprocess.run([os.path.join(os.path.dirname(gnmr.__file__),
                                       "bin", "gnmrctl"), "--admin",
                          f"ipc://{d}/admin.sock", "units", "wheel-job"],
                         capture_output=True, text=True).stdout
    daemon.terminate(); daemon.wait(10)
    print("on_time", on_time)
    print(out)
""")


PRIVATE = textwrap.dedent("""
    import torch
    from gnmr.pytorch import Controller
    model = torch.nn.Sequential(torch.nn.Linear(8, 4))
    with Controller(model, job="wheel-private") as ctl:
        print("gnmrd", ctl._private.proc.args[0])
        joined = 0
        for step in range(1, 4):
            model(torch.randn(2, 8)).sum().backward()
            joined += ctl.step(step, wait_ms=5000).joined
            model.zero_grad()
    print("joined", joined)
""")


class WheelTest(unittest.TestCase):
    def test_make_wheel_builds_no_torch_venv(self):
        """issue 48: `make wheel` built the test venv (4.7 GB) first; its
        own venv has only what building and repairing the wheel takes."""
        p = subprocess.run(["make", "-n", "wheel", "VENV=/nonexistent/venv",
                            "BUILD=" + BUILD], cwd=REPO, capture_output=True,
                           text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertNotIn("/nonexistent/venv", p.stdout)
        self.assertIn("venv-wheel", p.stdout)

    def test_the_wheel_installs_in_a_fresh_venv_and_a_loop_attaches(self):
        tmp = tempfile.mkdtemp(prefix="gnmr-wheel-")
        try:
            dist = os.path.join(tmp, "dist")
            p = subprocess.run(
                ["scripts/wheel.sh", BUILD, sys.executable, dist], cwd=REPO,
                capture_output=True, text=True, timeout=300)
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
            wheels = glob.glob(os.path.join(dist, "gnmr-*.whl"))
            self.assertEqual(len(wheels), 1, wheels)
            self.assertRegex(os.path.basename(wheels[0]),
                             r"^gnmr-[0-9.]+-py3-none-manylinux_2_\d+_x86_64")
            listing = subprocess.run(
                [sys.executable, "-m", "zipfile", "-l", wheels[0]],
                capture_output=True, text=True, check=True).stdout
            for member in ("gnmr/libgnmr-agent.so", "gnmr/bin/gnmrd",
                           "gnmr/bin/gnmrctl", "gnmr.libs/libzmq"):
                self.assertIn(member, listing)
            venv = os.path.join(tmp, "venv")
            subprocess.run([sys.executable, "-m", "venv", venv], check=True,
                           timeout=120)
            py = os.path.join(venv, "bin", "python")
            p = subprocess.run([py, "-m", "pip", "install", "-q", "--no-index",
                                "--no-deps", wheels[0]], capture_output=True,
                               text=True, timeout=300)
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
            site = subprocess.run(
                [py, "-c", "import sysconfig; print(sysconfig.get_paths()"
                 "['purelib'])"], capture_output=True, text=True,
                check=True).stdout.strip()
            with open(os.path.join(site, "build-venv-torch.pth"), "w") as f:
                f.write(sysconfig.get_paths()["purelib"] + "\n")
            env = {k: v for k, v in os.environ.items()
                   if not k.startswith("GNMR_") and k != "PYTHONPATH"}
            env["OMP_NUM_THREADS"] = "1"
            env["TMPDIR"] = tmp  # the loop's gnmrd data goes with tmp
            # the loaded libraries: the bundled ones, each resolved
            so = os.path.join(site, "gnmr", "libgnmr-agent.so")
            ldd = subprocess.run(["ldd", so], capture_output=True, text=True,
                                 check=True).stdout
            self.assertNotIn("not found", ldd)
            self.assertRegex(ldd, r"libzmq-[0-9a-f]+\.so.*gnmr\.libs")
            p = subprocess.run([py, "-c", LOOP], cwd=tmp, env=env,
                               capture_output=True, text=True, timeout=300)
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
            self.assertIn("on_time 5", p.stdout)
            # gnmrd's table: both units, 5 reports each
            self.assertRegex(p.stdout, r"(?m)^0 +0 +1 +5 ")
            self.assertRegex(p.stdout, r"(?m)^1 +2 +1 +5 ")
            # the commands as documented (issue 48), the first names as
            # aliases; each finds the wheel's own program
            for cmd in ("gnmrd", "gnmr-daemon", "gnmrctl", "gnmr-ctl"):
                p = subprocess.run([os.path.join(venv, "bin", cmd),
                                    "--which"], env=env, capture_output=True,
                                   text=True, timeout=60)
                self.assertEqual(p.returncode, 0, (cmd, p.stderr))
                self.assertTrue(p.stdout.strip().startswith(site),
                                (cmd, p.stdout))
            p = subprocess.run([os.path.join(venv, "bin", "gnmrctl"),
                                "--version"], env=env, capture_output=True,
                               text=True, timeout=60)
            self.assertEqual(p.returncode, 0, p.stderr)
            # no gnmrd anywhere: the Controller starts the wheel's own as
            # the job's private gnmrd (issue 48)
            run = os.path.join(tmp, "run")
            os.mkdir(run, 0o700)
            p = subprocess.run([py, "-c", PRIVATE], cwd=tmp,
                               env=dict(env, XDG_RUNTIME_DIR=run),
                               capture_output=True, text=True, timeout=300)
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
            self.assertIn("started a private gnmrd for job 'wheel-private'",
                          p.stderr)
            exe = p.stdout.split("gnmrd ", 1)[1].split()[0]
            self.assertTrue(exe.startswith(site), exe)
            self.assertIn("joined 3", p.stdout)
            self.assertTrue(os.path.isfile(os.path.join(tmp, "gnmr",
                                                        "gnmr.db")))
            # the man pages, where man finds them for the venv's bin/
            for page in ("share/man/man1/gnmrctl.1", "share/man/man8/gnmrd.8"):
                self.assertTrue(os.path.isfile(os.path.join(venv, page)),
                                page)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    unittest.main()
