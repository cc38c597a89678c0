# SPDX-License-Identifier: MIT
"""The manual pages against the programs: every gnmrctl command and each
command's every option, and every gnmrd flag, that --help lists is in
gnmrctl(1) / gnmrd(8). Only the standard library: it runs wherever the
binaries are built."""
import os
import re
import shlex
import shutil
import signal
import subprocess
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


if __name__ == "__main__":
    unittest.main()
