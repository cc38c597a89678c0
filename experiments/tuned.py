# SPDX-License-Identifier: MIT
"""What the baselines fix on the tuning seeds, from their measured
traces (experiments/paper.py --trace-dir on low-cost path runs):

    experiments/tuned.py --bounds-quantile Q [--top K] TRACE... > tuned.json

- `bounds`: measure_alone's per-unit bound, each unit's Q-quantile of its
  measure over the traces' unit-steps after the first 5 (the clean runs'
  99.9% quantile is the independent check's strongest per-unit bound);
- `static_best`: the K units with the highest mean damage value (the
  traces' '# damage' lines: a figure no signal reads) over the traces,
  as a regular expression on their names for --static-best-pattern: a
  per-unit sensitivity search on the tuning seeds.

Units are matched by name across traces (the same model). Pure
arithmetic on the traces: the same traces give the same JSON.
"""
import argparse
import json
import math
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
from gnmr.policy import read_trace  # noqa: E402


def names_of(path):
    """{unit id: name} from a trace's '# unit ID NAME' lines."""
    out = {}
    with open(path) as f:
        for line in f:
            if line.startswith("# unit "):
                _, _, u, name = line.split(maxsplit=3)
                out[int(u)] = name.strip()
    return out


def damage_of(path):
    """{unit id: [damage values]} from '# damage STEP UNIT VALUE' lines."""
    out = {}
    with open(path) as f:
        for line in f:
            if line.startswith("# damage "):
                _, _, _, u, v = line.split()
                out.setdefault(int(u), []).append(float(v))
    return out


def quantile(xs, q):
    """The q-quantile of xs, the nearest rank (ceil(q n)-th smallest)."""
    xs = sorted(xs)
    return xs[max(0, min(len(xs) - 1, math.ceil(q * len(xs)) - 1))]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("traces", nargs="+")
    p.add_argument("--bounds-quantile", type=float, required=True)
    p.add_argument("--top", type=int, default=0,
                   help="static_best's unit count (0: none)")
    p.add_argument("--skip", type=int, default=5,
                   help="leave the first steps out (default 5)")
    a = p.parse_args(argv)
    if not 0 < a.bounds_quantile <= 1:
        p.error("--bounds-quantile is in (0, 1]")
    meas, dmg = {}, {}
    for path in a.traces:
        try:
            trace, _, m = read_trace(path, measures=True)
        except (OSError, ValueError) as e:
            p.error(str(e))
        names = names_of(path)
        for t, row in m.items():
            if t > a.skip:
                for u, x in row.items():
                    meas.setdefault(names.get(u, str(u)), []).append(x)
        for u, vs in damage_of(path).items():
            dmg.setdefault(names.get(u, str(u)), []).extend(vs)
    if not meas:
        p.error("no measures in the traces (measured traces: "
                "step,unit,norm,measure)")
    out = {"traces": [os.path.basename(t) for t in a.traces],
           "bounds_quantile": a.bounds_quantile,
           "bounds": {n: quantile(xs, a.bounds_quantile)
                      for n, xs in sorted(meas.items())}}
    if a.top > 0:
        if not dmg:
            p.error("--top: no '# damage' lines in the traces")
        mean = {n: sum(v) / len(v) for n, v in dmg.items()}
        top = sorted(mean, key=lambda n: (-mean[n], n))[:a.top]
        out["static_best"] = {"units": sorted(top),
                              "mean_damage": {n: round(mean[n], 6)
                                              for n in sorted(top)},
                              "pattern": "^(?:" + "|".join(
                                  re.escape(n) for n in sorted(top)) + ")$"}
    json.dump(out, sys.stdout, indent=1, sort_keys=True)
    print()


if __name__ == "__main__":
    main()
