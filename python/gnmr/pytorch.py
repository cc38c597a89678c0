# SPDX-License-Identifier: MIT
"""The PyTorch adapter: attach GNMR to a model in a few lines.

    with Controller(model, job="my-job", on_route=set_precision) as ctl:
        for step in range(steps):
            loss = model(batch).loss
            loss.backward()
            res = ctl.step(step)        # report, wait (bounded), apply routes
            if res.nonfinite:           # NaN/Inf in a unit's gradient
                optimizer.zero_grad()   # skip the step, as GradScaler does
                continue
            optimizer.step(); optimizer.zero_grad()

or, to overlap the pass over host gradients with the optimizer step:

        loss.backward()
        ctl.report_async(step)  # reduces on a worker thread
        optimizer.step()
        ctl.finish(step)        # before zero_grad: wait, apply routes
        optimizer.zero_grad()

A loop that clips calls ctl.clip_grad_norm_(model.parameters(), max_norm)
after step(), in place of torch's: the report's sums stand in for the
units' norms (clip_grad_norm_ says when they cannot).

The endpoint defaults to gnmrd's own default (GNMR_ENDPOINT, else
ipc://RUN/agents.sock as `gnmrd --help` says), the job to GNMR_JOB.
With neither an endpoint nor GNMR_ENDPOINT given and no gnmrd listening
there, the Controller starts a private gnmrd for the job (daemon="auto";
its history in data_dir, else $GNMR_DATA_DIR, else ./gnmr; stopped
by close()), says so once and goes on; daemon="never" does not,
daemon="private" always does (docs/python.md, "A private gnmrd").
resume= says what this process is: None nothing (gnmrd's rule alone),
False a fresh start (the name's run that did not finish, its processes
gone, is ended and a new run begins), True a resume from a checkpoint
(the trainer callbacks say it from the trainer's step; docs/python.md,
"Runs and resumes").

Units are the modules chosen by type (`select`) and/or a regular
expression on their names (`pattern`). A unit's gradient is that of all
its parameters, its children's included, so a container (a block, an
expert) is a unit too; each parameter counts in one unit only: the
outermost match takes it, and a parameter shared by two units (tied
weights) counts in the first, with a warning. `experts=True` makes a
module of fused MoE expert weights (transformers' Mixtral/Qwen-MoE
`*Experts`: parameters [experts, ...]) one unit per expert, NAME.E, each
counting its rows of those parameters; on_route gets the experts module
and the unit's name. After backward,
`report(step)` sends every unit's sum of squares (host tensors are reduced
by libgnmr-agent in fp64, in step() on up to `reduce_threads` threads: 0,
the default, is one per CPU, at most 8, or GNMR_REDUCE_THREADS; the sums
do not depend on it; report_async() reduces on its one worker thread.
Parameters without a gradient make their unit "not reported"). Before the next forward, `apply_routes()` calls
`on_route(name, module, high)` for every unit whose route changed, `high`
meaning the recovery path. Without on_route nothing is switched, and the
first promotion says so once (a warning); on_route=False reads the
decisions (result.active) without that warning.

Steps: one call per optimizer step, with increasing numbers. The first
may be 0 (then gnmrd's steps are yours + 1). A repeated or lower step (a
call per micro-batch, a second call) reports nothing and warns once; its
result still carries this rank's nonfinite units and norms of the
gradients as they are then, so a NaN skip written after step() fires.
With gradient accumulation, call step() after the last micro-batch, or
give accumulate=N and call it after every one (the N-th reports).
Nothing here raises for a step number.

Identity and layout (gnmr._layout): the job's reporters come from the
model's DeviceMesh when its parameters are DTensors (FSDP2, tensor
parallelism: shard dimensions report, replicate dimensions observe,
gradients read on their local shard), else as follows. The global rank
comes from torch.distributed when it is initialised, else RANK,
SLURM_PROCID or OMPI_COMM_WORLD_RANK (or `global_rank`); a world size
above 1 without a rank is an error. Model parallelism: `tp_group` (a
process group of one replica's shards) or `tp_size` shards per replica;
replica 0 of each shard reports, the other replicas observe and receive
the same routes (Megatron's tensor_model_parallel attributes: the
parameters without it count on shard rank 0 only). A parameter's gradient
is its `main_grad` when set (Megatron-style fp32 buffers), else `grad`.
`nonfinite` is job-wide when the decision came in time (every shard and
replica; all ranks skip the same steps), else this rank's own view.
Units are named as in the plain model (no `_orig_mod.` from
torch.compile, no `module.` from DDP). Gradients on CUDA go to the
agent's CUDA backend when libgnmr-agent was built with nvcc and sees the
device; otherwise torch reduces them (one synchronisation per step).
`trace=FILE` writes, per step, the norms gnmrd decided from (step,unit,
norm CSV, for `gnmrctl replay`); with the CUDA backend it reads the
kernel's sums back, one synchronisation per step.

Shadow damage: a unit on its recovery path has a clean gradient, so GNMR
sees it calm and releases it when its lock runs out, though the low-cost
path would still be damaged (a controller that learns from the gradients
it protects is blind in this way; README, the stress experiment's
`hidden` misses). `shadow=fn`, fn(name, module) -> bool, asked after
backward for every unit on its recovery path, says whether the low-cost
path would have been damaged at this step (gnmr.recovery.fp8_overflowed
for FP8Linear: its input outgrew the stale FP8 scale). Such a unit is
reported to gnmrd as non-finite, as its gradient would have been on the
low-cost path, so GNMR keeps it while the damage lasts (Report.shadowed:
gnmrd records a `shadowed` event, not `nonfinite`, and /metrics counts
such steps apart). StepResult's
`nonfinite` still lists only real NaN/Inf gradients; `shadowed` lists
these units. `shadow_low=True` asks `shadow` of the units on their
low-cost path too: there it says whether the low-cost path damaged the
unit at this step (a measured error against a bound the caller chose),
and such a unit is reported the same way, so GNMR recovers it from the
next step on, within the budget and with its locks.

The measured signal: `measure=fn`, fn(name, module) -> a number >= 0,
inf or None, asked of every unit after backward, gives gnmrd the
recipe's own measure of the unit's low-cost path error at this step
(QuantLinear.low_error: gnmr.recipes' `measure`), whichever path the
unit took. gnmrd judges each unit's measure against its own history, as
it judges norms (docs/policy.md, "Measured signal": the job's
measure_alpha and measure_beta, in params=), so nobody picks a bound and
a unit whose low path is always coarse is judged against itself; its
`exceed` events say which signal made a unit risky.

Nothing waits while the agent has not joined gnmrd; after `warn_after`
such steps, and when most decisions come late, a warning (warnings and the
"gnmr" logger) names the endpoint, job and rank.
"""
import ctypes
import logging
import math
import os
import weakref
from contextlib import contextmanager
from itertools import compress

import torch

from . import _layout
from . import daemon as _daemon
from ._lib import default_endpoint
from ._warn import warn as _warn
from .agent import Agent
from .options import DOCS as OPTIONS_DOC
from .options import make as make_options
from .reduction import Reduction
from .clipping import Clipping
from .results import DecisionLog, StepResult, _flagged
from .units import identity, select_units

__all__ = ["Controller", "DecisionLog", "StepResult", "identity"]

log = logging.getLogger("gnmr")




def _recovery_switch():
    """gnmr.recovery.switch, when gnmr.recovery is imported (else None)."""
    import sys
    mod = sys.modules.get("gnmr.recovery")
    return getattr(mod, "switch", None)


class Controller(Clipping):
    def __init__(self, model, endpoint=None, job=None, options=None,
                 **fields):
        """model: the torch model; endpoint, job: as the options of those
        names (the first two arguments, as ever); options: a gnmr.Options,
        with fields (any option by name) on top. Every option is checked
        before anything starts (gnmr.options)."""
        for k, v in (("endpoint", endpoint), ("job", job)):
            if v is not None:
                fields[k] = v
        self.options = o = make_options(options, **fields)
        self.job = o.job or os.environ.get("GNMR_JOB")
        if not self.job:
            raise ValueError("give job= (or set GNMR_JOB): the name that "
                             "ties this run's ranks together in gnmrd "
                             f"({OPTIONS_DOC})")
        self.accumulate, self._micro = o.accumulate, 0
        frozen = self._choose_units(model, o)
        if o.trace is not None and self.layout.reporters > 1:
            raise ValueError("gnmr: trace= records whole-unit norms: with "
                             "tp shards each rank has only its part")
        self._private = None
        self._open_agent(o)
        self._set_routes(o.on_route, o.on_decision)
        self.wait_ms, self.warn_after = o.wait_ms, o.warn_after
        # the gradients' reduction and what the last report sent
        self._reduction = Reduction(
            self.agent, self.units, self._params, self.layout,
            o.reduce_threads, o.shadow, o.shadow_low, o.warn_after,
            self.job, frozen=[u for u, (n, _) in enumerate(self.units)
                              if n in frozen], measure=o.measure)
        self._init_state()
        self._trace = None
        if o.trace is not None:
            self._trace = open(o.trace, "w")
            self._trace.write("step,unit,norm\n")

    def _choose_units(self, model, o):
        """The units (select_units), their layout over the ranks, the
        same-step gates; returns the names of those that never have a
        gradient (frozen), said once."""
        self.units, self._params, named = [], [], []
        for name, m, params in select_units(model, o.select, o.pattern,
                                             o.experts):
            self.units.append((name, m))
            self._params.append(params)
            named.extend((name, p) for p in params)
        self._gates = self._same_step_gates() if o.same_step else None
        self.layout = _layout.layout(named, o.global_rank, o.tp_size,
                                     o.tp_group)
        self.tp_rank = self.layout.index
        frozen = [n for (n, _), ps in zip(self.units, self._params)
                  if not any(p.requires_grad for p in ps)]
        if frozen:
            _warn(f"gnmr: {len(frozen)} unit(s) have no parameter that "
                  f"requires a gradient and will never be reported: "
                  f"{', '.join(frozen[:8])}{', ...' if len(frozen) > 8 else ''}"
                  " (frozen layers: leave them out with select=/pattern=)")
        return frozen

    def _open_agent(self, o):
        """The endpoint (the user's, else the default, else a private
        gnmrd's: never a default another account made), the agent, and
        a bounded wait for it to join."""
        daemon = o.daemon
        explicit = bool(o.endpoint or os.environ.get("GNMR_ENDPOINT"))
        self.endpoint = o.endpoint or default_endpoint()
        whose = None if explicit else _daemon.foreign(self.endpoint)
        if whose is not None:
            if daemon == "never":
                raise PermissionError(
                    f"gnmr: the default endpoint {self.endpoint} is not "
                    f"yours ({whose}): whatever listens there could decide "
                    "this trainer's steps; give endpoint= (or "
                    "GNMR_ENDPOINT) a gnmrd you trust, or daemon='auto'")
            _warn(f"gnmr: the default endpoint {self.endpoint} is not "
                  f"yours ({whose}): not joining whatever listens there; "
                  "a private gnmrd on a path of its own serves this job")
            daemon = "private"
        if daemon == "private" or (daemon == "auto" and not explicit):
            self.endpoint, self._private = _daemon.private_endpoint(
                self.endpoint, daemon, o.data_dir, self.job)
        self.agent = Agent(self.endpoint, self.job,
                           [n for n, _ in self.units], rank=self.tp_rank,
                           reporters=self.layout.reporters,
                           observer=self.layout.observer,
                           node_ranks=(_layout.node_ranks(self.layout)
                                       if o.node_ranks is None
                                       else o.node_ranks),
                           **o.agent_kwargs())
        self._ids = list(o.unit_ids or range(len(self.units)))
        # once, bounded: the first steps find the agent joined when gnmrd
        # is there; when it is not, steps never wait for it
        import time
        deadline = time.monotonic() + o.join_wait_ms / 1000
        while not self.agent.joined and time.monotonic() < deadline:
            time.sleep(0.005)

    def _set_routes(self, on_route, on_decision):
        self.on_route, self.on_decision = on_route, on_decision
        if on_route is not None and on_route is _recovery_switch() and not any(
                hasattr(m, "recovery") for _, m in self.units):
            _warn("gnmr: on_route=gnmr.recovery.switch, but no unit is a "
                  "recovery module (none has .recovery): nothing will "
                  "switch; convert them first (gnmr.recovery.convert) or "
                  "select= the converted type")
        self._said_no_route = on_route is not None

    def _init_state(self):
        """What the steps keep between them."""
        self.high = [None] * len(self.units)
        self._names = [n for n, _ in self.units]
        self._active = []       # the names of the units self.high routes
        self._forced = None     # route_all()'s route
        self._applied = None    # the routes self.high holds, as bytes
        self._worker = None     # report_async's thread
        self._pending = None
        self._reported = None   # the step report() sent, not yet finished
        self._offset = None     # 1 when the first step was 0
        self._last = 0          # gnmrd's numbering
        self._last_result = None
        self._warned = set()
        self._acc_probe = None  # _watch_accumulation()'s parameter
        self._acc_seen = None   # (its gradient, versions) at the last step
        self._acc_runs = 0
        self._not_joined = 0
        self._said_run = False  # what run gnmrd let this rank into
        self._late = []         # the last on-time flags, for the warning

    def _same_step_gates(self):
        """The same-step mode's gates (gnmr.samestep), one a unit, set on
        its modules that take one (same_step_gate); ValueError when no
        unit has such a module."""
        from .samestep import Budget, Gate
        self._budget = Budget()
        gates, any_module = [], False
        for name, m in self.units:
            g = Gate(name, self._budget)
            for q in m.modules():
                if hasattr(q, "same_step_gate"):
                    q.same_step_gate = g
                    any_module = True
            gates.append(g)
        if not any_module:
            raise ValueError("same_step=True: no unit has a module that "
                             "measures before its GEMM (same_step_gate: "
                             "gnmr.quant.QuantLinear)")
        return gates

    def _arm_same_step(self):
        """The latest decision's bounds and spare budget on the gates, for
        the next step (none: every bound inf)."""
        _, spare, bounds = self.agent.bounds()
        self._budget.arm(spare)
        for g, b, high in zip(self._gates, bounds, self.high):
            g.bound = math.inf if high else b

    # ---- the reduction ----------------------------------------------------

    @property
    def cuda_backend(self):
        """'gnmr' when CUDA gradients go to the agent's kernel, else why
        torch reduces them (None before the first CUDA step)."""
        return self._reduction.cuda_backend

    @property
    def reduce_threads(self):
        return self._reduction.threads

    @property
    def shadow(self):
        return self._reduction.shadow

    @property
    def shadow_low(self):
        return self._reduction.shadow_low

    def _report(self, t, stream=None, threads=None):
        self._reduction.report(t, self.high, stream, threads)

    # ---- steps ----------------------------------------------------------

    def _watch_accumulation(self):
        """Says once when the steps look like micro-batches: three calls in
        a row between which one parameter's gradient (the same tensor) took
        exactly one more backward while the parameter did not change, so
        gnmrd was given partial gradients as steps (issue 48). A step
        done right changes the parameter, or starts from new or zeroed
        gradients (set_to_none, or zero_: two changes to the gradient);
        a fused optimizer, which changes parameters without counting it,
        is told apart by the latter."""
        if self.accumulate > 1 or self._acc_probe is False:
            return
        p = self._acc_probe
        if p is None:
            p = self._acc_probe = next(
                (q for ps in self._params for q in ps if q.requires_grad),
                False)
            if p is False:
                return
        g = p.grad
        if g is None:
            self._acc_seen, self._acc_runs = None, 0
            return
        seen, pv, gv = self._acc_seen or (None, None, None), p._version, \
            g._version
        if seen[0] is not None and seen[0]() is g and pv == seen[1] and \
                gv == seen[2] + 1:
            self._acc_runs += 1
        else:
            self._acc_runs = 0
        self._acc_seen = (weakref.ref(g), pv, gv)
        if self._acc_runs == 3 and "accumulate" not in self._warned:
            self._warned.add("accumulate")
            _warn("gnmr: step() was called 3 times in a row with the "
                  "gradients accumulating and the parameters unchanged: "
                  "it looks like once per micro-batch, so gnmrd decides "
                  "from partial gradients. Call step() once per optimizer "
                  "step, after the last micro-batch, or give "
                  "Controller(accumulate=N) and call it after each of the "
                  "N micro-batches")

    def _internal(self, step):
        """gnmrd's step for yours, or None (with a warning) when it does
        not advance."""
        if self._offset is None:
            self._offset = 1 if step == 0 else 0
        self._watch_accumulation()
        t = step + self._offset
        if t < 1 or t <= self._last:
            kind = "again" if t == self._last else "below an earlier step"
            if kind not in self._warned:
                self._warned.add(kind)
                _warn(f"gnmr: step({step}) {kind}: GNMR takes one report "
                      "per optimizer step, with increasing numbers (call "
                      "step() once, after the last micro-batch); this call "
                      "does nothing")
            return None
        self._last = t
        return t

    def report(self, step):
        """Reports the gradients of every unit for step (after backward);
        False when the step does not advance (a warning said why).
        finish(step) then takes its decision: wait for it where the next
        forward needs the routes, not before the optimizer step."""
        t = self._internal(step)
        if t is None:
            return False
        self._reported = None
        self._report(t)
        self._reported = step
        return True

    def apply_routes(self):
        """Calls on_route for every unit whose route changed; returns the
        routes (True: recovery path) for the next step."""
        self._changed = []
        n = len(self.units)
        cur = (bytes([self._forced]) * n if self._forced is not None
               else self.agent.routes_raw())
        if cur != self._applied:  # else nothing changed: no loop
            for unit, (name, module) in enumerate(self.units):
                high = cur[unit] == 1
                if high != self.high[unit]:
                    self.high[unit] = high
                    self._changed.append(name)
                    if self.on_route:
                        self.on_route(name, module, high)
            self._applied = cur
            self._active = list(compress(self._names, self.high))
            if not self._said_no_route and self._forced is None and \
                    any(self.high):
                self._said_no_route = True
                _warn(f"gnmr: gnmrd put {self._changed[:3]} on the recovery "
                      f"path, but no on_route was given, so nothing "
                      f"switched: pass on_route=gnmr.recovery.switch (for "
                      f"modules from gnmr.recovery.convert) or a function "
                      f"(name, module, high); on_route=False only reads "
                      f"the decisions")
        return list(self.high)

    def step(self, step, wait_ms=None):
        """report(step), wait for its decision (at most wait_ms), then
        apply_routes(). Returns a StepResult (truthy when on time).

        With accumulate=N, call it after every micro-batch: the N-th call
        of each optimizer step reports (the gradients then hold all N
        micro-batches); the others report nothing and return a `repeated`
        result with this rank's nonfinite units so far."""
        if self.accumulate > 1:
            self._micro += 1
            if self._micro % self.accumulate:
                return self._repeat(step)
        if self._internal(step) is None:
            return self._repeat(step)
        self._report(self._last)
        return self._finish(step, wait_ms)

    def report_async(self, step):
        """report(step) on a worker thread, so that the pass over host
        gradients overlaps what the caller does next (the optimizer step;
        the library releases the GIL). Call finish(step) before anything
        overwrites the gradients (zero_grad, the next backward)."""
        t = self._internal(step)
        if t is None:
            return
        if self._worker is None:
            from concurrent.futures import ThreadPoolExecutor
            self._worker = ThreadPoolExecutor(1, "gnmr-report")
        # the caller's stream, taken here: on the worker thread
        # current_stream() is that thread's (the default stream), which
        # the backward that made the gradients never ran on
        # one thread: the pass overlaps the caller's own work
        self._pending = (step, self._worker.submit(
            self._report, t, self._reduction.caller_stream(), 1))

    def finish(self, step, wait_ms=None):
        """Completes step, sent by report_async() (its errors are raised
        here) or report(): the wait for the decision (at most wait_ms),
        then apply_routes(). Returns a StepResult."""
        if self._reported == step and self._pending is None:
            # the optimizer may have changed or dropped the gradients
            # since: what is not known of them stays None
            self._reported = None
            return self._finish(step, wait_ms, grads_current=False)
        if self._pending is None or self._pending[0] != step:
            return self._repeat(step)
        pending, self._pending = self._pending[1], None
        pending.result()
        return self._finish(step, wait_ms)

    def _tell_run(self, step):
        """Says once which run gnmrd let this rank into, against what the
        training side's step suggests: a warning where they disagree (a
        resumed trainer given a new run, a fresh one given a live run's
        statistics), the `gnmr` logger's INFO otherwise. Returns the
        first result's `run`."""
        got = self.agent.run()
        if got is None:
            return None
        self._said_run = True
        run, last = got
        what = f"gnmr: job {self.job!r} rank {self.tp_rank}"
        if last == 0 and step > 1:
            _warn(f"{what}: the trainer is at step {step}, but gnmrd starts "
                  f"run {run} afresh (nothing decided in it before): GNMR's "
                  "statistics start over, warm-up included. gnmrd goes on "
                  "with a run only while it is unfinished; a run whose "
                  "ranks all said Bye is finished (docs/python.md, \"Runs "
                  "and resumes\")")
        elif last > 0 and step <= last and step <= 1:
            _warn(f"{what}: the trainer starts at step {step}, but gnmrd "
                  f"goes on with run {run}, decided up to step {last}, and "
                  "its statistics: a fresh start under a job name whose "
                  "run did not finish. For a new run, give a new job name "
                  "or end the old one first (gnmrctl finish JOB)")
        elif last > 0:
            log.info("%s: goes on with run %d after step %d (its "
                     "statistics kept)", what, run, last)
        else:
            log.info("%s: a new run, %d", what, run)
        return {"run": run, "continued_after": last}

    def _repeat(self, step):
        """A step that does not advance (a call per micro-batch): nothing is
        reported, but nonfinite and norms are this rank's gradients as
        they are now, so a NaN skip written after step() still fires."""
        r = StepResult(step, repeated=True, joined=self.agent.joined,
                       active=self._active)
        sumsq, nonfinite, nr = self._reduction.local_sums()
        r._sums = (self._names, sumsq, nr)
        r.nonfinite = _flagged(self._names, nonfinite)
        return r

    def _private_died(self, step):
        """True when this rank started a private gnmrd that has exited;
        said once, with its exit and its log's end (issue 63: it read as
        an endpoint never joined)."""
        p = getattr(self, "_private", None)
        code = p.proc.poll() if p is not None else None
        if code is None:
            return False
        if "private-died" not in self._warned:
            self._warned.add("private-died")
            how = (f"killed by signal {-code}" if code < 0 else
                   f"exit status {code}")
            _warn(f"gnmr: the private gnmrd of job {self.job!r} (pid "
                  f"{p.pid}) has stopped ({how}) by step {step}; every unit "
                  "stays on the fallback route, and its history in "
                  f"{p.data_dir} keeps what it committed. Its log, "
                  f"{p.log_path}, ends:\n{p._tail(800)}")
        return True

    def _finish(self, step, wait_ms, grads_current=True):
        t, red = self._last, self._reduction
        died = self._private_died(step)
        joined = self.agent.joined and not died
        if joined:
            self._not_joined = 0
            on_time = self.agent.wait(t, self.wait_ms if wait_ms is None
                                      else wait_ms)
            red.release()  # the kernel's gradients, once it read them
        else:  # nothing to wait for: routes fall back at once
            on_time = False
            self._not_joined += 1
            # a dead private gnmrd is said as such, not as an endpoint
            # never joined
            if not died and self._not_joined == self.warn_after:
                code, why = self.agent.last_error()
                _warn(f"gnmr: rank {self.tp_rank} of job {self.job!r} has "
                      f"not joined gnmrd at {self.endpoint} after "
                      f"{self.warn_after} steps: " +
                      (f"gnmrd refused it: {why}" if code else
                       "is gnmrd running there (`gnmrctl stats`)?") +
                      " Every unit stays on the fallback route until it "
                      "joins")
        if joined:
            self._late = (self._late + [on_time])[-20:]
            late = self._late.count(False)
            if len(self._late) == 20 and late > 10 and "late" not in \
                    self._warned:
                self._warned.add("late")
                _warn(f"gnmr: {late} of the last 20 decisions of job "
                      f"{self.job!r} came after wait_ms={self.wait_ms}: "
                      "raise wait_ms, or use report_async()/finish()")
        switched = [g.name for g in self._gates if g.switched] \
            if self._gates is not None else []
        self.apply_routes()
        if self._gates is not None:
            self._arm_same_step()
        res = StepResult(step, on_time, joined,
                         self._active, self._changed,
                         shadowed=[self.units[u][0] for u in red.shadowed],
                         same_step=switched)
        if joined and not self._said_run:
            res.run = self._tell_run(step)
        job_nonfinite = None
        if on_time:
            rstep, risky = self.agent.risky()
            if rstep == t:
                res.risky = {self.units[u][0]: (g, d, s)
                             for u, g, d, s in risky}
                # +inf scores are non-finite norms, job-wide (every shard
                # and replica), so every rank skips the same steps
                mine = set(red.shadowed)
                job_nonfinite = [self.units[u][0] for u, _, _, s in risky
                                 if s == math.inf and u not in mine]
        reported = red.local  # the sums this rank sent, if it did
        if reported is None and self._trace is not None:
            # the kernel's own sums, read back for the trace (one
            # synchronisation a step, only with trace=)
            reported = red.read_kernel(t)
        if reported is None and job_nonfinite is None and grads_current:
            # an observer, or the CUDA kernel's sums: this rank's own view
            red.local = red.local_sums()
        if red.local is not None:
            sumsq, nonfinite, nr = red.local
            res._sums = (self._names, sumsq, nr)
            res.nonfinite = _flagged(self._names, nonfinite)
        if job_nonfinite is not None:  # and this rank's own (a unit both
            # shadowed here and really non-finite is non-finite)
            bad = set(job_nonfinite) | set(res.nonfinite or ())
            res.nonfinite = [n for n in self._names if n in bad] if bad \
                else []
        if reported is not None and self._trace is not None:
            sumsq, nonfinite, nr = reported  # what gnmrd decided from:
            shadowed = set(red.shadowed)  # shadowed units as NaN
            for u, ((n, _), s, c, skip) in enumerate(
                    zip(self.units, sumsq, nonfinite, nr)):
                if not skip:
                    bad = c or u in shadowed
                    self._trace.write(f"{t},{self._ids[u]},"
                                      f"{'nan' if bad else repr(s ** .5)}"
                                      "\n")
        if self.on_decision is not None:
            self.on_decision(res)
        return res

    @property
    def local_nonfinite(self):
        """The units with NaN/Inf in the gradients this rank counted in
        its last report ([] for an observer; None when not known here:
        the CUDA kernel's sums). Every element of a unit's gradient is
        counted by one reporter, so the union over the ranks is the job's
        real non-finite units, `shadow`'s excluded."""
        if self.agent.observer:
            return []
        local = self._reduction.local
        if local is None:
            return None
        return _flagged(self._names, local[1])

    def read_local(self):
        """Makes local_nonfinite known after the CUDA kernel reduced the
        last report: its sums read back (one synchronisation of the stream
        the report ran on; no round trip to gnmrd). True when known."""
        if self.agent.observer:
            return True
        self._reduction.read_kernel(self._last)
        return self._reduction.local is not None

    # ---- gradient clipping on the report's sums ----------------------------

    # ---- routes for evaluation, lifecycle ---------------------------------

    @contextmanager
    def route_all(self, route="high"):
        """Every unit on one path inside the block (evaluation, say); the
        decided routes come back on leaving it."""
        if route not in ("high", "low"):
            raise ValueError("route is 'high' or 'low'")
        self._forced = route == "high"
        self.apply_routes()
        try:
            yield self
        finally:
            self._forced = None
            self.apply_routes()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        if self._pending is not None:
            self._pending[1].exception()  # wait; close is no place to raise
            self._pending = None
        if self._worker is not None:
            self._worker.shutdown()
            self._worker = None
        self._reduction.close()
        if self._trace is not None:
            self._trace.close()
            self._trace = None
        self.agent.close()
        if self._private is not None:  # after the Bye: the job finished
            self._private.ended(self.job)
            self._private.stop()
            self._private = None
