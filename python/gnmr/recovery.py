# SPDX-License-Identifier: MIT
"""Ready-made low-cost and recovery paths for `Controller(on_route=...)`.

Each module here is a drop-in `torch.nn.Linear` with two paths, chosen by
its `recovery` attribute (False: the low-cost path, True: the recovery
path). The forward GEMM is exact on both paths; what differs is the copy
of the input activation that the module saves for backward, which the
weight-gradient GEMM reads (low-precision activation storage, the part of
a low-precision recipe whose error reaches only this unit's weights):

- `FP8Linear`: the low path stores the activation as FP8 (E4M3 by default)
  with *delayed scaling*: the scale comes from the largest amax of the
  last `history` training steps, divided by 2**margin (Transformer
  Engine's DelayedScaling formula, scale = fp8_max / amax / 2**margin).
  An activation that outgrows that stale amax does not fit: a saturating
  cast clips it to +-fp8_max, a non-saturating cast turns it into NaN, as
  a raw cast of an out-of-range value does in E4M3FN. The recovery path
  stores the exact activation.
- `KBitLinear`: the low path stores a `low_bits` integer copy with a
  per-tensor scale taken from the tensor itself; the recovery path stores
  a `high_bits` copy (or the exact activation when high_bits is None).

Both count, at every forward, what the low path does or would do to the
current input (`low_overflow`: elements that do not fit the low path's
stale FP8 range; `low_error`: relative L2 error of the low-path copy), on
either path, so a caller can measure damage that recovery hid.

    from gnmr.recovery import FP8Linear, convert, switch
    convert(model, FP8Linear, select=(torch.nn.Linear,), pattern=r"blocks")
    ctl = Controller(model, endpoint, job, select=(FP8Linear,),
                     on_route=switch, shadow=fp8_overflowed)

`switch` sets `module.recovery`, so the route takes effect at the module's
next forward. `fp8_overflowed` tells the controller when a unit on its
recovery path would have been damaged on the low-cost path, so that GNMR
keeps it there (Controller's `shadow`). Only training forwards (grad enabled, module.training)
record amax: evaluation and probes leave the scale alone.
"""
import math
import re

import torch
import torch.nn.functional as F

from .quant import round_magnitude

# (mantissa bits, smallest normal exponent, largest finite value, has inf)
FP8_FORMATS = {"e4m3": (3, -6, 448.0, False),
               "e5m2": (2, -14, 57344.0, True)}


def fake_fp8(x, fmt="e4m3", saturate=True):
    """x rounded to the nearest FP8 value (round half to even, subnormals
    kept), in x's dtype. Out of range: +-max when saturate, else NaN
    (E4M3FN has no infinity) or +-inf (E5M2). NaN stays NaN."""
    try:
        mbits, emin, fmax, has_inf = FP8_FORMATS[fmt]
    except KeyError:
        raise ValueError(f"unknown FP8 format {fmt!r} (e4m3 or e5m2)") \
            from None
    xf = x.float()
    a = xf.abs()
    q = round_magnitude(a, mbits, emin)   # normals and subnormals
    if saturate:
        q = torch.where(torch.isnan(a), a, q.clamp(max=fmax))
    else:
        q = q.masked_fill(q > fmax, math.inf if has_inf else math.nan)
    return torch.copysign(q, xf).to(x.dtype)


def _int_dtype(bits):
    return torch.int8 if bits <= 8 else torch.int16


def _int_scale(x, bits):
    """The per-tensor scale of a `bits`-bit grid: amax / qmax, a 0-dim
    fp64 tensor on x's device (no host read)."""
    qmax = 2 ** (bits - 1) - 1
    return x.detach().abs().amax().double() / qmax if x.numel() else \
        torch.zeros((), dtype=torch.float64, device=x.device)


def _int_codes(x, bits, scale):
    """x's integer codes on the grid (int8 for bits <= 8, else int16)."""
    qmax = 2 ** (bits - 1) - 1
    safe = torch.where(scale > 0, scale, 1.0)
    return (x / safe).round().clamp(-qmax, qmax).to(_int_dtype(bits))


def _int_decode(codes, scale, like):
    """The values of codes: like's dtype; x itself when scale is 0 (an
    all-zero x), NaN where scale is not finite."""
    q = codes.to(like.dtype) * scale
    return torch.where(torch.isfinite(scale), torch.where(scale > 0, q, like),
                       math.nan)


def fake_int(x, bits, scale=None):
    """x rounded to a signed `bits`-bit grid with a per-tensor scale
    (the tensor's own amax / qmax unless scale is given)."""
    if not 2 <= bits <= 16:
        raise ValueError(f"bits must be 2..16, not {bits}")
    if scale is None:
        scale = _int_scale(x, bits)
    scale = torch.as_tensor(scale, dtype=torch.float64, device=x.device)
    return _int_decode(_int_codes(x, bits, scale), scale, x)


# the smallest magnitude that rounds past the largest finite value (round
# half to even: 464 rounds down to 448 in E4M3, 61440 up to 65536 in E5M2),
# and what it becomes without saturation
_PAST_MAX = {"e4m3": (464.0, False), "e5m2": (61440.0, True)}
_OUT_OF_RANGE = {"e4m3": math.nan, "e5m2": math.inf}


def _rounds_past_max(x, fmt):
    at, inclusive = _PAST_MAX[fmt]
    a = x.abs()
    return (a >= at) if inclusive else (a > at)


_FP8_DTYPES = {"e4m3": getattr(torch, "float8_e4m3fn", None),
               "e5m2": getattr(torch, "float8_e5m2", None)}


def _fp8_cast(x, s, fmt, saturate):
    """x * s in FP8: torch's float8 dtype where torch has it (rounding as
    fake_fp8 does, tested), else x's dtype rounded as FP8."""
    xs = x * s
    native = _FP8_DTYPES[fmt]
    if native is None:
        return fake_fp8(xs, fmt, saturate)
    if saturate:
        fmax = FP8_FORMATS[fmt][2]
        xs = xs.clamp(-fmax, fmax)
    else:  # torch's own out-of-range cast changed (2.15 saturates
        # E4M3): what does not fit is set first
        xs = torch.where(_rounds_past_max(xs, fmt),
                         _OUT_OF_RANGE[fmt] * xs.sign(), xs)
    return xs.to(native)


class DelayedScaling:
    """An amax history and the scale it gives (per tensor).

    scale = fp8_max / (max of the last `history` recorded amax) / 2**margin;
    before anything is recorded, the current tensor's own amax is used
    (the first step has no history to be stale). The history is a tensor
    on the activations' device: recording and scaling read nothing back to
    the host (`amax` and `scale()` do, for inspection)."""

    def __init__(self, fmt="e4m3", history=16, margin=0, saturate=True):
        if fmt not in FP8_FORMATS:
            raise ValueError(f"unknown FP8 format {fmt!r} (e4m3 or e5m2)")
        if history < 1:
            raise ValueError("history must be >= 1")
        self.fmt, self.history, self.margin = fmt, int(history), margin
        self.saturate = saturate
        self.fmax = FP8_FORMATS[fmt][2]
        self._hist = None       # (history,) fp32, oldest first, 0-padded
        self._n = None          # how many of them were recorded (0-dim)

    def _to(self, device):
        """Makes or moves the history to device (the module's weight's:
        made at construction, not inside a compiled graph, which would
        then be compiled again at the next step)."""
        if self._hist is None or self._hist.device.type == "meta":
            self._hist = torch.zeros(self.history, device=device)
            self._n = torch.zeros((), dtype=torch.int64, device=device)
        elif self._hist.device != device:
            self._hist, self._n = self._hist.to(device), self._n.to(device)

    def _state(self, device):
        if self._hist is None or self._hist.device != device:
            self._hist = torch.zeros(self.history, device=device)
            self._n = torch.zeros((), dtype=torch.int64, device=device)
        return self._hist, self._n

    @property
    def amax(self):
        """The recorded amax values, oldest first (a host read)."""
        if self._hist is None:
            return []
        n = int(self._n)
        return self._hist[self.history - n:].tolist() if n else []

    def _scale_t(self, current_amax):
        """The scale as a 0-dim fp64 tensor (current_amax: a tensor)."""
        hist, n = self._state(current_amax.device)
        ref = torch.where(n > 0, hist.max().double(),
                          current_amax.double())
        ok = (ref > 0) & torch.isfinite(ref)
        return torch.where(ok, self.fmax / torch.where(ok, ref, 1.0) /
                           2.0 ** self.margin, 1.0)

    def scale(self, current_amax=None):
        """The scale as a float (a host read)."""
        dev = self._hist.device if self._hist is not None else "cpu"
        cur = torch.tensor(math.nan if current_amax is None else
                           current_amax, dtype=torch.float64, device=dev)
        return float(self._scale_t(cur))

    def record(self, amax):
        """Adds amax (a float or 0-dim tensor) to the history, unless it is
        not finite."""
        dev = amax.device if torch.is_tensor(amax) else (
            self._hist.device if self._hist is not None else "cpu")
        hist, n = self._state(dev)
        a = torch.as_tensor(amax, dtype=torch.float32, device=dev).reshape(1)
        ok = torch.isfinite(a)
        self._hist = torch.where(ok, torch.cat([hist[1:], a]), hist)
        self._n = torch.where(ok[0], torch.clamp(n + 1, max=self.history), n)

    def encode(self, x, record=True, cast=True):
        """(x * scale in FP8 as torch's float8 dtype where torch has it,
        else in x's dtype, rounded as FP8; the scale, a 0-dim tensor; the
        number of elements out of range, a 0-dim tensor). Records x's amax
        afterwards when `record`; payload None when not `cast`."""
        a = x.detach().abs()
        amax = a.amax() if x.numel() else torch.zeros((), device=x.device)
        s = self._scale_t(amax)
        over = (a > self.fmax / s).sum()
        payload = _fp8_cast(x, s, self.fmt, self.saturate) if cast else None
        if record:
            self.record(amax)
        return payload, s, over

    def quantize(self, x, record=True, cast=True):
        """(x through the FP8 cast at the delayed scale, in x's dtype, or
        None when not `cast`; the number of elements out of range, a 0-dim
        tensor). Records x's amax afterwards when `record`."""
        payload, s, over = self.encode(x, record, cast)
        return (payload.to(x.dtype) / s if cast else None), over


def _autocast_dtype(device_type):
    """The dtype autocast computes matmuls in on this device, or None."""
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return None


class _SavedCopyLinear(torch.autograd.Function):
    """y = x W^T + b exactly; the weight gradient reads a stored copy of x
    (`payload` decoded by `decode`) instead of x itself: the low path's
    copy is FP8 or integer codes, so it really takes less memory.

    Under autocast the GEMMs run in autocast's dtype, as F.linear's would,
    and each gradient comes back in its input's dtype (what
    torch.amp.custom_fwd/custom_bwd do, for any device type: the device
    is the input's)."""

    @staticmethod
    def forward(ctx, x, w, b, payload, scale, decode):
        ctx.decode = decode
        ctx.save_for_backward(payload, scale, w)
        return _forward_gemm(ctx, x, w, b)

    @staticmethod
    def backward(ctx, gy):
        payload, scale, w = ctx.saved_tensors
        saved = ctx.decode(payload, scale, ctx.dt)
        return _backward_gemms(ctx, gy, w, lambda g2: g2.t() @ saved.reshape(
            -1, saved.shape[-1])) + (None, None, None)


def _forward_gemm(ctx, x, w, b):
    """y = x W^T + b in autocast's dtype, as F.linear's would be, with
    the dtypes backward needs kept in ctx."""
    dt = _autocast_dtype(x.device.type)
    ctx.dtypes = (x.dtype, w.dtype, None if b is None else b.dtype)
    ctx.dt = dt if dt is not None else x.dtype
    ctx.has_bias = b is not None
    with torch.autocast(x.device.type, enabled=False):
        if dt is None:
            return F.linear(x, w, b)
        return F.linear(x.to(dt), w.to(dt), None if b is None else b.to(dt))


def _backward_gemms(ctx, gy, w, weight_grad):
    """(input, weight, bias gradients), each in its input's dtype;
    weight_grad(g2): g2^T @ the saved copy, g2 the output gradient as
    rows in the GEMMs' dtype."""
    dt = ctx.dt
    gy = gy.to(dt)
    g2 = gy.reshape(-1, gy.shape[-1])
    with torch.autocast(gy.device.type, enabled=False):
        gx = (gy @ w.to(dt)).to(ctx.dtypes[0])
        gw = weight_grad(g2).to(ctx.dtypes[1])
        gb = g2.sum(0).to(ctx.dtypes[2]) if ctx.has_bias else None
    return gx, gw, gb


def _exact(payload, scale, dt):
    return payload.to(dt)


def _fp8_decode(payload, scale, dt):
    return payload.to(dt) / scale


def _int_decode_bw(payload, scale, dt):
    # an all-zero input has scale 0 and decodes as zeros
    return _int_decode(payload, scale, torch.zeros((), dtype=dt,
                                                   device=payload.device))


_NO_SCALE = {}


def _one(device):
    t = _NO_SCALE.get(device)
    if t is None:
        t = _NO_SCALE[device] = torch.ones((), dtype=torch.float64,
                                           device=device)
    return t


# ---- torch.compile: both paths inside one graph ---------------------------
#
# Compiled, a two-path linear is an autograd.Function whose saved copy is
# made and read by two custom operators (gnmr::save_input in forward,
# gnmr::saved_grad_weight in backward), opaque to the compiler, which read
# the route from a 0-dim CPU tensor at run time: a route change is a value
# change (no recompile, no host synchronisation) and the model is one graph.
# A custom operator's output must have a size known without its data, so
# the copy it saves is always the low path's size (FP8: a byte an element;
# k-bit: the low bits' integer codes). A recovery-path copy of that size
# (k-bit codes of high_bits <= 8) goes there; a larger one (the exact
# input, 16-bit codes) is kept beside it in _KEPT, keyed by the saved
# copy's storage, and freed by the backward that reads it (or, for a
# forward that never gets one, when its saved copy dies). Same numbers as
# the eager path, bit for bit (test_recovery).

_KEPT = {}      # StorageWeakRef.cdata -> (StorageWeakRef, the larger copy)


def _keep(payload, copy):
    from torch.multiprocessing.reductions import StorageWeakRef
    for key in [k for k, (ref, _) in _KEPT.items() if ref.expired()]:
        del _KEPT[key]  # forwards without a backward (a probe, a retry)
    ref = StorageWeakRef(payload.untyped_storage())
    _KEPT[ref.cdata] = (ref, copy)


def _kept(payload):
    from torch.multiprocessing.reductions import StorageWeakRef
    entry = _KEPT.pop(StorageWeakRef(payload.untyped_storage()).cdata, None)
    if entry is None:
        raise RuntimeError(
            "gnmr: the recovery path's saved copy of a compiled two-path "
            "linear was read by a backward already (a second backward "
            "through the same compiled graph)")
    return entry[1]


def _codec(codec):
    """('fp8', fmt, saturate) or ('int', low_bits, high_bits or 0)."""
    kind, a, b = codec.split(":")
    return (kind, a, b == "1") if kind == "fp8" else (kind, int(a), int(b))


def _payload_bytes(kind, a):
    return 1 if kind == "fp8" else _int_dtype(a).itemsize


@torch.library.custom_op("gnmr::save_input", mutates_args=())
def _save_input(x: torch.Tensor, route: torch.Tensor, s_low: torch.Tensor,
                s_high: torch.Tensor, codec: str
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(the saved copy as bytes, its scale, how it was kept: 0 the low
    path's, 1 the recovery path's in the same room, 2 the recovery path's
    in _KEPT); route: 0-dim CPU bool, True for the recovery path."""
    kind, a, b = _codec(codec)
    how = 0
    if kind == "fp8":
        if not bool(route):
            p, s = _fp8_cast(x, s_low, a, b), s_low
        else:
            p, s, how, copy = None, _one(x.device), 2, x.clone()
    else:
        if not bool(route):
            p, s = _int_codes(x, a, s_low), s_low
        elif b and _int_dtype(b) == _int_dtype(a):
            p, s, how = _int_codes(x, b, s_high), s_high, 1
        else:
            s, how = (s_high if b else _one(x.device)), 2
            p, copy = None, _int_codes(x, b, s_high) if b else x.clone()
    if p is None:
        p = torch.empty(x.numel() * _payload_bytes(kind, a),
                        dtype=torch.uint8, device=x.device)
        _keep(p, copy)
    else:
        p = p.contiguous().view(torch.uint8).reshape(-1)
    return p, s.clone(), torch.tensor(how)


@_save_input.register_fake
def _(x, route, s_low, s_high, codec):
    kind, a, _ = _codec(codec)
    return (x.new_empty((x.numel() * _payload_bytes(kind, a),),
                        dtype=torch.uint8),
            s_low.new_empty((), dtype=torch.float64),
            torch.empty((), dtype=torch.int64, device="cpu"))


@torch.library.custom_op("gnmr::saved_grad_weight", mutates_args=())
def _saved_grad_weight(g2: torch.Tensor, payload: torch.Tensor,
                       scale: torch.Tensor, how: torch.Tensor, k: int,
                       codec: str) -> torch.Tensor:
    """g2^T @ the saved copy decoded in g2's dtype (g2: the output
    gradient as rows, k: the input's last dimension)."""
    kind, a, b = _codec(codec)
    dt, h = g2.dtype, int(how)
    if h == 2:
        copy = _kept(payload)
        saved = (copy.to(dt) if copy.is_floating_point()
                 else _int_decode_bw(copy, scale, dt))
    elif kind == "fp8":
        saved = _fp8_decode(payload.view(_FP8_DTYPES[a]), scale, dt)
    else:
        saved = _int_decode_bw(payload.view(_int_dtype(a)), scale, dt)
    return g2.t() @ saved.reshape(-1, k)


@_saved_grad_weight.register_fake
def _(g2, payload, scale, how, k, codec):
    return g2.new_empty((g2.shape[1], k))


class _CompiledSavedLinear(torch.autograd.Function):
    """_SavedCopyLinear's graph-friendly twin: the same GEMMs and dtypes,
    the saved copy made and read by the custom operators above."""

    @staticmethod
    def forward(ctx, x, w, b, route, s_low, s_high, codec):
        ctx.codec, ctx.k = codec, x.shape[-1]
        payload, scale, how = torch.ops.gnmr.save_input(
            x.detach(), route, s_low, s_high, codec)
        ctx.save_for_backward(payload, scale, how, w)
        return _forward_gemm(ctx, x, w, b)

    @staticmethod
    def backward(ctx, gy):
        payload, scale, how, w = ctx.saved_tensors
        return _backward_gemms(
            ctx, gy, w, lambda g2: torch.ops.gnmr.saved_grad_weight(
                g2, payload, scale, how, ctx.k, ctx.codec)) + \
            (None, None, None, None)


class _Routed:
    """A two-path module's route: `recovery`, a bool the eager path reads,
    and the same value as a 0-dim CPU tensor (`_route`) that a compiled
    graph reads at run time (no recompile when it changes)."""

    _recovery = False
    _route = None

    @property
    def recovery(self):
        """True while the unit takes its recovery path."""
        return self._recovery

    @recovery.setter
    def recovery(self, high):
        self._recovery = bool(high)
        if self._route is None:
            self._route = torch.zeros((), dtype=torch.bool)
        self._route.fill_(self._recovery)


class _TwoPathLinear(_Routed, torch.nn.Linear):
    def __init__(self, in_features, out_features, bias=True, **kw):
        super().__init__(in_features, out_features, bias, **kw)
        self.recovery = False  # its route tensor made here, not in a graph
        self._overflow = 0      # FP8: at the last forward, either path
        self._err = 0.0         # k-bit: at the last forward, either path

    @property
    def low_overflow(self):
        """Input elements the low path's stale FP8 scale could not hold at
        the last training forward, on either path (a host read)."""
        return int(self._overflow)

    @property
    def low_error(self):
        """Relative L2 error of the low path's copy of the last training
        forward's input, on either path (a host read)."""
        return float(self._err)

    def _store(self, x, record, need=True):
        """(payload, scale, decode): the copy of x that backward reads
        (None when not `need`: no backward), setting the low path's
        statistics (low_overflow, low_error) either way."""
        raise NotImplementedError

    def _saved_copy(self, x, record, need=True):
        """The copy of x the weight gradient would read, decoded in x's
        dtype (for inspection; forward keeps the encoded one)."""
        payload, scale, decode = self._store(x.detach(), record)
        return decode(payload, scale, x.dtype)

    def forward(self, x):
        # Route changes must not recompile a compiled model: dynamo would
        # guard on `recovery` (a plain bool) and compile a graph for each
        # combination of routes. Compiled, the route is read at run time
        # from a tensor, inside the graph (see _CompiledSavedLinear).
        if torch.compiler.is_compiling():
            return self._forward_compiled(x)
        grad = torch.is_grad_enabled()
        stored = self._store(x.detach(), self.training and grad, grad)
        if not grad:  # the statistics only: an evaluation, a probe
            return F.linear(x, self.weight, self.bias)
        payload, scale, decode = stored
        return _SavedCopyLinear.apply(x, self.weight, self.bias, payload,
                                      scale, decode)

    def _forward_compiled(self, x):
        grad = torch.is_grad_enabled()
        s_low, s_high = self._scales(x.detach(), self.training and grad)
        if not grad:
            return F.linear(x, self.weight, self.bias)
        return _CompiledSavedLinear.apply(x, self.weight, self.bias,
                                          self._route, s_low, s_high,
                                          self._codec())

    def _scales(self, x, record):
        """(the low path's scale, the recovery path's), 0-dim fp64 device
        tensors, setting the low path's statistics as _store does."""
        raise NotImplementedError

    def _codec(self):
        raise NotImplementedError

    def _note(self, x, low):
        n = x.float().norm()
        err = (low.float() - x.float()).norm()
        rel = torch.where(n > 0, err / torch.where(n > 0, n, 1.0), 0.0)
        self._err = torch.where(torch.isfinite(err), rel, math.inf)

    def extra_repr(self):
        return super().extra_repr() + f", recovery={self.recovery}"


class FP8Linear(_TwoPathLinear):
    """Linear whose saved input activation is FP8 with delayed scaling on
    the low path (torch's float8 dtype: one byte an element) and exact on
    the recovery path (see the module doc)."""

    def __init__(self, in_features, out_features, bias=True, fmt="e4m3",
                 history=16, margin=0, saturate=True, **kw):
        super().__init__(in_features, out_features, bias, **kw)
        self.scaling = DelayedScaling(fmt, history, margin, saturate)
        self._placed()

    def _placed(self):
        self.scaling._to(self.weight.device)

    def _apply(self, fn, *a, **kw):
        out = super()._apply(fn, *a, **kw)
        self._placed()  # .to(), .cuda(), to_empty(): the history follows
        return out

    def _store(self, x, record, need=True):
        payload, s, self._overflow = self.scaling.encode(
            x, record, cast=need and not self.recovery)
        if not need:
            return None
        if self.recovery:
            return x, _one(x.device), _exact
        return payload, s, _fp8_decode

    def _scales(self, x, record):
        _, s, self._overflow = self.scaling.encode(x, record, cast=False)
        return s, torch.ones_like(s)

    def _codec(self):
        return f"fp8:{self.scaling.fmt}:{int(bool(self.scaling.saturate))}"


class KBitLinear(_TwoPathLinear):
    """Linear whose saved input activation is `low_bits` integer codes
    (per-tensor scale; int8 storage) on the low path and `high_bits` codes
    (or exact, when None) on the recovery path."""

    def __init__(self, in_features, out_features, bias=True, low_bits=4,
                 high_bits=8, **kw):
        super().__init__(in_features, out_features, bias, **kw)
        fake_int(torch.zeros(1), low_bits)  # validates
        if high_bits is not None:
            fake_int(torch.zeros(1), high_bits)
        self.low_bits, self.high_bits = low_bits, high_bits

    def _store(self, x, record, need=True):
        s = _int_scale(x, self.low_bits)
        codes = _int_codes(x, self.low_bits, s)
        self._note(x, _int_decode(codes, s, x))
        if not need:
            return None
        if not self.recovery:
            return codes, s, _int_decode_bw
        if self.high_bits is None:
            return x, _one(x.device), _exact
        s = _int_scale(x, self.high_bits)
        return _int_codes(x, self.high_bits, s), s, _int_decode_bw

    def _scales(self, x, record):
        s = _int_scale(x, self.low_bits)
        self._note(x, _int_decode(_int_codes(x, self.low_bits, s), s, x))
        return s, (_int_scale(x, self.high_bits) if self.high_bits
                   else torch.ones_like(s))

    def _codec(self):
        return f"int:{self.low_bits}:{self.high_bits or 0}"


def fp8_overflowed(name, module):
    """A `shadow` for Controller: True when the module's last training
    forward had input elements that its low-cost path's stale FP8 scale
    could not hold (FP8Linear.low_overflow, counted on either path), that
    is, when the low-cost path would have been damaged at this step."""
    return getattr(module, "low_overflow", 0) > 0


def low_error(name, module):
    """A `measure` for Controller (the measured signal, docs/policy.md):
    the relative L2 error of the unit's low-cost path at its last training
    forward (`low_error` of FP8Linear, KBitLinear, gnmr.quant.QuantLinear;
    for a unit that holds several, a block, the largest), measured on
    either path; None when the unit has none (nothing measured). gnmrd
    judges it against the unit's own history: no bound to choose."""
    e = getattr(module, "low_error", None)
    if e is not None:
        return float(e)
    found = [float(m.low_error) for m in module.modules()
             if m is not module and isinstance(
                 getattr(type(m), "low_error", None), property)]
    return max(found) if found else None


def switch(name, module, high):
    """An on_route for Controller: the unit takes its recovery path while
    gnmrd has it active."""
    module.recovery = bool(high)


def _replace(model, name, old, new):
    """model's submodule `name` (old) becomes new, in old's mode."""
    new.train(old.training)
    parent, _, attr = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, attr, new)


def convert(model, cls, select=(torch.nn.Linear,), pattern=None, **kw):
    """Replaces, in place, every module of type `select` whose qualified
    name matches `pattern` (all when None) by cls(..., **kw) with the same
    parameters. Returns the names replaced; ValueError when none."""
    rx = re.compile(pattern) if pattern else None
    done = []
    for name, mod in list(model.named_modules()):
        if type(mod) not in tuple(select) or (rx and not rx.search(name)):
            continue
        new = cls(mod.in_features, mod.out_features, mod.bias is not None,
                  **kw)
        new.weight, new.bias = mod.weight, mod.bias
        if hasattr(new, "_placed"):
            new._placed()
        _replace(model, name, mod, new)
        done.append(name)
    if not done:
        raise ValueError(f"convert: no module of type "
                         f"{[c.__name__ for c in select]} matches "
                         f"pattern {pattern!r}")
    return done


# ---- torchao float8 training as the low-cost path: gnmr.torchao_path --------

from .torchao_path import (_torchao_class, torchao_float8,  # noqa: E402,F401
                           torchao_recipes)
