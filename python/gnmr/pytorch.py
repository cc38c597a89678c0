# SPDX-License-Identifier: MIT
"""The PyTorch adapter: attach GNMR to a model in a few lines.

    ctl = Controller(model, "ipc:///run/gnmr/agents.sock", "my-job",
                     select=(torch.nn.Linear,), on_route=set_precision)
    for step in range(1, steps + 1):
        loss = model(batch).loss
        loss.backward()
        ctl.step(step)          # report, wait (bounded), apply routes
        optimizer.step(); optimizer.zero_grad()

or, to overlap the pass over host gradients with the optimizer step:

        loss.backward()
        ctl.report_async(step)  # reduces on a worker thread
        optimizer.step()
        ctl.finish(step)        # before zero_grad: wait, apply routes
        optimizer.zero_grad()

Units are the modules chosen by type (`select`) and/or a regular
expression on their names (`pattern`); a unit's gradient is that of the
module's own parameters. After backward, `report(step)` sends every unit's
sum of squares (host tensors are reduced by libgnmr-agent in fp64;
parameters without a gradient make their unit "not reported"). Before the
next forward, `apply_routes()` calls `on_route(name, module, high)` for
every unit whose route changed, `high` meaning the recovery path.

Model-parallel jobs: `tp_size` shards per replica (default 1); the global
rank comes from RANK or SLURM_PROCID (or `global_rank`). Replica 0 of each
shard reports; other replicas observe and receive the same routes.
Gradients on CUDA go to the agent's CUDA backend (one fused kernel on the
current stream, no synchronisation; the result reaches gnmrd from the
backend's own thread) when libgnmr-agent was built with nvcc and sees the
device; otherwise torch reduces them (one synchronisation per step).
"""
import os
import re

import torch

from .agent import Agent, CudaReducer, GnmrError, cuda_device_count

_DTYPES = {torch.float32: "float32", torch.float16: "float16",
           torch.bfloat16: "bfloat16", torch.float64: "float64"}
for _name in ("float8_e4m3fn", "float8_e5m2"):
    if hasattr(torch, _name):
        _DTYPES[getattr(torch, _name)] = _name


def _global_rank():
    for var in ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"):
        if var in os.environ:
            return int(os.environ[var])
    return 0


class Controller:
    def __init__(self, model, endpoint, job, select=(torch.nn.Linear,),
                 pattern=None, on_route=None, tp_size=1, global_rank=None,
                 wait_ms=50, **agent_kwargs):
        rx = re.compile(pattern) if pattern else None
        self.units = [(name, m) for name, m in model.named_modules()
                      if (not select or isinstance(m, tuple(select)))
                      and (rx is None or rx.search(name))
                      and any(True for _ in m.parameters(recurse=False))]
        if not self.units:
            raise ValueError("no module of the model matches select/pattern")
        rank = _global_rank() if global_rank is None else global_rank
        self.tp_rank, self.replica = rank % tp_size, rank // tp_size
        self.agent = Agent(endpoint, job, [n for n, _ in self.units],
                           rank=self.tp_rank, reporters=tp_size,
                           observer=self.replica != 0, **agent_kwargs)
        self._params = [list(m.parameters(recurse=False))
                        for _, m in self.units]
        self.on_route = on_route
        self.wait_ms = wait_ms
        self.high = [None] * len(self.units)
        self._cuda = None       # CudaReducer, opened at the first CUDA step
        self._cuda_failed = None  # why the CUDA backend is not used
        self._keep = []         # copies the GPU may still read
        self._worker = None     # report_async's thread
        self._pending = None

    def _cuda_reducer(self, device):
        if self._cuda is None and self._cuda_failed is None:
            if cuda_device_count() == 0:
                self._cuda_failed = "libgnmr-agent sees no CUDA device " \
                                    "(or was built without nvcc)"
            else:
                try:
                    self._cuda = CudaReducer(self.agent, device=device.index
                                             or 0)
                except GnmrError as e:
                    self._cuda_failed = str(e)
        return self._cuda

    @property
    def cuda_backend(self):
        """'gnmr' when CUDA gradients go to the agent's kernel, else why
        torch reduces them."""
        return "gnmr" if self._cuda is not None else self._cuda_failed

    def _sums_on_device(self, grads_by_unit):
        """Per-unit (sum of squares, non-finite count) reduced by torch."""
        sumsq, nonfinite = [], []
        for grads in grads_by_unit:
            if not grads:
                sumsq.append(0.0)
                nonfinite.append(0)
                continue
            flat = [g.detach().reshape(-1).double() for g in grads]
            bad = sum(int((~torch.isfinite(f)).sum()) for f in flat)
            s = sum(float(torch.where(torch.isfinite(f), f, 0).pow(2).sum())
                    for f in flat)
            sumsq.append(s)
            nonfinite.append(bad)
        return sumsq, nonfinite

    @staticmethod
    def _buffers(grads):
        """(tensors to keep alive, (unit, pointer, numel, dtype) tuples):
        contiguous gradients in a dtype the library reads."""
        keep, buffers = [], []
        for unit, gs in enumerate(grads):
            for g in gs:
                g = g.detach()
                if g.dtype not in _DTYPES:
                    g = g.float()
                if not g.is_contiguous():
                    g = g.contiguous()
                keep.append(g)
                buffers.append((unit, g.data_ptr(), g.numel(),
                                _DTYPES[g.dtype]))
        return keep, buffers

    def report(self, step):
        """Reports the gradients of every unit for step (after backward)."""
        grads = [[p.grad for p in ps if p.grad is not None]
                 for ps in self._params]
        if self.agent.observer:  # another replica reports this shard
            self.agent.report_sums(step, [0.0] * len(grads))
            return
        cuda = [g for gs in grads for g in gs if g.is_cuda]
        if cuda and self._cuda_reducer(cuda[0].device) is not None:
            # the kernel runs on the current stream: copies made here stay
            # valid for it (stream-ordered allocator); keep them one step
            self._keep, buffers = self._buffers(grads)
            self._cuda.report(step, buffers,
                              torch.cuda.current_stream(cuda[0].device)
                              .cuda_stream)
            return
        if cuda:
            sumsq, nonfinite = self._sums_on_device(grads)
            self.agent.report_sums(step, sumsq, nonfinite,
                                   not_reported=[not gs for gs in grads])
            return
        keep, buffers = self._buffers(grads)
        self.agent.report_buffers(step, buffers)  # reads them before return
        del keep

    def apply_routes(self):
        """Calls on_route for every unit whose route changed; returns the
        routes (True: recovery path) for the next step."""
        for unit, (name, module) in enumerate(self.units):
            high = self.agent.route(unit)
            if high != self.high[unit]:
                self.high[unit] = high
                if self.on_route is not None:
                    self.on_route(name, module, high)
        return list(self.high)

    def step(self, step, wait_ms=None):
        """report(step), wait for its decision (at most wait_ms), then
        apply_routes(). Returns whether the decision came in time."""
        self.report(step)
        return self.finish(step, wait_ms)

    def report_async(self, step):
        """report(step) on a worker thread, so that the pass over host
        gradients overlaps what the caller does next (the optimizer step;
        the library releases the GIL). Call finish(step) before anything
        overwrites the gradients (zero_grad, the next backward)."""
        if self._worker is None:
            from concurrent.futures import ThreadPoolExecutor
            self._worker = ThreadPoolExecutor(1, "gnmr-report")
        self._pending = self._worker.submit(self.report, step)

    def finish(self, step, wait_ms=None):
        """Completes step: the report_async() in flight (its errors are
        raised here), the wait for the decision (at most wait_ms), then
        apply_routes(). Returns whether the decision came in time."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()
        on_time = self.agent.wait(step, self.wait_ms if wait_ms is None
                                  else wait_ms)
        self.apply_routes()
        return on_time

    def close(self):
        if self._pending is not None:
            self._pending.exception()  # wait; close is no place to raise
            self._pending = None
        if self._worker is not None:
            self._worker.shutdown()
            self._worker = None
        if self._cuda is not None:
            self._cuda.close()
            self._cuda = None
        self.agent.close()
