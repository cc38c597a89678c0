# SPDX-License-Identifier: MIT
"""How the variants that are not GNMR choose their recovery units, and
GNMR's per-unit rule as one scalar signal (experiments/harness.py's
docstring defines each variant)."""
import math
import random
import re


def policy_of(args, n, relative=True):
    """GNMR's rule (docs/policy.md, gnmr.policy) over n units with the
    run's parameters: its scores say which unit-steps exceed."""
    from gnmr.policy import Policy
    return Policy(n, alpha=args.alpha, beta=args.beta, window=args.window,
                  max_active=args.max_active, lock_steps=args.lock_steps,
                  warmup_steps=args.warmup, mean_horizon=args.mean_horizon,
                  job_relative=args.job_relative if relative else 0,
                  confirm_steps=getattr(args, "confirm_steps", 0))


class ScalarPolicy:
    """GNMR's per-unit rule for one scalar signal (the global-norm
    trigger): risky(value) says whether the value at this step is. The
    job-relative rule is off: relative to itself, one value never moves."""

    def __init__(self, args):
        self.p = policy_of(args, 1, relative=False)
        self.t = 0

    def risky(self, n):
        self.t += 1
        self.p.step(self.t, {0: n})
        return self.p.s[0] > 1


class Chooser:
    """The recovery set of the non-GNMR variants, decided before the
    forward of each step from what the variant may know."""

    def __init__(self, variant, n_units, args, seed, gnmr_rec, names=()):
        self.v, self.n, self.args = variant, n_units, args
        pat = getattr(args, "static_best_pattern", "") \
            if variant == "static_best" else args.static_pattern
        rx = re.compile(pat) if pat else None
        self.static = {u for u, n in enumerate(names) if rx and rx.search(n)}
        # measure_alone: each unit's bound, fixed on tuning seeds
        self.bounds = [getattr(args, "measure_bounds", {}).get(n, math.inf)
                       for n in names] if variant == "measure_alone" else []
        self.prev_measures = None
        self.rng = random.Random(seed * 31 + 7)
        self.gnmr = gnmr_rec
        self.last_damage = [-10 ** 9] * n_units
        self.held, self.hold_left = [], 0
        self.glob = ScalarPolicy(args)
        self.prev_norms = None
        self.last_nan = [-10 ** 9] * n_units
        self.rec_total = 0        # nanonly_random: recovery unit-steps

    def before(self, step, probe_damage=None):
        a, n = self.args, self.n
        if self.v == "high":
            return set(range(n))
        if self.v in ("low", "fp"):
            return set()
        if self.v in ("static", "static_best"):
            return set(self.static)
        if self.v == "measure_alone":
            m = self.prev_measures
            return set() if m is None else {
                u for u in range(n) if m[u] is not None and
                m[u] > self.bounds[u]}
        if self.v == "random":
            return {u for u in range(n) if self.rng.random() <
                    self.gnmr["share"]}
        if self.v == "oracle":
            recent = [u for u in range(n)
                      if step - 1 - self.last_damage[u] <= a.lock_steps]
            recent.sort(key=lambda u: (-self.last_damage[u], u))
            return set(recent[:a.max_active])
        if self.v == "oracle_now":
            hit = sorted((u for u in range(n) if probe_damage[u]),
                         key=lambda u: (-probe_damage[u], u))
            return set(hit[:a.max_active])
        if self.v == "rawnorm":
            k = len(self.gnmr["active"][step])
            if k == 0 or self.prev_norms is None:
                return set()
            order = sorted(range(n), key=lambda u: (
                -(math.inf if not math.isfinite(self.prev_norms[u])
                  else self.prev_norms[u]), u))
            return set(order[:k])
        if self.v == "global":
            return set(self.held)
        if self.v in ("nanonly", "nanonly_random"):
            if step <= a.warmup + 1:   # GNMR decides nothing in warm-up
                return set()
            recent = [u for u in range(n)
                      if step - 1 - self.last_nan[u] <= a.lock_steps]
            recent.sort(key=lambda u: (-self.last_nan[u], u))
            picked = set(recent[:a.max_active])
            if self.v == "nanonly_random":
                want = round(self.gnmr["share"] * n * step) - \
                    self.rec_total - len(picked)
                others = [u for u in range(n) if u not in picked]
                picked |= set(self.rng.sample(others,
                                              max(0, min(want, len(others)))))
            self.rec_total += len(picked)
            return picked
        raise ValueError(self.v)

    def after(self, step, damage, norms, measures=None):
        """What the variant learns from step `step`: its damage flags
        (oracle), gradient norms (rawnorm, global) or the recipe's
        measures (measure_alone)."""
        self.prev_measures = measures
        for u in range(self.n):
            if damage[u]:
                self.last_damage[u] = step
            if not math.isfinite(norms[u]):
                self.last_nan[u] = step
        self.prev_norms = norms
        if self.v == "global":
            total = math.sqrt(sum(x * x for x in norms))
            risky = self.glob.risky(total)
            if step <= self.args.warmup:
                return
            if risky:
                if self.hold_left == 0:
                    self.held = sorted(self.rng.sample(
                        range(self.n), min(self.args.max_active, self.n)))
                self.hold_left = self.args.lock_steps + 1
            elif self.hold_left > 0:
                self.hold_left -= 1
                if self.hold_left == 0:
                    self.held = []
