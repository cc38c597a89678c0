# SPDX-License-Identifier: MIT
"""The manual pages against the programs: every gnmrctl command and each
command's every option, and every gnmrd flag, that --help lists is in
gnmrctl(1) / gnmrd(8). Only the standard library: it runs wherever the
binaries are built."""
import os
import re
import subprocess
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


if __name__ == "__main__":
    unittest.main()
