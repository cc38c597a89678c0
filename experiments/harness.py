# SPDX-License-Identifier: MIT
"""The experiment harness: one training loop, the variants that choose
the recovery units, the figures, the tables, and the runs in parallel,
for every setting (experiments/stress.py, experiments/paper.py).

A setting (a `Setting` subclass) says what trains: the model and its
units, the data and its batches, the loss, what counts as a unit's
damage, how an episode changes a unit's input, and the clean
evaluation. Everything else is here, the same for every setting:

Variants, from the same seeds, data and episode schedule:
  fp          the model without low-precision paths (settings that have it)
  high        every unit on its recovery path
  low         every unit on its low-cost path
  gnmr        low, with a real gnmrd choosing the recovery units
  random      low, each unit-step recovered with GNMR's share, at random
  oracle      lagged oracle: knows which units' low path was damaged at
              step t-1 (GNMR's information lag), recovers at most
              --max-active of them (most recent damage first) and holds
              each for --lock-steps steps after its damage ends
  oracle_now  same-step oracle (the ceiling): knows which units the low
              path would damage at step t (a probe forward; no lock)
  rawnorm     the same number of units as GNMR at every step, chosen by
              the largest raw gradient norm (not comparable across units)
  global      when the global gradient norm is risky by GNMR's own rule
              (one scalar through the policy), --max-active units chosen
              at random, held for --lock-steps calm steps: a global
              signal's timing without its locality
  nanonly     the rule GNMR must beat: a unit whose gradient norm was
              non-finite at step t-1 is recovered, and held for
              --lock-steps steps after, at most --max-active (most recent
              first), nothing else; no recovery in GNMR's warm-up either.
              GNMR with thresholds that no finite ratio crosses decides
              this way.
  nanonly_random  nanonly, and other units at random on top, as many as
              keep its recovery share at GNMR's (a running target): what
              GNMR's budget buys without its signal
  gnmr_shadow gnmr, and a unit on its recovery path whose low path would
              have been damaged at the step is reported as non-finite
              (Controller's shadow=), so GNMR holds it while the damage
              lasts. Not in the default variants.
  gnmr_measured  gnmr_shadow, and the setting's damage measure asked of
              the units on the low-cost path too (Controller's
              shadow_low=): a unit the low path damaged at step t is
              reported as non-finite, so GNMR recovers it from t+1 within
              its budget and locks. The recipe's own measure of harm as
              the signal, where the recipe can measure it (QuantLinear's
              low_error is computed on either path, every step); the
              lagged oracle's information, through GNMR's policy. Not in
              the default variants.
  gnmr_rerun  gnmr_measured with the same-step path: when the decision
              for step t promotes units that ran step t on the low-cost
              path, step t's forward and backward run again (same batch)
              with the new routes before the optimizer steps, so an
              episode's first damaged step is recovered too; GNMR's
              decisions are those of the first pass. Its cost: `reruns`,
              the steps run twice, and the step time. Not in the default
              variants.
  static      the units whose names match --static-pattern on their
              recovery path at every step, the others never: a fixed
              per-unit assignment, for damage that is persistent. Not in
              the default variants.
  static_best static with --static-best-pattern (a second fixed set: the
              best one a search on tuning seeds found).
  measure_alone  the recipe's measure and nothing else: a unit whose
              measure at step t was above its own bound (--measure-bounds,
              fixed on tuning seeds) takes its recovery path at t+1; no
              budget, lock, confirmation or ratio (a per-GEMM switch).
  gnmr_measure   GNMR with the recipe's measure as a signal of its own
              (Controller's measure=, the policy's measure_alpha and
              measure_beta: --measure-alpha, --measure-beta): each unit's
              measure judged against its own history, no bound chosen.
  gnmr_measure_now  gnmr_measure in the same-step mode (Controller's
              same_step=True): a unit whose measure, taken in the forward
              before its GEMM, is above the bound of gnmrd's latest
              decision takes its recovery path within that step, at most
              the budget gnmrd left (`same_steps` counts them).

Validation loss is measured clean: the episode scaling is off while the
setting evaluates (the model as training left it). Exceedances: for
every variant, each unit's gradient norms go through GNMR's per-unit rule
(docs/policy.md, gnmr.policy) and a unit-step after warm-up counts when
its finite GNMR or delta-GNMR crosses a threshold (`exceed`, the paper's
threshold-exceedance rate, as a share of the unit-steps after warm-up)
or its norm is non-finite (`nonfinite`, same denominator).

Damage is what the setting measures on either path (the low path's copy
overflowed, or its error passed a bound). Precision: of a variant's
recovery unit-steps, the share that were damage unit-steps; coverage: of
the damage unit-steps, the share recovered. Misses: every damage
unit-step (u, t) not recovered, by cause (misses_by_cause): `warmup`
(A_t was decided in warm-up), `first` (u was not damaged in the
--lock-steps + 1 steps before: an episode's first damage, which no
chooser that learns from step t-1 can see), `gap` (u was damaged within
those steps but not at t-1, and was not held), `hidden` (u was damaged at
t-1 while on its recovery path, so the damage never reached its
gradient, and was released at t), `not_chosen` (u's damage at t-1 was on
the low path, yet u was not recovered at t: the budget went to others).

--json writes the results (command, commit, seeds, per-variant per-seed
values, paired differences with standard errors), and a markdown table
and plot beside it. Everything is single-threaded and seeded: the same
command gives the same numbers on the same machine.
"""
import argparse
import glob
import json
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")   # single-threaded: reproducible
import torch  # noqa: E402

import gnmr  # noqa: E402
import gnmr.policy  # noqa: E402
from gnmr.pytorch import Controller  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import MISS_CAUSES, git_commit, plot, summarise, table  # noqa
from variants import Chooser, policy_of  # noqa: E402

DEFAULT_VARIANTS = ("fp", "high", "low", "gnmr", "random", "oracle",
                    "oracle_now", "rawnorm", "global", "nanonly",
                    "nanonly_random")
ALL_VARIANTS = DEFAULT_VARIANTS + ("gnmr_shadow", "gnmr_measured",
                                   "gnmr_rerun", "static", "static_best",
                                   "measure_alone", "gnmr_measure",
                                   "gnmr_measure_now")
CONTROLLED = {"gnmr", "gnmr_shadow", "gnmr_measured", "gnmr_rerun",
              "gnmr_measure", "gnmr_measure_now"}
MEASURE_SIGNAL = {"gnmr_measure", "gnmr_measure_now"}  # measure=
MEASURED = {"gnmr_measured", "gnmr_rerun"}  # shadow_low
# GNMR's share / per-step counts
NEEDS_GNMR = {"random", "rawnorm", "nanonly_random"}
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


class Built:
    """What a setting's build() gives the loop: the model, the units (in
    the controller's order) and their names, the parameters to train,
    the module types the controller selects, the on_route that switches
    a unit, and the modules whose input an episode changes (one a unit;
    default: the units), and the controller's name pattern (None: every
    module of the selected types)."""

    def __init__(self, model, names, units, params, select, on_route,
                 inject=None, experts=False, pattern=None):
        self.model, self.names, self.units = model, names, units
        self.pattern = pattern
        self.params, self.select, self.on_route = params, select, on_route
        self.inject = inject if inject is not None else units
        self.experts = experts


class Setting:
    """What trains (see the module doc). Subclasses set `name`, `script`,
    `variants` and `episode_kind` ("tokens": --episode-tokens positions
    of the unit's input are scaled; "channels": --episode-channels of its
    features are), and implement the methods below."""
    name = script = ""
    variants = DEFAULT_VARIANTS
    episode_kind = "tokens"
    job = "stress"

    def add_args(self, p):
        pass

    def check_args(self, p, args):
        pass

    def load(self, args):
        """The data, loaded once per process."""
        raise NotImplementedError

    def build(self, variant, seed, args, data):
        raise NotImplementedError

    def batches(self, data, args, gen):
        raise NotImplementedError

    def loss(self, model, x, y):
        raise NotImplementedError

    def damage(self, units, args):
        """[bool]: each unit's low path damaged at this step (either
        path)."""
        raise NotImplementedError

    def probe(self, units, args):
        """Per unit, how badly the low path would be damaged at this step
        (0/False: not at all), after a probe forward: oracle_now takes the
        worst first."""
        return self.damage(units, args)

    def reset(self, units):
        """Before each step's forward (a unit may not run every step)."""

    def measures(self, units, args):
        """Per unit, the recipe's own measure of its low path's error at
        this step (what a variant may use as a signal), or None where the
        setting has none."""
        return None

    def damage_values(self, units, args):
        """Per unit, the value damage() compares with its bound (for the
        traces), or None."""
        return None

    def set_latent(self, built, current):
        """--episode-mode latent: the units in `current` ({u: (positions,
        scale)}) get a latent outlier of that scale at those input
        features, every other unit none."""
        raise SystemExit(f"{self.script}: this setting has no latent "
                         "outliers (--episode-mode latent)")

    def set_route(self, unit, high):
        unit.recovery = high

    def on_recovery(self, unit):
        return unit.recovery

    def widths(self, built, args):
        """Per unit: the positions an episode picks from."""
        return [args.ctx] * len(built.units)

    def evaluate(self, model, data, args):
        """{"val": clean validation loss, ...other figures}."""
        raise NotImplementedError

    def extra_figures(self):
        """Figures evaluate() adds beside "val": [(key, label, higher is
        better)]."""
        return []


def read_licences(names=None, exclude=()):
    """The licence texts every Debian system ships (base-files), in file
    name order: those named (all when None) but the excluded."""
    data = bytearray()
    for f in sorted(glob.glob("/usr/share/common-licenses/*")):
        b = os.path.basename(f)
        if not os.path.isfile(f) or b in exclude or \
                (names is not None and b not in names):
            continue
        with open(f, "rb") as fh:
            data += fh.read()
    return data


def split_text(data, minimum, complaint):
    """(train, val) byte tensors, 90/10; SystemExit(complaint) when data
    has fewer than minimum bytes."""
    if len(data) < minimum:
        raise SystemExit(complaint)
    t = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(torch.long)
    n = int(len(t) * 0.9)
    return t[:n], t[n:]


def batches(data, n, batch, ctx, gen):
    """n (inputs, next-byte targets) batches of ctx bytes at random
    offsets."""
    for _ in range(n):
        i = torch.randint(0, len(data) - ctx - 1, (batch,), generator=gen)
        yield (torch.stack([data[j:j + ctx] for j in i]),
               torch.stack([data[j + 1:j + ctx + 1] for j in i]))


def episode_schedule(widths, steps, args, seed):
    """sched[t][u] = (positions, scale) while u is in an episode."""
    rng = random.Random(seed * 7919 + 1)
    scales = args.episode_scales
    k = args.episode_tokens
    sched = [dict() for _ in range(steps + 1)]
    for u, width in enumerate(widths):
        t = 1
        while t <= steps:
            if rng.random() < args.episode_rate:
                idx = rng.sample(range(width), min(k, width))
                for j, s in enumerate(scales):
                    if t + j <= steps:
                        sched[t + j][u] = (idx, s)
                t += len(scales)
            t += 1
    return sched


def unit_norms(units):
    """Each unit's gradient norm (fp64 sums of squares, added in parameter
    order), read to the host at once: one synchronisation a step on a GPU,
    not one a parameter."""
    sq, owner = [], []
    for u, m in enumerate(units):
        for p in m.parameters():
            if p.grad is not None:
                sq.append(p.grad.double().pow(2).sum())
                owner.append(u)
    s = [0.0] * len(units)
    for u, v in zip(owner, torch.stack(sq).tolist() if sq else []):
        s[u] += v
    return [math.sqrt(v) for v in s]


def unit_norm(m):
    return unit_norms([m])[0]


def all_finite(params):
    """Whether every gradient is finite: one read for all of them."""
    flags = [torch.isfinite(p.grad).all() for p in params
             if p.grad is not None]
    return bool(torch.stack(flags).all()) if flags else True


def _inject(setting, current, u):
    tokens = setting.episode_kind == "tokens"

    def hook(module, inputs):
        ep = current.get(u)
        if ep is None:
            return None
        x = inputs[0].clone()
        if tokens:
            x[:, ep[0], :] *= ep[1]
        else:
            x[..., ep[0]] *= ep[1]
        return (x,) + tuple(inputs[1:])
    return hook


def run(setting, variant, seed, args, data, endpoint=None, gnmr_rec=None):
    torch.manual_seed(seed)
    b = setting.build(variant, seed, args, data)
    model, names, units = b.model, b.names, b.units
    dev = torch.device(getattr(args, "device", "cpu"))
    if dev.type != "cpu":
        model.to(dev)  # in place: b.params are the model's, moved
    opt = torch.optim.AdamW(b.params, lr=args.lr, betas=(0.9, args.beta2))
    # linear warm-up, then cosine decay to lr/10, as LLM recipes schedule
    # (a skipped step still advances the schedule, as with GradScaler)
    sched_lr = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: min(
        (i + 1) / args.lr_warmup, 0.1 + 0.45 * (1 + math.cos(
            math.pi * min(i, args.steps) / args.steps))))
    sched = episode_schedule(setting.widths(b, args), args.steps, args, seed)
    current = {}
    latent = args.episode_mode == "latent"
    if not latent:
        for u, m in enumerate(b.inject):
            m.register_forward_pre_hook(_inject(setting, current, u))
    trace = [] if args.trace_dir else None
    errors = []                   # (step, unit, damage value), for traces

    ctl = None
    if variant in CONTROLLED:
        shadow = None
        if variant in ("gnmr_shadow",) + tuple(MEASURED):
            index = {id(m): u for u, m in enumerate(units)}

            def shadow(name, m):
                return setting.damage([m], args)[0] if id(m) in index \
                    else False
        measure = None
        if variant in MEASURE_SIGNAL:
            index = {id(m): u for u, m in enumerate(units)}

            def measure(name, m):
                return setting.measures([m], args)[0] if id(m) in index \
                    else None
        ctl = Controller(model, endpoint, f"{setting.job}-{seed}-"
                         f"{os.getpid()}", select=b.select,
                         pattern=b.pattern,
                         on_route=b.on_route, shadow=shadow,
                         shadow_low=variant in MEASURED,
                         experts=b.experts, measure=measure,
                         same_step=variant == "gnmr_measure_now",
                         params=gnmr.default_params(
                             alpha=args.alpha, beta=args.beta,
                             window=args.window,
                             max_active=args.max_active,
                             lock_steps=args.lock_steps,
                             warmup_steps=args.warmup,
                             mean_horizon=args.mean_horizon,
                             job_relative=args.job_relative,
                             confirm_steps=args.confirm_steps,
                             measure_alpha=args.measure_alpha
                             if variant in MEASURE_SIGNAL else 0.0,
                             measure_beta=args.measure_beta
                             if variant in MEASURE_SIGNAL else 0.0,
                             same_step=int(variant == "gnmr_measure_now")))
        if [n for n, _ in ctl.units] != names:
            raise RuntimeError("the controller's units are not the model's")
    chooser = Chooser(variant, len(units), args, seed, gnmr_rec, names)
    gen = torch.Generator().manual_seed(seed)
    curve, t_steps, skipped = [], 0.0, 0
    active_log = [set()]          # active_log[t]: recovery set at step t
    rec_steps = damage_steps = hits = 0
    damage_log = [[False] * len(units)]  # damage_log[t][u]
    rule = policy_of(args, len(units))  # GNMR's rule, for exceedances
    exceed = nonfinite = 0
    exceed_ep = 0                 # of them, in an episode of that unit
    reruns = 0                    # gnmr_rerun: steps run twice
    same_steps = 0                # gnmr_measure_now: units moved within
                                  # their step
    for step, (x, y) in enumerate(setting.batches(data, args, gen), 1):
        t0 = time.perf_counter()
        x, y = x.to(dev), y.to(dev)  # the same batches on any device
        current.clear()
        current.update(sched[step])
        if latent:
            setting.set_latent(b, current)
        probe = None
        if variant == "oracle_now":
            setting.reset(units)
            with torch.no_grad():
                model(x)          # records nothing: sees what the low path
            probe = setting.probe(units, args)
        if ctl is None:
            active = chooser.before(step, probe)
            for u, m in enumerate(units):
                if variant != "fp":
                    setting.set_route(m, u in active)
        else:
            active = {u for u, m in enumerate(units)
                      if setting.on_recovery(m)}
        active_log.append(active)
        setting.reset(units)
        loss = setting.loss(model, x, y)
        opt.zero_grad()
        loss.backward()
        damage = [False] * len(units) if variant == "fp" else \
            setting.damage(units, args)
        damage_log.append(damage)
        meas = None if variant == "fp" else setting.measures(units, args)
        if trace is not None and variant != "fp":
            dval = setting.damage_values(units, args)
        rec_steps += len(active)
        damage_steps += sum(damage)
        hits += sum(damage[u] for u in active)
        if ctl is not None:
            res = ctl.step(step, wait_ms=30000)
            if not res:
                raise RuntimeError(f"gnmrd's decision for step {step} was "
                                   f"late: the run would not reproduce")
            moved = {names.index(n) for n in res.same_step} - active
            if moved:   # the same-step mode moved them within the step
                same_steps += len(moved)
                active |= moved
                rec_steps += len(moved)
                hits += sum(damage[u] for u in moved)
        norms = unit_norms(units)
        if variant == "gnmr_rerun":
            now = {u for u, m in enumerate(units) if setting.on_recovery(m)}
            new = now - active
            if new:   # the same-step path: step t again, new routes
                reruns += 1
                active |= new
                rec_steps += len(new)
                hits += sum(damage[u] for u in new)
                setting.reset(units)
                loss = setting.loss(model, x, y)
                opt.zero_grad()
                loss.backward()
        if trace is not None:
            if variant == "fp" or meas is None:
                trace.extend((step, u, n) for u, n in enumerate(norms))
            else:
                trace.extend((step, u, n, meas[u])
                             for u, n in enumerate(norms))
            if variant != "fp" and dval is not None:
                errors.extend((step, u, v) for u, v in enumerate(dval))
        rule.step(step, dict(enumerate(norms)))
        for u, n in enumerate(norms):
            risky = rule.s[u] > 1
            if step > args.warmup and risky:
                if math.isfinite(n):
                    exceed += 1
                    exceed_ep += u in sched[step]
                else:
                    nonfinite += 1
        chooser.after(step, damage, norms, meas)
        finite = all_finite(b.params)
        if finite and args.clip > 0:   # after GNMR saw the norms
            torch.nn.utils.clip_grad_norm_(b.params, args.clip)
        if finite or not args.skip_nonfinite:
            opt.step()
        else:
            skipped += 1
        sched_lr.step()
        t_steps += time.perf_counter() - t0
        if step % args.eval_every == 0 or step == args.steps:
            current.clear()   # measured clean: no episode while evaluating
            if latent:
                setting.set_latent(b, current)
            curve.append((step, setting.evaluate(model, data, args)))
    if ctl is not None:
        ctl.close()
    if trace is not None:
        write_trace(os.path.join(args.trace_dir, f"{setting.name}-{variant}"
                                 f"-{seed}.csv"), trace, names,
                    [(t, u) for t in range(1, args.steps + 1)
                     for u in sorted(sched[t])], errors)
    unit_steps = len(units) * args.steps
    eligible = len(units) * max(1, args.steps - args.warmup)
    out = {"val": curve[-1][1]["val"],
           "curve": [(s, e["val"]) for s, e in curve],
           "exceed": exceed / eligible, "nonfinite": nonfinite / eligible,
           "share": rec_steps / unit_steps,
           "precision": hits / rec_steps if rec_steps else 0.0,
           "coverage": hits / damage_steps if damage_steps else 0.0,
           "damage": damage_steps / unit_steps,
           "skipped": skipped, "active": [sorted(a) for a in active_log],
           "reruns": reruns, "same_steps": same_steps,
           "misses": misses_by_cause(damage_log, active_log, args),
           "damage_steps": damage_steps,
           "step_ms": 1e3 * t_steps / args.steps}
    out.update(where_it_falls(damage_log, sched, exceed, exceed_ep))
    out["units"] = names
    for key, _, _ in setting.extra_figures():
        out[key] = curve[-1][1][key]
    return out


def write_trace(path, rows, names, episodes=(), errors=()):
    """The run's per-unit gradient norms as a trace of docs/policy.md
    (step,unit,norm; repr round-trips every double; rows of four values
    add the recipe's measure: step,unit,norm,measure), the units' names,
    the (step, unit) pairs in an episode and the damage values (`#
    damage STEP UNIT VALUE`) in comment lines: `gnmrctl replay` and
    gnmr.policy read it, experiments/defaults.py the episodes."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    measured = any(len(r) == 4 for r in rows)
    with open(path + ".tmp", "w") as f:
        for u, n in enumerate(names):
            f.write(f"# unit {u} {n}\n")
        for t, u in episodes:
            f.write(f"# episode {t} {u}\n")
        for t, u, v in errors:
            f.write(f"# damage {t} {u} {v!r}\n")
        f.write("step,unit,norm,measure\n" if measured else
                "step,unit,norm\n")
        for r in rows:
            f.write(",".join(repr(v) if isinstance(v, float) else str(v)
                             for v in r) + "\n")
    os.replace(path + ".tmp", path)


def where_it_falls(damage_log, sched, exceed, exceed_ep):
    """Whether the damage and the exceedances come with the episodes:
    the share of damage unit-steps in an episode of that unit, the share
    of finite exceedances in one, and per unit the share of its steps
    outside episodes that were damaged (a unit damaged whatever the
    episodes do has a persistent problem, which no controller of
    transient ones fixes)."""
    n = len(damage_log[0])
    dmg = dmg_ep = 0
    outside, calm = [0] * n, [0] * n
    for t in range(1, len(damage_log)):
        for u, hit in enumerate(damage_log[t]):
            ep = u in sched[t]
            dmg += hit
            dmg_ep += hit and ep
            if not ep:
                calm[u] += 1
                outside[u] += hit
    return {"damage_in_episode": dmg_ep / dmg if dmg else 0.0,
            "exceed_in_episode": exceed_ep / exceed if exceed else 0.0,
            "damage_outside_by_unit": [o / c if c else 0.0
                                       for o, c in zip(outside, calm)]}


def misses_by_cause(damage_log, active_log, args):
    """{cause: count} of the damage unit-steps not recovered (the module
    docstring defines the causes); damage_log[t][u], active_log[t] a set,
    for t = 1..steps (index 0: nothing)."""
    out = dict.fromkeys(MISS_CAUSES, 0)
    for t in range(1, len(damage_log)):
        for u, hit in enumerate(damage_log[t]):
            if not hit or u in active_log[t]:
                continue
            if t - 1 <= args.warmup:
                cause = "warmup"
            elif damage_log[t - 1][u]:
                cause = "hidden" if u in active_log[t - 1] else "not_chosen"
            elif any(damage_log[k][u] for k in
                     range(max(1, t - 1 - args.lock_steps), t - 1)):
                cause = "gap"
            else:
                cause = "first"
            out[cause] += 1
    return out


def start_gnmrd(bindir):
    tmp = tempfile.mkdtemp(prefix="gnmr-stress-")
    proc = subprocess.Popen([os.path.join(bindir, "gnmrd"), "--data-dir",
                             tmp + "/data", "--agents", "tcp://127.0.0.1:*",
                             "--admin", f"ipc://{tmp}/admin.sock",
                             "--log-level", "warn"],
                            stdout=subprocess.PIPE, text=True)
    for line in proc.stdout:
        m = re.match(r"gnmrd: agents (\S+)", line)
        if m:
            return proc, tmp, m.group(1)
    raise RuntimeError("gnmrd did not start")


def common_args(p, setting, defaults):
    """The loop's, the policy's and the runner's options; `defaults`
    overrides this setting's defaults."""
    d = dict(steps=300, batch=32, lr=3e-3, lr_warmup=20, beta2=0.95,
             episode_rate=0.015, episode_tokens=2,
             episode_scales="2,4,8,16,32", alpha=2.0, beta=2.0, window=8,
             max_active=2, lock_steps=2, warmup=20, eval_every=50,
             eval_batches=8)
    d.update(defaults)
    p.add_argument("--seeds", type=int, default=5,
                   help="seeds 1..N (default 5)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="where the model trains (the batches and the "
                   "episode schedule are the CPU's generator's either "
                   "way); cuda: deterministic where torch can be")
    p.add_argument("--seed-list", default="",
                   help="comma-separated seeds, instead of --seeds")
    p.add_argument("--steps", type=int, default=d["steps"])
    p.add_argument("--variants", default=",".join(setting.variants),
                   help=f"of {','.join(ALL_VARIANTS)} (default: "
                   f"{','.join(setting.variants)})")
    p.add_argument("--batch", type=int, default=d["batch"])
    p.add_argument("--lr", type=float, default=d["lr"])
    p.add_argument("--lr-warmup", type=int, default=d["lr_warmup"])
    p.add_argument("--beta2", type=float, default=d["beta2"],
                   help="AdamW's second-moment decay (LLM recipes use 0.95)")
    what = "token positions" if setting.episode_kind == "tokens" else \
        "input features (channels)"
    p.add_argument("--episode-rate", type=float, default=d["episode_rate"])
    p.add_argument("--episode-tokens", type=int, default=d["episode_tokens"],
                   help=f"how many {what} of a unit's input an episode "
                   "scales")
    p.add_argument("--episode-scales", default=d["episode_scales"],
                   help="the scale of the episode's positions, step by step")
    p.add_argument("--episode-mode", choices=("input", "latent"),
                   default=d.get("episode_mode", "input"),
                   help="input: the positions of the unit's input are "
                   "scaled (every path sees it); latent: only the unit's "
                   "quantizers see the scaled features, with the weight "
                   "columns divided by the same scale (the exact product "
                   "unchanged: a latent outlier feature)")
    p.add_argument("--trace-dir", default="",
                   help="write each run's per-unit gradient norms here as "
                   "a trace (SETTING-VARIANT-SEED.csv)")
    p.add_argument("--no-skip-nonfinite", dest="skip_nonfinite",
                   action="store_false",
                   help="apply steps with non-finite gradients")
    p.add_argument("--clip", type=float, default=d.get("clip", 0.0),
                   help="clip the global gradient norm to this before the "
                   "optimizer step (0: no clipping)")
    p.add_argument("--alpha", type=float, default=d["alpha"])
    p.add_argument("--beta", type=float, default=d["beta"])
    p.add_argument("--window", type=int, default=d["window"])
    p.add_argument("--max-active", type=int, default=d["max_active"])
    p.add_argument("--lock-steps", type=int, default=d["lock_steps"])
    p.add_argument("--warmup", type=int, default=d["warmup"])
    p.add_argument("--mean-horizon", type=int,
                   default=d.get("mean_horizon", 0),
                   help="the policy's mean horizon (0: all history)")
    p.add_argument("--job-relative", type=int, choices=(0, 1),
                   default=d.get("job_relative", 0),
                   help="the policy's job-relative rule (1: on)")
    p.add_argument("--confirm-steps", type=int,
                   default=d.get("confirm_steps", 0),
                   help="the policy's confirmed exceedances (0: off, as "
                   "the recorded results ran; the product's default is 2)")
    p.add_argument("--eval-every", type=int, default=d["eval_every"])
    p.add_argument("--eval-batches", type=int, default=d["eval_batches"])
    p.add_argument("--static-pattern", default=d.get("static_pattern", ""),
                   help="the static variant: a regular expression on unit "
                   "names; those units take their recovery path always")
    p.add_argument("--static-best-pattern",
                   default=d.get("static_best_pattern", ""),
                   help="the static_best variant's regular expression")
    p.add_argument("--tuned", default="",
                   help="what the tuning seeds fixed (experiments/tuned.py's "
                   "JSON): measure_alone's per-unit bounds and, unless "
                   "--static-best-pattern is given, static_best's units")
    deflt = gnmr.policy.params()   # the product's defaults in force
    p.add_argument("--measure-alpha", type=float,
                   default=d.get("measure_alpha", deflt["measure_alpha"]),
                   help="gnmr_measure: the policy's measure_alpha "
                   "(default: the product's)")
    p.add_argument("--measure-beta", type=float,
                   default=d.get("measure_beta", deflt["measure_beta"]),
                   help="gnmr_measure: the policy's measure_beta "
                   "(default: the product's)")
    p.add_argument("--share-of", default=d.get("share_of", "gnmr"),
                   choices=sorted(CONTROLLED | {"static"}),
                   help="the GNMR variant whose recovery share random and "
                   "nanonly_random take, and whose per-step counts rawnorm "
                   "takes (default gnmr)")
    p.add_argument("--jobs", type=int, default=1,
                   help="seeds run in this many processes at once (each "
                   "single-threaded; the results do not change)")
    p.add_argument("--json", default="",
                   help="write the results here, and a .md table and a .png "
                   "plot beside it")
    p.add_argument("--plot", default="", help="loss curves (PNG)")
    p.add_argument("--keep-runs", default="", metavar="DIR",
                   help="keep each finished run in DIR, and take the runs "
                   "found there instead of running them again: a sweep cut "
                   "off goes on where it stopped (experiments/runkeep.py: "
                   "a run is kept under its options and the code's digest)")
    p.add_argument("--gnmrd-bin", default=os.environ.get(
        "GNMR_BIN_DIR", os.path.join(ROOT, "build", "bin")))


def parse_args(setting, argv, defaults=None, doc=""):
    p = argparse.ArgumentParser(description=doc.split("\n")[0])
    setting.add_args(p)
    common_args(p, setting, defaults or {})
    args = p.parse_args(argv)
    try:
        args.episode_scales = [float(s) for s in
                               args.episode_scales.split(",")]
        seeds = ([int(s) for s in args.seed_list.split(",")]
                 if args.seed_list else list(range(1, args.seeds + 1)))
    except ValueError as e:
        p.error(f"bad number list: {e}")
    if not seeds or any(s < 0 for s in seeds):
        p.error("seeds must be >= 0 and at least one")
    variants = [v for v in args.variants.split(",") if v]
    bad = set(variants) - set(ALL_VARIANTS)
    if bad or not variants:
        p.error(f"unknown variant(s) {sorted(bad)}; choose from "
                f"{','.join(ALL_VARIANTS)}")
    if args.steps < 1 or args.eval_every < 1 or args.jobs < 1:
        p.error("--steps, --eval-every and --jobs must be >= 1")
    if args.max_active < 0 or args.lock_steps < 0 or args.warmup < 0:
        p.error("--max-active, --lock-steps and --warmup must be >= 0")
    if not 0 <= args.episode_rate <= 1 or not all(
            s > 0 and math.isfinite(s) for s in args.episode_scales):
        p.error("--episode-rate must be in [0, 1] and --episode-scales "
                "positive")
    tuned = read_tuned(p, args.tuned) if args.tuned else {}
    if not args.static_best_pattern:
        args.static_best_pattern = tuned.get("static_best", {}).get(
            "pattern", "")
    for v, opt in (("static", "static_pattern"),
                   ("static_best", "static_best_pattern")):
        if v not in variants:
            continue
        flag = "--" + opt.replace("_", "-")
        try:
            if not getattr(args, opt) or not re.compile(
                    getattr(args, opt)).pattern:
                p.error(f"the {v} variant needs {flag}")
        except re.error as e:
            p.error(f"{flag}: {e}")
    if "measure_alone" in variants and not tuned.get("bounds"):
        p.error("measure_alone needs --tuned FILE with its bounds")
    args.measure_bounds = tuned.get("bounds", {})
    if MEASURE_SIGNAL & set(variants) and not (
            args.measure_alpha > 0 or args.measure_beta > 0):
        p.error("gnmr_measure and gnmr_measure_now need --measure-alpha "
                "or --measure-beta above 0")
    if not args.clip >= 0:
        p.error("--clip must be >= 0")
    if args.episode_tokens < 1:
        p.error("--episode-tokens must be >= 1")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: torch sees no GPU")
    setting.check_args(p, args)
    return args, seeds, variants


_DATA = {}


def read_tuned(p, path):
    """experiments/tuned.py's JSON: {"bounds": {unit name: bound >= 0},
    "static_best": {"pattern": REGEX, ...}} (either may be absent)."""
    try:
        with open(path) as f:
            got = json.load(f)
        if not isinstance(got, dict):
            raise ValueError("expected a JSON object")
        bounds = got.get("bounds", {})
        if not isinstance(bounds, dict) or not all(
                isinstance(v, (int, float)) and v >= 0
                for v in bounds.values()):
            raise ValueError("bounds: expected {unit name: bound >= 0}")
        best = got.get("static_best", {})
        if not isinstance(best, dict) or not isinstance(
                best.get("pattern", ""), str):
            raise ValueError("static_best: expected {\"pattern\": REGEX}")
    except (OSError, ValueError) as e:
        p.error(f"--tuned {path}: {e}")
    return {"bounds": {str(k): float(v) for k, v in bounds.items()},
            "static_best": best}


def _one_blas_thread():
    """OpenBLAS reads OPENBLAS_NUM_THREADS once, when it loads: in a process
    that imported torch before this module (a test, a notebook) it runs on
    every CPU, and its threaded products need not give the same bits twice
    (on an AMD EPYC they did not). Set the loaded library to one thread;
    nothing to do where torch uses another BLAS."""
    import ctypes
    for name in ("libblas.so.3", "libopenblas.so.0"):
        try:
            ctypes.CDLL(name).openblas_set_num_threads(1)
            return
        except (OSError, AttributeError):
            continue


def run_task(setting, seed, variant, args, rec=None):
    """One variant of one seed, single-threaded; the GNMR variant with a
    gnmrd of its own. rec: GNMR's result for the seed (random, rawnorm)."""
    torch.set_num_threads(1)
    _one_blas_thread()
    if getattr(args, "device", "cpu") == "cuda":
        # cuBLAS is deterministic with a fixed workspace; index_add_'s
        # backward (the experts) has no deterministic CUDA kernel: warned
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
    else:
        torch.use_deterministic_algorithms(True)
    key = (type(setting).__name__, setting.data_key(args)
           if hasattr(setting, "data_key") else None)
    if key not in _DATA:
        _DATA[key] = setting.load(args)
    d = start_gnmrd(args.gnmrd_bin) if variant in CONTROLLED else None
    try:
        r = run(setting, variant, seed, args, _DATA[key],
                d[2] if d else None, rec)
    finally:
        if d:
            d[0].send_signal(signal.SIGTERM)
            d[0].wait()
            d[0].stdout.close()
            shutil.rmtree(d[1], ignore_errors=True)
    extra = "".join(f" {k} {r[k]:.4f}" for k, _, _ in
                    setting.extra_figures())
    print(f"seed {seed} {variant:10s} val {r['val']:.4f}{extra} "
          f"share {r['share']:.3f} prec {r['precision']:.2f} "
          f"cov {r['coverage']:.2f} skipped {r['skipped']:3d} "
          f"step {r['step_ms']:.1f} ms", flush=True)
    return r


def run_all(setting, seeds, order, args):
    """{(seed, variant): result}. With --jobs N, N single-threaded
    processes take (seed, variant) runs as they come, GNMR's first (random
    and rawnorm wait for GNMR's run of their seed): the same numbers as one
    process running them in turn."""
    res = {}
    ref = args.share_of   # whose share random, rawnorm, ... take
    kept = None
    if args.keep_runs:
        import runkeep
        kept = runkeep.Kept(args.keep_runs, type(setting).__name__, args,
                            ROOT)
        for seed in seeds:
            for v in order:
                r = kept.get(seed, v)
                if r is not None:
                    res[seed, v] = r
        args.kept_taken = kept.taken
        if kept.taken:
            print(f"{kept.taken} of {len(seeds) * len(order)} runs taken "
                  f"from {args.keep_runs}", flush=True)
    if args.jobs <= 1:
        for seed in seeds:
            for v in order:
                if (seed, v) not in res:
                    res[seed, v] = run_task(setting, seed, v, args,
                                            res.get((seed, ref)))
                    if kept:
                        kept.put(seed, v, res[seed, v])
        return res
    import concurrent.futures as cf
    import multiprocessing
    with cf.ProcessPoolExecutor(
            args.jobs, mp_context=multiprocessing.get_context("spawn")) as ex:
        pending = {}

        def submit(seed, v):
            if (seed, v) not in res:
                pending[ex.submit(run_task, setting, seed, v, args,
                                  res.get((seed, ref)))] = (seed, v)

        for seed in seeds:
            if ref in order:
                submit(seed, ref)
                if (seed, ref) in res:   # kept: its followers may start
                    for w in order:
                        if w in NEEDS_GNMR:
                            submit(seed, w)
        for seed in seeds:
            for v in order:
                if v != ref and v not in NEEDS_GNMR:
                    submit(seed, v)
        while pending:
            done, _ = cf.wait(pending, return_when=cf.FIRST_COMPLETED)
            for f in done:
                seed, v = pending.pop(f)
                res[seed, v] = f.result()
                if kept:
                    kept.put(seed, v, res[seed, v])
                if v == ref:
                    for w in order:
                        if w in NEEDS_GNMR:
                            submit(seed, w)
    return res


def main(setting, argv=None, defaults=None, doc=""):
    args, seeds, variants = parse_args(setting, argv, defaults, doc)
    ref = args.share_of
    order = ([ref] if ref in variants or NEEDS_GNMR & set(variants)
             else []) + [v for v in variants if v != ref]
    commit = git_commit()  # the code that runs, not what HEAD is at the end
    res = run_all(setting, seeds, order, args)
    results = {v: [res[s, v] for s in seeds] for v in order}
    results = {v: results[v] for v in ALL_VARIANTS if v in results}
    summary = summarise(setting, results, args, seeds, argv, commit)
    extras = setting.extra_figures()
    print()
    print(table(summary, extras))
    if args.json:
        base = os.path.splitext(args.json)[0]
        os.makedirs(os.path.dirname(os.path.abspath(args.json)),
                    exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
            f.write("\n")
        with open(base + ".md", "w") as f:
            m = summary["machine"]
            f.write(f"Command: `{summary['command']}`\n\n"
                    f"Commit: {summary['commit']}; seeds: {seeds}; "
                    f"machine: {m['cpu']} ({m['cpus']} CPUs, {m['blas']}), "
                    f"torch {summary['torch']}\n\n")
            if getattr(args, "kept_taken", 0):
                f.write(f"{args.kept_taken} of {len(seeds) * len(order)} "
                        "runs were taken from --keep-runs (run earlier by "
                        "the same code, by its digest)\n\n")
            f.write(table(summary, extras))
        plot(results, base + ".png")
        print(f"wrote {args.json}, {base}.md, {base}.png")
    if args.plot:
        plot(results, args.plot)
    return results
