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

    def failing_lines(self, d, word):
        """The lines holding word of a run over d that must fail."""
        r = run(d)
        self.assertEqual(r.returncode, 1, r.stdout)
        return [line for line in r.stdout.splitlines() if word in line]

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

    def test_a_daemon_function_named_after_another_file_is_found(self):
        """Issue 51: a public function of daemon/ carries its file's name
        (jobs_on_message lived in dispatch.c); statics and main may be
        named anything, and other folders are not held to it."""
        d = self.tree({})
        os.mkdir(os.path.join(ROOT, d, "daemon"))
        files = {
            "daemon/dispatch.c": "void dispatch_on_message(void) {}\n"
                                 "void jobs_on_message(void)\n{\n}\n"
                                 "static void helper(void) {}\n",
            "daemon/main.c": "int main(void) { return 0; }\n",
            "other.c": "void anything(void) {}\n",
        }
        for name, text in files.items():
            with open(os.path.join(ROOT, d, name), "w") as f:
                f.write(text)
        self.assertEqual(
            self.failing_lines(d, "prefix"),
            [f"layers: {d}/daemon/dispatch.c defines jobs_on_message(), "
             "whose prefix is not dispatch_"])
        with open(os.path.join(ROOT, d, "daemon", "dispatch.c"), "w") as f:
            f.write(files["daemon/dispatch.c"].replace("jobs_", "dispatch_x_"))
        r = run(d)
        self.assertEqual(r.returncode, 0, r.stdout)

    def test_a_destructor_that_leaves_the_pointer_dangling_is_found(self):
        """Issue 51: a destructor takes T ** and nulls it; statics,
        declarations, the C API's gnmr_* and a reference count's
        release(void) are not held to it."""
        d = self.tree({
            "a.c": "void thing_free(thing *t) {\n  free(t);\n}\n"
                   "void list_close(list **lp)\n{\n  *lp = NULL;\n}\n"
                   "void cell_destroy(cell *c);\n"
                   "static void helper_free(x *p) { free(p); }\n"
                   "void gnmr_agent_close(gnmr_agent *a) { free(a); }\n"
                   "void ctx_release(void) { refs--; }\n"
                   "int port_free(int p) { return p; }\n",
        })
        self.assertEqual(
            self.failing_lines(d, "destructor"),
            [f"layers: {d}/a.c defines thing_free(), a destructor that "
             "takes no T ** to null (or a *_clear of what a struct holds)"])

    def test_a_function_over_100_lines_is_found(self):
        """Issue 51: a function, static or not, of more than 100 lines
        (signature to closing brace) is listed; one of 100 is not, nor a
        long initializer or comment."""
        body = "  x++;\n"
        d = self.tree({
            "a.c": "static int long_one(int x)\n{\n" + body * 98 + "}\n"
                   "int ok_one(int x) {\n" + body * 98 + "}\n"
                   "static const int table[] = {\n" + "  1,\n" * 200 +
                   "};\n/*\n" + "int fake(void) {\n" * 200 + "*/\n",
        })
        self.assertEqual(
            self.failing_lines(d, "lines"),
            [f"layers: {d}/a.c defines long_one() in 101 lines, more than "
             "100: split it into named phases"])

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
        self.assertIn("no module of python/gnmr longer than 700", r.stdout)

    def test_python_functions_and_modules_have_the_c_limits(self):
        """Issue 63: no function or method of the package over 100 lines,
        no module over 700, as for C."""
        sys.path.insert(0, os.path.join(ROOT, "scripts"))
        import layers
        with tempfile.TemporaryDirectory() as root:
            pkg = os.path.join(root, "python", "gnmr")
            os.makedirs(pkg)
            body = "".join(f"    x{i} = {i}\n" for i in range(100))
            with open(os.path.join(pkg, "a.py"), "w") as f:
                f.write("class C:\n    def long(self):\n" +
                        body.replace("    ", "        ") +
                        "\ndef short():\n    return 1\n")
            with open(os.path.join(pkg, "b.py"), "w") as f:
                f.write("\n".join(f"y{i} = {i}" for i in range(701)) + "\n")
            got = layers.python_sizes(root)
        self.assertEqual(sorted(got), [
            (os.path.join("python", "gnmr", "a.py"), "long", 101),
            (os.path.join("python", "gnmr", "b.py"), None, 701)])


if __name__ == "__main__":
    unittest.main()
