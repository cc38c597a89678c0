# SPDX-License-Identifier: MIT
"""scripts/layers.py: C files that call each other in a circle are found
(with the calls that close it), layers and alternative builds of one
interface are not, and the tree itself has no circle."""
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(ROOT, "scripts", "layers.py")


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], cwd=ROOT,
                          capture_output=True, text=True)


class LayersTest(unittest.TestCase):
    def tree(self, files):
        d = tempfile.mkdtemp(prefix="gnmr-layers-", dir=os.path.join(
            ROOT, "build"))
        self.addCleanup(lambda: subprocess.run(["rm", "-rf", d]))
        for name, text in files.items():
            with open(os.path.join(d, name), "w") as f:
                f.write(text)
        return os.path.relpath(d, ROOT)

    def test_a_circle_is_found_with_its_calls(self):
        d = self.tree({
            "a.c": "int a_top(void) {\n  return b_mid();\n}\n",
            "b.c": "int b_mid(void)\n{\n  return c_low(); /* a_top() */\n}\n",
            "c.c": 'int c_low(void) { puts("b_mid()"); return a_top(); }\n',
        })
        r = run(d)
        self.assertEqual(r.returncode, 1, r.stdout)
        self.assertIn(f"{d}/c.c -> {d}/a.c (a_top)", r.stdout)
        self.assertIn(f"{d}/a.c -> {d}/b.c (b_mid)", r.stdout)

    def test_a_string_holding_slashes_hides_no_call(self):
        """Issue 51: comments were taken out before strings, so the "//"
        of "postgres://" opened a comment that ate the rest of its line,
        closing quote included, and the next quote paired with a later
        one across lines: the calls between went unseen (the store's
        db.c circle with them)."""
        d = self.tree({
            "a.c": 'int a_top(const char *s) {\n'
                   '  if (s == "postgres://")\n'
                   '    return b_mid(s);\n'
                   '  return puts("done");\n}\n',
            "b.c": 'int b_mid(const char *s) { /* "a_top( */\n'
                   '  return s ? a_top(s) : 0; // "\n}\n',
        })
        r = run(d)
        self.assertEqual(r.returncode, 1, r.stdout)
        self.assertIn(f"{d}/a.c -> {d}/b.c (b_mid)", r.stdout)
        self.assertIn(f"{d}/b.c -> {d}/a.c (a_top)", r.stdout)

    def test_layers_statics_and_alternatives_pass(self):
        d = self.tree({
            "top.c": "int top(void) {\n  return low() + alt();\n}\n",
            "low.c": "static int top(void) { return 1; }\n"
                     "int low(void) {\n  return top();\n}\n",
            "alt_a.c": "int alt(void) { return low(); }\n",
            "alt_b.c": "int alt(void) { return top(); }\n",
        })
        r = run(d)
        self.assertEqual(r.returncode, 0, r.stdout)
        self.assertIn("no circle", r.stdout)

    def test_the_tree_has_no_circle(self):
        r = run()
        self.assertEqual(r.returncode, 0, r.stdout)


if __name__ == "__main__":
    unittest.main()
