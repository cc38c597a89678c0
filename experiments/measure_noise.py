# SPDX-License-Identifier: MIT
"""A candidate for the measured signal: thresholds in units of each
unit's own noise, replayed offline on measured traces beside the ratio
thresholds in force (docs/policy.md, "Measured signal").

    experiments/measure_noise.py [--tuned BOUNDS.json]
        [--damaged TRACE]... [--damage-error X] CLEAN...

Why: the measured signal's ratio thresholds (g_m = x / m_m above αm 4,
or d_m above βm 3) were chosen quiet on every clean trace, the noisiest
being a Mixtral's experts (their input changes with their tokens: g_m up
to ~2 on clean training). A recipe whose measure is steady (NVFP4's
input error: a step's measure within 1-2% of its recent mean) moves by
1.3-1.5x in a latent outlier episode, a large change by its own noise but
far below any ratio that the Mixtral's clean training allows. One ratio
cannot serve both; a unit's own noise can.

The candidate (offline only: gnmrd does not run it): each unit keeps,
besides its measure's mean, the mean of |g_m - 1| over its history (the
same count and mean horizon as the mean: v = msum-like with H), its
noise σ_m; z_m = (g_m - 1) / σ_m before this step's update, and the
unit's measured score is max(the rule in force, z_m / κ). With the
job-relative rule, g_m is first divided by the step's lower median of
g_m where that is above 1. A unit whose σ_m is 0 (no history of change)
has no z term. Everything else (the pool, budget, locks, no confirmation
for a measured exceedance) is gnmr.policy's.

Tables as experiments/measure_defaults.py's: on CLEAN traces the
measure-risky unit-steps after warm-up (% of the reported ones) and the
promotions per 100 steps; on each --damaged trace, the coverage of its
damage unit-steps by a lagged controller's routes, their precision and
the routed share; pure replay, the same traces give the same tables.
"""
import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
import measure_defaults as md  # noqa: E402
from gnmr.policy import Policy, read_trace  # noqa: E402


class NoisePolicy(Policy):
    """gnmr.policy's Policy with the noise-relative term on the measure."""

    def __init__(self, n, kappa, clip=False, **kw):
        super().__init__(n, **kw)
        self.kappa, self.clip = kappa, clip
        self.vcnt = [0] * n
        self.vsum = [0.0] * n
        self.z = [math.nan] * n
        self.sig = [math.nan] * n   # σ_m before this step's update

    def score_measure(self, u, x):
        s = super().score_measure(u, x)
        self.z[u] = self.sig[u] = math.nan
        g = self.gm[u]
        if math.isnan(g) or math.isinf(s):
            return s
        if self.vcnt[u] > 0 and self.vsum[u] > 0:
            self.sig[u] = self.vsum[u] / self.vcnt[u]
            self.z[u] = (g - 1) / self.sig[u]
            s = max(s, self.z[u] / self.kappa)
        dev, h = abs(g - 1), self.p["mean_horizon"]
        if self.clip and not math.isnan(self.sig[u]):
            if self.clip == "skip" and self.z[u] > self.kappa:
                return s  # an exceedance: not the unit's noise
            dev = min(dev, self.kappa * self.sig[u])
        if h and self.vcnt[u] >= h:
            self.vsum[u] = (self.vsum[u] - self.vsum[u] / h) + dev
        else:
            self.vsum[u] += dev
            self.vcnt[u] += 1
        return s

    def relative(self, a, b):
        """gnmr.policy's rule, which rescores a candidate's measure from
        g_m and d_m alone when any median is above 1; the z term is put
        back, its g_m over the step's median of g_m where that is above
        1."""
        cand = [u for u in range(self.n) if self.s[u] > 1 or self.lock[u]]
        super().relative(a, b)
        gs = sorted(g for g in self.gm if not math.isnan(g))
        mg = max(1.0, gs[(len(gs) - 1) // 2]) if len(gs) > 1 else 1.0
        for u in cand:
            if math.isnan(self.z[u]):
                continue
            z = (self.gm[u] / mg - 1) / self.sig[u]
            plain = run_terms(self, u)
            self.sm[u] = max(plain, z / self.kappa)
            self.s[u] = max(self.sn[u], self.sm[u])


def run_terms(pol, u):
    """The rule in force's measured score of u after the job-relative
    rescaling (gnmr.policy's relative() left it in sm before the z term
    was added back): recomputed from gm and dm."""
    gs = sorted(g for g in pol.gm if not math.isnan(g))
    ds = sorted(d for g, d in zip(pol.gm, pol.dm)
                if not math.isnan(g) and not math.isnan(d))
    mg = max(1.0, gs[(len(gs) - 1) // 2]) if len(gs) > 1 else 1.0
    mdd = max(1.0, ds[(len(ds) - 1) // 2]) if len(ds) > 1 else 1.0
    a, b = pol.p["measure_alpha"] * mg, pol.p["measure_beta"] * mdd
    ga = pol.gm[u] / a if a > 0 else 0.0
    db = pol.dm[u] / b if b > 0 and not math.isnan(pol.dm[u]) else 0.0
    return max(ga, db)


IN_FORCE = dict(measure_alpha=4, measure_beta=3)
SETS = [("am=4 bm=3 (in force)", IN_FORCE)]
SETS += [(f"am=4 bm=3 + kappa={k:g}", IN_FORCE,
          lambda n, k=k, **kw: NoisePolicy(n, k, **kw))
         for k in (4, 6, 8, 10, 12, 16)]
SETS += [(f"am=4 bm=3 + kappa={k:g} clipped", IN_FORCE,
          lambda n, k=k, **kw: NoisePolicy(n, k, clip=True, **kw))
         for k in (6, 8, 10, 12, 16)]
SETS += [(f"am=4 bm=3 + kappa={k:g} exceedances skipped", IN_FORCE,
          lambda n, k=k, **kw: NoisePolicy(n, k, clip="skip", **kw))
         for k in (6, 8, 10, 12, 16)]


def unit_names(path):
    """{unit: name} from a trace's '# unit U NAME' lines."""
    out = {}
    with open(path) as f:
        for line in f:
            if line.startswith("# unit "):
                parts = line.split(None, 3)
                out[int(parts[2])] = parts[3].strip()
    return out


def episodes(path):
    """{(step, unit)} of a trace's '# episode STEP UNIT' lines."""
    out = set()
    with open(path) as f:
        for line in f:
            if line.startswith("# episode "):
                parts = line.split()
                out.add((int(parts[2]), int(parts[3])))
    return out


def ratios(meas, epi):
    """Sorted lists of x_t(u) / (the mean of u's last 20 measures outside
    its episodes), for the unit-steps after step 50 in an episode and
    outside one: how far an outlier lifts the measure against its
    steady state."""
    hist, rin, rout = {}, [], []
    for t in sorted(meas):
        for u, x in meas[t].items():
            h = hist.setdefault(u, [])
            if len(h) >= 20 and t > 50:
                r = x / (sum(h[-20:]) / 20)
                (rin if (t, u) in epi else rout).append(r)
            if (t, u) not in epi:
                h.append(x)
    return sorted(rin), sorted(rout)


def q(a, p):
    """The p quantile of a sorted list (nan when empty)."""
    return a[int(p * (len(a) - 1))] if a else math.nan


def baselines(paths, bounds_file, damage_error):
    """Beside the policy's rows, on each damaged trace: the measure alone
    (a unit whose measure at t is above its bound from bounds_file,
    experiments/tuned.py's, takes its recovery path at t + 1; no budget,
    lock or ratio: the harness's measure_alone) and the ceiling of any
    lagged controller (the damage unit-steps whose unit was in an episode
    the step before: what a decision of the step before could know)."""
    with open(bounds_file) as f:
        bounds = json.load(f)["bounds"]
    for path in paths:
        trace, n, meas = read_trace(path, measures=True)
        names = unit_names(path)
        dmg = md.read_damage(path, damage_error)
        dec = [(t, {u for u, x in meas.get(t, {}).items()
                    if x > bounds.get(names.get(u), math.inf)})
               for t in range(min(trace), max(trace) + 1)]
        cov, prec, share = md.routed(dec, dmg, n)
        epi = episodes(path)
        ceil = sum((t - 1, u) in epi for t, u in dmg) / max(len(dmg), 1)
        rin, rout = ratios(meas, epi)
        print(f"\n{os.path.basename(path).rsplit('.', 1)[0]}: the "
              f"measure alone (bounds of {os.path.basename(bounds_file)}): "
              f"coverage {cov:.2f}, precision {prec:.2f}, share "
              f"{share:.3f}; a lagged controller's ceiling: coverage "
              f"{ceil:.2f}; {len(epi)} unit-steps in an episode; a "
              f"step's measure over its unit's last 20 outside episodes "
              f"(from step 51): in episodes q10 {q(rin, .1):.3f}, q50 "
              f"{q(rin, .5):.3f}, q90 {q(rin, .9):.3f}; outside q50 "
              f"{q(rout, .5):.3f}, q99 {q(rout, .99):.3f}, q99.9 "
              f"{q(rout, .999):.3f}, max {rout[-1]:.3f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--tuned")
    known, rest = ap.parse_known_args()
    md.main(rest, sets=SETS, doc=__doc__)
    if known.tuned:
        rp = argparse.ArgumentParser(add_help=False)
        rp.add_argument("--damaged", action="append", default=[])
        rp.add_argument("--damage-error", type=float, action="append",
                        default=[])
        r, _ = rp.parse_known_args(rest)
        if len(r.damage_error) != 1:
            sys.exit("measure_noise.py: --tuned takes one --damage-error")
        baselines(r.damaged, known.tuned, r.damage_error[0])
