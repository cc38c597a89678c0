# SPDX-License-Identifier: MIT
"""experiments/corpus.py — a byte corpus made from text the machine
already has: the Python standard library's own sources (issue 50: the
GPU machine has Python and nothing can be downloaded there).

    python3 experiments/corpus.py [--mb N] [--out FILE]

prints what the corpus is (JSON: the Python version, its library's
directory, how many files, bytes, and their SHA-256), and writes the bytes
to FILE when asked. The corpus is every `*.py` file under the standard
library's directory (`sysconfig`'s `stdlib` path), site-packages and
dist-packages left out, in sorted order of their paths relative to it,
concatenated, cut at --mb MiB: the same bytes for the same Python build,
on any machine, which the recorded hash lets one check. Two machines with
different Python versions make different corpora (their sizes and hashes
say so).
"""
import argparse
import hashlib
import json
import math
import os
import sys
import sysconfig

LEFT_OUT = ("site-packages", "dist-packages", "__pycache__")


def stdlib_files(root):
    """The library's *.py files under root, as sorted relative paths."""
    out = []
    for d, dirs, files in os.walk(root):
        dirs[:] = [x for x in dirs if x not in LEFT_OUT]
        for f in files:
            if f.endswith(".py"):
                out.append(os.path.relpath(os.path.join(d, f), root))
    return sorted(out)


def stdlib_corpus(mb=64.0, root=None):
    """(bytes, info): the standard library's sources, concatenated in
    sorted path order, at most mb MiB. SystemExit when there are none."""
    if not (mb > 0 and math.isfinite(mb)):
        raise ValueError(f"corpus: mb must be a size above 0, not {mb!r}")
    root = root or sysconfig.get_paths()["stdlib"]
    files = stdlib_files(root) if os.path.isdir(root) else []
    if not files:
        raise SystemExit(f"corpus: no Python sources under {root} (a "
                         f"Python without its standard library's sources)")
    cap = int(mb * (1 << 20))
    data, used = bytearray(), 0
    for rel in files:
        if len(data) >= cap:
            break
        with open(os.path.join(root, rel), "rb") as f:
            data += f.read()
        used += 1
    del data[cap:]
    info = {"source": "python-stdlib", "python": sys.version.split()[0],
            "root": root, "files": used, "bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest()}
    return bytes(data), info


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mb", type=float, default=64.0,
                   help="at most this many MiB (default 64)")
    p.add_argument("--out", default="", help="write the bytes here")
    args = p.parse_args(argv)
    if not (args.mb > 0 and math.isfinite(args.mb)):
        p.error(f"--mb: a size above 0, not {args.mb}")
    data, info = stdlib_corpus(args.mb)
    if args.out:
        with open(args.out, "wb") as f:
            f.write(data)
    print(json.dumps(info, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
