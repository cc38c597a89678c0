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

Variants, measures (precision, coverage, misses by cause, exceedance)
and the runner: experiments/harness.py. gnmr_shadow (not in the default
variants) holds a unit on its recovery path whose low path would have
been damaged at the step: gnmr.recovery.fp8_overflowed, or the int4
error above --damage-error.

Damage (measured, on either path): the low path's copy of a unit's input
at step t had elements out of the FP8 range (fp8), or a relative error
above --damage-error (int4).

--json writes the results (command, commit, seeds, per-variant per-seed
values, paired differences with standard errors), and a markdown table
and plot beside it. Everything is single-threaded and seeded: the same
command gives the same numbers on the same machine.
"""
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import ALL_VARIANTS, DEFAULT_VARIANTS, MISS_CAUSES  # noqa
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from gnmr.recovery import FP8Linear, KBitLinear, switch  # noqa: E402

__all__ = ["ALL_VARIANTS", "DEFAULT_VARIANTS", "MISS_CAUSES", "main",
           "misses_by_cause", "parse_args"]


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
    return harness.split_text(
        harness.read_licences(), 100000,
        "stress.py: /usr/share/common-licenses has too little text (is "
        "base-files installed?)")


batches = harness.batches


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


class Stress(harness.Setting):
    """The GPT of this file, its FP8 (or int4) activation storage, and
    token episodes (the module doc)."""
    name = "stress"
    script = "experiments/stress.py"

    def add_args(self, p):
        p.add_argument("--recipe", default="fp8", choices=("fp8", "int4"))
        p.add_argument("--d", type=int, default=128)
        p.add_argument("--layers", type=int, default=2)
        p.add_argument("--heads", type=int, default=4)
        p.add_argument("--ctx", type=int, default=64)
        p.add_argument("--amax-history", type=int, default=16)
        p.add_argument("--margin", type=float, default=0.5)
        p.add_argument("--saturate", action="store_true",
                       help="saturating FP8 cast (clip to +-448) instead of "
                       "NaN")
        p.add_argument("--low-bits", type=int, default=4)
        p.add_argument("--high-bits", type=int, default=8)
        p.add_argument("--damage-error", type=float, default=0.5,
                       help="int4: relative error of the saved copy that "
                       "counts as damage")

    def check_args(self, p, args):
        if not 0 < args.episode_tokens <= args.ctx:
            p.error("--episode-tokens must be in 1..--ctx")

    def load(self, args):
        return load_text()

    def build(self, variant, seed, args, data):
        model = GPT(make_linear(variant, args), args.d, args.layers,
                    args.heads, args.ctx)
        names = [n for n, m in model.named_modules()
                 if n.startswith("blocks.") and
                 isinstance(m, torch.nn.Linear)]
        units = [model.get_submodule(n) for n in names]
        return harness.Built(model, names, units, list(model.parameters()),
                             (type(units[0]),), switch)

    def batches(self, data, args, gen):
        return batches(data[0], args.steps, args.batch, args.ctx, gen)

    def loss(self, model, x, y):
        return F.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1))

    def damage(self, units, args):
        if args.recipe == "fp8":
            return [m.low_overflow > 0 for m in units]
        return [m.low_error > args.damage_error for m in units]

    def probe(self, units, args):
        if args.recipe == "fp8":
            return [m.low_overflow for m in units]
        return self.damage(units, args)

    def evaluate(self, model, data, args):
        return {"val": evaluate(model, data[1], args)}


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


def parse_args(argv):
    """(args, seeds, variants) of this script's command line."""
    return harness.parse_args(Stress(), argv, doc=__doc__)


misses_by_cause = harness.misses_by_cause


def main(argv=None):
    return harness.main(Stress(), argv, doc=__doc__)


if __name__ == "__main__":
    main()
