# SPDX-License-Identifier: MIT
"""bench/compile_routes.py — what GNMR's switchable linears cost a model
under torch.compile (issue 48, item 6): graph breaks and recompiles per
100 steps while the routes change every step, and the compiled step time
against the same model compiled without GNMR (plain nn.Linear), both
measured in this process, alternating, on a small Llama from a config.

    build/venv/bin/python bench/compile_routes.py [--steps N]

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
Nothing here talks to gnmrd: the routes are what it would send.
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


def step(m, opt, x):
    m(input_ids=x, labels=x).loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=False)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=100)
    args = p.parse_args()
    if args.steps < 10:
        p.error("--steps: at least 10")
    torch.set_num_threads(1)
    plain, plain_eager, fp8, eager = model(0), model(0), model(0), model(0)
    ao, ao_eager = model(0), model(0)
    units = convert(fp8, FP8Linear, pattern=r"layers\.")
    convert(eager, FP8Linear, pattern=r"layers\.")
    torchao_float8(ao, pattern=r"layers\.")
    torchao_float8(ao_eager, pattern=r"layers\.")
    mods = [m.get_submodule(n) for n in units
            for m in (fp8, eager, ao, ao_eager)]
    runs = {"plain": torch.compile(plain), "plain eager": plain_eager,
            "fp8": torch.compile(fp8), "fp8 eager": eager,
            "torchao": torch.compile(ao), "torchao eager": ao_eager}
    opts = {"plain": plain, "plain eager": plain_eager, "fp8": fp8,
            "fp8 eager": eager, "torchao": ao, "torchao eager": ao_eager}
    opts = {k: torch.optim.AdamW(m.parameters(), lr=1e-4)
            for k, m in opts.items()}
    rng = random.Random(1)
    g = torch.Generator().manual_seed(2)
    batches = [torch.randint(0, 256, (8, 64), generator=g)
               for _ in range(args.steps + 3)]
    # the first steps compile, one model at a time: their graph breaks
    # and graphs counted, not timed
    made = {}
    c = torch._dynamo.utils.counters
    for key in ("plain", "fp8", "torchao"):
        c.clear()
        step(runs[key], opts[key], batches[0])
        made[key] = (sum(c["graph_break"].values()),
                     c["stats"].get("unique_graphs", 0))

    def turn(x, timed=None):
        high = [rng.random() < 0.2 for _ in units]  # gnmrd's routes
        for i, m in enumerate(mods):  # the same route in the four models
            switch("", m, high[i // 4])
        for key, m in runs.items():
            t0 = time.perf_counter()
            step(m, opts[key], x)
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
    print(f"compile_routes: torch {torch.__version__}, {len(units)} "
          f"switchable linears, {args.steps} steps, routes drawn each step")
    for key in ("plain", "fp8", "torchao"):
        print(f"{key}: {made[key][0]} graph breaks in the compiled model "
              f"({100 * made[key][0]} per 100 steps), {made[key][1]} graphs "
              f"compiled at its first step")
    print(f"graphs compiled in the {args.steps} steps after them (route "
          f"changes recompiling): {later}")
    print(f"compiled step: plain {med['plain']:.2f} ms, fp8 "
          f"{med['fp8']:.2f} ms: {med['fp8'] / med['plain']:.2f}x the plain "
          f"model (limit 1.00x)")
    print(f"compiled step: torchao {med['torchao']:.2f} ms: "
          f"{med['torchao'] / med['plain']:.2f}x the plain model (float8 "
          f"GEMMs emulated where there is no GPU)")
    for key in ("plain", "fp8", "torchao"):
        e = med[key + " eager"]
        print(f"eager step: {key} {e:.2f} ms ({e / med[key]:.2f}x its "
              f"compiled: what compiling gains it)")

if __name__ == "__main__":
    main()
