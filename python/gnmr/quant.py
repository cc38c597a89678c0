# SPDX-License-Identifier: MIT
"""Fine-grained low-precision recipes as two-path linears (`recovery`
False: the low-cost recipe, True: the recovery recipe), for
`Controller(on_route=gnmr.recovery.switch)`.

A recipe says how a linear layer's GEMMs see their inputs. Each is a
name:

- `int4-g32`, `int8-g32`, ...: `int<bits>-g<group>`: the activation
  saved for backward as signed integers with one absmax scale per group
  of `group` consecutive features of each token (per-token-group scales,
  as activation-compression methods group them); the forward is exact.
  `int<bits>-tok`: one scale per token (the whole feature row).
- `e4m3-tile`, `e3m2-tile`, `e2m3-tile`: DeepSeek-V3's fine-grained
  scaling: the activation quantized in 1x128 tiles (one scale per token
  and 128 features), the weight in 128x128 blocks, each scale the tile's
  own amax over the format's largest value (so nothing overflows: the
  cast saturates), E4M3 (FP8) or the 6-bit E3M2/E2M3. The forward GEMM
  reads both quantized copies, and so do backward's (the weight gradient
  reads the quantized activation, the input gradient the quantized
  weight); the output gradient stays in the input's precision.
- `int8-row`: LLM.int8's vector-wise INT8 without its outlier split: the
  activation per token, the weight per output channel, absmax int8, in
  the forward GEMM and in backward as above.
- `bf16`: activation and weight rounded to bfloat16 in all three GEMMs.
- `nvfp4`: NVIDIA's NVFP4 in all three GEMMs: every operand in blocks of
  16 along the GEMM's inner dimension, FP4 E2M1 values (round to nearest
  even, saturating at 6), each block's scale an E4M3 number under one
  FP32 scale per tensor (its amax over 448 x 6, current scaling): the
  forward reads the activation and the weight blocked along the input
  features, the input gradient the output gradient and the weight
  blocked along the output features, the weight gradient the output
  gradient and the activation blocked along the tokens (NVIDIA's recipe
  also applies a random Hadamard transform and stochastic rounding to the
  weight gradient's operands; this one rounds to nearest everywhere).
- `nvfp4-block`: `nvfp4` without its per-tensor scale, as torchao's
  NVFP4Tensor.to_nvfp4 quantizes when given no per_tensor_scale (its
  default): each block's scale is its amax over 6 as an E4M3 number, at
  least E4M3's smallest normal 2^-6, so an element under 2^-8 in a block
  whose amax is under 0.09 rounds to zero: most output gradients. Kept to
  measure what leaving the per-tensor scale out costs (docs/experiments.md).
- `mxfp4`: OCP's MXFP4 in all three GEMMs: blocks of 32, E2M1 values,
  each block's scale a power of two (E8M0), 2^(floor(log2 amax) - 2) as
  torchao's default (FLOOR) computes it, so a block's largest values
  saturate at 6.
  The three are bit for bit what torchao's `mx_formats` quantize and
  dequantize (NVFP4Tensor.to_nvfp4 with a per-tensor scale and without,
  MXTensor.to_mx; tests check it), computed here in a few float32 passes.
- `exact`: the layer as torch.nn.Linear computes it.

`QuantLinear(in, out, low="e3m2-tile", high="e4m3-tile")` takes the
low recipe unless `recovery` is set. At every training forward it also
measures what the low recipe does to the current input, on either path:
`low_error`, the relative L2 error of the low recipe's copy of the
activation, feature by feature, averaged over the input features (the
weight gradient's column c reads the activation's feature c, so this is
the mean relative error of its columns; one outlier feature that spoils
its neighbours' scale shows, where a whole-tensor error would be
dominated by the outlier itself), so a caller can measure damage that
recovery hid.

`latent`: a latent outlier feature, as the layer's quantizers see it
(None: none). Set to (features, s), the input features listed are
multiplied by s before either recipe quantizes the activation and the
matching weight columns divided by s before the weight is quantized,
then both copies are scaled back: the exact product is unchanged (so an
`exact` path, and `bf16` up to its rounding, compute what they computed
before), as with the outlier features of real activations whose weights
compensate, while a recipe whose scale a group, tile or row shares
loses the precision of that feature's neighbours (and, for a weight
grid, of the feature's own small column). Tests and experiments set it;
the training side never does.
"""
import math
import re

import torch
import torch.nn.functional as F

# (mantissa bits, smallest normal exponent, largest finite value)
FLOAT_FORMATS = {"e4m3": (3, -6, 448.0), "e5m2": (2, -14, 57344.0),
                 "e3m2": (2, -2, 28.0), "e2m3": (3, 0, 7.5),
                 "e2m1": (1, 0, 6.0)}
TILE = 128
E4M3_TINY = 2.0 ** -6    # the smallest normal E4M3 (NVFP4's least scale)
F32_MIN_NORMAL = 2.0 ** -126


def round_magnitude(a, mbits, emin):
    """|x| (a, float32, non-negative) rounded to a float format with mbits
    mantissa bits and smallest normal exponent emin: round half to even on
    float32's bits in the normal range (a carry into the exponent is the
    right answer), a fixed step of 2**(emin - mbits) below it (exact in
    float32). No saturation: the caller clamps or marks what is too
    large."""
    sh = 23 - mbits
    bits = a.view(torch.int32)
    bits = (bits + ((1 << (sh - 1)) - 1) + ((bits >> sh) & 1)) \
        & ~((1 << sh) - 1)
    q = bits.view(torch.float32)
    step = 2.0 ** (emin - mbits)
    return torch.where(a < 2.0 ** emin, torch.round(a * (1 / step)) * step,
                       q)


def fake_float(x, fmt):
    """x rounded to the nearest value of a small float format (round half
    to even, subnormals kept, saturating at the largest finite value), in
    float32. NaN stays NaN."""
    try:
        mbits, emin, fmax = FLOAT_FORMATS[fmt]
    except KeyError:
        raise ValueError(f"unknown float format {fmt!r} (one of "
                         f"{', '.join(FLOAT_FORMATS)})") from None
    xf = x.float()
    a = xf.abs()
    q = round_magnitude(a, mbits, emin)
    q = torch.where(torch.isnan(a), a, q.clamp(max=fmax))
    return torch.copysign(q, xf)


def _groups(x, group):
    """x viewed as (..., n_groups, group) along its last dimension."""
    n = x.shape[-1]
    if group <= 0 or n % group:
        raise ValueError(f"{n} features do not split into groups of {group}")
    return x.reshape(*x.shape[:-1], n // group, group)


def _safe(scale):
    return torch.where(scale > 0, scale, torch.ones_like(scale))


def int_grouped(x, bits, group):
    """x through a signed `bits`-bit grid with one absmax scale per group
    of `group` consecutive features (group = x.shape[-1]: per row),
    in float32."""
    if not 2 <= bits <= 8:
        raise ValueError(f"bits must be 2..8, not {bits}")
    g = _groups(x.float(), group)
    qmax = 2 ** (bits - 1) - 1
    s = _safe(g.abs().amax(-1, keepdim=True) / qmax)
    return ((g / s).round().clamp(-qmax, qmax) * s).reshape(x.shape)


def float_tiles(x, fmt, tile=TILE):
    """x in 1 x `tile` tiles along its last dimension, each scaled so that
    its amax is the format's largest value, rounded to the format, and
    scaled back (float32). A last dimension under `tile` is one tile."""
    fmax = FLOAT_FORMATS[fmt][2] if fmt in FLOAT_FORMATS else None
    if fmax is None:
        fake_float(x, fmt)      # the error names the formats
    t = min(tile, x.shape[-1])
    g = _groups(x.float(), t)
    s = _safe(g.abs().amax(-1, keepdim=True) / fmax)
    return (fake_float(g / s, fmt) * s).reshape(x.shape)


def float_blocks(w, fmt, block=TILE):
    """A 2-D weight in `block` x `block` blocks, each scaled to the
    format's largest value and rounded (float32)."""
    fmax = FLOAT_FORMATS[fmt][2] if fmt in FLOAT_FORMATS else None
    if fmax is None:
        fake_float(w, fmt)
    o, i = w.shape
    bo, bi = min(block, o), min(block, i)
    if o % bo or i % bi:
        raise ValueError(f"a {o}x{i} weight does not split into "
                         f"{bo}x{bi} blocks")
    b = w.float().reshape(o // bo, bo, i // bi, bi)
    s = _safe(b.abs().amax((1, 3), keepdim=True) / fmax)
    return (fake_float(b / s, fmt) * s).reshape(o, i)


def _padded(q, block):
    """q applied to x's last dimension zero-padded to a multiple of block
    (as kernels pad a GEMM's inner dimension: zeros change no amax), and
    cut back."""
    def padded(x):
        n = x.shape[-1]
        if n % block == 0:
            return q(x)
        p = torch.nn.functional.pad(x.float(), (0, block - n % block))
        return q(p)[..., :n]
    padded.__doc__ = q.__doc__
    padded.__name__ = q.__name__
    return padded


@lambda q: _padded(q, 16)
def nvfp4(x):
    """x (2-D) through NVFP4 along its last dimension (blocks of 16; a
    last dimension that does not split into them is zero-padded), in
    float32: the module doc's `nvfp4`."""
    xf = x.float()
    n = xf.shape[-1]
    amax = xf.abs().amax()
    if not amax > 0:        # all zero (or NaN: NaN everywhere, as torchao)
        return xf * 0 if amax == 0 else torch.full_like(xf, math.nan)
    ts = amax / (448.0 * 6.0)
    g = xf.reshape(-1, n // 16, 16)
    bs = (g.abs().amax(-1, keepdim=True) / 6.0 / ts).clamp(
        E4M3_TINY, 448.0).to(torch.float8_e4m3fn).float()
    v = fake_float((g * ((1.0 / ts) / bs)).clamp(-6.0, 6.0), "e2m1")
    return (v * (bs * ts)).reshape(xf.shape)


@lambda q: _padded(q, 16)
def nvfp4_block(x):
    """x (2-D) through NVFP4's blocks without its per-tensor scale, in
    float32: the module doc's `nvfp4-block`."""
    xf = x.float()
    n = xf.shape[-1]
    g = xf.reshape(-1, n // 16, 16)
    bs = (g.abs().amax(-1, keepdim=True) / 6.0).clamp(
        E4M3_TINY, 448.0).to(torch.float8_e4m3fn).float()
    v = fake_float((g * (1.0 / bs)).clamp(-6.0, 6.0), "e2m1")
    return (v * bs).reshape(xf.shape)


@lambda q: _padded(q, 32)
def mxfp4(x):
    """x (2-D) through MXFP4 along its last dimension (blocks of 32; a
    last dimension that does not split into them is zero-padded), in
    float32: the module doc's `mxfp4`."""
    xf = x.float()
    n = xf.shape[-1]
    g = xf.reshape(-1, n // 32, 32)
    amax = g.abs().amax(-1, keepdim=True)
    e = ((amax.view(torch.int32) >> 23) & 0xFF) - 127 - 2
    scale = torch.ldexp(torch.ones_like(amax), e.clamp(-127, 128)).clamp(
        min=F32_MIN_NORMAL)
    v = fake_float(g / scale, "e2m1")
    return torch.where(torch.isnan(amax), amax, v * scale).reshape(xf.shape)


FP4 = {"nvfp4": nvfp4, "nvfp4-block": nvfp4_block, "mxfp4": mxfp4}


def _plain(t):
    """`exact` beside a rows recipe: a GEMM operand as it is (float32)."""
    return t.float()


def _bf16_rows(t):
    """`bf16` beside a rows recipe: a GEMM operand rounded to bfloat16."""
    return t.to(torch.bfloat16).float()


_AS_ROWS = {"exact": _plain, "bf16": _bf16_rows}

_RECIPE = re.compile(r"^(?:int([2-8])-(?:g(\d+)|(tok))|(e4m3|e5m2|e3m2|e2m3)"
                     r"-tile|(int8-row)|(bf16)|(exact)|(nvfp4|nvfp4-block|mxfp4))$")


class Recipe:
    """What one path does to a linear layer's GEMM inputs (see the module
    doc for the names). `act(x)`: the activation the weight gradient
    reads (and the forward GEMM, unless `storage_only`); `weight(w)`: the
    weight the GEMMs read. A recipe with `rows` (nvfp4, mxfp4) quantizes
    every operand of all three GEMMs, each blocked along that GEMM's inner
    dimension: `rows(t)` quantizes a 2-D t along its last dimension."""

    def __init__(self, name):
        m = _RECIPE.fullmatch(name) if isinstance(name, str) else None
        if not m:
            raise ValueError(
                f"unknown recipe {name!r}: int<2-8>-g<group>, int<2-8>-tok, "
                "e4m3-tile, e5m2-tile, e3m2-tile, e2m3-tile, int8-row, "
                "bf16, nvfp4, nvfp4-block, mxfp4 or exact")
        self.name = name
        bits, group, tok, fmt, row, bf16, exact, fp4 = m.groups()
        self.storage_only = bits is not None
        self.rows = FP4[fp4] if fp4 else None
        if fp4:
            self._act = self._w = self.rows
        elif bits is not None:
            b = int(bits)
            if tok:
                self._act = lambda x: int_grouped(x, b, x.shape[-1])
            else:
                g = int(group)
                self._act = lambda x: int_grouped(x, b, g)
            self._w = None
        elif fmt:
            self._act = lambda x: float_tiles(x, fmt)
            self._w = lambda w: float_blocks(w, fmt)
        elif row:
            self._act = lambda x: int_grouped(x, 8, x.shape[-1])
            self._w = lambda w: int_grouped(w, 8, w.shape[-1])
        elif bf16:
            self._act = lambda x: x.to(torch.bfloat16).float()
            self._w = self._act
        else:
            self._act = self._w = None

    def act(self, x):
        return x if self._act is None else self._act(x).to(x.dtype)

    def weight(self, w):
        return w if self._w is None else self._w(w).to(w.dtype)

    def __repr__(self):
        return self.name


class _QuantGemm(torch.autograd.Function):
    """y = fx wq^T + b, where fx and wq are the recipe's forward copies;
    the weight gradient reads `saved` (the recipe's stored activation),
    the input gradient wq (straight through the rounding)."""

    @staticmethod
    def forward(ctx, x, w, b, fx, wq, saved):
        ctx.has_bias = b is not None
        ctx.save_for_backward(saved, wq)
        ctx.dtypes = (x.dtype, w.dtype)
        return F.linear(fx, wq, b)

    @staticmethod
    def backward(ctx, gy):
        saved, wq = ctx.saved_tensors
        g2 = gy.reshape(-1, gy.shape[-1])
        gx = (gy @ wq).to(ctx.dtypes[0]) if ctx.needs_input_grad[0] else None
        gw = (g2.t() @ saved.reshape(-1, saved.shape[-1])).to(
            ctx.dtypes[1]) if ctx.needs_input_grad[1] else None
        gb = g2.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return gx, gw, gb, None, None, None


def _latent_rows(q, t, sv, sign):
    """q(t) for a 2-D t whose rows are input features, as the quantizer
    sees them under a latent outlier (QuantLinear.latent): each row scaled
    by sv^sign (the activation's features up, the weight's columns down)
    before q, and back after; t itself when sv is None."""
    if sv is None:
        return q(t.contiguous())
    f = (sv if sign > 0 else 1 / sv)[:, None]
    return q((t * f).contiguous()) / f


class _RowsGemm(torch.autograd.Function):
    """y = fx wq^T + b for a recipe that quantizes every GEMM operand
    (Recipe.rows): fx and wq are the forward's copies (blocked along the
    input features); backward quantizes the output gradient and the weight
    along the output features for the input gradient, the output gradient
    and the activation along the tokens for the weight gradient. `probe`
    (None, or a QuantLinear) receives `grad_error`: the relative error of
    the weight gradient its low recipe computes against the exact product
    of the same output gradient and activation (an experiment's damage,
    measured on either path)."""

    @staticmethod
    def forward(ctx, x, w, b, fx, wq, rows, probe, sv):
        ctx.has_bias = b is not None
        ctx.rows, ctx.probe, ctx.sv = rows, probe, sv
        ctx.save_for_backward(x.detach(), w.detach())
        ctx.dtypes = (x.dtype, w.dtype)
        return F.linear(fx, wq, b)

    @staticmethod
    def backward(ctx, gy):
        x, w = ctx.saved_tensors
        q, sv = ctx.rows, ctx.sv
        g2 = gy.reshape(-1, gy.shape[-1]).float()
        x2 = x.reshape(-1, x.shape[-1]).float()
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:
            gx = (q(g2) @ _latent_rows(q, w.float().t(), sv, -1).t()
                  ).reshape(*gy.shape[:-1], w.shape[1]).to(ctx.dtypes[0])
        gt, xt = g2.t().contiguous(), x2.t().contiguous()
        if ctx.needs_input_grad[1]:
            gw = q(gt) @ _latent_rows(q, xt, sv, 1).t()
        if ctx.probe is not None:
            ctx.probe._grad_error(gt, xt, gw if q is ctx.probe.low.rows
                                  else None, sv)
        if gw is not None:
            gw = gw.to(ctx.dtypes[1])
        if ctx.has_bias and ctx.needs_input_grad[2]:
            gb = g2.sum(0).to(gy.dtype)
        return gx, gw, gb, None, None, None, None, None


class QuantLinear(torch.nn.Linear):
    """torch.nn.Linear computed by the `low` recipe, or by `high` while
    `recovery` is set (see the module doc)."""

    def __init__(self, in_features, out_features, bias=True, low="int4-g32",
                 high="int8-g32", **kw):
        super().__init__(in_features, out_features, bias, **kw)
        self.low, self.high = Recipe(low), Recipe(high)
        self.recovery = False
        self.latent = None
        self._err = 0.0
        # experiments: the low recipe's weight-gradient error (rows recipes)
        # and its output's error, measured on either path
        self.track_grad_error = False
        self.grad_error = 0.0
        self.track_out_error = False
        self.out_error = 0.0
        # the same-step mode's gate (gnmr.samestep.Gate, set by the
        # Controller): asked with low_error before the GEMM
        self.same_step_gate = None

    def _scales(self):
        """The latent outlier's per-feature scale (None: no latent)."""
        if self.latent is None:
            return None
        idx, s = self.latent
        v = torch.ones(self.in_features, dtype=torch.float32,
                       device=self.weight.device)
        v[torch.as_tensor(idx, dtype=torch.long, device=v.device)] = float(s)
        return v

    @property
    def low_error(self):
        """Mean over input features of the relative L2 error of the low
        recipe's copy of that feature, at the last training-mode forward
        (probes without grad included), on either path (a host read)."""
        return float(self._err)

    def _grad_error(self, gt, xt, low_gw, sv=None):
        """grad_error (see _RowsGemm): the low (rows) recipe's weight
        gradient (low_gw when the low path computed it) against the exact
        product of the same operands."""
        exact = gt @ xt.t()
        if low_gw is None:
            q = self.low.rows
            low_gw = q(gt) @ _latent_rows(q, xt, sv, 1).t()
        n = exact.norm()
        self.grad_error = float((low_gw - exact).norm() / n) if n > 0 \
            else 0.0

    def _out_error(self, xd, low, weight):
        """out_error: the relative L2 error of the low recipe's output
        (bias left out) against the exact product, for this input (an
        experiment's damage, measured on either path; 0 for a recipe
        that keeps the forward exact)."""
        w = self.weight.detach()
        exact = F.linear(xd.float(), w.float())
        fx = xd if self.low.storage_only else low
        got = F.linear(fx.float(), weight(self.low, w).float())
        n = exact.norm()
        self.out_error = float((got - exact).norm() / n) if n > 0 else 0.0

    @torch.compiler.disable
    def forward(self, x):
        high = self.recovery
        xd = x.detach()
        sv = self._scales()

        def act(rec, v):
            if sv is None or rec._act is None:
                return rec.act(v)
            return (rec.act(v * sv) / sv).to(v.dtype)

        def weight(rec, w):
            if sv is None or rec._w is None:
                return rec.weight(w)
            return (rec.weight(w / sv) * sv).to(w.dtype)

        saved = None
        if self.training:
            low = act(self.low, xd)
            xf = xd.float().reshape(-1, xd.shape[-1])
            n = xf.norm(dim=0)
            e = (low.float().reshape(-1, xd.shape[-1]) - xf).norm(dim=0)
            self._err = torch.where(n > 0, e / _safe(n), 0.0).mean()
            if self.track_out_error:
                self._out_error(xd, low, weight)
            if not high and self.same_step_gate is not None and \
                    torch.is_grad_enabled():  # the same-step mode
                high = self.same_step_gate(float(self._err))
        r = self.high if high else self.low
        if self.training and torch.is_grad_enabled():
            saved = low if r is self.low else act(r, xd)
        rows = r.rows or (self.low.rows and _AS_ROWS.get(r.name))
        if rows is not None:
            return self._rows_forward(x, xd, r, rows, act, weight, saved,
                                      sv)
        if r._act is None and r._w is None:
            return F.linear(x, self.weight, self.bias)
        fx = x if r.storage_only else (
            saved if saved is not None else act(r, xd))
        wq = weight(r, self.weight.detach())
        if saved is None or not torch.is_grad_enabled():
            return F.linear(fx, wq, self.bias)
        return _QuantGemm.apply(x, self.weight, self.bias, fx, wq, saved)

    def _rows_forward(self, x, xd, r, rows, act, weight, saved, sv):
        """The forward of a recipe that quantizes all three GEMMs with
        `rows` (its own, or, beside a low recipe that does, `bf16` and
        `exact` as every operand rounded to bfloat16 or kept): _RowsGemm.
        With track_grad_error, grad_error is measured on either path."""
        fx = saved if saved is not None else act(r, xd)
        wq = weight(r, self.weight.detach()) if r._w is not None else \
            self.weight.detach()
        if not torch.is_grad_enabled():
            return F.linear(fx.to(x.dtype), wq.to(x.dtype), self.bias)
        probe = self if self.track_grad_error and self.low.rows else None
        return _RowsGemm.apply(x, self.weight, self.bias, fx.to(x.dtype),
                               wq.to(x.dtype), rows, probe, sv)

    def extra_repr(self):
        return (super().extra_repr() + f", low={self.low}, high={self.high}"
                f", recovery={self.recovery}")
