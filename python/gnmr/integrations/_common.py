# SPDX-License-Identifier: MIT
"""What the trainer callbacks share: the unit selection, the recipe
(the low-cost/recovery switch), the Controller, the skip of a step with
non-finite gradients, and the figures handed to the trainer's loggers."""
import logging
import math
import os
import re

import torch

from .. import recipes, recovery
from ..options import NAMES, Options
from ..options import make as make_options
from ..pytorch import Controller, _warn

log = logging.getLogger("gnmr")

# the recipe names the callbacks take: gnmr.recipes' registry


def _head_ids(model):
    """The output heads of the transformers models in `model` (tied to
    the embedding, a vocabulary-wide GEMM usually kept in high
    precision): not units of units="auto"."""
    heads = set()
    for m in model.modules():
        get = getattr(m, "get_output_embeddings", None)
        if callable(get):
            try:
                head = get()
            except (AttributeError, NotImplementedError):
                head = None
            if isinstance(head, torch.nn.Module):
                heads.add(id(head))
    return heads


class Session:
    """One training run's GNMR: made by a callback with the user's words,
    prepared on the model (conversion), started when the trainer has
    wrapped it (Controller), stepped once per optimizer step."""

    def __init__(self, job=None, units="auto", recipe=None, clip=True,
                 skip_nonfinite=True, max_logged_units=16, overlap=True,
                 options=None, **fields):
        """options, fields: the Controller's (gnmr.Options), checked here,
        before the trainer starts anything; job= is the job's name."""
        if job is not None:
            fields["job"] = job
        self.options = make_options(options, **fields)
        # what the user set, which the session's own choices never replace
        self._given = {f for f in NAMES if getattr(self.options, f) !=
                       getattr(Options(), f)}
        if not (units == "auto" or isinstance(units, str)):
            raise ValueError(f"units={units!r}: 'auto' (every nn.Linear but "
                             "the output head, and MoE experts one by one) "
                             "or a regular expression on module names")
        if units != "auto":
            try:
                re.compile(units)
            except re.error as e:
                raise ValueError(f"units={units!r} is not a regular "
                                 f"expression: {e}") from None
        # a name (gnmr.recipes), None (observe, switch nothing) or a
        # function on_route(name, module, high)
        self._recipe = None
        if recipe is not None and not callable(recipe):
            try:
                self._recipe = recipes.get(recipe)
            except ValueError as e:
                raise ValueError(f"{e}, None (observe, no switch), or a "
                                 "function on_route(name, module, high)"
                                 ) from None
        self.job, self.units, self.recipe = self.options.job, units, recipe
        self.endpoint, self.clip = self.options.endpoint, clip
        self.skip_nonfinite = skip_nonfinite
        self.max_logged_units = max_logged_units
        # overlap: report before the optimizer step, skip from what the
        # job's ranks counted themselves, and take gnmrd's decision (the
        # routes) before the next forward (begin_step); else all of it
        # before the optimizer step (docs/python.md, "What waits")
        self.overlap = bool(overlap)
        self._open = None           # a reported step whose decision waits
        self.ctl = None
        self.converted = set()
        self._said_frozen = False
        self.skipped = 0            # steps skipped for non-finite gradients
        self.steps = 0
        self._reset_interval()
        self.last = None            # the last StepResult

    # ---- before the trainer wraps the model --------------------------------

    def _pattern(self, model):
        """The Controller's (select, pattern) for the unit selection."""
        if self.units != "auto":
            return None, self.units
        heads = _head_ids(model)
        linears = [(n, m) for n, m in model.named_modules()
                   if isinstance(m, torch.nn.Linear) and id(m) not in heads]
        # frozen linears (a PEFT base model's) never have a gradient
        names = [n for n, m in linears
                 if any(p.requires_grad for p in m.parameters())]
        if len(names) < len(linears) and not self._said_frozen:
            self._said_frozen = True
            r = self._recipe
            frozen = next(n for n, m in linears if n not in set(names))
            if r is not None and r.convert is not None:
                # a recipe on the adapters alone is not what one expects
                # of "the model in FP8": said where it is seen (issue 48)
                log.warning("gnmr: recipe=%r converts the trainable "
                            "nn.Linear only: %d frozen ones (a PEFT base "
                            "model's, e.g. %s) keep their own precision "
                            "and are not units", self.recipe,
                            len(linears) - len(names), frozen)
            else:
                log.info("gnmr: units='auto' leaves out %d frozen "
                         "nn.Linear (no parameter requires a gradient), "
                         "e.g. %s", len(linears) - len(names), frozen)
        if not names:
            return (torch.nn.Linear,), None
        return (torch.nn.Linear,), \
            "^(?:" + "|".join(re.escape(n) for n in names) + ")$"

    def _fused_left_out(self, model):
        """Whether fused MoE experts (3-D weights: transformers' Mixtral
        and Qwen experts) are left out of the units: a recipe that
        switches converted nn.Linear cannot switch them, so as units
        they would hold places of the budget while nothing switched
        (issue 61). Said once, with their names."""
        if self._recipe is None or self._recipe.switch is None:
            return False   # observing: each expert is a unit
        from .._layout import fused_experts
        fused = [(n, fused_experts(m)) for n, m in model.named_modules()
                 if fused_experts(m)]
        if fused and not getattr(self, "_said_fused", False):
            self._said_fused = True
            log.warning(
                "gnmr: recipe=%r switches converted nn.Linear; the fused "
                "experts of %d module(s) (%s) have no recovery path it can "
                "switch, so they are not units (they take no place in the "
                "budget and are not watched). recipe=None watches each "
                "expert; a model with one nn.Linear an expert is switched "
                "expert by expert", self.recipe, len(fused),
                ", ".join(f"{n} ({k} experts)" for n, k in fused[:4]) +
                (", ..." if len(fused) > 4 else ""))
        return bool(fused)

    def prepare(self, model):
        """Converts the selected linears to the recipe's two-path modules
        (their parameters kept: the optimizer's stay valid)."""
        r = self._recipe
        if model is None or self.converted or r is None or r.convert is None:
            return
        select, pattern = self._pattern(model)
        if self.units != "auto":  # the linears inside the matched units
            rx = re.compile(self.units)
            pattern = None
            inside = [n for n, m in model.named_modules()
                      if isinstance(m, torch.nn.Linear) and any(
                          rx.search(p) for p in _prefixes(n))]
            if not inside:
                raise ValueError(f"units={self.units!r}: no nn.Linear is in "
                                 f"a module that matches, for recipe "
                                 f"{self.recipe!r} to convert")
            pattern = "^(?:" + "|".join(map(re.escape, inside)) + ")$"
        self.converted = set(r.convert(model, pattern=pattern))

    # ---- once the trainer has wrapped the model ----------------------------

    def start(self, model, default_job=None, default_data_dir=None,
              resumed=None):
        """default_data_dir: where a private gnmrd keeps the history
        (beside the trainer's output) unless data_dir= or GNMR_DATA_DIR
        says; resumed: whether the trainer resumed from a checkpoint
        (Controller's resume=, unless given)."""
        job = self.job or os.environ.get("GNMR_JOB") or default_job
        select, pattern = self._pattern(model)
        mine = {"select": select or (torch.nn.Linear,), "pattern": pattern,
                "on_route": self._route, "job": job,
                "experts": self.units == "auto" and
                not self._fused_left_out(model)}
        if default_data_dir and not os.environ.get("GNMR_DATA_DIR"):
            mine["data_dir"] = default_data_dir
        if resumed is not None:
            mine["resume"] = bool(resumed)
        r = self._recipe
        if r is not None and r.shadow is not None:
            mine["shadow"] = r.shadow
        if r is not None and r.measure is not None:
            mine["measure"] = r.measure
        self._switches = {}
        self.ctl = Controller(model, options=self.options.replace(**{
            k: v for k, v in mine.items() if k not in self._given or
            k in ("select", "pattern", "on_route")}))
        _same_units_everywhere([n for n, _ in self.ctl.units])
        # a unit switches the converted linears in it (itself, or those of
        # a block); an expert of fused weights has none
        self._switches = {}
        for name, m in self.ctl.units:
            if _is_expert(name, m):
                continue
            self._switches[name] = [x for x in m.modules()
                                    if hasattr(x, "recovery")]
        if self._recipe is not None and self._recipe.binds:
            try:
                from . import te
            except ModuleNotFoundError as e:
                if e.name is None or not e.name.startswith("nvdlfw_inspect"):
                    raise
                raise ImportError(
                    'recipe="te" runs GNMR as a Transformer Engine debug '
                    "feature through nvdlfw-inspect, which this Python "
                    f"cannot import ({e}): pip install 'gnmr[te]' (or "
                    "nvdlfw-inspect), or choose another recipe") from e
            te.bind(self.ctl)
        return self.ctl

    def _route(self, name, module, high):
        if callable(self.recipe):
            self.recipe(name, module, high)
            return
        # recipe=None: modules the user made two-path switch as ever
        switch = self._recipe.switch if self._recipe is not None else \
            recovery.switch
        if switch is None:
            return
        for m in self._switches.get(name, ()):  # a unit's converted linears
            switch(name, m, high)

    def step(self, step, model):
        """The optimizer step `step` (the trainer's number, from 1), before
        the optimizer: report; a step with non-finite gradients anywhere
        in the job drops every gradient, so the optimizer changes nothing.
        Overlapped, the decision (the routes) is taken by begin_step()
        before the next forward; else here. Returns (StepResult or None
        when it waits, skipped)."""
        self.begin_step()  # a decision the trainer did not take yet
        self.steps += 1
        if self.overlap and self.ctl.report(step):
            res, self._open = None, step
            skipped = self.skip_nonfinite and _job_nonfinite_local(self.ctl)
            units = self.ctl.local_nonfinite if skipped else None
        else:  # synchronous, or a step that does not advance (repeated)
            res = self.ctl.step(step)
            self.last = res
            self._note(res)
            skipped = _job_nonfinite(res, self.ctl) and self.skip_nonfinite
            units = res.nonfinite if skipped else None
        if skipped:
            for p in model.parameters():
                p.grad = None
            self.skipped += 1
            # said once per skipped step, at WARNING (issue 48: only a
            # counter moved, at the next logging step)
            units = list(units or ())
            if units:
                more = f" and {len(units) - 8} more" if len(units) > 8 else ""
                why = (f"a non-finite gradient (NaN/Inf) in "
                       f"{', '.join(units[:8])}{more}")
            else:
                why = "a non-finite gradient on another rank"
            log.warning("gnmr: step %d was skipped (its optimizer update "
                         "dropped, on every rank): %s", step, why)
        return res, skipped

    def begin_step(self):
        """Before a forward: the decision of the step reported last, its
        routes applied (waits at most wait_ms, most of which the optimizer
        step and the next batch's loading have already spent). Returns
        its StepResult, or None when none waits."""
        if self._open is None or self.ctl is None:
            return None
        step, self._open = self._open, None
        res = self.ctl.finish(step)
        self.last = res
        self._note(res)
        return res

    # ---- what the loggers get ----------------------------------------------

    def _reset_interval(self):
        self._i_steps = self._i_late = self._i_active = 0
        self._i_scores = {}
        self._i_exceeded = set()

    def _note(self, res):
        self._i_steps += 1
        self._i_late += not res.on_time
        self._i_active += len(res.active)
        for name, (_, _, s) in (res.risky or {}).items():
            self._i_exceeded.add(name)
            # a non-finite norm scores +inf: counted in skipped_steps and
            # said at WARNING, never logged as a score (a logger's axis
            # cannot show it; issue 63)
            if math.isfinite(s) and s > self._i_scores.get(name, -math.inf):
                self._i_scores[name] = s

    def metrics(self):
        """The figures since the last call, as a flat dict of floats:
        gnmr/active_units (at the last step), gnmr/active_unit_steps,
        gnmr/late_decisions, gnmr/skipped_steps (since the start),
        gnmr/exceeded_units (the units that exceeded a threshold, 0 on a
        quiet interval: always there), and, when one exceeded with a
        finite score, gnmr/max_score and gnmr/score/UNIT (the highest
        `max_logged_units`; a non-finite step is in skipped_steps)."""
        if self.ctl is None or self._i_steps == 0:
            return {}
        out = {"gnmr/active_units": float(len(self.last.active)),
               "gnmr/active_unit_steps": float(self._i_active),
               "gnmr/late_decisions": float(self._i_late),
               "gnmr/skipped_steps": float(self.skipped),
               "gnmr/exceeded_units": float(len(self._i_exceeded))}
        if self._i_scores:
            top = sorted(self._i_scores.items(), key=lambda kv: -kv[1])
            out["gnmr/max_score"] = float(top[0][1])
            for name, s in top[:self.max_logged_units]:
                out[f"gnmr/score/{name}"] = float(s)
        self._reset_interval()
        return out

    def close(self):
        if self.ctl is not None:
            try:
                self.begin_step()  # the last step's decision, noted
            except Exception as e:  # closing: said, not raised
                log.warning("gnmr: the last decision was not taken: %s", e)
            if self._recipe is not None and self._recipe.binds:
                from . import te
                te.unbind(self.ctl)
            self.ctl.close()
            self.ctl = None


def _job_nonfinite(res, ctl):
    """Whether any rank's gradients had NaN/Inf at this step, the same
    answer on every rank: one rank's shadowed unit (reported to gnmrd as
    non-finite, Controller's shadow) must not skip the step on the
    others, nor a late decision on one rank leave it out. One all-reduce
    of a flag per step when the job has several processes."""
    if not _several_processes():
        return bool(res.nonfinite)
    local = ctl.local_nonfinite
    return _any_rank(bool(local) if local is not None
                     else bool(res.nonfinite))


def _job_nonfinite_local(ctl):
    """_job_nonfinite without gnmrd: each rank's own count (the CUDA
    kernel's read back), and one all-reduce of a flag when the job has
    several processes. Every element of a unit's gradient is counted by
    one reporter (replicas hold the same gradients), so the union is the
    job's; shadowed units are not in it, as in _job_nonfinite."""
    ctl.read_local()
    flag = bool(ctl.local_nonfinite)
    return _any_rank(flag) if _several_processes() else flag


def _several_processes():
    dist = torch.distributed
    return dist.is_available() and dist.is_initialized() and \
        dist.get_world_size() > 1


def _any_rank(flag):
    """flag on any rank of the default group (one all-reduce)."""
    dist = torch.distributed
    dev = "cpu"
    if "nccl" in str(dist.get_backend()) and torch.cuda.is_available():
        dev = torch.device("cuda", torch.cuda.current_device())
    t = torch.tensor([int(flag)], dtype=torch.int32, device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def _is_expert(name, module):
    from .._layout import fused_experts
    n = fused_experts(module)
    tail = name.rpartition(".")[2]
    return bool(n) and tail.isdigit() and int(tail) < n


def _prefixes(name):
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def _same_units_everywhere(names):
    """An error on every rank when the ranks chose different units (a
    pattern that depends on the rank, a model built differently): gnmrd
    would mix their norms."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or \
            dist.get_world_size() == 1:
        return
    import hashlib
    mine = (len(names), hashlib.sha256("\n".join(names).encode()).hexdigest())
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    odd = [r for r, x in enumerate(every) if x != every[0]]
    if odd:
        raise ValueError(
            f"gnmr: the ranks chose different units (rank 0: {every[0][0]} "
            f"units; rank(s) {odd[:8]}: "
            f"{sorted({every[r][0] for r in odd})}): give every rank the "
            "same model and the same units=")


def warn(msg):
    _warn(msg)
