# SPDX-License-Identifier: MIT
"""gnmr.policy, the Python reference of docs/policy.md, against `gnmrctl
replay` (gnmrd's engine): the same decisions, step for step, on random
traces and on the shared sample traces, with the optional rules (mean
horizon, job-relative thresholds) off, alone and together; the trace
reader and the parameters refuse what is malformed."""
import math
import os
import random
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from test_gnmr import BIN  # noqa: E402

from gnmr.policy import Policy, exceedances, params, read_trace, \
    replay  # noqa: E402

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
SHARED = os.path.join(ROOT, "..", "shared", "traces")


def gnmrctl_replay(path, **kw):
    args = [os.path.join(BIN, "gnmrctl"), "replay"]
    for k, v in kw.items():
        args += ["--" + k.replace("_", "-"), str(v)]
    out = subprocess.run(args + [path], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert out[0] == "step,active", out[0]
    return out[1:]


def as_csv(decisions):
    return [f"{t},{' '.join(map(str, a))}" for t, a in decisions]


def random_trace(rng, units, steps):
    """Norms over four orders of magnitude, drift, spikes of one unit and
    of the whole job, idle and missing units, NaN and Inf."""
    scale = [10 ** rng.uniform(-3, 1) for _ in range(units)]
    rows = []
    for t in range(1, steps + 1):
        job = rng.uniform(3, 12) if rng.random() < 0.06 else 1.0
        for u in range(units):
            x = rng.random()
            if x < 0.04:
                continue                       # not reported
            n = scale[u] * job * (1 + t / steps) * rng.uniform(0.7, 1.3)
            x = rng.random()
            if x < 0.05:
                n *= rng.uniform(3, 30)
            elif x < 0.07:
                n = 0.0
            elif x < 0.08:
                n = rng.choice([math.nan, math.inf])
            rows.append((t, u, n))
    return rows


def write(rows, path):
    with open(path, "w") as f:
        f.write("# a random trace\nstep,unit,norm\n")
        for t, u, n in rows:
            f.write(f"{t},{u},{n!r}\n")


def measured(rng, rows):
    """rows with a measure each: a unit's own level over three orders of
    magnitude (a coarse unit and a fine one), noise, episodes of 2-6
    steps at 2-20x, none (empty or nan), exact (0) and not finite."""
    level, ep = {}, {}
    out = []
    for t, u, n in rows:
        lv = level.setdefault(u, 10 ** rng.uniform(-3, 0))
        if ep.get(u, (0, 0))[0] <= 0 and rng.random() < 0.03:
            ep[u] = (rng.randint(2, 6), rng.uniform(2, 20))
        left, mag = ep.get(u, (0, 1.0))
        x = lv * rng.uniform(0.85, 1.15) * (mag if left > 0 else 1.0)
        ep[u] = (left - 1, mag)
        r = rng.random()
        if r < 0.03:
            x = ""
        elif r < 0.05:
            x = "nan"
        elif r < 0.06:
            x = 0.0
        elif r < 0.065:
            x = math.inf
        out.append((t, u, n, x))
    return out


def write_measured(rows, path):
    with open(path, "w") as f:
        f.write("# a random measured trace\nstep,unit,norm,measure\n")
        for t, u, n, x in rows:
            f.write(f"{t},{u},{n!r},{x if isinstance(x, str) else repr(x)}"
                    "\n")


OFF = dict(mean_horizon=0, job_relative=0, confirm_steps=0)
RULES = [OFF, dict(OFF, mean_horizon=7),
         dict(OFF, job_relative=1), dict(OFF, confirm_steps=3),
         {},  # {}: the defaults
         dict(mean_horizon=1, job_relative=1, confirm_steps=2, alpha=1.4,
              beta=1.3, window=3, max_active=3, lock_steps=2,
              warmup_steps=5)]


class ReferenceTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="gnmr-policy-ref-")

    def tearDown(self):
        import shutil
        shutil.rmtree(self.tmp, ignore_errors=True)

    def test_random_traces_decide_as_gnmrctl_replay(self):
        rng = random.Random(46)
        differ = 0
        for trial in range(6):
            path = os.path.join(self.tmp, f"t{trial}.csv")
            write(random_trace(rng, rng.randint(1, 40), 150), path)
            trace, n = read_trace(path)
            plain = None
            for kw in RULES:
                want = gnmrctl_replay(path, **kw)
                got = as_csv(replay(trace, n, **kw))
                self.assertEqual(got, want, f"{path} {kw}")
                if plain is None:
                    plain = got
                differ += got != plain
        self.assertGreater(differ, 0, "the rules changed no decision")

    def test_measured_traces_decide_as_gnmrctl_replay(self):
        """The measured signal (docs/policy.md): its thresholds alone, with
        the optional rules, with the norm's; and the signals named."""
        rng = random.Random(61)
        on = [dict(measure_alpha=2.0, measure_beta=0.0),
              dict(measure_alpha=0.0, measure_beta=1.7),
              dict(OFF, measure_alpha=2.5, measure_beta=2.0),
              dict(measure_alpha=1.5, measure_beta=3.0, mean_horizon=4,
                   confirm_steps=0, window=3, max_active=2),
              dict(alpha=1e9, beta=1e9, measure_alpha=3.0,
                   measure_beta=3.0)]
        seen = set()
        for trial in range(5):
            path = os.path.join(self.tmp, f"m{trial}.csv")
            write_measured(measured(rng, random_trace(
                rng, rng.randint(1, 30), 150)), path)
            trace, n, meas = read_trace(path, measures=True)
            off = dict(measure_alpha=0, measure_beta=0)
            base = as_csv(replay(trace, n, meas, **off))
            self.assertEqual(base, gnmrctl_replay(path, **off),
                             "a measured trace with the rule off")
            self.assertEqual(base, as_csv(replay(trace, n)),
                             "the rule off, or no measure given")
            self.assertEqual(as_csv(replay(trace, n, meas)),
                             gnmrctl_replay(path), "the defaults")
            changed = 0
            for kw in on:
                want = gnmrctl_replay(path, **kw)
                got = as_csv(replay(trace, n, meas, **kw))
                self.assertEqual(got, want, f"{path} {kw}")
                changed += got != base
                pol = Policy(n, **kw)
                for t in range(min(trace), max(trace) + 1):
                    pol.step(t, trace.get(t, {}), meas.get(t))
                    seen.update(pol.signal.values())
            self.assertGreater(changed, 0, "the measure changed nothing")
        self.assertLessEqual({"measure", "norm"}, seen)

    def test_the_shared_traces_decide_as_gnmrctl_replay(self):
        names = ["small", "burst", "moe_idle"]
        if not all(os.path.exists(os.path.join(SHARED, f"{n}.csv"))
                   for n in names):
            self.skipTest("../shared/traces is not beside the checkout")
        for name in names:
            path = os.path.join(SHARED, f"{name}.csv")
            trace, n = read_trace(path)
            for kw in RULES:
                self.assertEqual(as_csv(replay(trace, n, **kw)),
                                 gnmrctl_replay(path, **kw), f"{name} {kw}")

    def test_worked_example_and_exceedances(self):
        # docs/policy.md's worked example: unit 0 risky at step 4 only
        trace = {1: {0: 1.0}, 2: {0: 1.0}, 3: {0: 1.0}, 4: {0: 5.0},
                 5: {0: 2.0}, 6: {0: 2.0}}
        kw = dict(alpha=2, beta=2, window=2, max_active=1, lock_steps=1,
                  warmup_steps=0, **OFF)
        self.assertEqual(replay(trace, 1, **kw),
                         [(1, []), (2, []), (3, []), (4, [0]), (5, [0]),
                          (6, [])])
        self.assertEqual(exceedances(trace, 1, **kw), (1, 0, 6))
        # a job-wide rise of 5x is nobody's with the job-relative rule
        wide = {t: {u: (5.0 if t == 4 else 1.0) for u in range(3)}
                for t in range(1, 7)}
        self.assertEqual(exceedances(wide, 3, **kw)[0], 3)
        rel = dict(kw, job_relative=1)
        self.assertEqual(exceedances(wide, 3, **rel)[0], 0)
        # ... but one unit's rise still is
        wide[4][2] = 30.0
        self.assertEqual(replay(wide, 3, **rel)[3], (4, [2]))
        # and a job of one unit keeps the plain rule
        one = {t: {0: wide[t][0]} for t in wide}
        self.assertEqual(exceedances(one, 1, **rel)[0], 1)
        # confirm_steps: one step's spike is not risky, two in a row are
        # (the worked example's spike lasts one step: nobody is chosen)
        self.assertEqual(replay(trace, 1, **dict(kw, confirm_steps=2)),
                         [(t, []) for t in range(1, 7)])
        two = dict(trace)
        two[5] = {0: 20.0}
        self.assertEqual(replay(two, 1, **dict(kw, confirm_steps=2))[4],
                         (5, [0]))
        self.assertEqual(exceedances(two, 1, **dict(kw, confirm_steps=2)),
                         (1, 0, 6))
        # a mean horizon of 2 forgets: after 1, 1, 4, 4 the mean is 3.25
        # (the plain mean 2.5), so 6 is not twice it (it is twice 2.5)
        for h, risky in ((2, False), (0, True)):
            p = Policy(1, alpha=2, beta=100, warmup_steps=0, mean_horizon=h,
                       job_relative=0)
            for t, n in enumerate([1.0, 1.0, 4.0, 4.0], 1):
                p.step(t, {0: n})
            self.assertEqual(p.sum[0] / p.cnt[0], 3.25 if h else 2.5)
            p.step(5, {0: 6.0})
            self.assertEqual(p.s[0] > 1, risky)

    def test_bad_parameters_and_traces_are_refused(self):
        for kw in (dict(alpha=0), dict(beta=math.nan), dict(window=0),
                   dict(job_relative=2), dict(mean_horizon=-1),
                   dict(confirm_steps=-1), dict(confirm_steps=2 ** 32),
                   dict(max_active=1.5), dict(gamma=1), dict(alpha="2")):
            with self.assertRaises(ValueError, msg=str(kw)):
                params(**kw)
        bad = ["step,unit\n1,0\n", "step,unit,norm\n1,0,x\n",
               "step,unit,norm\n0,0,1\n", "step,unit,norm\n1,-1,1\n",
               "step,unit,norm\n1,0,-2\n", "step,unit,norm\n1,0,1\n1,0,2\n",
               "step,unit,norm\n1,0,1,2\n", "# nothing\n",
               "step,unit,norm\n1,0,\xff\n"]
        for i, text in enumerate(bad):
            path = os.path.join(self.tmp, f"bad{i}.csv")
            with open(path, "w", encoding="utf-8", errors="surrogateescape")\
                    as f:
                f.write(text)
            with self.assertRaises(ValueError, msg=repr(text)):
                read_trace(path)


if __name__ == "__main__":
    unittest.main()
