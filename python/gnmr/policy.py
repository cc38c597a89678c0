# SPDX-License-Identifier: MIT
"""The GNMR policy of docs/policy.md in plain Python: a reference that
decides as gnmrd and `gnmrctl replay` do, bit for bit, for the same trace
and parameters (tests/ check it against `gnmrctl replay`), with the
optional rules (docs/policy.md, "Optional rules").

It is for the offline side: reading a trace, replaying it under other
parameters (the experiments choose the defaults with it), and the
exceedance rate a job would see. The training side never runs it; gnmrd
decides.

    from gnmr.policy import Policy, read_trace, replay
    trace, units = read_trace("trace.csv")   # {step: {unit: norm}}
    decisions = replay(trace, alpha=4, beta=4)   # [(step, [units])]

A measured trace (header step,unit,norm,measure) gives the measures too:
`read_trace(path, measures=True)` returns (trace, units, measures) with
measures {step: {unit: value}}, and `replay(trace, measures=measures,
measure_alpha=...)` scores them (docs/policy.md, "Measured signal").

Arithmetic follows the engine's: IEEE doubles, the window summed oldest
to newest, max(g / a, d / b) with a NaN d giving g / a.
"""
import math

from ._params import PARAMS

_DEFAULTS = {p[0]: p[2] for p in PARAMS}
_THRESHOLDS = {p[0] for p in PARAMS if p[4] == "threshold"}
_SIGNALS = {p[0] for p in PARAMS if p[4] == "signal"}
_INHERITS = {p[0]: p[3] for p in PARAMS if p[3]}


def params(**kw):
    """A dict of every parameter: the defaults, then kw (names as fields,
    max_active; None leaves a default). Checked as gnmrd checks them:
    ValueError names what is wrong."""
    out = {}
    for name, deflt in _DEFAULTS.items():
        out[name] = None if name in _INHERITS else deflt
    for k, v in kw.items():
        if k not in out:
            raise ValueError(f"unknown parameter {k!r} (one of "
                             f"{', '.join(out)})")
        if v is not None:
            out[k] = v
    for name in out:
        v = out[name]
        if name in _THRESHOLDS:
            if v is None and name in _INHERITS:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or \
                    not math.isfinite(v) or v <= 0:
                raise ValueError(f"{name} must be a finite number > 0, "
                                 f"not {v!r}")
            out[name] = float(v)
        elif name in _SIGNALS:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or \
                    not math.isfinite(v) or v < 0:
                raise ValueError(f"{name} must be a finite number >= 0 "
                                 f"(0: off), not {v!r}")
            out[name] = float(v)
        else:
            if isinstance(v, bool) or not isinstance(v, int) or v < 0 or \
                    v >= 2 ** 64:
                raise ValueError(f"{name} must be a count >= 0, not {v!r}")
    if out["window"] < 1 or out["window"] > 65536:
        raise ValueError("window must be 1..65536")
    if out["job_relative"] not in (0, 1):
        raise ValueError("job_relative must be 0 or 1")
    if out["confirm_steps"] >= 2 ** 32:
        raise ValueError("confirm_steps must be below 2^32")
    return out


class _Stats:
    """A signal's per-unit statistics: the long-horizon mean (count and
    sum, with the mean horizon) and the window of its ratios."""

    def __init__(self, n, p):
        self.p = p
        self.cnt = [0] * n
        self.sum = [0.0] * n
        self.win = [[] for _ in range(n)]

    def ratios(self, u, x):
        """(g, d) of a finite x > 0 against u's history (None before it
        has one), then x added: steps 1-3 of the spec."""
        out = None
        if self.cnt[u] > 0:
            g = x / (self.sum[u] / self.cnt[u])
            d = 1.0
            w = self.win[u]
            if w:
                acc = 0.0
                for v in w:
                    acc += v
                d = g / (acc / len(w))
            out = (g, d)
            w.append(g)
            if len(w) > self.p["window"]:
                del w[0]
        h = self.p["mean_horizon"]
        if h and self.cnt[u] >= h:
            self.sum[u] = (self.sum[u] - self.sum[u] / h) + x
        else:
            self.sum[u] += x
            self.cnt[u] += 1
        return out


def _terms(g, d, a, b):
    """max(g / a, d / b), a zero threshold leaving its term out (the
    measured signal's), a NaN d giving g / a."""
    ga = g / a if a > 0 else 0.0
    db = d / b if b > 0 else 0.0
    return ga if math.isnan(db) else max(ga, db)


class Policy:
    """One job's policy over units 0..n-1. step(t, norms, measures=None)
    takes {unit: norm} (a unit absent: not reported; 0.0: idle; NaN/inf:
    non-finite) and, with the measured rule on, {unit: measure} (absent or
    NaN: none) and returns A_t as a sorted list. After a step, .s[u] holds
    u's score, .risky the risky units and .signal[u] which signal made a
    risky unit risky ("norm", "measure" or "norm+measure")."""

    def __init__(self, n, **kw):
        self.p = params(**kw)
        self.n = n
        self._norms = _Stats(n, self.p)
        self.cnt, self.sum, self.win = (self._norms.cnt, self._norms.sum,
                                        self._norms.win)
        self.measured = self.p["measure_alpha"] > 0 or \
            self.p["measure_beta"] > 0
        self._meas = _Stats(n, self.p)
        self.gm = [math.nan] * n
        self.dm = [math.nan] * n
        self.sm = [0.0] * n
        self.sn = [0.0] * n
        self.signal = {}
        self.lock = [0] * n
        self.s = [0.0] * n
        self.g = [math.nan] * n   # this step's GNMR (NaN: none)
        self.d = [math.nan] * n
        self.risky = set()
        self.last = 0
        self.xend = [0] * n       # confirm_steps: the newest exceedance
        self.xlen = [0] * n       # and the steps in a row up to it

    def thresholds(self, t):
        p = self.p
        a, b = p["alpha"], p["beta"]
        if t <= p["early_steps"]:
            a = p["early_alpha"] if p["early_alpha"] is not None else a
            b = p["early_beta"] if p["early_beta"] is not None else b
        return a, b

    def score(self, u, n, a, b):
        """Steps 1-3 of the spec for unit u's finite or non-finite norm n
        (not None); updates the statistics; returns s."""
        self.g[u] = self.d[u] = math.nan
        if n == 0:
            return 0.0
        if not math.isfinite(n):
            return math.inf
        r = self._norms.ratios(u, n)
        if r is None:
            return 0.0
        self.g[u], self.d[u] = r
        return _terms(r[0], r[1], a, b)

    def score_measure(self, u, x):
        """The measured signal's score of unit u's measure x (None or NaN:
        none; 0: exact), its statistics updated."""
        self.gm[u] = self.dm[u] = math.nan
        if x is None or math.isnan(x) or x == 0:
            return 0.0
        if math.isinf(x):
            return math.inf
        r = self._meas.ratios(u, x)
        if r is None:
            return 0.0
        self.gm[u], self.dm[u] = r
        return _terms(r[0], r[1], self.p["measure_alpha"],
                      self.p["measure_beta"])

    @staticmethod
    def _medians(gv, dv):
        """max(1, lower median) of the step's g and of the non-NaN d."""
        gs = sorted(x for x in gv if not math.isnan(x))
        ds = sorted(d for x, d in zip(gv, dv)
                    if not math.isnan(x) and not math.isnan(d))
        mg = max(1.0, gs[(len(gs) - 1) // 2]) if len(gs) > 1 else 1.0
        md = max(1.0, ds[(len(ds) - 1) // 2]) if len(ds) > 1 else 1.0
        return mg, md

    def relative(self, a, b):
        """The job-relative rule: the candidates' scores (s > 1 by the
        plain thresholds, or locked) over the thresholds times the step's
        lower medians of g and d (and of the measure's gm and dm), where
        any is above 1."""
        cand = [u for u in range(self.n) if self.s[u] > 1 or self.lock[u]]
        if not cand:
            return
        mg, md = self._medians(self.g, self.d)
        mgm, mdm = self._medians(self.gm, self.dm) if self.measured \
            else (1.0, 1.0)
        if mg > 1 or md > 1 or mgm > 1 or mdm > 1:
            ta, tb = a * mg, b * md
            tam = self.p["measure_alpha"] * mgm
            tbm = self.p["measure_beta"] * mdm
            for u in cand:
                g = self.g[u]
                if not math.isnan(g):
                    self.sn[u] = _terms(g, self.d[u], ta, tb)
                if self.measured and not math.isnan(self.gm[u]):
                    self.sm[u] = _terms(self.gm[u], self.dm[u], tam, tbm)
                self.s[u] = max(self.sn[u], self.sm[u]) if self.measured \
                    else self.sn[u]

    def exceed(self, u, prev, t):
        """The final score of u at t: an exceedance extends its run of
        steps in a row; risky when s > 1 and, for a finite s not the
        measure's, the run has lasted confirm_steps steps."""
        s = self.s[u]
        if not s > 1:
            return False
        n = self.xlen[u] if prev and self.xend[u] == prev else 0
        self.xlen[u] = min(n + 1, 2 ** 32 - 1)
        self.xend[u] = t
        return s == math.inf or (self.measured and self.sm[u] > 1) or \
            self.xlen[u] >= self.p["confirm_steps"]

    def step(self, t, norms, measures=None):
        if t <= self.last:
            raise ValueError(f"step {t} after step {self.last}")
        prev, self.last = self.last, t
        a, b = self.thresholds(t)
        s = self.s
        meas = measures if self.measured and measures is not None else {}
        for u in range(self.n):
            n = norms.get(u)
            if n is None:
                self.g[u] = self.d[u] = math.nan
                s[u] = 0.0
            else:
                s[u] = self.score(u, n, a, b)
            self.sn[u] = s[u]
            if self.measured:
                self.sm[u] = 0.0
                self.gm[u] = self.dm[u] = math.nan
                if n is not None:
                    self.sm[u] = self.score_measure(u, meas.get(u))
                s[u] = max(s[u], self.sm[u])
        if self.p["job_relative"]:
            self.relative(a, b)
        self.risky = {u for u in range(self.n) if self.exceed(u, prev, t)}
        self.signal = {u: "+".join(k for k, v in (
            ("norm", self.sn[u]), ("measure", self.sm[u]))
            if v > 1 and (k == "norm" or self.measured))
            for u in self.risky}
        if t <= self.p["warmup_steps"]:
            return []
        pool = self.risky | {u for u in range(self.n) if self.lock[u] > 0}
        k = min(self.p["max_active"], len(pool))
        act = sorted(sorted(pool, key=lambda u: (-s[u], u))[:k])
        chosen = set(act)
        for u in range(self.n):
            r = u in self.risky
            if u in chosen and r:
                self.lock[u] = self.p["lock_steps"]
            elif self.lock[u] > 0 and not r:
                self.lock[u] -= 1
        return act


_HEADERS = {"step,unit,norm": 3, "step,unit,norm,measure": 4}


def read_trace(path, measures=False):
    """({step: {unit: norm}}, units) from a trace CSV (docs/policy.md);
    with measures=True, (trace, units, {step: {unit: measure}}) (a unit
    whose measure field is empty or nan has none). ValueError with the
    line on a malformed one."""
    out, meas, units = {}, {}, 0
    with open(path) as f:
        cols = None
        for i, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if cols is None:
                if line not in _HEADERS:
                    raise ValueError(f"{path}:{i}: the header must be "
                                     "step,unit,norm or "
                                     "step,unit,norm,measure")
                cols = _HEADERS[line]
                continue
            parts = line.split(",")
            try:
                if len(parts) != cols:
                    raise ValueError(f"{cols} fields")
                t, u = int(parts[0]), int(parts[1])
                n = float(parts[2])
                if t < 1 or u < 0 or (n < 0 and n != -math.inf):
                    raise ValueError("a step >= 1, a unit >= 0, a norm >= 0")
                x = float(parts[3]) if cols == 4 and parts[3].strip() \
                    else math.nan
                if x < 0:
                    raise ValueError("a measure >= 0")
            except ValueError as e:
                raise ValueError(f"{path}:{i}: {line!r}: {e}") from None
            row = out.setdefault(t, {})
            if u in row:
                raise ValueError(f"{path}:{i}: step {t} unit {u} twice")
            row[u] = n
            if not math.isnan(x):
                meas.setdefault(t, {})[u] = x
            units = max(units, u + 1)
    if cols is None:
        raise ValueError(f"{path}: no header line")
    return (out, units, meas) if measures else (out, units)


def replay(trace, units=None, measures=None, **kw):
    """[(step, A_t)] for every step from the trace's first to its last,
    as `gnmrctl replay` prints them. trace: {step: {unit: norm}};
    measures: {step: {unit: measure}} (the measured signal's)."""
    if units is None:
        units = 1 + max((u for r in trace.values() for u in r), default=-1)
    if not trace:
        return []
    pol = Policy(units, **kw)
    measures = measures or {}
    return [(t, pol.step(t, trace.get(t, {}), measures.get(t)))
            for t in range(min(trace), max(trace) + 1)]


def exceedances(trace, units=None, **kw):
    """(finite exceedances, non-finite, eligible unit-steps) of a trace:
    the unit-steps after warm-up whose finite GNMR or delta-GNMR crossed
    a threshold and made the unit risky (with confirm_steps > 1, only the
    confirmed ones; at 0 or 1 the paper's threshold-exceedance rate is
    the first over the third), those with a non-finite norm, and every
    reported unit-step after warm-up."""
    if units is None:
        units = 1 + max((u for r in trace.values() for u in r), default=-1)
    pol = Policy(units, **kw)
    fin = bad = elig = 0
    for t in range(min(trace), max(trace) + 1):
        row = trace.get(t, {})
        pol.step(t, row)
        if t <= pol.p["warmup_steps"]:
            continue
        for u, n in row.items():
            elig += 1
            if u in pol.risky:
                if math.isfinite(n):
                    fin += 1
                else:
                    bad += 1
    return fin, bad, elig
