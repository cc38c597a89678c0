# SPDX-License-Identifier: MIT
"""bench/compile_routes.py — what GNMR's switchable linears cost a model
under torch.compile (issue 48, item 6): graph breaks and recompiles per
100 steps while the routes change every step, and the compiled step time
against the same model compiled without GNMR (plain nn.Linear), both
measured in this process, alternating, on a small Llama from a config.

    build/venv/bin/python bench/compile_routes.py [--steps N] [--device D]

Six models of the same weights and batches, stepped in turn: `plain`
(nn.Linear, the floor), `fp8` (every q/k/v/o and gate/up/down an
FP8Linear, routes drawn at random each step, as gnmrd's decisions would
switch them) and `torchao` (the same projections as torchao's float8
training linears, switchable, emulated on a CPU), each compiled and
eager. Printed: the graph breaks of each
compiled model (dynamo's counter while it compiles at its first step;
every step then runs through each of them) and the graphs compiled in
the timed steps, after 3 warm ones (a route change that recompiled would
add some), the median compiled step
of fp8 against plain (a ratio: the limit is the plain model's time in
the same run), and each model's eager step against its compiled one.
Nothing here talks to gnmrd: the routes are what it would send. On a
GPU (`--device cuda`, scripts/gpu_check.sh) the models are there, each
step's time taken between two synchronisations, torchao's GEMMs real
float8 (where torchao is installed; else its two models are left out).
"""
import argparse
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
import torch  # noqa: E402
import torch._dynamo  # noqa: E402
import transformers  # noqa: E402

from gnmr.recovery import (FP8Linear, convert, switch,  # noqa: E402
                           torchao_float8)


def model(seed):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(
        vocab_size=256, hidden_size=128, intermediate_size=256,
        num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=64)
    return transformers.LlamaForCausalLM(cfg)


def step(m, opt, x, sync):
    m(input_ids=x, labels=x).loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=False)
    sync()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--device", default="cpu",
                   help="cpu (default) or cuda")
    args = p.parse_args()
    if args.steps < 10:
        p.error("--steps: at least 10")
    if args.device not in ("cpu", "cuda"):
        p.error(f"--device: cpu or cuda, not {args.device!r}")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: torch sees no GPU")
    dev = torch.device(args.device)
    if dev.type == "cpu":
        torch.set_num_threads(1)
        sync = lambda: None  # noqa: E731
    else:
        sync = torch.cuda.synchronize
    try:
        import torchao.float8  # noqa: F401
        kinds = ("plain", "fp8", "torchao")
    except ImportError:
        print("compile_routes: torchao not installed: its models left out")
        kinds = ("plain", "fp8")
    models = {k: model(0).to(dev) for k in kinds}
    models.update({k + " eager": model(0).to(dev) for k in kinds})
    units = convert(models["fp8"], FP8Linear, pattern=r"layers\.")
    convert(models["fp8 eager"], FP8Linear, pattern=r"layers\.")
    if "torchao" in kinds:
        torchao_float8(models["torchao"], pattern=r"layers\.")
        torchao_float8(models["torchao eager"], pattern=r"layers\.")
    switched = [m for k, m in models.items() if not k.startswith("plain")]
    mods = [m.get_submodule(n) for n in units for m in switched]
    runs = {k: m if k.endswith("eager") else torch.compile(m)
            for k, m in models.items()}
    opts = {k: torch.optim.AdamW(m.parameters(), lr=1e-4)
            for k, m in models.items()}
    rng = random.Random(1)
    g = torch.Generator().manual_seed(2)
    batches = [torch.randint(0, 256, (8, 64), generator=g).to(dev)
               for _ in range(args.steps + 3)]
    # the first steps compile, one model at a time: their graph breaks
    # and graphs counted, not timed
    made = {}
    c = torch._dynamo.utils.counters
    for key in kinds:
        c.clear()
        step(runs[key], opts[key], batches[0], sync)
        made[key] = (sum(c["graph_break"].values()),
                     c["stats"].get("unique_graphs", 0))

    def turn(x, timed=None):
        high = [rng.random() < 0.2 for _ in units]  # gnmrd's routes
        for i, m in enumerate(mods):  # the same route in every model
            switch("", m, high[i // len(switched)])
        for key, m in runs.items():
            t0 = time.perf_counter()
            step(m, opts[key], x, sync)
            if timed is not None:
                timed[key].append(time.perf_counter() - t0)
    # two untimed turns: the two compiled models share transformers' code
    # objects, whose resumed frames dynamo compiles once for each
    for x in batches[1:3]:
        turn(x)
    c.clear()
    times = {k: [] for k in runs}
    for x in batches[3:]:
        turn(x, times)
    later = c["stats"].get("unique_graphs", 0)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    print(f"compile_routes: torch {torch.__version__} on {args.device}, "
          f"{len(units)} switchable linears, {args.steps} steps, routes "
          f"drawn each step")
    for key in kinds:
        print(f"{key}: {made[key][0]} graph breaks in the compiled model "
              f"({100 * made[key][0]} per 100 steps), {made[key][1]} graphs "
              f"compiled at its first step")
    print(f"graphs compiled in the {args.steps} steps after them (route "
          f"changes recompiling): {later}")
    print(f"compiled step: plain {med['plain']:.2f} ms, fp8 "
          f"{med['fp8']:.2f} ms: {med['fp8'] / med['plain']:.2f}x the plain "
          f"model (limit 1.00x)")
    if "torchao" in kinds:
        print(f"compiled step: torchao {med['torchao']:.2f} ms: "
              f"{med['torchao'] / med['plain']:.2f}x the plain model "
              f"(float8 GEMMs emulated where there is no GPU)")
    for key in kinds:
        e = med[key + " eager"]
        print(f"eager step: {key} {e:.2f} ms ({e / med[key]:.2f}x its "
              f"compiled: what compiling gains it)")

if __name__ == "__main__":
    main()
