# SPDX-License-Identifier: MIT
"""The documentation against the programs: every gnmrctl command and each
command's every option, and every gnmrd flag, that --help lists is in
gnmrctl(1) / gnmrd(8); the systemd unit uses the shipped config; every
relative link in README.md and docs/ leads somewhere; and every code block
there fenced as sh, python or c (meant to run) is run: the README's
quickstart by test_readme_quickstart, the others here, against a real
gnmrd."""
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
BIN = os.environ.get("GNMR_BIN_DIR", os.path.join(REPO, "build", "bin"))


def helptext(*argv):
    r = subprocess.run([os.path.join(BIN, argv[0])] + list(argv[1:]),
                       capture_output=True, text=True, timeout=30)
    return r.stdout + r.stderr


def man(path):
    """A man page's text with roff's escapes for '-' undone."""
    with open(os.path.join(REPO, path)) as f:
        return f.read().replace("\\-", "-").replace("\\fB", "") \
            .replace("\\fR", "").replace("\\fI", "")


def flags(text):
    return set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", text))


class OptionsTableTest(unittest.TestCase):
    def test_the_options_table_is_generated_and_current(self):
        sys.path.insert(0, os.path.join(REPO, "python"))
        from gnmr.options import table
        with open(os.path.join(REPO, "docs", "python.md")) as f:
            page = f.read()
        got = page.split("<!-- options table: generated -->\n")[1] \
            .split("\n<!-- end of the options table -->")[0]
        self.assertEqual(got, table(), "docs/python.md's options table "
                         "is stale: regenerate it from gnmr.options")


class ManPagesTest(unittest.TestCase):
    def test_gnmrctl_1_has_every_command_and_option(self):
        page = man("man/man1/gnmrctl.1")
        top = helptext("gnmrctl", "--help")
        commands = re.findall(r"^  ([a-z]+)\s{2,}", top, re.M)
        self.assertIn("keygen", commands)
        self.assertGreaterEqual(len(commands), 14, top)
        entries = set(re.findall(r"^\.BI? ([a-z]+)", page, re.M))
        for c in commands:
            self.assertIn(c, entries, f"gnmrctl(1) has no entry for {c}")
        missing = flags(top) - flags(page) - {"--help", "--version"}
        self.assertEqual(missing, set(), "global options not in gnmrctl(1)")
        for c in commands:
            sub = helptext("gnmrctl", c, "--help")
            # every command's help as full as the others (issue 63: stats
            # and watch had two-line synopses): its usage, a paragraph,
            # and, where it takes options, each one said
            self.assertTrue(sub.startswith(f"usage: gnmrctl {c}"), sub)
            self.assertRegex(sub, r"\n\n[A-Z][^\n]+\n", f"{c}: {sub}")
            body = sub.split("\n\n", 1)[-1]
            for flag in flags(sub.split("\n\n", 1)[0]) - {"--help"}:
                self.assertIn(flag, body, f"{c}: {flag} not described in "
                              f"its help:\n{sub}")
            missing = flags(sub) - flags(page) - {"--help"}
            self.assertEqual(missing, set(),
                             f"gnmrctl {c} --help options not in gnmrctl(1)")

    def test_gnmrd_8_has_every_flag(self):
        page = man("man/man8/gnmrd.8")
        text = helptext("gnmrd", "--help")
        missing = flags(text) - flags(page) - {"--help", "--version"}
        self.assertEqual(missing, set(), "gnmrd --help flags not in gnmrd(8)")

    def test_each_command_has_its_own_help_and_refuses_others_options(self):
        h = helptext("gnmrctl", "history", "--help")
        self.assertTrue(h.startswith("usage: gnmrctl history JOB"), h)
        self.assertIn("agent_joined", h)     # the --kind values, listed
        self.assertNotIn("gnmrctl jobs", h)  # not the shared usage
        self.assertIn("keys:\n  alpha, beta,", helptext("gnmrctl", "set",
                                                        "--help"))
        r = subprocess.run([os.path.join(BIN, "gnmrctl"), "jobs", "--kind",
                            "promote"], capture_output=True, text=True)
        self.assertEqual(r.returncode, 2)
        self.assertIn("--kind is not an option of jobs", r.stderr)


class SystemdUnitTest(unittest.TestCase):
    def test_the_unit_runs_gnmrd_on_the_configs_endpoints_and_data_dir(self):
        # gnmrd started as systemd/gnmrd.service starts it, with the
        # shipped deploy/gnmrd.conf where the paths are moved to a
        # temporary directory: what the config says is what it uses
        with open(os.path.join(REPO, "systemd", "gnmrd.service")) as f:
            unit = f.read()
        line = re.search(r"^ExecStart=(.*)$", unit, re.M).group(1)
        argv = shlex.split(line)
        self.assertEqual(argv[0], "/usr/local/bin/gnmrd")
        for flag in ("--data-dir", "--agents", "--admin", "--store"):
            self.assertNotIn(flag, argv, "a flag in ExecStart overrides "
                             "what gnmrd.conf says")
        tmp = tempfile.mkdtemp(prefix="gnmr-unit-")
        try:
            with open(os.path.join(REPO, "deploy", "gnmrd.conf")) as f:
                conf = f.read()
            for key in ("data_dir", "agents", "admin"):
                self.assertRegex(conf, rf"(?m)^{key} = ")
            conf = conf.replace("/var/lib/gnmr", tmp + "/state") \
                       .replace("ipc:///run/gnmr/", f"ipc://{tmp}/run/")
            os.makedirs(tmp + "/run", mode=0o700)
            cfg = os.path.join(tmp, "gnmrd.conf")
            with open(cfg, "w") as f:
                f.write(conf)
            argv = [os.path.join(BIN, "gnmrd")] + [
                cfg if a == "/etc/gnmr/gnmrd.conf" else a for a in argv[1:]]
            p = subprocess.Popen(argv, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
            try:
                said = [p.stdout.readline() for _ in range(3)]
            finally:
                p.send_signal(signal.SIGTERM)
                out, err = p.communicate(timeout=20)
            self.assertEqual(p.returncode, 0, err)
            self.assertIn(f"gnmrd: agents ipc://{tmp}/run/agents.sock\n",
                          said, err)
            self.assertIn(f"gnmrd: admin ipc://{tmp}/run/admin.sock\n",
                          said, err)
            self.assertTrue(os.path.exists(tmp + "/state/gnmr.db"), err)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


DOCS = ["README.md"] + sorted(
    os.path.join("docs", f) for f in os.listdir(os.path.join(REPO, "docs"))
    if f.endswith(".md"))


def fenced(path):
    """[(language, code)] of a page's fenced blocks meant to run."""
    with open(os.path.join(REPO, path)) as f:
        text = f.read()
    if path == "README.md":  # its quickstart is test_readme_quickstart's
        text = re.sub(r"(?ms)^## PyTorch in 5 minutes\n.*?(?=^## )", "",
                      text)
    return re.findall(r"(?ms)^```(sh|python|c)\n(.*?)^```", text)


class DocsTest(unittest.TestCase):
    def test_relative_links_lead_somewhere(self):
        for page in DOCS:
            with open(os.path.join(REPO, page)) as f:
                text = f.read()
            for target in re.findall(r"\]\(([^)\s#]+)(?:#[^)]*)?\)", text):
                if re.match(r"[a-z]+:", target):
                    continue
                where = os.path.normpath(os.path.join(
                    REPO, os.path.dirname(page), target))
                self.assertTrue(os.path.exists(where),
                                f"{page}: link to {target}: no such file")

    def test_every_runnable_block_runs(self):
        blocks = [(page, lang, code) for page in DOCS
                  for lang, code in fenced(page)]
        langs = sorted(lang for _, lang, _ in blocks)
        self.assertEqual(langs, ["c", "c", "python", "python", "python",
                                 "python"],
                         "a new runnable block: run it here")
        sys.path.insert(0, HERE)
        from test_gnmr import Daemon
        d = Daemon()
        tmp = tempfile.mkdtemp(prefix="gnmr-docs-")
        lib = os.path.join(os.path.dirname(BIN), "lib")
        # the library by its soname, as `make install` links it
        os.symlink(os.path.join(lib, "libgnmr-agent.so"),
                   os.path.join(tmp, "libgnmr-agent.so.0"))
        env = dict(os.environ, GNMR_ENDPOINT=d.agents,
                   PYTHONPATH=os.path.join(REPO, "python"),
                   LD_LIBRARY_PATH=tmp, OMP_NUM_THREADS="1")
        try:
            for i, (page, lang, code) in enumerate(blocks):
                src = os.path.join(tmp, f"b{i}." + ("py" if lang == "python"
                                                    else "c"))
                with open(src, "w") as f:
                    f.write(code)
                if lang == "python":
                    r = subprocess.run([sys.executable, src], env=env,
                                       capture_output=True, text=True,
                                       timeout=300)
                    self.assertEqual(r.returncode, 0, f"{page}: {r.stderr}")
                    continue
                exe = src[:-2]
                cc = ["cc", "-std=c11", "-Wall", "-Wextra", "-Werror",
                      "-I", os.path.join(REPO, "include"), src]
                if "int main(" in code:
                    r = subprocess.run(cc + ["-o", exe, "-L", lib,
                                             "-lgnmr-agent"],
                                       capture_output=True, text=True)
                    self.assertEqual(r.returncode, 0, f"{page}: {r.stderr}")
                    r = subprocess.run([exe], env=env, capture_output=True,
                                       text=True, timeout=120)
                    self.assertEqual(r.returncode, 0, f"{page}: {r.stderr}")
                    self.assertIn("step 31: layer0.mlp.up on its recovery "
                                  "path", r.stdout, page)
                else:  # a function of a loop (the GPU's): it compiles
                    r = subprocess.run(cc + ["-c", "-o", exe + ".o"],
                                       capture_output=True, text=True)
                    self.assertEqual(r.returncode, 0, f"{page}: {r.stderr}")
            jobs = subprocess.run([os.path.join(BIN, "gnmrctl"),
                                   f"--admin=ipc://{d.dir}/admin.sock",
                                   "jobs", "--csv"], capture_output=True,
                                  text=True).stdout
            for job in ("my-job", "my-fp8-job", "my-recipe-job", "c-example",
                        "my-measure-job"):
                self.assertIn(f"\n{job},", jobs)
        finally:
            d.stop()
            shutil.rmtree(tmp, ignore_errors=True)


class BenchChartTest(unittest.TestCase):
    def test_the_charts_are_the_committed_outputs_redrawn(self):
        sys.path.insert(0, os.path.join(REPO, "scripts"))
        import bench_chart
        with open(os.path.join(REPO, "docs", "results",
                               "bench_2026-12-01.txt")) as f:
            rows = bench_chart.figures(f.read())
        got = {r[0]: r[1:4] for r in rows}
        # figures read from their lines as docs/benchmarks.md quotes them
        self.assertEqual(got["jobs p99"], (0.85, "<=", 1.5))
        self.assertEqual(got["norm_cpu fp32 100000000 elements"],
                         (98.0, ">=", 80.0))
        self.assertEqual(got["rtt protocol peers -> gnmrd (p99)"],
                         (1.22, "<=", 1.0))
        self.assertEqual(got["store 5000 step records x 100 events"],
                         (513579.0, ">=", 200000.0))
        self.assertEqual(got["torch_overhead time inside Controller.step "
                             "per step"], (3.72, "<=", 1.0))
        self.assertEqual(len(rows), 17)
        tmp = tempfile.mkdtemp(prefix="gnmr-chart-")
        try:
            for day in ("2026-11-30", "2026-12-01", "2026-12-07"):
                base = os.path.join(REPO, "docs", "results", f"bench_{day}")
                out = os.path.join(tmp, f"{day}.png")
                self.assertEqual(bench_chart.main([base + ".txt", "-o", out]),
                                 0)
                with open(out, "rb") as a, open(base + ".png", "rb") as b:
                    self.assertEqual(a.read(), b.read(),
                                     f"docs/results/bench_{day}.png is not "
                                     f"what make bench-charts draws")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    unittest.main()
