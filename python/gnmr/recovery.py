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
    # normal range: round float32's mantissa to mbits bits, half to even,
    # on the bits (a carry into the exponent is the right answer)
    sh = 23 - mbits
    bits = a.view(torch.int32)
    bits = (bits + ((1 << (sh - 1)) - 1) + ((bits >> sh) & 1)) \
        & ~((1 << sh) - 1)
    q = bits.view(torch.float32)
    # FP8 subnormals: a fixed step of 2**(emin - mbits); exact in float32
    step = 2.0 ** (emin - mbits)
    q = torch.where(a < 2.0 ** emin, torch.round(a * (1 / step)) * step, q)
    if saturate:
        q = torch.where(torch.isnan(a), a, q.clamp(max=fmax))
    else:
        q = q.masked_fill(q > fmax, math.inf if has_inf else math.nan)
    return torch.copysign(q, xf).to(x.dtype)


def fake_int(x, bits, scale=None):
    """x rounded to a signed `bits`-bit grid with a per-tensor scale
    (the tensor's own amax / qmax unless scale is given)."""
    if not 2 <= bits <= 16:
        raise ValueError(f"bits must be 2..16, not {bits}")
    qmax = 2 ** (bits - 1) - 1
    if scale is None:
        scale = float(x.detach().abs().max()) / qmax
    if scale <= 0 or not math.isfinite(scale):
        return x.clone() if scale <= 0 else x * math.nan
    return (x / scale).round().clamp(-qmax, qmax) * scale


class DelayedScaling:
    """An amax history and the scale it gives (per tensor).

    scale() = fp8_max / (max of the last `history` recorded amax) / 2**margin;
    before anything is recorded, the current tensor's own amax is used
    (the first step has no history to be stale)."""

    def __init__(self, fmt="e4m3", history=16, margin=0, saturate=True):
        if fmt not in FP8_FORMATS:
            raise ValueError(f"unknown FP8 format {fmt!r} (e4m3 or e5m2)")
        if history < 1:
            raise ValueError("history must be >= 1")
        self.fmt, self.history, self.margin = fmt, int(history), margin
        self.saturate = saturate
        self.fmax = FP8_FORMATS[fmt][2]
        self.amax = []          # the last `history` recorded amax values

    def scale(self, current_amax=None):
        ref = max(self.amax) if self.amax else current_amax
        if ref is None or not ref > 0 or not math.isfinite(ref):
            return 1.0
        return self.fmax / ref / 2.0 ** self.margin

    def record(self, amax):
        if math.isfinite(amax):
            self.amax.append(amax)
            del self.amax[:-self.history]

    def quantize(self, x, record=True, cast=True):
        """(x through the FP8 cast at the delayed scale, or None when not
        `cast`; the number of elements out of range). Records x's amax
        afterwards when `record`."""
        a = x.detach().abs()
        amax = float(a.max()) if x.numel() else 0.0
        s = self.scale(amax)
        over = int((a > self.fmax / s).sum()) if amax * s > self.fmax else 0
        q = fake_fp8(x * s, self.fmt, self.saturate) / s if cast else None
        if record:
            self.record(amax)
        return q, over


class _SavedCopyLinear(torch.autograd.Function):
    """y = x W^T + b exactly; the weight gradient reads `saved` instead of
    x (the input gradient needs only W)."""

    @staticmethod
    def forward(ctx, x, saved, w, b):
        ctx.save_for_backward(saved, w)
        ctx.has_bias = b is not None
        return F.linear(x, w, b)

    @staticmethod
    def backward(ctx, gy):
        saved, w = ctx.saved_tensors
        g2 = gy.reshape(-1, gy.shape[-1])
        gw = g2.t() @ saved.reshape(-1, saved.shape[-1])
        return (gy @ w, None, gw, g2.sum(0) if ctx.has_bias else None)


class _TwoPathLinear(torch.nn.Linear):
    def __init__(self, in_features, out_features, bias=True, **kw):
        super().__init__(in_features, out_features, bias, **kw)
        self.recovery = False
        self.low_overflow = 0     # FP8: at the last forward, either path
        self.low_error = 0.0      # k-bit: at the last forward, either path

    def _saved_copy(self, x, record, need):
        """The copy to save (None when not `need`: no backward), setting
        low_overflow / low_error for the low path either way."""
        raise NotImplementedError

    def forward(self, x):
        grad = torch.is_grad_enabled()
        saved = self._saved_copy(x.detach(), self.training and grad, grad)
        if not grad:
            return F.linear(x, self.weight, self.bias)
        return _SavedCopyLinear.apply(x, saved, self.weight, self.bias)

    def _note(self, x, low):
        n = float(x.float().norm())
        err = float((low.float() - x.float()).norm())
        self.low_error = (err / n if n > 0 else 0.0) if math.isfinite(err) \
            else math.inf

    def extra_repr(self):
        return super().extra_repr() + f", recovery={self.recovery}"


class FP8Linear(_TwoPathLinear):
    """Linear whose saved input activation is FP8 with delayed scaling on
    the low path and exact on the recovery path (see the module doc)."""

    def __init__(self, in_features, out_features, bias=True, fmt="e4m3",
                 history=16, margin=0, saturate=True, **kw):
        super().__init__(in_features, out_features, bias, **kw)
        self.scaling = DelayedScaling(fmt, history, margin, saturate)

    def _saved_copy(self, x, record, need):
        low, self.low_overflow = self.scaling.quantize(
            x, record, cast=need and not self.recovery)
        return x if self.recovery else low


class KBitLinear(_TwoPathLinear):
    """Linear whose saved input activation is `low_bits` integers (per-
    tensor scale) on the low path and `high_bits` (or exact, when None) on
    the recovery path."""

    def __init__(self, in_features, out_features, bias=True, low_bits=4,
                 high_bits=8, **kw):
        super().__init__(in_features, out_features, bias, **kw)
        fake_int(torch.zeros(1), low_bits)  # validates
        if high_bits is not None:
            fake_int(torch.zeros(1), high_bits)
        self.low_bits, self.high_bits = low_bits, high_bits

    def _saved_copy(self, x, record, need):
        low = fake_int(x, self.low_bits)
        self._note(x, low)
        if not self.recovery:
            return low
        return x if self.high_bits is None else fake_int(x, self.high_bits)


def fp8_overflowed(name, module):
    """A `shadow` for Controller: True when the module's last training
    forward had input elements that its low-cost path's stale FP8 scale
    could not hold (FP8Linear.low_overflow, counted on either path), that
    is, when the low-cost path would have been damaged at this step."""
    return getattr(module, "low_overflow", 0) > 0


def switch(name, module, high):
    """An on_route for Controller: the unit takes its recovery path while
    gnmrd has it active."""
    module.recovery = bool(high)


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
        new.train(mod.training)
        parent, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, attr, new)
        done.append(name)
    if not done:
        raise ValueError(f"convert: no module of type "
                         f"{[c.__name__ for c in select]} matches "
                         f"pattern {pattern!r}")
    return done
