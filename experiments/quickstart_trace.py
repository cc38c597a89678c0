# SPDX-License-Identifier: MIT
"""The README quickstart's model trained clean, without GNMR, its
per-unit gradient norms written as a trace (docs/policy.md's format):
the clean-training evidence for the policy's defaults
(experiments/defaults.py reads it).

    experiments/quickstart_trace.py --seed 1 --steps 1100 -o TRACE

The model, data and optimizer are the README's "own loop" snippet's (a
2-layer Llama of width 64 from a config, random tokens, AdamW 1e-3,
batches of 4 x 32), plain nn.Linear (no low-precision path: nothing to
recover), and its units the controller's default: every nn.Linear but
the output head, in module order.
"""
import argparse
import math
import os
import sys

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import unit_norm, write_trace  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--steps", type=int, default=1100)
    p.add_argument("-o", "--output", required=True)
    a = p.parse_args(argv)
    if a.steps < 1 or a.seed < 0:
        p.error("--steps must be >= 1 and --seed >= 0")
    import transformers
    torch.set_num_threads(1)
    torch.manual_seed(a.seed)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4))
    names = [n for n, m in model.named_modules()
             if isinstance(m, torch.nn.Linear) and n != "lm_head"]
    units = [model.get_submodule(n) for n in names]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    rows = []
    for step in range(1, a.steps + 1):
        x = torch.randint(0, 128, (4, 32))
        model(input_ids=x, labels=x).loss.backward()
        for u, m in enumerate(units):
            n = unit_norm(m)
            if not math.isfinite(n):
                raise SystemExit(f"step {step}: {names[u]} non-finite")
            rows.append((step, u, n))
        opt.step()
        opt.zero_grad()
    write_trace(a.output, rows, names)
    print(f"wrote {a.output}: {a.steps} steps, {len(units)} units")


if __name__ == "__main__":
    main()
