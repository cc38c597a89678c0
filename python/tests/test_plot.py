# SPDX-License-Identifier: MIT
"""gnmrctl plot: a real gnmrd, a synthetic job from gnmr-sim (real
agents), the picture drawn from gnmrd and from the SQLite store after it
stopped; what is drawn is checked against the job's own history, and
every mistake gets its message."""
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from gnmr import plot  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
BIN = os.environ.get("GNMR_BIN_DIR", os.path.join(REPO, "build", "bin"))


def png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n", head[:8]
    return struct.unpack(">II", head[16:24])


class PlotTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="gnmr-plot-")
        cls.admin = f"ipc://{cls.dir}/admin.sock"
        cls.gnmrd = subprocess.Popen(
            [os.path.join(BIN, "gnmrd"), "--data-dir", cls.dir + "/data",
             "--agents", f"ipc://{cls.dir}/agents.sock", "--admin",
             cls.admin], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            text=True)
        for line in cls.gnmrd.stdout:
            if line.startswith("gnmrd: admin"):
                break
        sim = subprocess.run(
            [os.path.join(BIN, "gnmr-sim"), "--agents",
             f"ipc://{cls.dir}/agents.sock", "--job", "pic", "--ranks", "2",
             "--units", "16", "--steps", "120", "--seed", "7",
             "--max-active", "2"], capture_output=True, text=True,
            timeout=120)
        assert sim.returncode == 0, sim.stderr
        cls.export = json.loads(cls.ctl("export", "pic").stdout)

    @classmethod
    def tearDownClass(cls):
        if cls.gnmrd.poll() is None:
            cls.gnmrd.send_signal(signal.SIGTERM)
            cls.gnmrd.wait(timeout=20)
        cls.gnmrd.stdout.close()
        shutil.rmtree(cls.dir, ignore_errors=True)

    @classmethod
    def ctl(cls, *args, store=None):
        where = [f"--store={store}"] if store else [f"--admin={cls.admin}"]
        return subprocess.run([os.path.join(BIN, "gnmrctl")] + where +
                              list(args), capture_output=True, text=True,
                              timeout=300)

    def test_what_is_drawn_is_the_jobs_history(self):
        data = plot.series(self.export)
        self.assertTrue(data["units"], "the job promoted no unit")
        promoted = {e["unit"] for e in self.export["events"]
                    if e["kind"] == "promote"}
        self.assertEqual({u["id"] for u in data["units"]} - promoted, set())
        decisions = self.ctl("decisions", "pic", "--csv").stdout
        active = {int(r.split(",")[0]): set(map(int, r.split(",")[1].split()))
                  for r in decisions.splitlines()[1:]}
        for u in data["units"]:
            # the bands are exactly the steps the unit was active
            inband = {s for a, b in u["active"] for s in range(a, b + 1)}
            self.assertEqual(inband, {s for s, a in active.items()
                                      if u["id"] in a}, u["name"])
            # and the points its events' g
            want = sorted({(e["step"], e["g"]) for e in self.export["events"]
                           if e["unit"] == u["id"] and e["g"] is not None
                           and e["kind"] in plot.POLICY_EVENTS})
            self.assertEqual(u["g"], want)
        self.assertEqual(data["steps"], sorted(active))
        self.assertEqual(data["n_active"], [len(active[s])
                                            for s in sorted(active)])
        self.assertLessEqual(max(data["n_active"]), 2)  # the budget
        self.assertEqual(data["budget"], [(1, 2)])
        # a unit's non-finite steps are in its series, to be marked
        # (issue 63): one added to the history's events
        u0 = data["units"][0]
        nan_ev = dict(next(e for e in self.export["events"]
                           if e["unit"] == u0["id"]), kind="nonfinite",
                      step=41, g=None, d=None)
        withnan = dict(self.export, events=self.export["events"] + [nan_ev])
        got = plot.series(withnan, units=[u0["name"]])["units"][0]
        self.assertEqual(got["nonfinite"], [41])
        self.assertEqual(u0["nonfinite"], [])
        out = os.path.join(self.dir, "nan.png")
        plot.draw(plot.series(withnan, units=[u0["name"]]), out)
        self.assertGreater(png_size(out)[0], 500)
        self.assertEqual(plot._plain(6.0), "6")
        self.assertEqual(plot._plain_minor(0.05), "0.05")
        self.assertEqual(plot._plain_minor(0.07), "")
        # a step range and a unit chosen by a regular expression
        part = plot.series(self.export, units=[r"^unit\.1[0-5]$"],
                           steps=(30, 60))
        self.assertEqual([u["name"] for u in part["units"]],
                         [f"unit.{i}" for i in range(10, 16)])
        self.assertEqual(part["steps"], list(range(30, 61)))
        self.assertTrue(all(30 <= s <= 60 for u in part["units"]
                            for s, _ in u["g"]))

    def test_gnmrctl_plot_from_gnmrd_and_from_the_store(self):
        png = os.path.join(self.dir, "pic.png")
        r = self.ctl("plot", "pic", "-o", png)
        self.assertEqual(r.returncode, 0, r.stderr)
        w, h = png_size(png)
        self.assertGreater(w, 500)
        self.assertGreater(h, 300)
        self.assertIn("unit(s), steps 1 to 120", r.stdout)
        svg = os.path.join(self.dir, "pic.svg")
        r = self.ctl("plot", "pic", "-o", svg, "--units", "unit.3",
                     "--steps", "10:90", store=self.dir + "/data")
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(svg) as f:
            text = f.read()
        self.assertTrue(text.lstrip().startswith("<?xml"), text[:80])
        self.assertIn("1 unit(s), steps 10 to 90", r.stdout)

    def test_mistakes_are_named(self):
        out = os.path.join(self.dir, "x.png")
        for args, code, part in [
                (["pic", "-o", os.path.join(self.dir, "x.gif")], 2,
                 "is a .png or an .svg"),
                (["pic", "-o", out, "--steps", "9:3"], 2, "3 is below 9"),
                (["pic", "-o", out, "--steps", "a:b"], 2, "expected A:B"),
                (["pic", "-o", out, "--steps", "500:"], 2,
                 "none in 500:"),
                (["pic", "-o", out, "--units", "nothing"], 2,
                 "has no such unit"),
                (["pic", "-o", out, "--units", "("], 2,
                 "not a unit name nor a regular expression"),
                (["nojob", "-o", out], 1, "unknown job 'nojob'"),
                (["pic"], 2, "-o/--output"),
                (["pic", "-o", out, "--bogus"], 2, "unrecognized")]:
            r = self.ctl("plot", *args)
            self.assertEqual(r.returncode, code, (args, r.stderr))
            self.assertIn(part, r.stderr, args)
            self.assertTrue(r.stderr.startswith("gnmrctl plot") or
                            "usage: gnmrctl plot" in r.stderr, r.stderr)
        self.assertFalse(os.path.exists(out))

    def test_a_gnmr_package_in_the_current_directory_never_runs(self):
        # issue 47: `python -c` put the current directory first on
        # sys.path, so another user's gnmr/__init__.py in a shared
        # directory ran as whoever called gnmrctl plot there; a
        # PYTHONPATH of such a directory did the same
        cwd = tempfile.mkdtemp(prefix="gnmr-plot-cwd-")
        try:
            os.makedirs(os.path.join(cwd, "gnmr"))
            marker = os.path.join(cwd, "ran")
            with open(os.path.join(cwd, "gnmr", "__init__.py"), "w") as f:
                f.write(f"open({marker!r}, 'w').close()\n")
            out = os.path.join(cwd, "p.png")
            r = subprocess.run(
                [os.path.join(BIN, "gnmrctl"), f"--admin={self.admin}",
                 "plot", "pic", "-o", out],
                cwd=cwd, env=dict(os.environ, PYTHONPATH=cwd),
                capture_output=True, text=True, timeout=300)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertFalse(os.path.exists(marker),
                             "the current directory's gnmr package ran")
            self.assertTrue(os.path.getsize(out) > 0)
        finally:
            shutil.rmtree(cwd)


if __name__ == "__main__":
    unittest.main()
