#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""scripts/pytests.py [--jobs N] [NAME...] — the Python suites (`make
test-python`), each test module in its own process, N at a time (default:
the CPUs), run from python/ with tests/ on the path. NAME is a module
(test_gnmr) or any unittest name within one (test_gnmr.ControllerTest);
none: every python/tests/test_*.py.

Modules start longest first (LONGEST, measured on a 2-CPU VM) so that the
last to end is a short one. A module's whole output is printed when it
fails; of one that passes, its count, its time and its skipped tests with
their reasons (a test is skipped only when its hardware is absent, and
says so). The last lines are unittest's: "Ran N tests in S s", then "OK"
or "FAILED", and the exit status is 1 when any module failed.

Modules run side by side share the machine, not state: each test makes
its own directories, gnmrd and endpoints."""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PYDIR = os.path.join(HERE, "..", "python")
# the slowest modules, slowest first (seconds alone on a 2-CPU VM, torch
# 2.11: integrations 125, distributed 70, user_mistakes 54,
# readme_quickstart 37, wheel 25, docs 24); the others follow by name
LONGEST = ("test_integrations", "test_distributed", "test_user_mistakes",
           "test_readme_quickstart", "test_wheel", "test_docs")


def modules():
    tests = os.path.join(PYDIR, "tests")
    return sorted(f[:-3] for f in os.listdir(tests)
                  if f.startswith("test_") and f.endswith(".py"))


def order(names):
    rank = {m: i for i, m in enumerate(LONGEST)}
    return sorted(names, key=lambda n: (rank.get(n.split(".")[0],
                                                 len(LONGEST)), n))


def summary(text):
    """(tests run, skipped, failures + errors, skip lines) of unittest -v
    output."""
    ran = re.findall(r"^Ran (\d+) tests? in", text, re.M)
    # a test that writes to stderr splits its "... skipped 'why'" line
    skips = [ln.strip() for ln in text.splitlines()
             if re.search(r"skipped '", ln)]
    counted = re.findall(r"^(?:OK|FAILED) \(.*skipped=(\d+)", text, re.M)
    bad = re.findall(r"^FAILED \((.*)\)$", text, re.M)
    nbad = sum(int(n) for part in bad
               for n in re.findall(r"(?:failures|errors)=(\d+)", part))
    return (int(ran[-1]) if ran else 0,
            int(counted[-1]) if counted else len(skips), nbad, skips)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("names", nargs="*")
    a = ap.parse_args()
    if a.jobs < 1:
        ap.error("--jobs must be at least 1")
    names = order(a.names or modules())
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in ("tests", env.get("PYTHONPATH")) if p)
    waiting, running = list(names), []
    total = skipped = 0
    failed = []
    t0 = time.monotonic()
    while waiting or running:
        while waiting and len(running) < a.jobs:
            name = waiting.pop(0)
            log = tempfile.TemporaryFile("w+")
            p = subprocess.Popen(
                [sys.executable, "-m", "unittest", "-v", name], cwd=PYDIR,
                env=env, stdout=log, stderr=subprocess.STDOUT)
            running.append((name, p, log, time.monotonic()))
        time.sleep(0.1)
        for item in list(running):
            name, p, log, start = item
            if p.poll() is None:
                continue
            running.remove(item)
            log.seek(0)
            text = log.read()
            log.close()
            n, s, bad, skips = summary(text)
            total, skipped = total + n, skipped + s
            took = time.monotonic() - start
            if p.returncode != 0 or bad:
                failed.append(name)
                print(f"== {name}: FAILED (exit {p.returncode}, "
                      f"{took:.1f} s); its output:")
                print(text.rstrip())
            else:
                print(f"== {name}: {n} tests passed in {took:.1f} s")
                for ln in skips:
                    print(f"   {ln}")
            sys.stdout.flush()
    print(f"Ran {total} tests in {time.monotonic() - t0:.3f}s "
          f"({len(names)} modules, {a.jobs} at a time)")
    if failed:
        print(f"FAILED ({', '.join(failed)})")
        return 1
    print(f"OK (skipped={skipped})" if skipped else "OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
