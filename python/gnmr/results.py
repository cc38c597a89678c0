# SPDX-License-Identifier: MIT
"""What a Controller's step gives (StepResult) and a log of them
(DecisionLog): gnmr.pytorch's results, kept apart from how they are made."""
import csv
import ctypes
import json
from itertools import compress

__all__ = ["DecisionLog", "StepResult"]


def _flagged(names, flags):
    """The names whose flag is nonzero. flags is a list or a ctypes array
    (a host report's counts): an array of zeros, the common case, is told
    by one comparison of its bytes (a memcmp; bytes.strip reads them one
    at a time) rather than 10,000 reads of its items."""
    if isinstance(flags, ctypes.Array):
        raw = bytes(flags)
        if raw == bytes(len(raw)):
            return []
    return list(compress(names, flags))



class StepResult:
    """What a step gave. Truthy when its decision came in time.

    step: your step number; on_time; joined (the agent is in gnmrd's job);
    active: the units on the recovery path for the next step; changed: the
    units whose route changed now; nonfinite: the units whose gradient had
    NaN or Inf elements (None when not known here: gradients reduced by the
    CUDA kernel, or an observer); norms: {unit: this rank's gradient norm}
    (None likewise; with tp shards, this shard's part); risky: {unit:
    (g, d, s)}, the units that exceeded a threshold at this step with their
    GNMR, Delta-GNMR and score, gnmrd's reason for the active set ({} when
    none did; None when the decision did not come in time); repeated: the
    call repeated an earlier step and did nothing; shadowed: the units on
    their recovery path that `shadow` said the low-cost path would have
    damaged, reported to gnmrd as non-finite ([] without `shadow`); run:
    on the first result after this rank joined gnmrd, {"run": the job's
    run, "continued_after": the step gnmrd had decided up to, 0 for a new
    run} (docs/python.md, "Runs and resumes"), else None; same_step: the
    units the same-step mode moved to their recovery path within this
    step ([] without it)."""

    FIELDS = ("step", "on_time", "joined", "active", "changed",
              "nonfinite", "norms", "risky", "repeated", "shadowed", "run",
              "same_step")
    __slots__ = tuple(f for f in FIELDS if f != "norms") + ("_norms", "_sums")

    def __init__(self, step, on_time=False, joined=False, active=(),
                 changed=(), nonfinite=None, norms=None, repeated=False,
                 risky=None, shadowed=(), run=None, same_step=()):
        self.step, self.on_time, self.joined = step, on_time, joined
        self.same_step = list(same_step)
        self.run = run
        self.active, self.changed = list(active), list(changed)
        self.nonfinite, self._norms, self._sums = nonfinite, norms, None
        self.risky = risky
        self.repeated = repeated
        self.shadowed = list(shadowed)

    @property
    def norms(self):
        # made when first read: a step of 10,000 units need not build a
        # dictionary nobody reads
        if self._norms is None and self._sums is not None:
            names, sumsq, not_reported = self._sums
            self._norms = {n: (s ** 0.5 if not skip else None)
                           for n, s, skip in zip(names, sumsq, not_reported)}
            self._sums = None
        return self._norms

    @norms.setter
    def norms(self, value):
        self._norms, self._sums = value, None

    def __bool__(self):
        return bool(self.on_time)

    def as_dict(self):
        return {k: getattr(self, k) for k in self.FIELDS}

    def __repr__(self):
        return (f"StepResult(step={self.step}, on_time={self.on_time}, "
                f"active={self.active}, nonfinite={self.nonfinite})")


class DecisionLog:
    """Writes each StepResult as a CSV row or a JSON line; pass it as
    on_decision (or call it from your own callback, or hand its rows to any
    logger). Columns: step, on_time, joined, active, nonfinite (unit names
    joined by spaces)."""

    def __init__(self, path, fmt=None):
        self.fmt = fmt or ("jsonl" if str(path).endswith(".jsonl") else "csv")
        if self.fmt not in ("csv", "jsonl"):
            raise ValueError("fmt is 'csv' or 'jsonl'")
        self._f = open(path, "w", newline="")
        self._csv = None
        if self.fmt == "csv":
            self._csv = csv.writer(self._f)
            self._csv.writerow(["step", "on_time", "joined", "active",
                                "nonfinite"])

    def __call__(self, res):
        if self.fmt == "jsonl":
            d = res.as_dict()
            d.pop("norms")
            self._f.write(json.dumps(d) + "\n")
        else:
            self._csv.writerow([res.step, int(bool(res.on_time)),
                                int(res.joined), " ".join(res.active),
                                " ".join(res.nonfinite or [])])
        self._f.flush()

    def close(self):
        self._f.close()
