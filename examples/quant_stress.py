# SPDX-License-Identifier: MIT
"""Low-precision stress experiment: does GNMR's *choice* of units matter?

A byte-level GPT-style causal language model trains on CPU on the licence
texts every Debian system ships (/usr/share/common-licenses, base-files).
Every linear projection is a unit with two paths (gnmr.recovery).

The recipe (--recipe fp8, the default): FP8 activation storage. Each
projection's input activation is saved for backward as FP8 E4M3 with
delayed scaling: the scale comes from the largest amax of the last
--amax-history (16) training steps with a --margin of 0.5 (headroom
2**0.5), as Transformer Engine's DelayedScaling computes it. The cast does
not saturate, so an element that outgrows the stale scale becomes NaN (as
a raw cast does in E4M3FN), and the weight gradient of that unit, and only
that unit, turns non-finite. The training loop then does what users do
with non-finite gradients (GradScaler's hygiene): it skips the optimizer
step, and counts it. That is the harm: local in cause (one unit's low
path spoils the step) and transient, and putting that one unit on its
recovery path (the exact activation) while its activation grows saves the
steps after the first. The optimizer is AdamW (beta2 --beta2, 0.95) with
a warm-up and cosine schedule, as LLM recipes use.

The stress: each unit enters, with probability --episode-rate (0.015) per
step, a growth episode in which --episode-tokens (2) token positions of its
input are scaled by --episode-scales (x2, x4, ... x32 over five steps): an
activation that grows faster than a stale amax history and its margin
allow, as an instability that builds over a few steps does. Natural growth
stays within the margin (no damage at all with --episode-rate 0). The
schedule is the same for every variant of a seed. The forward is exact on
both paths, so every variant sees the same inputs; only the saved copies
differ.

--recipe int4 keeps the earlier stress through gnmr.recovery.KBitLinear
(4-bit saved activations with a per-tensor scale, 8 bits on the recovery
path; with --episode-scales 20,20,20 --episode-rate 0.2 the x20 outlier
tokens of the first experiment), where the harm is spread over every
token and no selection rule helps.

Variants, from the same seeds, data and episode schedule:
  fp          plain torch.nn.Linear, no quantization
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
              have been damaged at the step (its copy measured on either
              path: gnmr.recovery.fp8_overflowed, or the int4 error above
              --damage-error) is reported as non-finite (Controller's
              shadow=), so GNMR holds it while the damage lasts. Not in
              the default --variants (make experiment's nine).

Validation loss is measured clean: the episode scaling is off while
evaluate() runs (the model as training left it). Exceedances: for every
variant, each unit's gradient norms go through GNMR's per-unit rule
(docs/policy.md, ScalarPolicy) and a unit-step after warm-up counts when
its finite GNMR or delta-GNMR crosses a threshold (`exceed`, the paper's
threshold-exceedance rate, as a share of the unit-steps after warm-up)
or its norm is non-finite (`nonfinite`, same denominator).

Damage (measured, on either path): the low path's copy of a unit's input
at step t had elements out of the FP8 range (fp8), or a relative error
above --damage-error (int4). Precision: of a variant's recovery
unit-steps, the share that were damage unit-steps; coverage: of the damage
unit-steps, the share recovered. Misses: every damage unit-step (u, t) not
recovered, by cause (misses_by_cause): `warmup` (A_t was decided in
warm-up), `first` (u was not damaged in the --lock-steps + 1 steps before:
an episode's first damage, which no chooser that learns from step t-1 can
see), `gap` (u was damaged within those steps but not at t-1, and was not
held), `hidden` (u was damaged at t-1 while on its recovery path, so the
damage never reached its gradient, and was released at t), `not_chosen`
(u's damage at t-1 was on the low path, a non-finite gradient in the fp8
recipe, yet u was not recovered at t: the budget went to others).

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
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")   # single-threaded: reproducible
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import gnmr  # noqa: E402
from gnmr.pytorch import Controller  # noqa: E402
from gnmr.recovery import FP8Linear, KBitLinear, switch  # noqa: E402
from gnmr.recovery import fp8_overflowed  # noqa: E402

DEFAULT_VARIANTS = ("fp", "high", "low", "gnmr", "random", "oracle",
                    "oracle_now", "rawnorm", "global", "nanonly",
                    "nanonly_random")
ALL_VARIANTS = DEFAULT_VARIANTS + ("gnmr_shadow",)
CONTROLLED = {"gnmr", "gnmr_shadow"}  # a real gnmrd chooses
# GNMR's share / per-step counts
NEEDS_GNMR = {"random", "rawnorm", "nanonly_random"}


class Block(torch.nn.Module):
    def __init__(self, d, heads, lin):
        super().__init__()
        self.h = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = lin(d, 3 * d), lin(d, d)
        self.fc1, self.fc2 = lin(d, 4 * d), lin(4 * d, d)

    def forward(self, x):
        B, T, D = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(D, dim=2)
        q, k, v = (t.view(B, T, self.h, D // self.h).transpose(1, 2)
                   for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(D // self.h)
        att = att.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool),
                                         1), float("-inf")).softmax(-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(B, T, D))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPT(torch.nn.Module):
    def __init__(self, lin, d=128, layers=2, heads=4, ctx=64):
        super().__init__()
        self.emb = torch.nn.Embedding(256, d)
        self.pos = torch.nn.Parameter(torch.zeros(1, ctx, d))
        self.blocks = torch.nn.ModuleList(Block(d, heads, lin)
                                          for _ in range(layers))
        self.ln = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, 256)

    def forward(self, idx):
        x = self.emb(idx) + self.pos[:, :idx.shape[1]]
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln(x))


def load_text():
    files = sorted(glob.glob("/usr/share/common-licenses/*"))
    data = bytearray()
    for f in files:
        if os.path.isfile(f):
            with open(f, "rb") as fh:
                data += fh.read()
    if len(data) < 100000:
        raise SystemExit("quant_stress: /usr/share/common-licenses has too "
                         "little text (is base-files installed?)")
    t = torch.tensor(list(data), dtype=torch.long)
    n = int(len(t) * 0.9)
    return t[:n], t[n:]


def batches(data, n, batch, ctx, gen):
    for _ in range(n):
        i = torch.randint(0, len(data) - ctx - 1, (batch,), generator=gen)
        yield (torch.stack([data[j:j + ctx] for j in i]),
               torch.stack([data[j + 1:j + ctx + 1] for j in i]))


def episode_schedule(units, steps, args, seed):
    """sched[t][u] = (token positions, scale) while u is in an episode."""
    rng = random.Random(seed * 7919 + 1)
    scales = args.episode_scales
    sched = [dict() for _ in range(steps + 1)]
    for u in range(units):
        t = 1
        while t <= steps:
            if rng.random() < args.episode_rate:
                idx = rng.sample(range(args.ctx), args.episode_tokens)
                for k, s in enumerate(scales):
                    if t + k <= steps:
                        sched[t + k][u] = (idx, s)
                t += len(scales)
            t += 1
    return sched


def make_linear(variant, args):
    if variant == "fp":
        return torch.nn.Linear
    if args.recipe == "fp8":
        return lambda i, o: FP8Linear(i, o, fmt="e4m3",
                                      history=args.amax_history,
                                      margin=args.margin,
                                      saturate=args.saturate)
    return lambda i, o: KBitLinear(i, o, low_bits=args.low_bits,
                                   high_bits=args.high_bits)


class ScalarPolicy:
    """GNMR's per-unit rule (docs/policy.md) for one scalar signal: returns
    whether the value at this step is risky."""

    def __init__(self, args):
        self.a, self.b, self.w = args.alpha, args.beta, args.window
        self.cnt, self.sum, self.win = 0, 0.0, []

    def risky(self, n):
        if n == 0:
            return False
        if not math.isfinite(n):
            return True
        s = 0.0
        if self.cnt:
            g = n / (self.sum / self.cnt)
            d = g / (sum(self.win) / len(self.win)) if self.win else 1.0
            s = max(g / self.a, d / self.b)
            self.win = (self.win + [g])[-self.w:]
        self.sum += n
        self.cnt += 1
        return s > 1


class Chooser:
    """The recovery set of the non-GNMR variants, decided before the
    forward of each step from what the variant may know."""

    def __init__(self, variant, n_units, args, seed, gnmr_rec):
        self.v, self.n, self.args = variant, n_units, args
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

    def after(self, step, damage, norms):
        """What the variant learns from step `step`: its damage flags
        (oracle) or gradient norms (rawnorm, global)."""
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


def unit_norm(m):
    s = 0.0
    for p in m.parameters():
        if p.grad is not None:
            s += float(p.grad.double().pow(2).sum())
    return math.sqrt(s)


def run(variant, seed, args, train, val, endpoint=None, gnmr_rec=None):
    torch.manual_seed(seed)
    model = GPT(make_linear(variant, args), args.d, args.layers, args.heads,
                args.ctx)
    names = [n for n, m in model.named_modules()
             if n.startswith("blocks.") and isinstance(m, torch.nn.Linear)]
    units = [model.get_submodule(n) for n in names]
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr,
                            betas=(0.9, args.beta2))
    # linear warm-up, then cosine decay to lr/10, as LLM recipes schedule
    # (a skipped step still advances the schedule, as with GradScaler)
    sched_lr = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: min(
        (i + 1) / args.lr_warmup, 0.1 + 0.45 * (1 + math.cos(
            math.pi * min(i, args.steps) / args.steps))))
    sched = episode_schedule(len(units), args.steps, args, seed)
    current = {}

    def inject(u):
        def hook(module, inputs):
            ep = current.get(u)
            if ep is None:
                return None
            x = inputs[0].clone()
            x[:, ep[0], :] *= ep[1]
            return (x,)
        return hook
    for u, m in enumerate(units):
        m.register_forward_pre_hook(inject(u))

    ctl = None
    if variant in CONTROLLED:
        shadow = None
        if variant == "gnmr_shadow":
            shadow = fp8_overflowed if args.recipe == "fp8" else (
                lambda name, m: m.low_error > args.damage_error)
        ctl = Controller(model, endpoint, f"stress-{seed}-{os.getpid()}",
                         select=(type(units[0]),), on_route=switch,
                         shadow=shadow,
                         params=gnmr.default_params(
                             alpha=args.alpha, beta=args.beta,
                             window=args.window,
                             max_active=args.max_active,
                             lock_steps=args.lock_steps,
                             warmup_steps=args.warmup))
        if [n for n, _ in ctl.units] != names:
            raise RuntimeError("the controller's units are not the model's")
    chooser = Chooser(variant, len(units), args, seed, gnmr_rec)
    gen = torch.Generator().manual_seed(seed)
    curve, t_steps, skipped = [], 0.0, 0
    active_log = [set()]          # active_log[t]: recovery set at step t
    rec_steps = damage_steps = hits = 0
    damage_log = [[False] * len(units)]  # damage_log[t][u]
    rules = [ScalarPolicy(args) for _ in units]  # GNMR's rule, per unit
    exceed = nonfinite = 0
    for step, (x, y) in enumerate(batches(train, args.steps, args.batch,
                                          args.ctx, gen), 1):
        t0 = time.perf_counter()
        current.clear()
        current.update(sched[step])
        probe = None
        if variant == "oracle_now":
            with torch.no_grad():
                model(x)          # records nothing: sees what the low path
            probe = [m.low_overflow if args.recipe == "fp8" else
                     (m.low_error > args.damage_error) for m in units]
        if ctl is None:
            active = chooser.before(step, probe)
            for u, m in enumerate(units):
                if variant != "fp":
                    m.recovery = u in active
        else:
            active = {u for u, m in enumerate(units) if m.recovery}
        active_log.append(active)
        loss = F.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        if variant == "fp":
            damage = [False] * len(units)
        elif args.recipe == "fp8":
            damage = [m.low_overflow > 0 for m in units]
        else:
            damage = [m.low_error > args.damage_error for m in units]
        damage_log.append(damage)
        rec_steps += len(active)
        damage_steps += sum(damage)
        hits += sum(damage[u] for u in active)
        if ctl is not None:
            if not ctl.step(step, wait_ms=30000):
                raise RuntimeError(f"gnmrd's decision for step {step} was "
                                   f"late: the run would not reproduce")
        norms = [unit_norm(m) for m in units]
        for u, n in enumerate(norms):
            risky = rules[u].risky(n)
            if step > args.warmup and risky:
                if math.isfinite(n):
                    exceed += 1
                else:
                    nonfinite += 1
        chooser.after(step, damage, norms)
        finite = all(bool(torch.isfinite(p.grad).all())
                     for p in model.parameters() if p.grad is not None)
        if finite or not args.skip_nonfinite:
            opt.step()
        else:
            skipped += 1
        sched_lr.step()
        t_steps += time.perf_counter() - t0
        if step % args.eval_every == 0 or step == args.steps:
            current.clear()   # measured clean: no episode while evaluating
            curve.append((step, evaluate(model, val, args)))
    if ctl is not None:
        ctl.close()
    unit_steps = len(units) * args.steps
    eligible = len(units) * max(1, args.steps - args.warmup)
    return {"val": curve[-1][1], "curve": curve,
            "exceed": exceed / eligible, "nonfinite": nonfinite / eligible,
            "share": rec_steps / unit_steps,
            "precision": hits / rec_steps if rec_steps else 0.0,
            "coverage": hits / damage_steps if damage_steps else 0.0,
            "damage": damage_steps / unit_steps,
            "skipped": skipped, "active": [sorted(a) for a in active_log],
            "misses": misses_by_cause(damage_log, active_log, args),
            "damage_steps": damage_steps,
            "step_ms": 1e3 * t_steps / args.steps}


MISS_CAUSES = ("warmup", "first", "gap", "hidden", "not_chosen")


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


def evaluate(model, val, args):
    gen = torch.Generator().manual_seed(0)
    model.eval()
    with torch.no_grad():
        losses = [float(F.cross_entropy(model(x).reshape(-1, 256),
                                        y.reshape(-1)))
                  for x, y in batches(val, args.eval_batches, args.batch,
                                      args.ctx, gen)]
    model.train()
    return sum(losses) / len(losses)


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


def paired(results, a, b):
    d = [x["val"] - y["val"] for x, y in zip(results[a], results[b])]
    se = statistics.stdev(d) / math.sqrt(len(d)) if len(d) > 1 else 0.0
    return {"mean": statistics.mean(d), "se": se, "per_seed": d}


COMPARISONS = [("low", "high"), ("oracle", "random"), ("gnmr", "random"),
               ("gnmr", "low"), ("oracle_now", "random"),
               ("rawnorm", "random"), ("global", "random"),
               ("gnmr", "rawnorm"), ("gnmr", "global"), ("gnmr", "oracle"),
               ("high", "fp"), ("nanonly", "low"),
               ("gnmr", "nanonly"), ("gnmr", "nanonly_random"),
               ("nanonly_random", "random"), ("gnmr_shadow", "gnmr"),
               ("gnmr_shadow", "random"), ("gnmr_shadow", "oracle")]


def summarise(results, args, seeds, argv, commit):
    cap = os.environ.get("ATEN_CPU_CAPABILITY")
    out = {"command": (f"ATEN_CPU_CAPABILITY={cap} " if cap else "") +
           "build/venv/bin/python examples/quant_stress.py " +
           " ".join(argv if argv is not None else sys.argv[1:]),
           "commit": commit, "seeds": seeds,
           "torch": torch.__version__, "machine": machine(),
           "settings": {k: v for k, v in sorted(vars(args).items())
                        if k not in ("json", "gnmrd_bin", "jobs")},
           "variants": {}, "paired": {}}
    for v, rs in results.items():
        out["variants"][v] = {
            "val": [round(r["val"], 6) for r in rs],
            "share": [round(r["share"], 6) for r in rs],
            "precision": [round(r["precision"], 6) for r in rs],
            "coverage": [round(r["coverage"], 6) for r in rs],
            "damage": [round(r["damage"], 6) for r in rs],
            "skipped": [r["skipped"] for r in rs],
            "exceed": [round(r["exceed"], 6) for r in rs],
            "nonfinite": [round(r["nonfinite"], 6) for r in rs],
            "damage_unit_steps": [r["damage_steps"] for r in rs],
            "misses_by_cause": {c: [r["misses"][c] for r in rs]
                                for c in MISS_CAUSES}}
    for a, b in COMPARISONS:
        if a in results and b in results:
            p = paired(results, a, b)
            out["paired"][f"{a}-{b}"] = {
                "mean": round(p["mean"], 6), "se": round(p["se"], 6),
                "t": round(p["mean"] / p["se"], 2) if p["se"] else None,
                "per_seed": [round(x, 6) for x in p["per_seed"]]}
    if all(v in results for v in ("gnmr", "random", "oracle")):
        g = -statistics.mean(out["paired"]["gnmr-random"]["per_seed"])
        o = -statistics.mean(out["paired"]["oracle-random"]["per_seed"])
        out["gnmr_gain_over_oracle_gain"] = round(g / o, 4) if o else None
    # the share of the low-high gap (of mean final losses) each closes
    if "low" in results and "high" in results:
        lo = statistics.mean(r["val"] for r in results["low"])
        gap = lo - statistics.mean(r["val"] for r in results["high"])
        out["gap_closed"] = {
            v: round((lo - statistics.mean(r["val"] for r in rs)) / gap, 4)
            for v, rs in results.items()
            if v not in ("low", "high", "fp")} if gap else {}
    return out


def machine():
    """What the numbers depend on beyond the command: the CPU, and the
    kernels OpenBLAS chose for it (another CPU gives other bits)."""
    cpu, core = "unknown", "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    import ctypes
    for name in ("libblas.so.3", "libopenblas.so.0"):
        try:
            fn = ctypes.CDLL(name).openblas_get_corename
            fn.restype = ctypes.c_char_p
            core = "OpenBLAS " + fn().decode()
            break
        except (OSError, AttributeError):
            continue
    return {"cpu": cpu, "cpus": os.cpu_count(), "blas": core}


def git_commit():
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], check=True,
                              capture_output=True, text=True,
                              cwd=os.path.dirname(os.path.abspath(__file__))
                              ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def table(summary):
    """The results as markdown."""
    var = summary["variants"]
    gap = summary.get("gap_closed", {})
    lines = ["| variant | final val loss (mean ± sd) | recovery share | "
             "exceed | nonfinite | precision | coverage | skipped steps | "
             "gap closed |",
             "|---|---|---|---|---|---|---|---|---|"]
    for v, r in var.items():
        sd = statistics.stdev(r["val"]) if len(r["val"]) > 1 else 0.0
        g = f"{gap[v]:+.2f}" if v in gap else "-"
        lines.append(
            f"| {v} | {statistics.mean(r['val']):.4f} ± {sd:.4f} | "
            f"{statistics.mean(r['share']):.3f} | "
            f"{statistics.mean(r['exceed']):.4f} | "
            f"{statistics.mean(r['nonfinite']):.4f} | "
            f"{statistics.mean(r['precision']):.2f} | "
            f"{statistics.mean(r['coverage']):.2f} | "
            f"{statistics.mean(r['skipped']):.1f} | {g} |")
    lines += ["", "Damage unit-steps not recovered, by cause, as a share of "
              "all damage unit-steps (mean over seeds; the module docstring "
              "defines the causes):", "",
              "| variant | coverage | " + " | ".join(MISS_CAUSES) + " |",
              "|---|---|" + "---|" * len(MISS_CAUSES)]
    for v, r in var.items():
        m, n = r.get("misses_by_cause"), r.get("damage_unit_steps")
        if m is None or n is None or 0 in n:
            continue
        shares = [statistics.mean(k / d for k, d in zip(m[c], n))
                  for c in MISS_CAUSES]
        lines.append(f"| {v} | {statistics.mean(r['coverage']):.2f} | " +
                     " | ".join(f"{x:.2f}" for x in shares) + " |")
    lines += ["", "Paired differences of final validation loss (negative: "
              "the first is better), mean ± standard error over seeds:", "",
              "| difference | mean ± se | mean/se | per seed |",
              "|---|---|---|---|"]
    for k, p in summary["paired"].items():
        t = "-" if p["t"] is None else f"{p['t']:+.1f}"
        lines.append(f"| {k} | {p['mean']:+.4f} ± {p['se']:.4f} | {t} | " +
                     " ".join(f"{x:+.4f}" for x in p["per_seed"]) + " |")
    lines += ["", "exceed: unit-steps after warm-up whose finite GNMR or "
              "Δ-GNMR crossed a threshold; nonfinite: those with a NaN/Inf "
              "norm (both as a share of the unit-steps after warm-up); gap "
              "closed: (low − variant) / (low − high) of the mean final "
              "losses. Validation loss is measured with no episode active."]
    if summary.get("gnmr_gain_over_oracle_gain") is not None:
        lines += ["", "GNMR's gain over random as a fraction of the lagged "
                  f"oracle's: {summary['gnmr_gain_over_oracle_gain']:.2f}"]
    return "\n".join(lines) + "\n"


def plot(results, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no plot: python3-matplotlib is not installed")
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    for v, rs in results.items():
        steps = [s for s, _ in rs[0]["curve"]]
        mean = [statistics.mean(r["curve"][i][1] for r in rs)
                for i in range(len(steps))]
        ax.plot(steps, mean, label=v)
    ax.set_xlabel("step")
    ax.set_ylabel("validation loss (mean over seeds)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, default=5,
                   help="seeds 1..N (default 5)")
    p.add_argument("--seed-list", default="",
                   help="comma-separated seeds, instead of --seeds")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--variants", default=",".join(DEFAULT_VARIANTS),
                   help=f"of {','.join(ALL_VARIANTS)} (default: all but "
                   "gnmr_shadow)")
    p.add_argument("--recipe", default="fp8", choices=("fp8", "int4"))
    p.add_argument("--d", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--ctx", type=int, default=64)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--lr-warmup", type=int, default=20)
    p.add_argument("--beta2", type=float, default=0.95,
                   help="AdamW's second-moment decay (LLM recipes use 0.95)")
    p.add_argument("--amax-history", type=int, default=16)
    p.add_argument("--margin", type=float, default=0.5)
    p.add_argument("--saturate", action="store_true",
                   help="saturating FP8 cast (clip to +-448) instead of NaN")
    p.add_argument("--low-bits", type=int, default=4)
    p.add_argument("--high-bits", type=int, default=8)
    p.add_argument("--damage-error", type=float, default=0.5,
                   help="int4: relative error of the saved copy that counts "
                   "as damage")
    p.add_argument("--episode-rate", type=float, default=0.015)
    p.add_argument("--episode-tokens", type=int, default=2)
    p.add_argument("--episode-scales", default="2,4,8,16,32",
                   help="the input scale of the episode tokens, step by step")
    p.add_argument("--no-skip-nonfinite", dest="skip_nonfinite",
                   action="store_false",
                   help="apply steps with non-finite gradients")
    p.add_argument("--alpha", type=float, default=2.0)
    p.add_argument("--beta", type=float, default=2.0)
    p.add_argument("--window", type=int, default=8)
    p.add_argument("--max-active", type=int, default=2)
    p.add_argument("--lock-steps", type=int, default=2)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--eval-batches", type=int, default=8)
    p.add_argument("--jobs", type=int, default=1,
                   help="seeds run in this many processes at once (each "
                   "single-threaded; the results do not change)")
    p.add_argument("--json", default="",
                   help="write the results here, and a .md table and a .png "
                   "plot beside it")
    p.add_argument("--plot", default="", help="loss curves (PNG)")
    p.add_argument("--gnmrd-bin", default=os.environ.get("GNMR_BIN_DIR",
                                                         "build/bin"))
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
    if not 0 < args.episode_tokens <= args.ctx:
        p.error("--episode-tokens must be in 1..--ctx")
    return args, seeds, variants


_TEXT = None


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


def run_task(seed, variant, args, rec=None):
    """One variant of one seed, single-threaded; the GNMR variant with a
    gnmrd of its own. rec: GNMR's result for the seed (random, rawnorm)."""
    global _TEXT
    torch.set_num_threads(1)
    _one_blas_thread()
    torch.use_deterministic_algorithms(True)
    if _TEXT is None:
        _TEXT = load_text()
    d = start_gnmrd(args.gnmrd_bin) if variant in CONTROLLED else None
    try:
        r = run(variant, seed, args, *_TEXT, d[2] if d else None, rec)
    finally:
        if d:
            d[0].send_signal(signal.SIGTERM)
            d[0].wait()
            d[0].stdout.close()
            shutil.rmtree(d[1], ignore_errors=True)
    print(f"seed {seed} {variant:10s} val {r['val']:.4f} "
          f"share {r['share']:.3f} prec {r['precision']:.2f} "
          f"cov {r['coverage']:.2f} skipped {r['skipped']:3d} "
          f"step {r['step_ms']:.1f} ms", flush=True)
    return r


def run_all(seeds, order, args):
    """{(seed, variant): result}. With --jobs N, N single-threaded
    processes take (seed, variant) runs as they come, GNMR's first (random
    and rawnorm wait for GNMR's run of their seed): the same numbers as one
    process running them in turn."""
    res = {}
    if args.jobs <= 1:
        for seed in seeds:
            for v in order:
                res[seed, v] = run_task(seed, v, args, res.get((seed,
                                                                "gnmr")))
        return res
    import concurrent.futures as cf
    import multiprocessing
    with cf.ProcessPoolExecutor(
            args.jobs, mp_context=multiprocessing.get_context("spawn")) as ex:
        pending = {}
        for seed in seeds:
            if "gnmr" in order:
                pending[ex.submit(run_task, seed, "gnmr", args)] = (seed,
                                                                    "gnmr")
        for seed in seeds:
            for v in order:
                if v != "gnmr" and v not in NEEDS_GNMR:
                    pending[ex.submit(run_task, seed, v, args)] = (seed, v)
        while pending:
            done, _ = cf.wait(pending, return_when=cf.FIRST_COMPLETED)
            for f in done:
                seed, v = pending.pop(f)
                res[seed, v] = f.result()
                if v == "gnmr":
                    for w in order:
                        if w in NEEDS_GNMR:
                            pending[ex.submit(run_task, seed, w, args,
                                              res[seed, v])] = (seed, w)
    return res


def main(argv=None):
    args, seeds, variants = parse_args(argv)
    order = (["gnmr"] if "gnmr" in variants or NEEDS_GNMR & set(variants)
             else []) + [v for v in variants if v != "gnmr"]
    commit = git_commit()  # the code that runs, not what HEAD is at the end
    res = run_all(seeds, order, args)
    results = {v: [res[s, v] for s in seeds] for v in order}
    results = {v: results[v] for v in ALL_VARIANTS if v in results}
    summary = summarise(results, args, seeds, argv, commit)
    print()
    print(table(summary))
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
            f.write(table(summary))
        plot(results, base + ".png")
        print(f"wrote {args.json}, {base}.md, {base}.png")
    if args.plot:
        plot(results, args.plot)
    return results


if __name__ == "__main__":
    main()
