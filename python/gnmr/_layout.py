# SPDX-License-Identifier: MIT
"""Units and the job's layout: which modules are units (named as in the
plain model), which ranks report, and which of this rank's gradients count
in its report.

gnmrd adds the reporters' sums of squares in rank order, so a unit's norm
is right when every element of its full gradient is counted by exactly one
reporter. The layout says who that is:

- No DTensor parameter (one process, DDP, Megatron-style model
  parallelism): `tp_size` (or `tp_group`) shards per replica report, one
  per shard rank; replica 0 reports, the other replicas observe (they get
  the same routes). With Megatron's `tensor_model_parallel` attribute on
  some parameters, the others (layer norms, replicated biases) are copies
  on every shard rank: only shard rank 0 counts them, as Megatron's own
  norm does.
- DTensor parameters (FSDP2's `fully_shard`, `parallelize_module`), all
  on one DeviceMesh: a mesh dimension on which some parameter is sharded
  reports (the ranks along it are the reporters, in the mesh's order), a
  dimension on which every parameter is replicated observes (coordinate 0
  reports, the others observe). A parameter replicated along a reporting
  dimension counts on that dimension's coordinate 0 only; a plain tensor
  beside DTensors counts on reporter 0 only. Gradients are read on their
  local shard (`to_local()`): GNMR starts no collective.

A parameter's gradient is its `main_grad` when it has one (Megatron-style
fp32 buffers, with `grad` None), else its `grad`.
"""
import math
import os

import torch

try:  # torch built without distributed support has no DTensor
    from torch.distributed.tensor import DTensor
except ImportError:  # pragma: no cover
    DTensor = None

# module attributes that wrap the module the user wrote: a name through
# them is the name of the wrapped module
_WRAPPER_ATTRS = ("_orig_mod", "_fsdp_wrapped_module",
                  "_checkpoint_wrapped_module")


def _wrapper_types():
    """The wrappers whose `module` attribute is the module the user wrote
    (torch.compile's OptimizedModule keeps its in `_orig_mod`, above: it
    is not imported here, which took torch._dynamo's 5 s import into the
    first Controller of a script that compiles nothing)."""
    types = []
    for mod, name in (("torch.nn.parallel", "DistributedDataParallel"),
                      ("torch.nn", "DataParallel")):
        try:
            types.append(getattr(__import__(mod, fromlist=[name]), name))
        except (ImportError, AttributeError):
            pass
    return tuple(types)


def plain_named_modules(model):
    """model.named_modules() with the names the unwrapped model gives:
    torch.compile's `_orig_mod.`, DDP's `module.`, FSDP1's and activation
    checkpointing's wrapper attributes left out. A wrapper and what it
    wraps then share a name; the wrapper comes first."""
    wrappers = _wrapper_types()
    names = {}
    out = []
    for name, m in model.named_modules():
        parent, _, attr = name.rpartition(".")
        if name == "":
            clean = ""
        else:
            pmod = model.get_submodule(parent) if parent else model
            pclean = names[id(pmod)]
            if attr in _WRAPPER_ATTRS or (
                    attr == "module" and isinstance(pmod, wrappers)):
                clean = pclean
            else:
                clean = f"{pclean}.{attr}" if pclean else attr
        names[id(m)] = clean
        out.append((clean, m))
    return out


class ExpertSlice:
    """Expert `index` of a fused MoE parameter (shape [experts, ...], as
    transformers' `*Experts` modules hold them): what a per-expert unit
    counts in place of a whole parameter. Its gradient is that of the
    parameter at `index` (a contiguous view: no copy)."""

    __slots__ = ("param", "index")

    def __init__(self, param, index):
        self.param, self.index = param, index

    @property
    def grad(self):
        g = self.param.grad
        return None if g is None else g[self.index]

    @property
    def main_grad(self):
        g = getattr(self.param, "main_grad", None)
        return None if g is None else g[self.index]

    @property
    def requires_grad(self):
        return self.param.requires_grad

    @property
    def is_cuda(self):
        return self.param.is_cuda


def fused_experts(module):
    """The number of experts when `module` holds fused expert weights (an
    int `num_experts` and direct parameters of 3 or more dimensions, each
    with num_experts rows: Mixtral's, Qwen-MoE's, OLMoE's `*Experts`),
    else 0. A router (2-dimensional weight) is not one."""
    n = getattr(module, "num_experts", None)
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        return 0
    ps = list(module.parameters(recurse=False))
    if ps and all(p.dim() >= 3 and p.shape[0] == n for p in ps):
        if DTensor is not None and any(isinstance(p, DTensor) for p in ps):
            raise ValueError(
                f"gnmr: the fused expert weights of {type(module).__name__} "
                "are DTensors (expert parallelism): per-expert units read "
                "whole local experts, which this version does not split; "
                "pass experts=False to count the experts as one unit")
        return n
    return 0


def grad_of(p):
    """The gradient GNMR reads for parameter p: main_grad when set, else
    grad; None when it has neither."""
    g = getattr(p, "main_grad", None)
    return p.grad if g is None else g


def _env_int(*names):
    for var in names:
        if os.environ.get(var, "") != "":
            try:
                return int(os.environ[var]), var
            except ValueError:
                raise ValueError(f"{var}={os.environ[var]!r} is not an "
                                 "integer") from None
    return None, None


def node_ranks(layout):
    """Hello.node_ranks for this layout: the launcher's ranks per node
    (torchrun's LOCAL_WORLD_SIZE, Slurm's SLURM_NTASKS_PER_NODE) when every
    rank reports (its reporter number its global rank) and the launcher
    lays ranks out a node at a time (rank % per == the local rank), as
    torchrun does and Slurm's block distribution; else 0, each rank its
    own node (docs/protocol.md, "Node relays")."""
    if layout.world <= 1 or layout.reporters != layout.world or \
            layout.index != layout.rank:
        return 0
    per, _ = _env_int("LOCAL_WORLD_SIZE")
    local, _ = _env_int("LOCAL_RANK")
    if per is None:
        v = os.environ.get("SLURM_NTASKS_PER_NODE", "")
        per = int(v) if v.isdigit() else None  # "4(x2)": not one count
        local, _ = _env_int("SLURM_LOCALID")
    if not per or local is None or per > 4096 or layout.world % per or \
            layout.rank % per != local:
        return 0
    return per


class Layout:
    """rank (global), world, index (this rank's reporter number),
    reporters, observer, mesh (the DeviceMesh, or None), describe()."""

    def __init__(self, rank, world, index, reporters, observer, mesh=None,
                 report_dims=(), megatron=False):
        self.rank, self.world = rank, world
        self.index, self.reporters, self.observer = index, reporters, observer
        self.mesh, self.report_dims = mesh, tuple(report_dims)
        self.megatron = megatron
        self._coord = mesh.get_coordinate() if mesh is not None else None

    def counts(self, p):
        """Whether this rank's local gradient of p is its share of the
        unit's norm (False: another reporter counts the same elements)."""
        if self.mesh is None:
            if self.megatron and self.index != 0:
                return bool(getattr(p, "tensor_model_parallel", False))
            return True
        if DTensor is None or not isinstance(p, DTensor):
            return self.index == 0
        for d, pl in enumerate(p.placements):
            if pl.is_replicate() and self._coord[d] != 0:
                return False
        return True

    def describe(self):
        if self.mesh is None:
            return (f"rank {self.rank} of {self.world}: reporter "
                    f"{self.index} of {self.reporters}" +
                    (", observer" if self.observer else ""))
        names = self.mesh.mesh_dim_names or tuple(
            f"dim{d}" for d in range(self.mesh.ndim))
        rep = [names[d] for d in self.report_dims]
        return (f"rank {self.rank} of {self.world}, mesh "
                f"{dict(zip(names, self.mesh.mesh.shape))}: reports along "
                f"{rep or 'no dimension'}, reporter {self.index} of "
                f"{self.reporters}" + (", observer" if self.observer else ""))


def _mesh_of(params):
    """The one DeviceMesh of the DTensor parameters, the dimensions some
    parameter is sharded on; (None, ()) without DTensors."""
    if DTensor is None:
        return None, ()
    mesh, first, sharded = None, None, set()
    for name, p in params:
        if not isinstance(p, DTensor):
            continue
        m = p.device_mesh
        if mesh is None:
            mesh, first = m, name
        elif m is not mesh and (m.mesh.shape != mesh.mesh.shape or
                                not torch.equal(m.mesh, mesh.mesh)):
            raise ValueError(
                f"gnmr: parameters {first} and {name} are DTensors on two "
                f"DeviceMeshes ({mesh} and {m}); GNMR reads one mesh per "
                "model (apply fully_shard/parallelize_module on one mesh, "
                "or its sub-meshes of the same ranks)")
        for d, pl in enumerate(p.placements):
            if pl.is_partial():
                raise ValueError(
                    f"gnmr: parameter {name} is Partial on mesh dimension "
                    f"{d}: a Partial tensor's norm needs a collective")
            if pl.is_shard():
                sharded.add(d)
    return mesh, tuple(sorted(sharded))


def _megatron_tp_group():
    """Megatron-core's tensor-parallel group when it is initialised."""
    try:
        from megatron.core import parallel_state
    except ImportError:
        return None
    try:
        if parallel_state.model_parallel_is_initialized():
            return parallel_state.get_tensor_model_parallel_group()
    except Exception:  # an older or changed parallel_state
        return None
    return None


def layout(named_params, global_rank=None, tp_size=None, tp_group=None):
    """The Layout of this rank for a model's (name, parameter) pairs: from
    its DeviceMesh when it has DTensor parameters, else from
    torch.distributed or the launcher's environment and tp_size/tp_group;
    an error when the world has several processes but this one's rank
    cannot be found."""
    dist = torch.distributed
    live = dist.is_available() and dist.is_initialized()
    world, world_var = _env_int("WORLD_SIZE", "SLURM_NTASKS",
                                "OMPI_COMM_WORLD_SIZE")
    if global_rank is not None:
        rank = global_rank
    elif live:
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        rank, _ = _env_int("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK")
        if rank is None:
            if world is not None and world > 1:
                raise ValueError(
                    f"{world_var}={world} but this process has no rank: "
                    "initialise torch.distributed, set RANK (or "
                    "SLURM_PROCID), or pass global_rank=; without one, "
                    "every process would report as rank 0")
            rank = 0
    world = world or 1
    mesh, dims = _mesh_of(named_params)
    if mesh is not None:
        if tp_size is not None or tp_group is not None:
            raise ValueError(
                "gnmr: the model's parameters are DTensors on a DeviceMesh, "
                "which says who reports: leave out tp_size/tp_group")
        coord = mesh.get_coordinate()
        if coord is None:
            raise ValueError(f"gnmr: rank {rank} is not in the model's "
                             f"DeviceMesh {mesh}")
        shape = mesh.mesh.shape
        index, reporters = 0, 1
        for d in dims:
            index = index * shape[d] + coord[d]
            reporters *= shape[d]
        observer = any(coord[d] != 0 for d in range(mesh.ndim)
                       if d not in dims)
        return Layout(rank, world, index, reporters, observer, mesh, dims)
    megatron = any(hasattr(p, "tensor_model_parallel")
                   for _, p in named_params)
    if megatron and tp_group is None and tp_size is None and world > 1:
        tp_group = _megatron_tp_group()
        if tp_group is None:
            raise ValueError(
                "gnmr: the model has Megatron-style tensor_model_parallel "
                "parameters in a world of several processes: pass "
                "tp_group= (parallel_state.get_tensor_model_parallel_group()"
                ") or tp_size= (1 without tensor parallelism), so that "
                "each shard rank reports its part")
    if tp_group is not None:
        if not live:
            raise ValueError("tp_group needs torch.distributed initialised")
        size, tp_rank = dist.get_world_size(tp_group), dist.get_rank(tp_group)
        if tp_size is not None and tp_size != size:
            raise ValueError(f"tp_size={tp_size} but tp_group has {size} "
                             "ranks")
        return Layout(rank, world, tp_rank, size, rank // size != 0,
                      megatron=megatron)
    size = 1 if tp_size is None else tp_size
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise ValueError(f"tp_size={tp_size!r}: a positive integer")
    return Layout(rank, world, rank % size, size, rank // size != 0,
                  megatron=megatron)


def local(g):
    """A gradient as a plain tensor of this rank's elements."""
    if DTensor is not None and isinstance(g, DTensor):
        return g.to_local()
    return g


_OWNERS = {}  # (device, unit of each gradient) -> its index tensor


def sums_on_device(grads_by_unit):
    """Per-unit (sum of squares, non-finite count) of device gradients,
    reduced by torch in fp64 with no copy of a gradient and one host
    synchronisation (a second pass, and a second one, only for units with
    NaN/Inf: their count and the sum of their finite elements)."""
    flat, owner = [], []
    for u, grads in enumerate(grads_by_unit):
        for g in grads:
            if g.numel():
                flat.append(g)
                owner.append(u)
    n = len(grads_by_unit)
    if not flat:
        return [0.0] * n, [0] * n
    dev = flat[0].device
    norms = torch._foreach_norm(flat, 2, dtype=torch.float64)
    per = torch.zeros(n, dtype=torch.float64, device=dev)
    key = (dev, tuple(owner))
    index = _OWNERS.get(key)
    if index is None:  # once per layout: no host-to-device copy a step
        if len(_OWNERS) > 64:
            _OWNERS.clear()
        index = _OWNERS[key] = torch.tensor(owner, device=dev)
    per.index_add_(0, index, torch.stack([t.to(dev) for t in norms])
                   .square())
    sumsq = per.tolist()  # the one synchronisation
    nonfinite = [0] * n
    bad = [u for u, s in enumerate(sumsq) if not math.isfinite(s)]
    if bad:
        for u in bad:
            gs = [g for g in grads_by_unit[u] if g.numel()]
            fin = [torch.isfinite(g) for g in gs]
            cnt = sum((~f).sum() for f in fin)
            ss = sum(torch.where(f, g.double(), 0.0).square().sum()
                     for f, g in zip(fin, gs))
            sumsq[u], nonfinite[u] = float(ss), int(cnt)
    return sumsq, nonfinite
