# SPDX-License-Identifier: MIT
"""One rank of a distributed training run with GNMR, launched by torchrun
(`python -m torch.distributed.run`) from test_distributed.py.

    dist_worker.py KIND ENDPOINT JOB OUTDIR STEPS

KIND: ddp, fsdp2 (fully_shard on a 1-D mesh), hsdp (fully_shard on a
(replicate, shard) mesh), tp (parallelize_module: colwise/rowwise, the
norm and head plain), megatron (hand-sharded column/row-parallel linears
with tensor_model_parallel attributes and fp32 main_grad buffers, grad
None), compile (torch.compile of the plain model, one process).

Each rank trains the same small model on gloo, calls Controller.step()
after backward, and writes OUTDIR/rank<R>.jsonl (each step's active units,
nonfinite units, whether the decision came in time). Rank 0 also writes
OUTDIR/reference.csv: every unit's norm of its full, unsharded gradient in
fp64 (gathered for the test only, after GNMR's report), the trace that
gnmrd should have decided from. At step NAN_STEP the last reporter (and
each replica of it) puts a NaN in its own elements of `down`'s weight
gradient, as a NaN from the reduction would be.
"""
import json
import math
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import gnmr  # noqa: E402
from gnmr.pytorch import Controller  # noqa: E402

NAN_STEP = 9
SPIKE_STEP = 6
UNITS = ("up", "down", "norm", "head")


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(8, 32)
        self.down = torch.nn.Linear(32, 16)
        self.norm = torch.nn.LayerNorm(16)
        self.head = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.head(self.norm(self.down(torch.relu(self.up(x)))))


class _AllReduce(torch.autograd.Function):
    """Megatron's row-parallel output: forward all-reduces, backward is
    the identity."""

    @staticmethod
    def forward(ctx, x):
        x = x.clone()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, g):
        return g


class MegatronNet(torch.nn.Module):
    """Net split over the world as Megatron does: up column-parallel (rows
    of W and b), down row-parallel (columns of W; its bias and the rest
    replicated, without tensor_model_parallel)."""

    def __init__(self, full, rank, world):
        super().__init__()
        rows = full.up.weight.shape[0] // world
        sl = slice(rank * rows, (rank + 1) * rows)
        self.up = torch.nn.Linear(8, rows)
        self.down = torch.nn.Linear(rows, 16)
        with torch.no_grad():
            self.up.weight.copy_(full.up.weight[sl])
            self.up.bias.copy_(full.up.bias[sl])
            self.down.weight.copy_(full.down.weight[:, sl])
            self.down.bias.copy_(full.down.bias)
        self.norm, self.head = full.norm, full.head
        for p, dim in ((self.up.weight, 0), (self.up.bias, 0),
                       (self.down.weight, 1)):
            p.tensor_model_parallel, p.partition_dim = True, dim
        for p in self.parameters():
            p.main_grad = torch.zeros_like(p, dtype=torch.float32)

    def forward(self, x):
        h = torch.relu(self.up(x))
        y = torch.nn.functional.linear(h, self.down.weight)
        y = _AllReduce.apply(y) + self.down.bias
        return self.head(self.norm(y))


def batch(step):
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(16, 8, generator=g)
    if step == SPIKE_STEP:
        x = x * 8
    return x, torch.randn(16, 4, generator=g)


def full_grad(p, kind, world):
    """p's whole gradient (a collective for sharded ones: every rank
    calls it)."""
    from torch.distributed.tensor import DTensor
    g = getattr(p, "main_grad", None)
    g = p.grad if g is None else g
    if isinstance(g, DTensor):
        return g.full_tensor()
    if kind == "megatron" and getattr(p, "tensor_model_parallel", False):
        parts = [torch.empty_like(g) for _ in range(world)]
        dist.all_gather(parts, g.contiguous())
        return torch.cat(parts, p.partition_dim)
    return g


def main():
    kind, endpoint, job, out, steps = sys.argv[1:6]
    steps = int(steps)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if world > 1 else 0
    torch.manual_seed(0)
    net = Net()
    model = net
    lo, hi = 0, 16  # this rank's rows of the global batch
    if kind == "ddp":
        from torch.nn.parallel import DistributedDataParallel
        model = DistributedDataParallel(net)
        lo, hi = rank * 16 // world, (rank + 1) * 16 // world
    elif kind in ("fsdp2", "hsdp"):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        if kind == "fsdp2":
            mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
            shard = rank
            nshard = world
        else:
            mesh = init_device_mesh("cpu", (2, world // 2),
                                    mesh_dim_names=("replicate", "shard"))
            shard, nshard = rank, world
        for m in (net.up, net.down, net.norm, net.head):
            fully_shard(m, mesh=mesh)
        fully_shard(net, mesh=mesh)
        lo, hi = shard * 16 // nshard, (shard + 1) * 16 // nshard
    elif kind == "tp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import (
            ColwiseParallel, RowwiseParallel, parallelize_module)
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
        parallelize_module(net, mesh, {"up": ColwiseParallel(),
                                       "down": RowwiseParallel()})
    elif kind == "megatron":
        model = net = MegatronNet(net, rank, world)
    elif kind == "compile":
        # aot_eager: dynamo's graph (the wrapper whose names GNMR reads
        # through) and AOTAutograd's backward, without inductor's code
        # generation (40 s of this test on a 2-CPU VM); inductor runs in
        # bench/compile_routes.py and scripts/gpu_check.sh
        model = torch.compile(net, backend="aot_eager")
    else:
        raise SystemExit(f"unknown kind {kind}")
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ctl = Controller(model, endpoint, job,
                     select=(torch.nn.Linear, torch.nn.LayerNorm),
                     params=gnmr.default_params(warmup_steps=2, max_active=1,
                                                lock_steps=1, alpha=1.3,
                                                beta=1.3),
                     wait_ms=20000, join_wait_ms=20000,
                     tp_size=world if kind == "megatron" else None)
    names = [n for n, _ in ctl.units]
    assert names == list(UNITS), names
    res_f = open(os.path.join(out, f"rank{rank}.jsonl"), "w")
    ref_f = open(os.path.join(out, "reference.csv"), "w") if rank == 0 \
        else None
    if ref_f:
        ref_f.write("step,unit,norm\n")
    mods = dict(net.named_children())
    for step in range(1, steps + 1):
        x, y = batch(step)
        loss = torch.nn.functional.mse_loss(model(x[lo:hi]), y[lo:hi])
        loss.backward()
        if kind == "megatron":  # Megatron accumulates into main_grad
            for p in net.parameters():
                p.main_grad.add_(p.grad)
                p.grad = None
        lay = ctl.layout  # the last reporter's elements, on each replica
        if step == NAN_STEP and lay.index == lay.reporters - 1:
            g = mods["down"].weight
            g = g.main_grad if kind == "megatron" else g.grad
            g = g.to_local() if hasattr(g, "to_local") else g
            g.view(-1)[0] = float("nan")
        res = ctl.step(step)
        ref = {}
        for u, name in enumerate(UNITS):  # after the report: test only
            sq = 0.0
            for p in mods[name].parameters():
                sq += float(full_grad(p, kind, world).double().square()
                            .sum())
            ref[u] = math.sqrt(sq)
        if ref_f:
            for u in range(len(UNITS)):
                ref_f.write(f"{step},{u},{ref[u]!r}\n")
        res_f.write(json.dumps({"step": step, "on_time": bool(res.on_time),
                                "active": res.active,
                                "nonfinite": res.nonfinite,
                                "walks": ctl._reduction.walks}) + "\n")
        if not res.nonfinite:
            if kind == "megatron":
                for p in net.parameters():
                    p.grad = p.main_grad
            opt.step()
        opt.zero_grad()
        if kind == "megatron":
            for p in net.parameters():
                p.main_grad.zero_()
                p.grad = None
    res_f.close()
    if ref_f:
        ref_f.close()
    ctl.close()
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
