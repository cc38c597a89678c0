# SPDX-License-Identifier: MIT
"""bench_chart.py BENCH.txt -o CHART.png — `make bench`'s output as one
chart: every figure printed against a target, as the share of its limit
it uses (figure / limit for "<=" and "<" targets, limit / figure for
">="), so that every bar left of 1 meets its target. `make bench-charts`
redraws docs/results/bench_*.png from the committed outputs; the same
input gives the same picture, byte for byte."""
import argparse
import os
import re
import sys

NUM = r"[-+]?\d+(?:\.\d+)?"
UNIT = r"(x|%|ms|us)?"
GROUP = re.compile(r"\(([^()]*)\)")
TARGET = re.compile(rf"target\s*(<=|>=|<)\s*({NUM})\s*{UNIT}\s*$")


def figures(text):
    """[(label, value, op, limit, share)] of every '(... target OP L)' in
    the lines: the figure is the clause's last number in the target's unit
    (its first number when the target has none), the clause being what
    comes before the parenthesis, back to the last ')' or ';'."""
    out = []
    for line in text.splitlines():
        hits = []
        for g in GROUP.finditer(line):
            t = TARGET.search(g.group(1).split(";")[-1].strip())
            if not t:
                continue
            before = line[:g.start()]
            cut = max(before.rfind(")"), before.rfind(";"))
            clause = before[cut + 1:]
            if ":" in clause and t.group(3) is None:
                clause = clause.rsplit(":", 1)[1]
            nums = [(float(m.group(1)), m.group(2)) for m in
                    re.finditer(rf"({NUM})\s*{UNIT}(?![\w.])", clause)]
            if t.group(3) is None:
                pick = nums[:1]
            else:
                pick = [n for n in nums if n[1] == t.group(3)][-1:]
            if not pick:
                continue
            # the label: the line's name and the headings before the
            # clause ("policy 10000 units: snapshot off the loop"), and
            # the clause's first word where it is one ("begin", "p99")
            segs = [x.strip() for x in line[:g.start()].split(":")]
            where = ": ".join([re.split(r"[=(]", segs[0])[0].strip()] +
                              [x for x in segs[1:-1] if len(x) < 40])
            word = (segs[-1].split(";")[-1].strip().split(" ") or [""])[0]
            if len(segs) > 1 and re.fullmatch(r"[a-z_][a-z0-9_]*", word) \
                    and word not in ("the", "a", "an", "at", "in", "of"):
                where += f" ({word})"
            hits.append((re.sub(r"\s+", " ", where), pick[0][0], t.group(1),
                         float(t.group(2))))
        for where, value, op, limit in hits:
            if limit == 0 or (op == ">=" and value == 0):
                continue
            share = value / limit if op != ">=" else limit / value
            label = where
            out.append((label[:60], value, op, limit, share))
    return out


def draw(rows, path, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(9, 0.32 * len(rows) + 1.4))
    ys = range(len(rows))[::-1]
    shares = [min(r[4], 5.0) for r in rows]
    colors = ["tab:green" if r[4] <= 1 else "tab:red" for r in rows]
    ax.barh(list(ys), shares, color=colors, height=0.6)
    for y, r in zip(ys, rows):
        ax.text(min(r[4], 5.0) + 0.03, y, f"{r[1]:g} ({r[2]} {r[3]:g})",
                va="center", fontsize=7)
    ax.axvline(1.0, color="k", lw=1, ls="--")
    ax.set_yticks(list(ys))
    ax.set_yticklabels([r[0] for r in rows], fontsize=7)
    ax.set_xlabel("share of the limit used (left of 1: target met; cut at 5)")
    ax.set_xlim(0, 5.6)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata={"Software": "GNMR"})
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("bench", metavar="BENCH.txt")
    ap.add_argument("-o", "--output", required=True, metavar="CHART.png")
    a = ap.parse_args(argv)
    with open(a.bench) as f:
        rows = figures(f.read())
    if not rows:
        print(f"bench_chart: {a.bench}: no figure with a target",
              file=sys.stderr)
        return 1
    draw(rows, a.output, f"make bench against its targets "
         f"({os.path.basename(a.bench)})")
    met = sum(r[4] <= 1 for r in rows)
    print(f"{a.output}: {len(rows)} figures, {met} within their targets")
    return 0


if __name__ == "__main__":
    sys.exit(main())
