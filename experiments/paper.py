# SPDX-License-Identifier: MIT
"""The GNMR paper's three settings in miniature, on a Llama (or Mixtral,
experts as units) from `transformers` built from a config, byte-level,
trained on the CPU on the licence texts every Debian system ships
(/usr/share/common-licenses), with a real gnmrd and the package's
recovery paths (gnmr.quant.QuantLinear). docs/experiments.md has the
results and what they show.

    experiments/paper.py --setting act4|fp8|lora [harness options]

Settings (every projection of every layer is a unit, an expert is one
unit in Mixtral; the router stays exact):

  act4   activation-compressed training: each projection's input saved
         for backward as 4-bit integers with one scale per group of 32
         features of each token (int4-g32) on the low path, 8 bits
         (int8-g32) on the recovery path; the forward is exact.
  fp8    a DeepSeek-V3-style fine-grained low-precision recipe: the
         projections' activations in 1x128 tiles and their weights in
         128x128 blocks, each with its own scale, saturating, in the
         forward GEMM and in backward; the low path in a 6-bit float
         (--low e2m3-tile, or e3m2-tile), the recovery path in FP8 E4M3
         (--high e4m3-tile, or bf16). Mixtral by default (4 experts, top
         2): experts are units.
  lora   LoRA fine-tuning with peft: a base Llama pre-trained here first
         (exact, --base-steps steps, cached under build/experiments and
         regenerated when missing) on every licence but the held-out
         ones, then adapters (rank --lora-rank on every projection)
         trained on a held-out licence text while the frozen base
         computes in INT8 (LLM.int8's vector-wise int8 without its
         outlier split, int8-row) on the low path and bfloat16 on the
         recovery path; units are the adapted projections. Task figure:
         next-byte top-1 accuracy on the held-out text's test split.

The stress (the same in every setting, stated so): transient outlier
features. Each unit enters, with probability --episode-rate per step, an
episode in which --episode-tokens of its input features (channels, for
every token) grow by --episode-scales over a few steps, as the emergent
outlier features of LLM activations (LLM.int8) do; natural activations
of a model this small have none. An outlier feature spoils the scale of
its group (act4), tile (fp8) or row (lora) on the low path, so the
neighbouring features lose their precision: local in cause (that unit),
transient. Damage (measured on either path): the low path's copy of a
unit's input had a mean per-feature relative error above
--damage-error (QuantLinear.low_error).

Variants, figures and the runner: experiments/harness.py. `fp` is the
model without quantization (exact linears).
"""
import hashlib
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import corpus  # noqa: E402
import harness  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from gnmr.quant import QuantLinear  # noqa: E402
from gnmr.recovery import convert  # noqa: E402

VOCAB = 256
HELD_OUT = ("Apache-2.0", "MPL-2.0")   # the lora setting's task text
PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
        "down_proj")
DEFAULTS = {
    "act4": dict(model="llama", low="int4-g32", high="int8-g32",
                 damage_error=0.3),
    "fp8": dict(model="mixtral", low="e2m3-tile", high="e4m3-tile",
                damage_error=0.1),
    "lora": dict(model="llama", low="int8-row", high="bf16",
                 damage_error=0.05),
    # 4-bit pre-training: every linear NVFP4 in all three GEMMs on the low
    # path, BF16 on the recovery path; a deeper model (2.75M parameters:
    # NVIDIA's static choice keeps its last block, 7 of 42 units, in BF16)
    # on the licence texts; no stress unless asked (--episode-rate): the
    # harm is FP4's own. Damage: the low recipe's output error.
    "fp4": dict(model="llama", low="nvfp4", high="bf16", damage_error=0.2,
                damage_measure="out", d=192, ffn=512, layers=6, heads=6),
}


read_licences = harness.read_licences
batches = harness.batches


def split(data, what):
    return harness.split_text(
        data, 20000, f"paper.py: /usr/share/common-licenses has too little "
        f"{what} (is base-files installed?)")


def make_model(args, seed):
    import transformers
    torch.manual_seed(seed)
    common = dict(vocab_size=VOCAB, hidden_size=args.d,
                  intermediate_size=args.ffn, num_hidden_layers=args.layers,
                  num_attention_heads=args.heads,
                  num_key_value_heads=args.heads,
                  max_position_embeddings=args.ctx, tie_word_embeddings=False,
                  attn_implementation="eager")
    if args.model == "mixtral":
        cfg = transformers.MixtralConfig(num_local_experts=args.experts,
                                         num_experts_per_tok=2,
                                         router_jitter_noise=0.0, **common)
        return transformers.MixtralForCausalLM(cfg)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))


class Expert(torch.nn.Module):
    """One expert of a Mixtral layer as its own module (a unit): its
    gate/up and down projections as linears."""

    def __init__(self, gate_up, down, act, lin):
        super().__init__()
        self.gate_up = lin(gate_up.shape[1], gate_up.shape[0])
        self.down = lin(down.shape[1], down.shape[0])
        with torch.no_grad():
            self.gate_up.weight.copy_(gate_up)
            self.down.weight.copy_(down)
        self.act = act

    def forward(self, x):
        g, u = self.gate_up(x).chunk(2, dim=-1)
        return self.down(self.act(g) * u)


class SplitExperts(torch.nn.Module):
    """transformers' MixtralExperts (fused 3-D weights) as a list of
    Expert modules, the same routing arithmetic."""

    def __init__(self, fused, lin):
        super().__init__()
        self.num_experts = fused.num_experts
        self.experts = torch.nn.ModuleList(
            Expert(fused.gate_up_proj[e].detach(),
                   fused.down_proj[e].detach(), fused.act_fn, lin)
            for e in range(fused.num_experts))

    def forward(self, hidden, top_k_index, top_k_weights):
        out = torch.zeros_like(hidden)
        for e, expert in enumerate(self.experts):
            tok, pos = torch.where(top_k_index == e)
            if tok.numel() == 0:
                continue
            y = expert(hidden[tok]) * top_k_weights[tok, pos, None]
            out.index_add_(0, tok, y.to(out.dtype))
        return out


def _lin(variant, args):
    def plain(i, o):
        return torch.nn.Linear(i, o, bias=False)
    if variant == "fp":
        return plain
    return lambda i, o: QuantLinear(i, o, bias=False, low=args.low,
                                    high=args.high)


def _quantized(m):
    return [q for q in m.modules() if isinstance(q, QuantLinear)]


def track(model, args):
    """The quantized linears measure the damage --damage-measure names."""
    for q in _quantized(model):
        q.track_grad_error = args.damage_measure == "grad"
        q.track_out_error = args.damage_measure == "out"


class Paper(harness.Setting):
    episode_kind = "channels"
    script = "experiments/paper.py"
    job = "paper"

    def __init__(self, name):
        self.name = name

    def add_args(self, p):
        d = DEFAULTS[self.name]
        p.add_argument("--setting", required=True, choices=tuple(DEFAULTS))
        p.add_argument("--model", default=d["model"],
                       choices=("llama", "mixtral"))
        p.add_argument("--low", default=d["low"],
                       help="the low path's recipe (gnmr.quant)")
        p.add_argument("--high", default=d["high"],
                       help="the recovery path's recipe (gnmr.quant)")
        p.add_argument("--damage-error", type=float,
                       default=d["damage_error"],
                       help="a unit-step is damaged when its --damage-measure "
                       "is above this")
        p.add_argument("--damage-measure", choices=("act", "out", "grad"),
                       default=d.get("damage_measure", "act"),
                       help="act: the low path's copy of the unit's input, "
                       "its mean per-feature relative error "
                       "(QuantLinear.low_error, what the measured variants "
                       "read); out: the relative error of the low recipe's "
                       "output against the exact product "
                       "(QuantLinear.out_error); grad: that of the weight "
                       "gradient the low recipe computes against the exact "
                       "product of the same operands (QuantLinear.grad_error; "
                       "nvfp4 and mxfp4 only). out and grad are measures no "
                       "variant's signal reads")
        p.add_argument("--d", type=int, default=d.get("d", 128))
        p.add_argument("--ffn", type=int, default=d.get("ffn", 256))
        p.add_argument("--layers", type=int, default=d.get("layers", 2))
        p.add_argument("--heads", type=int, default=d.get("heads", 4))
        p.add_argument("--experts", type=int, default=4)
        p.add_argument("--ctx", type=int, default=64)
        p.add_argument("--base-steps", type=int, default=600,
                       help="lora: the base model's pre-training steps")
        p.add_argument("--lora-rank", type=int, default=8)
        p.add_argument("--corpus", choices=("licences", "stdlib"),
                       default=d.get("corpus", "licences"),
                       help="the text: the licences Debian ships "
                       "(default), or the Python standard library's sources "
                       "(experiments/corpus.py: the GPU machine's text)")
        p.add_argument("--corpus-mb", type=float, default=64.0,
                       help="--corpus stdlib: at most this many MiB")
        p.add_argument("--keep-high", default=None, metavar="REGEX",
                       help="a mixed recipe: the projections whose names "
                       "match run the recovery path's recipe always, and "
                       "are not units (a recipe's static choice for inputs "
                       "it knows are damaged persistently)")

    def check_args(self, p, args):
        from gnmr.quant import Recipe
        for r in (args.low, args.high):
            try:
                Recipe(r)
            except ValueError as e:
                p.error(str(e))
        if args.damage_measure == "grad" and Recipe(args.low).rows is None:
            p.error(f"--damage-measure grad: the low recipe {args.low!r} "
                    "does not quantize the weight gradient (nvfp4, mxfp4)")
        if args.setting == "lora" and args.model != "llama":
            p.error("--setting lora trains a Llama (--model llama)")
        if args.corpus == "stdlib":
            if args.setting == "lora":
                p.error("--corpus stdlib: the lora setting's task is a "
                        "held-out licence text")
            try:  # what the data is, recorded with the results
                args.corpus_info = corpus.stdlib_corpus(args.corpus_mb)[1]
            except ValueError as e:
                p.error(f"--corpus-mb: {e}")
        if args.keep_high is not None:
            try:
                re.compile(args.keep_high)
            except re.error as e:
                p.error(f"--keep-high {args.keep_high!r}: {e}")
            if args.setting == "lora":
                p.error("--keep-high: the lora setting's units are its "
                        "adapters (not a recipe's projections)")

    def data_key(self, args):
        return (args.setting, args.model, args.d, args.ffn, args.layers,
                args.heads, args.ctx, args.base_steps, args.corpus,
                args.corpus_mb)

    def load(self, args):
        if args.corpus == "stdlib":
            data, info = corpus.stdlib_corpus(args.corpus_mb)
            if info != args.corpus_info:  # read twice: the same bytes
                raise RuntimeError(f"the corpus changed: {info}")
            return harness.split_text(data, 20000, "paper.py: too little "
                                      "text in the standard library")
        if self.name != "lora":
            return split(read_licences(), "text")
        base = split(read_licences(exclude=HELD_OUT), "text")
        task = split(read_licences(names=HELD_OUT), "held-out text")
        return {"base": base, "task": task,
                "weights": pretrained_base(args, base)}

    def build(self, variant, seed, args, data):
        if self.name == "lora":
            return self._build_lora(variant, seed, args, data)
        model = make_model(args, seed)
        lin = _lin(variant, args)
        if args.model == "mixtral":
            for layer in model.model.layers:
                layer.mlp.experts = SplitExperts(layer.mlp.experts, lin)
        keep = re.compile(args.keep_high) if args.keep_high else None
        if variant != "fp":
            done = convert(model, QuantLinear,
                           pattern=r"self_attn|mlp\.(gate|up|down)_proj",
                           low=args.low, high=args.high)
            for n in done:
                if keep and keep.search(n):
                    # the recipe's static choice: the recovery path's
                    # recipe on both paths, so no route changes it
                    convert(model, QuantLinear, select=(QuantLinear,),
                            pattern=rf"^{re.escape(n)}$", low=args.high,
                            high=args.high)
        kinds = (Expert, QuantLinear, torch.nn.Linear)
        names = [n for n, m in model.named_modules()
                 if (isinstance(m, Expert) or
                     (isinstance(m, kinds[1:]) and n.rsplit(".", 1)[-1]
                      in PROJ)) and not (keep and keep.search(n))]
        if not names:
            raise ValueError(f"--keep-high {args.keep_high!r} leaves no "
                             f"unit")
        units = [model.get_submodule(n) for n in names]
        track(model, args)
        select = tuple({type(m) for m in units})
        return harness.Built(model, names, units, list(model.parameters()),
                             select, _switch, pattern=keep and
                             rf"^(?!.*(?:{args.keep_high}))")

    def _build_lora(self, variant, seed, args, data):
        import peft
        model = make_model(args, 0)
        model.load_state_dict(data["weights"])
        if variant != "fp":
            convert(model, QuantLinear, pattern=r"_proj$", low=args.low,
                    high=args.high)
        torch.manual_seed(seed)
        model = peft.get_peft_model(model, peft.LoraConfig(
            r=args.lora_rank, lora_alpha=2 * args.lora_rank,
            lora_dropout=0.0, target_modules=list(PROJ)))
        track(model, args)
        lora_cls = peft.tuners.lora.Linear
        names = [n for n, m in model.named_modules()
                 if isinstance(m, lora_cls)]
        units = [model.get_submodule(n) for n in names]
        params = [p for p in model.parameters() if p.requires_grad]
        return harness.Built(model, names, units, params, (lora_cls,),
                             _switch)

    def widths(self, built, args):
        out = []
        for m in built.inject:
            lin = next((q for q in m.modules()
                        if isinstance(q, torch.nn.Linear)), None)
            out.append(lin.in_features)
        return out

    def batches(self, data, args, gen):
        d = data["task"] if self.name == "lora" else data
        return batches(d[0], args.steps, args.batch, args.ctx, gen)

    def loss(self, model, x, y):
        return F.cross_entropy(model(input_ids=x).logits.reshape(-1, VOCAB),
                               y.reshape(-1))

    def reset(self, units):
        for m in units:
            for q in _quantized(m):
                q._err = 0.0
                q.grad_error = q.out_error = 0.0

    def _errors(self, units, args):
        key = {"grad": "grad_error", "out": "out_error"}.get(
            args.damage_measure, "low_error")
        return [max((getattr(q, key) for q in _quantized(m)), default=0.0)
                for m in units]

    def damage(self, units, args):
        return [e > args.damage_error for e in self._errors(units, args)]

    def damage_values(self, units, args):
        return self._errors(units, args)

    def measures(self, units, args):
        return [max((q.low_error for q in _quantized(m)), default=0.0)
                for m in units]

    def probe(self, units, args):
        return [e if e > args.damage_error else 0.0
                for e in self._errors(units, args)]

    def set_route(self, unit, high):
        _switch("", unit, high)

    def set_latent(self, built, current):
        for u, m in enumerate(built.inject):
            ep = current.get(u)
            for q in _quantized(m):
                q.latent = None if ep is None else (ep[0], ep[1])

    def on_recovery(self, unit):
        return any(q.recovery for q in _quantized(unit))

    def evaluate(self, model, data, args):
        d = data["task"] if self.name == "lora" else data
        gen = torch.Generator().manual_seed(0)
        model.eval()
        losses, right, total = [], 0, 0
        dev = next(model.parameters()).device
        with torch.no_grad():
            for x, y in batches(d[1], args.eval_batches, args.batch,
                                args.ctx, gen):
                x, y = x.to(dev), y.to(dev)
                logits = model(input_ids=x).logits
                losses.append(float(F.cross_entropy(
                    logits.reshape(-1, VOCAB), y.reshape(-1))))
                right += int((logits.argmax(-1) == y).sum())
                total += y.numel()
        model.train()
        out = {"val": sum(losses) / len(losses)}
        if self.name == "lora":
            out["acc"] = right / total
        return out

    def extra_figures(self):
        return [("acc", "task accuracy", True)] if self.name == "lora" \
            else []


def _switch(name, module, high):
    """on_route: every quantized linear inside the unit takes the path."""
    for q in _quantized(module):
        q.recovery = bool(high)


def pretrained_base(args, base):
    """The lora setting's base model: exact training on the base text,
    seed 0, cached by its configuration (regenerated when missing)."""
    key = hashlib.sha256(repr(("v1", args.d, args.ffn, args.layers,
                               args.heads, args.ctx, args.base_steps,
                               args.batch)).encode()).hexdigest()[:16]
    cache = os.path.join(harness.ROOT, "build", "experiments",
                         f"lora_base_{key}.pt")
    if os.path.exists(cache):
        return torch.load(cache)
    model = make_model(args, 0)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95))
    n = args.base_steps
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: min(
        (i + 1) / 20, 1.0 - 0.9 * i / n))
    gen = torch.Generator().manual_seed(0)
    for x, y in batches(base[0], n, args.batch, args.ctx, gen):
        loss = F.cross_entropy(model(input_ids=x).logits.reshape(-1, VOCAB),
                               y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    os.makedirs(os.path.dirname(cache), exist_ok=True)
    state = model.state_dict()
    torch.save(state, cache + ".tmp")
    os.replace(cache + ".tmp", cache)
    return state


def defaults_for(name):
    """The harness defaults a setting changes."""
    d = {"lora": dict(lr=2e-3, steps=300),
         "fp4": dict(steps=600, batch=16, episode_rate=0.0)}.get(name, {})
    d.setdefault("episode_scales", "4,8,16,32,64")
    d.setdefault("clip", 1.0)   # as LLM recipes clip
    return d


def main(argv=None):
    import argparse
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--setting", choices=tuple(DEFAULTS))
    known, _ = pre.parse_known_args(argv)
    if known.setting is None:
        known.setting = "act4"   # --help, or the error that names it
    setting = Paper(known.setting)
    return harness.main(setting, argv, defaults_for(known.setting),
                        doc=__doc__)


if __name__ == "__main__":
    main()
