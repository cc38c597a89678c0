#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The README's Python snippet, whole: a small model trained for 30 steps
with GNMR attached. Start gnmrd first (`build/bin/gnmrd`, in another
terminal: it listens where this looks by default), then:

    GNMR_AGENT_LIB=build/lib/libgnmr-agent.so build/venv/bin/python examples/quickstart.py

It prints each step's routes and the units gnmrd put on the recovery path.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))

import torch  # noqa: E402

from gnmr import default_params  # noqa: E402
from gnmr.pytorch import Controller  # noqa: E402

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(),
                            torch.nn.Linear(64, 64), torch.nn.ReLU(),
                            torch.nn.Linear(64, 1))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x, y = torch.randn(256, 16), torch.randn(256, 1)
steps = 30


def set_precision(name, module, high):       # your switch, per module
    module.use_high_precision = high


with Controller(model, job=os.environ.get("GNMR_JOB", "quickstart"),
                select=(torch.nn.Linear,), on_route=set_precision,
                params=default_params(max_active=1, warmup_steps=5)) as ctl:
    for step in range(steps):                 # steps may start at 0
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        if 20 <= step < 23:   # one unit's gradient 30x for three steps: an
            model[2].weight.grad.mul_(30)     # episode, not a one-step blip
        res = ctl.step(step)   # report, wait <= 50 ms, apply routes
        print(f"step {step:2d} loss {loss.item():.4f} on time {bool(res)} "
              f"recovery path: {res.active or '-'}")
        if res.nonfinite:      # NaN/Inf in these units' gradients
            opt.zero_grad()    # skip the step, as GradScaler does
            continue
        opt.step()
        opt.zero_grad()
