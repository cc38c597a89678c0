#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""scripts/bench_summary.py LOG [OUT] — what of a `make bench` run falls
short of its target (issue 64: a regression is seen the day it lands).

Every benchmark prints its figures with their targets in its own words:
"... = 1.62x raw (target <= 2x); p99 1340 us = 1.34 ms (target <= 1 ms)".
Each "(target OP LIMIT ...)" (OP <=, <, >=, > or none: at most) is read
with the last number before it in the same clause (after the previous
';' or target) as the figure's value. The summary lists each figure
outside its target with its line, value and target, then how many were
read and how many held; it is printed and, with OUT, written there too
(the run's date first). Speed is not a test: the exit status is 0 unless
LOG cannot be read.
"""
import datetime
import re
import sys

TARGET = re.compile(r"\(target:?\s*(<=|>=|<|>)?\s*([-+]?\d+(?:\.\d+)?)")
NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


def figures(line):
    """[(value, op, limit, text)] of a line's targets."""
    out, start = [], 0
    for m in TARGET.finditer(line):
        clause = line[start:m.start()]
        clause = clause[clause.rfind(";") + 1:]
        nums = NUMBER.findall(clause)
        if nums:
            out.append((float(nums[-1]), m.group(1) or "<=",
                        float(m.group(2)), line.strip()))
        start = m.end()
    return out


def holds(value, op, limit):
    return {"<=": value <= limit, "<": value < limit,
            ">=": value >= limit, ">": value > limit}[op]


def summary(lines):
    read, short = 0, []
    for line in lines:
        for value, op, limit, text in figures(line):
            read += 1
            if not holds(value, op, limit):
                short.append((value, op, limit, text))
    out = [f"make bench: {read} figures with a target, {read - len(short)} "
           f"within it, {len(short)} short of it"]
    for value, op, limit, text in short:
        out.append(f"  SHORT {value:g} (target {op} {limit:g}): {text}")
    return out


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not 1 <= len(argv) <= 2:
        print(__doc__.split("\n")[0], file=sys.stderr)
        return 2
    try:
        with open(argv[0], errors="replace") as f:
            lines = f.readlines()
    except OSError as e:
        print(f"bench_summary: {argv[0]}: {e.strerror}", file=sys.stderr)
        return 1
    out = summary(lines)
    print("\n".join(out))
    if len(argv) == 2:
        with open(argv[1], "w") as f:
            f.write(f"{datetime.date.today().isoformat()}\n" +
                    "\n".join(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
