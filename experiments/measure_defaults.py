# SPDX-License-Identifier: MIT
"""How the measured signal's thresholds (docs/policy.md, "Measured
signal": measure_alpha, measure_beta) fire on clean training and what
they catch under stress: the evidence for their defaults.

    experiments/measure_defaults.py [--damaged TRACE]... CLEAN...

Every trace is a measured one (experiments/paper.py --trace-dir: the
header step,unit,norm,measure, from a run on the low-cost path, whose
measure the recipe computes whichever path a unit takes). For each
parameter set below, at every other default in force:

- on each CLEAN trace (no stress): the unit-steps after warm-up that the
  measure made risky, as a share of the reported ones, and the
  promotions per 100 steps of the decisions (gnmr.policy, gnmrd's
  decisions: python/tests/test_policy_ref.py);
- on each --damaged trace (a run under stress; its damage in '# damage
  STEP UNIT VALUE' lines, a figure no signal reads, and --damage-error
  the bound that makes a unit-step damaged): the share of damage
  unit-steps whose unit the decision before them routed (coverage, as a
  lagged controller's decision acts), the share of routed unit-steps
  that were damaged (precision), and the routed share of all unit-steps.

Pure replay: the same traces give the same table.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
from gnmr.policy import Policy, read_trace  # noqa: E402

DEFAULTS = dict(alpha=6, beta=8, mean_horizon=20, job_relative=1,
                confirm_steps=2, warmup_steps=5)
SETS = [("measure off", dict(measure_alpha=0, measure_beta=0))]
SETS += [(f"am={a:g} bm={b:g}", dict(measure_alpha=a, measure_beta=b))
         for a, b in ((2, 0), (3, 0), (4, 0), (0, 2), (0, 3), (0, 4),
                      (1.5, 1.5), (2, 2), (2.5, 2.5), (3, 3), (3, 4), (4, 3),
                      (4, 4), (5, 5))]
SETS += [(f"am={a:g} bm={b:g} C={c}",
          dict(measure_alpha=a, measure_beta=b, confirm_steps=c))
         for a, b, c in ((2, 2, 0), (3, 3, 0))]


def read_damage(path, bound):
    """{(step, unit)} whose '# damage STEP UNIT VALUE' is above bound."""
    out = set()
    seen = 0
    with open(path) as f:
        for i, line in enumerate(f, 1):
            if not line.startswith("# damage "):
                continue
            parts = line.split()
            try:
                t, u, v = int(parts[2]), int(parts[3]), float(parts[4])
            except (IndexError, ValueError):
                raise ValueError(f"{path}:{i}: a malformed damage line")
            seen += 1
            if v > bound:
                out.add((t, u))
    if not seen:
        raise ValueError(f"{path}: no '# damage' lines")
    return out


def run(trace, n, meas, kw, make=Policy):
    """(decisions [(t, A_t)], measure-risky unit-steps after warm-up,
    reported unit-steps after warm-up, promotions) of make(n, **params)
    (gnmr.policy's Policy, or a candidate rule's)."""
    pol = make(n, **dict(DEFAULTS, **kw))
    out, risky, elig, prom, prev = [], 0, 0, 0, set()
    for t in range(min(trace), max(trace) + 1):
        row = trace.get(t, {})
        act = pol.step(t, row, meas.get(t))
        out.append((t, set(act)))
        prom += len(set(act) - prev)
        prev = set(act)
        if t > pol.p["warmup_steps"]:
            elig += len(row)
            risky += sum("measure" in pol.signal.get(u, "") for u in row)
    return out, risky, elig, prom


def routed(decisions, damage, n):
    """(coverage, precision, share) of a lagged controller's routes: A_t
    routes step t + 1."""
    route = {t + 1: a for t, a in decisions}
    steps = [t for t, _ in decisions]
    hit = rec = 0
    for t in steps:
        a = route.get(t, set())
        rec += len(a)
        hit += sum((t, u) in damage for u in a)
    cov = hit / len(damage) if damage else 0.0
    return cov, hit / rec if rec else 0.0, rec / (n * len(steps))


def main(argv=None, sets=None, doc=__doc__):
    """The tables for sets [(label, params) or (label, params, make)]."""
    sets = [x if len(x) == 3 else (x[0], x[1], Policy)
            for x in (SETS if sets is None else sets)]
    p = argparse.ArgumentParser(description=doc.split("\n")[0])
    p.add_argument("clean", nargs="*")
    p.add_argument("--damaged", action="append", default=[])
    p.add_argument("--damage-error", type=float, action="append",
                   default=[], help="each --damaged trace's bound, in "
                   "order (one for all)")
    a = p.parse_args(argv)
    if a.damaged and len(a.damage_error) not in (1, len(a.damaged)):
        p.error("one --damage-error, or one for each --damaged")
    load = []
    for path in a.clean + a.damaged:
        try:
            trace, n, meas = read_trace(path, measures=True)
        except (OSError, ValueError) as e:
            p.error(str(e))
        if not meas:
            p.error(f"{path}: not a measured trace")
        load.append((os.path.basename(path).rsplit(".", 1)[0], trace, n,
                     meas))
    clean, hurt = load[:len(a.clean)], load[len(a.clean):]
    bounds = a.damage_error * len(a.damaged) if len(a.damage_error) == 1 \
        else a.damage_error
    damage = [read_damage(path, b) for path, b in zip(a.damaged, bounds)]
    print("Others at the defaults in force: " +
          " ".join(f"{k}={v}" for k, v in DEFAULTS.items()) + "\n")
    if clean:
        print("Clean: measure-risky unit-steps, % of those after warm-up "
              "(promotions per 100 steps)\n")
        print("| parameters | " + " | ".join(x[0] for x in clean) +
              " | max |")
        print("|---" * (len(clean) + 2) + "|")
        for label, kw, make in sets:
            cells, worst = [], 0.0
            for _, trace, n, meas in clean:
                _, risky, elig, prom = run(trace, n, meas, kw, make)
                rate = 100 * risky / max(elig, 1)
                worst = max(worst, rate)
                steps = max(trace) - min(trace) + 1
                cells.append(f"{rate:.2f} ({100 * prom / steps:.1f})")
            print(f"| {label} | " + " | ".join(cells) + f" | {worst:.2f} |")
    for (name, trace, n, meas), dmg, b in zip(hurt, damage, bounds):
        print(f"\n{name}: {len(dmg)} damage unit-steps (damage above {b}):"
              " coverage / precision / share of the routes\n")
        print("| parameters | coverage | precision | share |\n"
              "|---|---|---|---|")
        for label, kw, make in sets:
            dec, _, _, _ = run(trace, n, meas, kw, make)
            cov, prec, share = routed(dec, dmg, n)
            print(f"| {label} | {cov:.2f} | {prec:.2f} | {share:.3f} |")


if __name__ == "__main__":
    main()
