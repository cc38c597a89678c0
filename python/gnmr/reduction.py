# SPDX-License-Identifier: MIT
"""The reduction of a Controller's units (gnmr.pytorch): each unit's sum of
squares and NaN/Inf count from its gradients, on the host (libgnmr-agent,
one pass over a table of tensors), on CUDA (the agent's kernel) or by
torch, and the report to gnmrd. A Controller holds one Reduction and
reads what the last report sent from it (local, shadowed, reduced); the
Reduction reaches the agent through its public calls only."""
import ctypes
import weakref
from array import array
from itertools import repeat
from operator import attrgetter, is_

import torch

from . import _layout
from ._layout import grad_of, local as _local, sums_on_device
from ._lib import Tensor as _Tensor
from ._warn import warn as _warn
from .agent import CudaReducer, GnmrError, cuda_device_count, reduce_cpu
from .agent import _TENSOR, _DTYPE_CODES as _CODES_BY_NAME, lib

_DTYPES = {torch.float32: "float32", torch.float16: "float16",
           torch.bfloat16: "bfloat16", torch.float64: "float64"}
for _name in ("float8_e4m3fn", "float8_e5m2"):
    if hasattr(torch, _name):
        _DTYPES[getattr(torch, _name)] = _name
_DTYPE_CODES = {dt: _CODES_BY_NAME[name] for dt, name in _DTYPES.items()}
_FLIP = bytes([1, 0]) + bytes(254)  # seen -> not reported
_GRAD, _DTYPE = attrgetter("grad"), attrgetter("dtype")
_MAIN = attrgetter("main_grad")
_LOCAL_GRAD = attrgetter("grad._local_tensor")  # a DTensor gradient's
_IS_CPU = attrgetter("is_cpu")
_DEVICE = attrgetter("device")
_T = torch.Tensor
_DEREF = weakref.ref.__call__
_STORAGE_PTR = torch.UntypedStorage.data_ptr
# main_grad views of a few buffers (_HostTable.storages): the most
# buffers, and the views checked a step
_STATIC_STORAGES = 8
_SPOT = 256


class _HostTable:
    """The gnmr_tensor table of a layout whose gradients are plain p.grad
    (or main_grad), on the host or on one CUDA device
    (Reduction._cached_table): packed once while the gradients' dtypes
    and sizes stay, its pointers rewritten (one strided copy) when the
    gradients move, and left as it is while they are the same tensors at
    the same addresses. Holds the gradients weakly (a
    zero_grad(set_to_none=True) frees them as without GNMR), each weak
    reference with a callback that marks the table stale when its
    gradient dies: while none has died, a step reads only the pointers.
    device: None on the host, else the CUDA device they are on."""
    __slots__ = ("buf", "ptr_words", "refs", "dtypes", "numels", "ptrs",
                 "died", "storages", "spot", "device")

    def __init__(self, dtypes, numels, units):
        size = _TENSOR.size
        self.buf = bytearray(size * max(len(units), 1))
        pack = _TENSOR.pack_into
        for i, (dt, numel, unit) in enumerate(zip(dtypes, numels, units)):
            pack(self.buf, i * size, 0, numel, _DTYPE_CODES[dt], unit, 0.0)
        # the data pointers: word 0 of each 4-word entry
        self.ptr_words = memoryview(self.buf).cast("Q")[0::size // 8]
        self.refs, self.ptrs, self.died = [], None, [True]
        self.dtypes, self.numels = dtypes, numels
        # main_grad views of at most _STATIC_STORAGES buffers: [(storage,
        # its pointer, its size)], held (what the table points into stays
        # allocated), each checked every step, the views _SPOT a step in
        # turn from self.spot (Reduction._static); else None
        self.storages, self.spot = None, 0
        self.device = None

    def watch(self, grads):
        """Holds grads weakly; self.died[0] turns True when one dies. The
        callback holds the flag, not the table: no cycle."""
        died = self.died = [False]

        def dead(_ref):
            died[0] = True
        self.refs = list(map(weakref.ref, grads, repeat(dead, len(grads))))


_WALK = object()  # _kept_still's answer: the step walks the parameters


class Reduction:
    """One Controller's reduction (see the module's docstring): its
    tables, its CUDA reducer and what its last report sent.

    agent: the Controller's Agent; units: [(name, module)]; params: each
    unit's parameters; layout: _layout.layout()'s answer for them;
    threads: the host pass's threads (0: automatic); shadow, shadow_low:
    the Controller's; warn_after, job, frozen (units never to expect a
    gradient from): for the warning about units without gradients."""

    def __init__(self, agent, units, params, layout, threads=0, shadow=None,
                 shadow_low=False, warn_after=3, job="", frozen=(),
                 measure=None):
        self.agent, self.units, self._params = agent, units, params
        self.layout, self.threads = layout, threads
        self.shadow, self.shadow_low = shadow, shadow_low
        self.measure = measure  # fn(name, module) -> float or None
        self.measured = None    # what the last report sent of it
        self.warn_after, self.job = warn_after, job
        # parameters whose local gradient another reporter counts: read
        # for "has a gradient", not summed
        self._skip = {id(p) for ps in params for p in ps
                      if not layout.counts(p)}
        # every gradient a plain p.grad counted here: the fast pass; and
        # the gradient the kept table reads (_cached_table): p.grad, or
        # main_grad when every parameter has one (Megatron-style buffers,
        # whose views stay put), else None (_walk_table every step)
        plain = not self._skip and layout.mesh is None
        mains = [hasattr(p, "main_grad") for ps in params for p in ps]
        self._simple = plain and not any(mains)
        self._kept = _GRAD if self._simple else \
            _MAIN if plain and mains and all(mains) else None
        if self._kept is None and not self._skip and not any(mains) and \
                _layout.DTensor is not None and mains and \
                all(isinstance(p, _layout.DTensor)
                    for ps in params for p in ps):
            # DTensor parameters on a mesh (FSDP2's shards, a tensor-
            # parallel model), each rank's local gradient counted here:
            # the kept table reads the local tensors (a gradient that is
            # not a DTensor walks, as a missing one does)
            self._kept = _LOCAL_GRAD
        self.walks = 0  # steps the table was walked (_walk_table)
        self._never = set(range(len(units))) - set(frozen)
        self._reports = 0
        self._table = bytearray(_TENSOR.size * 64)  # _walk_table()'s
        self._flat = None       # the parameters _cached_table() reads
        self._frozen = []       # and those it leaves out (no gradient)
        # per unit, whether _flat has none of its parameters
        self._bare = [not ps for ps in params]
        self._hcache = None     # its _HostTable
        # main_grad views checked a step when they are views of a few
        # buffers (_static); 0: every view every step. Turned to 0 after
        # 3 steps in a row whose check failed
        self.spot, self._misses = _SPOT, 0
        # steps in a row whose gradients were new tensors; from 2, they are
        # not watched (weak references), but on one step in `rewatch`
        self._fresh, self.rewatch = 0, 64
        self.cuda = None        # CudaReducer, opened at the first CUDA step
        self._cuda_failed = None  # why the CUDA backend is not used
        self._kernel = None     # (step, stream) of the last kernel report
        self._keep = []         # copies the GPU may still read
        # what the last report sent: (sumsq, nonfinite, not_reported) per
        # unit, None when the kernel has them (read_kernel()) or nothing
        # was sent (an observer)
        self.local = None
        self.shadowed = []      # the units it reported as shadowed
        self.clipping = False   # keep `reduced` (clip_grad_norm_)
        self.reduced = None     # (step, [(unit, p, grad, grad._version)])

    def close(self):
        if self.cuda is not None:
            self.cuda.close()
            self.cuda = None

    def release(self):
        """Drops the gradients kept for the kernel (_keep) once it has
        read them: every report's result delivered (the library counts a
        result before it hands it on, so after this rank's decision is in,
        they are). Else they are dropped at the next report. Without it,
        gradients freed by zero_grad(set_to_none=True) stayed allocated
        through the next forward and backward."""
        if self._keep and self.cuda is not None:
            st = self.cuda.stats()
            if st["delivered"] >= st["reports"]:
                self._keep = []

    def read_kernel(self, t):
        """`local` of step t's report when the CUDA kernel reduced it: its
        sums read back (one synchronisation of the report's stream); None
        when step t was not a kernel report."""
        if self.local is None and self._kernel is not None and \
                self._kernel[0] == t:
            sumsq, nonfinite, seen = self.cuda.read(
                self._kernel[1].cuda_stream)
            self.local = (sumsq, nonfinite, [not x for x in seen])
            return self.local
        return None

    def _cuda_reducer(self, device):
        if self.cuda is None and self._cuda_failed is None:
            if cuda_device_count() == 0:
                self._cuda_failed = "libgnmr-agent sees no CUDA device " \
                                    "(or was built without nvcc)"
            else:
                try:
                    self.cuda = CudaReducer(self.agent, device=device.index
                                            or 0)
                except GnmrError as e:
                    self._cuda_failed = str(e)
        return self.cuda

    @property
    def cuda_backend(self):
        """'gnmr' when CUDA gradients go to the agent's kernel, else why
        torch reduces them."""
        return "gnmr" if self.cuda is not None else self._cuda_failed

    @staticmethod
    def _buffers(grads):
        """(tensors to keep alive, (unit, pointer, numel, dtype) tuples):
        contiguous host gradients in a dtype the library reads."""
        keep, buffers = [], []
        append = buffers.append
        for unit, gs in enumerate(grads):
            for g in gs:
                dt = _DTYPES.get(g.dtype)
                if g.requires_grad or dt is None or not g.is_contiguous():
                    if g.requires_grad:  # backward(create_graph=True)
                        g = g.detach()
                    if dt is None:
                        g = g.float()
                        dt = _DTYPES[g.dtype]
                    g = g.contiguous()
                    keep.append(g)  # a copy: alive until reduced
                append((unit, g.data_ptr(), g.numel(), dt))
        return keep, buffers

    def caller_stream(self):
        """The current CUDA stream of the first CUDA parameter's device, on
        the calling thread; None without CUDA parameters."""
        for ps in self._params:
            for p in ps:
                if p.is_cuda:
                    return torch.cuda.current_stream(p.device)
        return None

    def report(self, t, high, stream=None, threads=None):
        """Reduces and reports step t's gradients (high: the units' routes,
        for `shadow`); stream: the caller's CUDA stream when this runs on a
        worker thread; threads: the host pass's, else self.threads."""
        if threads is None:
            threads = self.threads
        if stream is not None:  # a worker thread: the caller's stream
            with torch.cuda.stream(stream):
                return self._report_on(t, high, stream, threads)
        return self._report_on(t, high, None, threads)

    def _any_table(self):
        """(gnmr_tensor table, its length, tensors to keep alive while it
        is read, device): device None when every gradient is on the host;
        a CUDA device when every gradient is a plain p.grad (or main_grad)
        on it, readable as it is (the kept table); None when neither."""
        if self._kept is not None:
            return self._cached_table()
        return self._walk_table()

    def _host_table(self):
        """_any_table() when every gradient is on the host, else None."""
        table = self._any_table()
        return table if table is not None and table[3] is None else None

    def _cached_table(self):
        """_any_table() of plain p.grad gradients (or every parameter's
        main_grad) at the cost of reading their pointers: the table is
        kept (_HostTable), on the host and for gradients all on one CUDA
        device (the kernel's table, which the library uploads only when
        it changed). A main_grad that is None reads the parameters
        again (_walk_table), as a missing p.grad does. While every
        gradient it was made from is alive and the pointers read now are
        the ones it holds, it is used as it is: a tensor's dtype, size and
        device are its parameter's, and a gradient replaced by another
        tensor at the same address while the old one lives on (a view of
        it) is read as the old one's memory, as the table says (docs/
        python.md, "What a step costs"). Otherwise the gradients are read
        again and checked (device, contiguity, dtype, size) before the
        pointers are rewritten: after zero_grad(set_to_none=True) (new
        tensors each step), a storage replaced in place (module.double()
        with gradients present)."""
        flat = self._flat_list()
        if flat is None:
            return self._walk_table()
        c = self._hcache
        if c is not None:
            got = self._kept_still(c, flat)
            if got is _WALK:
                return self._walk_table()
            if got is not None:
                return got
        return self._new_table(flat, c)

    def _flat_list(self):
        """The parameters the kept table reads (made once, and again
        after a parameter gained or lost its gradient), or None where the
        table cannot stand (the step walks them)."""
        flat = self._flat
        if flat is None:
            pairs = [(u, p) for u, ps in enumerate(self._params) for p in ps]
            self._frozen = []
            if self._kept is not _MAIN:  # parameters without a gradient
                # now (LoRA's frozen base weights, a unit out of the
                # loss) left out while they have none
                self._frozen = [p for _, p in pairs if p.grad is None]
                pairs = [(u, p) for u, p in pairs if p.grad is not None]
            flat = self._flat = [p for _, p in pairs]
            self._flat_units = [u for u, _ in pairs]
            units = set(self._flat_units)
            self._bare = [u not in units for u in range(len(self._params))]
            self._hcache = None  # made for another list
        if self._frozen and not all(map(is_, map(_GRAD, self._frozen),
                                        repeat(None))):
            # one of them has a gradient now: counted as the walk counts
            # it; the lists are made again at the next step
            self._flat = None
            return None
        return flat or None  # no parameter to keep: the walk

    def _kept_still(self, c, flat):
        """The kept table c when it still holds (the table's answer), None
        when it is to be made again, _WALK when the step must walk."""
        if c.died[0]:
            self._fresh += 1  # new gradient tensors (set_to_none)
            return None
        if c.storages is not None:
            if self._static(c, flat):
                self._misses = self._fresh = 0
                # the buffers, held by the table, are what a kernel reads
                return c.buf, len(flat), [], c.device
            self._misses += 1
            if self._misses >= 3:  # moved step after step: exact
                self.spot = 0
            return None
        try:  # one C-level pass: each gradient and its pointer
            if c.device is None:
                grads = []
                ptrs = list(map(_T.data_ptr, map(self._kept, flat)))
            else:  # a kernel reads them after this returns: held until
                # the next report, as the walk's are
                grads = list(map(self._kept, flat))
                ptrs = list(map(_T.data_ptr, grads))
        except (TypeError, AttributeError):  # one without
            self._flat = None  # the lists made again next step
            return _WALK
        if ptrs == c.ptrs:
            self._fresh = 0
            return c.buf, len(ptrs), grads, c.device
        return None

    def _new_table(self, flat, c):
        """The gradients read again and checked (device, contiguity,
        dtype, size) and the kept table's pointers rewritten (a new table
        where dtypes or sizes changed); the walk where they do not fit."""
        try:
            grads = list(map(self._kept, flat))
            ptrs = list(map(_T.data_ptr, grads))
        except (TypeError, AttributeError):  # a parameter without one
            if self._kept is not _MAIN:
                self._flat = None  # the lists made again next step
            return self._walk_table()
        device = None
        if not all(map(_IS_CPU, grads)):
            devices = set(map(_DEVICE, grads))
            device = devices.pop()
            if devices or device.type != "cuda":
                return self._walk_table()  # several devices, or not CUDA
        if not all(map(_T.is_contiguous, grads)):
            return self._walk_table()  # copies to make
        dtypes = list(map(_DTYPE, grads))
        numels = list(map(_T.numel, grads))
        if c is None or dtypes != c.dtypes or numels != c.numels:
            if not all(dt in _DTYPE_CODES for dt in set(dtypes)):
                return self._walk_table()  # read as float32 copies
            c = self._hcache = _HostTable(dtypes, numels, self._flat_units)
        c.ptr_words[:] = array("Q", ptrs)
        c.ptrs, c.device = ptrs, device
        c.storages, c.spot = None, 0
        if self._fresh >= 2 and self._fresh % self.rewatch:
            # new tensors step after step: weak references would die
            # unused, and 20,000 of them a step bring the garbage
            # collector's full passes (200 ms stalls at 10,000 units); the
            # next step reads and checks the gradients again, and one step
            # in `rewatch` watches them, to find them kept again
            c.refs, c.died = [], [True]
            return c.buf, len(grads), grads if device is not None else [], \
                device
        c.watch(grads)
        if self._kept is _MAIN and self.spot > 0:
            sts = list(map(_T.untyped_storage, grads))
            by_ptr = dict(zip(map(_STORAGE_PTR, sts), sts))
            if len(by_ptr) <= _STATIC_STORAGES:
                c.storages = [(st, ptr, st.nbytes())
                              for ptr, st in by_ptr.items()]
        return c.buf, len(grads), grads if device is not None else [], \
            device

    def _static(self, c, flat):
        """Whether c, a table of main_grad views of a few buffers, still
        holds: each buffer at the pointer and size it had (one check a
        buffer), and self.spot of the views, in turn, the same tensors at
        the same pointers. A view replaced by another tensor or moved in
        place is found within len(flat) / self.spot steps (or at once,
        when its old tensor dies: c.died); until then its unit is read
        from the memory the view had, which the table keeps allocated
        (docs/python.md, "What a step costs")."""
        for st, ptr, nbytes in c.storages:
            if st.data_ptr() != ptr or st.nbytes() != nbytes:
                return False
        i = c.spot
        j = min(i + self.spot, len(flat))
        try:
            views = list(map(self._kept, flat[i:j]))
            if not all(map(is_, views, map(_DEREF, c.refs[i:j]))) or \
                    list(map(_T.data_ptr, views)) != c.ptrs[i:j]:
                return False
        except (TypeError, AttributeError):  # a main_grad None or gone
            return False
        c.spot = j if j < len(flat) else 0
        return True

    def _walk_table(self):
        """_any_table() of host gradients in one pass over the parameters,
        packing the table as it goes: any layout (shards, main_grad,
        parameters without a gradient, copies of gradients the library
        cannot read as they are); None when one is on a device."""
        self.walks += 1
        buf, size, pack = self._table, _TENSOR.size, _TENSOR.pack_into
        keep, i = [], 0
        simple, skip, read = self._simple, self._skip, self._grad
        for unit, ps in enumerate(self._params):
            for p in ps:
                g = p.grad if simple else read(p)
                if g is None:
                    continue
                if g.is_cuda:
                    return None
                if (i + 1) * size > len(buf):  # grown, never resized in place
                    buf = self._table = bytearray(bytes(buf) +
                                                  bytes(len(buf) + size))
                if skip and id(p) in skip:  # seen, counted by another rank
                    pack(buf, i * size, 0, 0, 0, unit, 0.0)
                    i += 1
                    continue
                code = _DTYPE_CODES.get(g.dtype)
                if g.requires_grad or code is None or not g.is_contiguous():
                    if g.requires_grad:  # backward(create_graph=True)
                        g = g.detach()
                    if code is None:
                        g = g.float()
                        code = _DTYPE_CODES[g.dtype]
                    g = g.contiguous()
                    keep.append(g)  # a copy: alive until reduced
                pack(buf, i * size, g.data_ptr(), g.numel(), code, unit, 0.0)
                i += 1
        return buf, i, keep, None

    def _grad(self, p):
        """p's gradient as a plain tensor of this rank's elements."""
        g = grad_of(p)
        if g is not None and self.layout.mesh is None and \
                _layout.DTensor is not None and \
                isinstance(g, _layout.DTensor):
            raise ValueError(
                "gnmr: the gradients are DTensors but the parameters were "
                "not when the Controller was made: make it after "
                "fully_shard()/parallelize_module(), so that it reads the "
                "DeviceMesh and the parameters the model trains")
        return _local(g)

    def _shadow_units(self, high):
        """The units on their recovery path whose low-cost path `shadow`
        says would have been damaged at this step (with shadow_low, those
        on the low-cost path it says were)."""
        if self.shadow is None:
            return []
        low = self.shadow_low
        return [u for u, (name, m) in enumerate(self.units)
                if (high[u] or low) and self.shadow(name, m)]

    def _reduce_host(self, threads, table):
        """A _host_table() reduced: (sumsq, nonfinite, seen) as ctypes
        arrays, the sums straight into the arrays a report is sent from."""
        buf, count, keep, _ = table
        n = len(self._params)
        sumsq = (ctypes.c_double * n)()
        nonfinite = (ctypes.c_uint64 * n)()
        seen = (ctypes.c_uint8 * n)()
        if count:
            arr = (_Tensor * count).from_buffer(buf)
            rv = (lib().gnmr_reduce_cpu(arr, count, n, sumsq, nonfinite, seen)
                  if threads == 1 else
                  lib().gnmr_reduce_cpu_threads(arr, count, n, sumsq,
                                                nonfinite, seen, threads))
            del arr  # releases buf for the next step's growth
            if rv != 0:
                raise GnmrError(rv, "reduce")
        del keep
        return sumsq, nonfinite, seen

    def _unit_grads(self):
        """Per unit, the local gradients counted here and whether the unit
        has a gradient at all (counted here or by another reporter)."""
        grads, has = [], []
        skip = self._skip
        for ps in self._params:
            gs, any_g = [], False
            for p in ps:
                g = self._grad(p)
                if g is None:
                    continue
                any_g = True
                if id(p) not in skip:
                    gs.append(g)
            grads.append(gs)
            has.append(any_g)
        return grads, has

    def local_sums(self, threads=None):
        """(sumsq, nonfinite, not_reported) of this rank's gradients, as
        lists, without reporting them: for a repeated step."""
        if threads is None:
            threads = self.threads
        table = self._host_table()
        if table is not None:
            sumsq, nonfinite, seen = self._reduce_host(threads, table)
            return list(sumsq), list(nonfinite), [not x for x in seen]
        grads, has = self._unit_grads()
        sumsq, nonfinite = self._mixed_sums(grads, threads)
        return sumsq, nonfinite, [not h for h in has]

    def _mixed_sums(self, grads, threads):
        """Sums of gradients on devices (torch, one synchronisation) and on
        the host (the library)."""
        cuda = [[g for g in gs if g.is_cuda] for gs in grads]
        if any(cuda):
            sumsq, nonfinite = sums_on_device(cuda)
        else:
            sumsq, nonfinite = [0.0] * len(grads), [0] * len(grads)
        keep, buffers = self._buffers([[g for g in gs if not g.is_cuda]
                                       for gs in grads])
        if buffers:
            hs, hn = reduce_cpu(buffers, len(grads), threads)
            sumsq = [a + b for a, b in zip(sumsq, hs)]
            nonfinite = [a + b for a, b in zip(nonfinite, hn)]
        del keep
        return sumsq, nonfinite

    def _note_gradients(self, not_reported):
        """Once, after warn_after reports: the units that never had a
        gradient on this rank, named (a unit outside the loss, parameters
        replaced after the Controller was made)."""
        if self._never is None:
            return
        self._never -= {u for u, nr in enumerate(not_reported) if not nr}
        self._reports += 1
        if self._reports >= max(self.warn_after, 1):
            if self._never:
                names = [self.units[u][0] for u in sorted(self._never)]
                _warn(f"gnmr: {len(names)} unit(s) of job {self.job!r} had "
                      f"no gradient in {self._reports} steps on rank "
                      f"{self.layout.rank}: "
                      f"{', '.join(names[:8])}{', ...' if len(names) > 8 else ''}"
                      " (not in the loss, frozen, or their parameters were "
                      "replaced after the Controller was made: make it after "
                      "fully_shard()/compile()/wrapping)")
            self._never = None

    def _report_host(self, t, threads, table, shadowed=()):
        """Reduces and reports a _host_table()."""
        sumsq, nonfinite, seen = self._reduce_host(threads, table)
        n = len(self._params)
        not_reported = bytes(seen).translate(_FLIP)
        nr = (ctypes.c_uint8 * n).from_buffer_copy(not_reported)
        # the arrays are kept: a list of 10,000 would cost more than the
        # reduction
        self.shadowed = [u for u in shadowed if seen[u]]
        sh = None
        if self.shadowed:  # scored as the low-cost path would have made
            sh = (ctypes.c_uint8 * n)()  # it, recorded as shadowed
            for u in self.shadowed:
                sh[u] = 1
        self.agent.report_sums(t, sumsq, nonfinite, not_reported=nr,
                               shadowed=sh)
        self.local = (sumsq, nonfinite, not_reported)

    def _report_on(self, t, high, stream, threads):
        self.local = None
        self.reduced = None
        self.shadowed = []
        self.measured = None
        if self.agent.observer:  # another replica reports this shard
            self.agent.report_sums(t, [0.0] * len(self._params))
            return
        shadowed = self._shadow_units(high)
        if self.measure is not None:  # sent with this step's report
            self.measured = [self.measure(name, m) for name, m in self.units]
            self.agent.measure(t, self.measured)
        table = self._any_table()
        if table is not None and table[3] is not None:  # one CUDA device
            if not shadowed and self._cuda_reducer(table[3]) is not None:
                # the kept table, read by the kernel on the current stream
                # (no per-unit Python a step; the library uploads it only
                # when it changed); the gradients kept one step, as below
                buf, count, keep, device = table
                self._keep = keep
                self._note_gradients(self._bare)
                if stream is None:
                    stream = torch.cuda.current_stream(device)
                self.cuda.report_table(t, buf, count, stream.cuda_stream)
                self._kernel = (t, stream)
                return
            table = None
        if table is not None:
            self._report_host(t, threads, table, shadowed)
            self._note_gradients(self.local[2])
            if self.clipping:  # the gradients these sums are of
                self.reduced = (t, [(u, p, g, g._version)
                                    for u, ps in enumerate(self._params)
                                    for p in ps
                                    for g in (self._grad(p),)
                                    if g is not None])
            return
        grads, has = self._unit_grads()
        not_reported = [not h for h in has]
        self._note_gradients(not_reported)
        cuda = [g for gs in grads for g in gs if g.is_cuda]
        if cuda and len(cuda) == sum(len(gs) for gs in grads) and \
                len({g.device for g in cuda}) == 1 and not shadowed and \
                not self._skip and \
                self._cuda_reducer(cuda[0].device) is not None:
            # every gradient on one device: the kernel reads them in
            # order on the current stream; copies made here stay valid
            # for it (stream-ordered allocator); keep them one step
            keep, buffers = self._buffers(grads)
            self._keep = (grads, keep)
            if stream is None:
                stream = torch.cuda.current_stream(cuda[0].device)
            self.cuda.report(t, buffers, stream.cuda_stream)
            self._kernel = (t, stream)
            return
        sumsq, nonfinite = self._mixed_sums(grads, threads)
        self.shadowed = [u for u in shadowed if not not_reported[u]]
        mine = set(self.shadowed)  # scored as the low-cost path would
        self.agent.report_sums(t, sumsq, nonfinite,  # have made it
                               not_reported=not_reported,
                               shadowed=[u in mine for u in range(len(
                                   sumsq))] if mine else None)
        self.local = (sumsq, nonfinite, not_reported)
