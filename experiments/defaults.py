# SPDX-License-Identifier: MIT
"""How often GNMR's thresholds fire on clean training, per parameter set:
the evidence for the policy's parameters (docs/policy.md, "Parameters
for clean training").

    experiments/defaults.py TRACE...

Each TRACE is a run's per-unit gradient norms (experiments/paper.py
--trace-dir, experiments/quickstart_trace.py). For each parameter set
below and each trace it prints the threshold-exceedance rate (the
unit-steps after warm-up whose finite GNMR or delta-GNMR crossed a
threshold, as a share of the reported unit-steps after warm-up: the
paper's figure) and, from the decisions gnmr.policy gives (the same as
gnmrd's: python/tests/test_policy_ref.py), the promotions per 100 steps
at the policy's max_active and lock_steps. Pure replay: the same traces
give the same table.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
from gnmr.policy import Policy, exceedances, read_trace, \
    replay  # noqa: E402

# the warm-up as it was when these were chosen (20), whatever the default
OFF = dict(mean_horizon=0, job_relative=0, confirm_steps=0,  # rules off
           warmup_steps=20)
HJ = dict(mean_horizon=20, job_relative=1, confirm_steps=0, warmup_steps=20)
SETS = [
    ("first defaults (a=b=2)", dict(alpha=2, beta=2, **OFF)),
    ("a=b=4", dict(alpha=4, beta=4, **OFF)),
    ("a=6 b=8", dict(alpha=6, beta=8, **OFF)),
    ("a=b=4 H=20 J=1", dict(alpha=4, beta=4, **HJ)),
    ("a=5 b=6 H=20 J=1", dict(alpha=5, beta=6, **HJ)),
    ("a=6 b=8 H=20 J=1", dict(alpha=6, beta=8, **HJ)),
    ("a=16 b=24 H=20 J=1", dict(alpha=16, beta=24, **HJ)),
    ("a=6 b=8 H=20 J=1 C=2", dict(alpha=6, beta=8, **dict(HJ,
                                                           confirm_steps=2))),
]
# the warm-up at the rest of the defaults (W: warmup_steps; 20 above)
SETS += [(f"a=6 b=8 H=20 J=1 C=2 W={w}",
          dict(alpha=6, beta=8, **dict(HJ, confirm_steps=2, warmup_steps=w)))
         for w in (10, 5, 3)]


def promotions(decisions):
    out, prev = 0, set()
    for _, act in decisions:
        out += len(set(act) - prev)
        prev = set(act)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("traces", nargs="+")
    p.add_argument("--damaged", action="append", default=[],
                   help="a trace of a run under stress (its episodes in "
                   "'# episode STEP UNIT' lines, as experiments/ write "
                   "them): also print, per parameter set, the share of "
                   "its episode unit-steps after warm-up scored risky")
    a = p.parse_args(argv)
    loaded = []
    for path in a.traces:
        try:
            trace, n = read_trace(path)
        except (OSError, ValueError) as e:
            p.error(str(e))
        loaded.append((os.path.basename(path).rsplit(".", 1)[0], trace, n))
    print("risky unit-steps, % of unit-steps after warm-up: the threshold "
          "exceedances, those confirmed with C > 1 (promotions per 100 "
          "steps)")
    print("| parameters | " + " | ".join(n for n, _, _ in loaded) +
          " | max |")
    print("|---" * (len(loaded) + 2) + "|")
    for label, kw in SETS:
        cells, worst = [], 0.0
        for _, trace, n in loaded:
            fin, _, elig = exceedances(trace, n, **kw)
            rate = 100 * fin / elig if elig else 0.0
            worst = max(worst, rate)
            steps = max(trace) - min(trace) + 1
            prom = 100 * promotions(replay(trace, n, **kw)) / steps
            cells.append(f"{rate:.2f} ({prom:.1f})")
        print(f"| {label} | " + " | ".join(cells) + f" | {worst:.2f} |")
    for path in a.damaged:
        try:
            trace, n = read_trace(path)
            episodes = read_episodes(path)
        except (OSError, ValueError) as e:
            p.error(str(e))
        print(f"\n{os.path.basename(path)}: episode unit-steps after "
              "warm-up scored risky (detected), other unit-steps scored "
              "risky (false)")
        print("| parameters | detected | false |\n|---|---|---|")
        for label, kw in SETS:
            hit, fp, ep, other = detection(trace, n, episodes, kw)
            print(f"| {label} | {hit / max(ep, 1):.2f} of {ep} | "
                  f"{100 * fp / max(other, 1):.2f}% |")


def read_episodes(path):
    """{(step, unit)} from a trace's '# episode STEP UNIT' lines."""
    out = set()
    with open(path) as f:
        for i, line in enumerate(f, 1):
            if line.startswith("# episode "):
                parts = line.split()
                if len(parts) != 4 or not all(x.isdigit()
                                              for x in parts[2:]):
                    raise ValueError(f"{path}:{i}: a malformed episode line")
                out.add((int(parts[2]), int(parts[3])))
    if not out:
        raise ValueError(f"{path}: no '# episode' lines (a trace of a run "
                         "under stress, from --trace-dir)")
    return out


def detection(trace, n, episodes, kw):
    """(episode unit-steps scored risky, other reported unit-steps scored
    risky, episode unit-steps, other unit-steps), after warm-up."""
    pol = Policy(n, **kw)
    hit = fp = ep = other = 0
    for t in range(min(trace), max(trace) + 1):
        row = trace.get(t, {})
        pol.step(t, row)
        if t <= pol.p["warmup_steps"]:
            continue
        for u in row:
            e = (t, u) in episodes
            r = u in pol.risky
            ep += e
            other += not e
            hit += e and r
            fp += r and not e
    return hit, fp, ep, other


if __name__ == "__main__":
    main()
