# SPDX-License-Identifier: MIT
"""Tests of gnmr.quant: the fine-grained recipes (grouped integers, tile
and block scaled small floats, LLM.int8's vector-wise int8, bf16) and
QuantLinear's two paths."""
import math
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from gnmr.quant import (FLOAT_FORMATS, QuantLinear, Recipe,  # noqa: E402
                        fake_float, float_blocks, float_tiles, int_grouped,
                        mxfp4, nvfp4, nvfp4_block)
from gnmr.recovery import switch  # noqa: E402


def format_values(ebits, mbits, bias):
    """Every finite value of a small float format with no inf/NaN codes
    (OCP's FP6 E3M2 and E2M3), decoded from its bits."""
    out = []
    for e in range(2 ** ebits):
        for m in range(2 ** mbits):
            v = (m / 2 ** mbits) * 2.0 ** (1 - bias) if e == 0 else \
                (1 + m / 2 ** mbits) * 2.0 ** (e - bias)
            out += [v, -v]
    return sorted(set(out))


class FakeFloatTest(unittest.TestCase):
    def test_every_value_is_kept_and_midpoints_round_to_even(self):
        for fmt, (eb, mb, bias) in {"e3m2": (3, 2, 3),
                                    "e2m3": (2, 3, 1)}.items():
            vals = format_values(eb, mb, bias)
            self.assertEqual(max(vals), FLOAT_FORMATS[fmt][2], fmt)
            t = torch.tensor(vals)
            self.assertTrue(torch.equal(fake_float(t, fmt), t), fmt)
            pos = [v for v in vals if v >= 0]
            for lo, hi in zip(pos, pos[1:]):
                mid = torch.tensor([(lo + hi) / 2])
                got = float(fake_float(mid, fmt))
                # the even neighbour: the one whose last mantissa bit is 0
                self.assertIn(got, (lo, hi), fmt)
                near = float(fake_float(torch.tensor([lo + (hi - lo) / 4]),
                                        fmt))
                self.assertEqual(near, lo, fmt)

    def test_out_of_range_saturates_and_nan_stays(self):
        t = torch.tensor([1e6, -1e6, math.inf, math.nan])
        got = fake_float(t, "e3m2")
        self.assertEqual(got[:3].tolist(), [28.0, -28.0, 28.0])
        self.assertTrue(math.isnan(float(got[3])))

    def test_bad_format_is_a_clear_error(self):
        with self.assertRaisesRegex(ValueError, "unknown float format"):
            fake_float(torch.ones(2), "e9m9")
        with self.assertRaisesRegex(ValueError, "unknown float format"):
            float_tiles(torch.ones(2, 4), "fp7")


class GroupedIntTest(unittest.TestCase):
    def test_each_group_has_its_own_scale(self):
        torch.manual_seed(0)
        x = torch.randn(16, 64)
        x[:, 3] *= 100            # an outlier feature in the first group
        q = int_grouped(x, 4, 32)
        # the outlier's group is crushed, the other group is not
        err = lambda a, b: float((a - b).norm() / b.norm())  # noqa: E731
        self.assertGreater(err(q[:, 4:32], x[:, 4:32]), 0.5)
        self.assertLess(err(q[:, 32:], x[:, 32:]), 0.2)
        self.assertTrue(torch.equal(q[:, 32:], int_grouped(x[:, 32:], 4,
                                                           32)))
        # at most 15 levels a group: 4-bit signed, symmetric
        for g in range(2):
            s = x[0, 32 * g:32 * g + 32].abs().max() / 7
            lv = torch.round(q[0, 32 * g:32 * g + 32] / s)
            self.assertLessEqual(int(lv.abs().max()), 7)

    def test_bad_shapes_and_bits_are_clear_errors(self):
        with self.assertRaisesRegex(ValueError, "groups of 32"):
            int_grouped(torch.ones(2, 48), 4, 32)
        with self.assertRaisesRegex(ValueError, "bits must be 2..8"):
            int_grouped(torch.ones(2, 32), 9, 32)
        with self.assertRaisesRegex(ValueError, "blocks"):
            float_blocks(torch.ones(192, 256), "e4m3")
        for bad in ("", "int4", "int9-g32", "int4-g", "e4m3", "fp8-tile",
                    "int4-g32 ", "exact\n", None):
            with self.assertRaisesRegex(ValueError, "unknown recipe"):
                Recipe(bad)


class TilesTest(unittest.TestCase):
    def test_tiles_and_blocks_scale_to_the_formats_largest_value(self):
        torch.manual_seed(1)
        x = torch.randn(4, 256)
        x[0, 5] = 1000.0          # only its 1x128 tile is affected
        q = float_tiles(x, "e4m3")
        self.assertEqual(float(q[0, 5]), 1000.0)   # the amax is exact
        self.assertTrue(torch.equal(q[0, 128:], float_tiles(x[0:1, 128:],
                                                           "e4m3")[0]))
        self.assertLess(float((q[1:] - x[1:]).norm() / x[1:].norm()), 0.04)
        w = torch.randn(256, 256)
        w[0, 0] = 500.0
        qw = float_blocks(w, "e4m3")
        self.assertEqual(float(qw[0, 0]), 500.0)
        self.assertTrue(torch.equal(qw[128:, 128:],
                                    float_blocks(w[128:, 128:], "e4m3")))
        # a 6-bit float cannot hold a tile with a x1000 outlier
        q6 = float_tiles(x, "e2m3")
        self.assertGreater(float((q6[0, 6:128] - x[0, 6:128]).norm() /
                                 x[0, 6:128].norm()), 0.9)


class Fp4Test(unittest.TestCase):
    """NVFP4 and MXFP4: the E2M1 grid, the block scales, and torchao's
    mx_formats quantize-dequantize, bit for bit."""

    def test_e2m1_keeps_its_values_and_rounds_midpoints_to_even(self):
        vals = format_values(2, 1, 1)   # E2M1: 0, 0.5, 1, 1.5, 2, 3, 4, 6
        self.assertEqual(max(vals), 6.0)
        t = torch.tensor(vals)
        self.assertTrue(torch.equal(fake_float(t, "e2m1"), t))
        mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0])
        self.assertEqual(fake_float(mids, "e2m1").tolist(),
                         [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0])

    def test_blocks_have_their_own_scales(self):
        torch.manual_seed(7)
        x = torch.randn(8, 64)
        x[0, 3] = 40.0   # an outlier: its block of 16 (NVFP4) or 32 (MX)
        for q, block in ((nvfp4, 16), (mxfp4, 32)):
            got = q(x)
            err = lambda a, b: float((a - b).norm() / b.norm())  # noqa
            near = [i for i in range(block) if i != 3]  # its neighbours
            self.assertGreater(err(got[0, near], x[0, near]),
                               2 * err(got[0, block:], x[0, block:]))
            self.assertLess(err(got[1:], x[1:]), 0.15)
            # at most 8 magnitudes a block, from one scale
            vals = {abs(v) for v in got[1, :block].tolist()}
            self.assertLessEqual(len(vals), 8)
        self.assertTrue(torch.equal(nvfp4(torch.zeros(2, 16)),
                                    torch.zeros(2, 16)))
        # a row that does not split into blocks is zero-padded (as kernels
        # pad): the same values as the padded row's, cut back
        odd = torch.randn(3, 24)
        for q, n in ((nvfp4, 32), (nvfp4_block, 32), (mxfp4, 64)):
            pad = torch.cat([odd, torch.zeros(3, n - 24)], 1)
            self.assertTrue(torch.equal(q(odd), q(pad)[:, :24]))

    def test_nvfp4_and_mxfp4_are_torchaos_bit_for_bit(self):
        try:
            from torchao.prototype.mx_formats.mx_tensor import MXTensor
            from torchao.prototype.mx_formats.nvfp4_tensor import (
                NVFP4Tensor, per_tensor_amax_to_scale)
        except ImportError as e:  # the pinned torchao is in both venvs
            self.fail(f"torchao's mx_formats: {e}")
        torch.manual_seed(8)
        for trial in range(4):
            x = torch.randn(64, 128) * torch.exp(3 * torch.randn(128))
            x[trial, :20] = 0
            want = NVFP4Tensor.to_nvfp4(
                x, per_tensor_scale=per_tensor_amax_to_scale(
                    x.abs().amax())).dequantize(torch.float32)
            self.assertTrue(torch.equal(nvfp4(x), want), trial)
            want = NVFP4Tensor.to_nvfp4(x).dequantize(torch.float32)
            self.assertTrue(torch.equal(nvfp4_block(x), want), trial)
            # values of a gradient's size: without the per-tensor scale
            # nearly all round to zero
            g = torch.randn(64, 128) * 1e-3
            self.assertTrue(torch.equal(
                nvfp4_block(g),
                NVFP4Tensor.to_nvfp4(g).dequantize(torch.float32)), trial)
            self.assertGreater((nvfp4_block(g) == 0).float().mean(), 0.8)
            self.assertLess((nvfp4(g) == 0).float().mean(), 0.2)
            want = MXTensor.to_mx(x, torch.float4_e2m1fn_x2,
                                  32).dequantize(torch.float32)
            self.assertTrue(torch.equal(mxfp4(x), want), trial)


class QuantLinearTest(unittest.TestCase):
    def grads(self, lin, x):
        x = x.clone().requires_grad_(True)
        y = lin(x)
        gy = torch.linspace(-1, 1, y.numel()).reshape(y.shape)
        y.backward(gy)
        return y.detach(), x.grad, lin.weight.grad.clone(), gy

    def test_storage_only_recipe_keeps_the_forward_exact(self):
        torch.manual_seed(2)
        lin = QuantLinear(64, 8, low="int4-g32", high="int8-g32").train()
        x = torch.randn(5, 64)
        y, gx, gw, gy = self.grads(lin, x)
        self.assertTrue(torch.allclose(y, F.linear(x, lin.weight,
                                                   lin.bias)))
        self.assertTrue(torch.allclose(gx, gy @ lin.weight.detach()))
        self.assertTrue(torch.allclose(gw, gy.t() @ int_grouped(x, 4, 32),
                                       atol=1e-6))
        self.assertGreater(lin.low_error, 0.03)
        switch("u", lin, True)
        lin.weight.grad = None
        _, _, gw8, _ = self.grads(lin, x)
        self.assertTrue(torch.allclose(gw8, gy.t() @ int_grouped(x, 8, 32),
                                       atol=1e-6))
        low = lin.low_error   # measured on the recovery path too
        self.assertGreater(low, 0.03)

    def test_gemm_recipes_quantize_forward_and_backward(self):
        torch.manual_seed(3)
        lin = QuantLinear(128, 128, bias=True, low="e3m2-tile",
                          high="exact").train()
        x = torch.randn(6, 128)
        y, gx, gw, gy = self.grads(lin, x)
        xq = float_tiles(x, "e3m2")
        wq = float_blocks(lin.weight.detach(), "e3m2")
        self.assertTrue(torch.allclose(y, F.linear(xq, wq, lin.bias),
                                       atol=1e-5))
        self.assertTrue(torch.allclose(gx, gy @ wq, atol=1e-5))
        self.assertTrue(torch.allclose(gw, gy.t() @ xq, atol=1e-5))
        self.assertTrue(torch.allclose(lin.bias.grad, gy.sum(0)))
        lin.recovery = True
        lin.weight.grad = lin.bias.grad = None
        ref = torch.nn.Linear(128, 128)
        ref.load_state_dict({"weight": lin.weight.detach(),
                             "bias": lin.bias.detach()})
        y2, gx2, gw2, _ = self.grads(lin, x)
        ry, rgx, rgw, _ = self.grads(ref, x)
        self.assertTrue(torch.equal(y2, ry))
        self.assertTrue(torch.equal(gx2, rgx) and torch.equal(gw2, rgw))

    def test_fp4_recipes_quantize_all_three_gemms(self):
        """nvfp4: the forward reads the activation and weight blocked
        along the input features, the input gradient the output gradient
        and the weight along the output features, the weight gradient the
        output gradient and activation along the tokens; bf16 beside it
        rounds every operand; the damage figures on either path."""
        torch.manual_seed(9)
        lin = QuantLinear(64, 32, bias=True, low="nvfp4",
                          high="bf16").train()
        lin.track_grad_error = lin.track_out_error = True
        x = torch.randn(16, 64)
        y, gx, gw, gy = self.grads(lin, x)
        w = lin.weight.detach()
        self.assertTrue(torch.allclose(y, F.linear(nvfp4(x), nvfp4(w),
                                                   lin.bias), atol=1e-5))
        self.assertTrue(torch.allclose(
            gx, nvfp4(gy) @ nvfp4(w.t().contiguous()).t(), atol=1e-5))
        self.assertTrue(torch.allclose(
            gw, nvfp4(gy.t().contiguous()) @ nvfp4(x.t().contiguous()).t(),
            atol=1e-5))
        self.assertTrue(torch.allclose(lin.bias.grad, gy.sum(0)))
        exact = gy.t() @ x
        self.assertAlmostEqual(lin.grad_error, float(
            (gw - exact).norm() / exact.norm()), places=5)
        self.assertAlmostEqual(lin.out_error, float(
            (F.linear(nvfp4(x), nvfp4(w)) - F.linear(x, w)).norm() /
            F.linear(x, w).norm()), places=5)
        low_grad, low_out = lin.grad_error, lin.out_error
        self.assertTrue(0.02 < low_grad < 0.3 and 0.02 < low_out < 0.3)
        lin.recovery = True
        lin.weight.grad = lin.bias.grad = None
        y2, gx2, gw2, _ = self.grads(lin, x)
        bf = lambda t: t.bfloat16().float()  # noqa: E731
        self.assertTrue(torch.allclose(y2, F.linear(bf(x), bf(w), lin.bias),
                                       atol=1e-5))
        self.assertTrue(torch.allclose(gw2, bf(gy).t() @ bf(x), atol=1e-4))
        self.assertTrue(torch.allclose(gx2, bf(gy) @ bf(w), atol=1e-4))
        # measured on the recovery path too: the low recipe's figures
        self.assertAlmostEqual(lin.out_error, low_out, places=6)
        self.assertGreater(lin.grad_error, 0.02)
        # a latent outlier: the low path's damage grows, the product holds
        lin.latent = ([5], 4096.0)
        self.grads(lin, x)
        self.assertGreater(lin.out_error, 2 * low_out)
        self.assertGreater(lin.low_error, 2 * low_grad)

    def test_int8_rows_and_bf16(self):
        torch.manual_seed(4)
        lin = QuantLinear(32, 16, bias=False, low="int8-row",
                          high="bf16").train()
        x = torch.randn(3, 32)
        with torch.no_grad():
            y = lin(x)
            ref = F.linear(int_grouped(x, 8, 32),
                           int_grouped(lin.weight, 8, 32))
            self.assertTrue(torch.allclose(y, ref, atol=1e-6))
            lin.recovery = True
            y = lin(x)
            ref = F.linear(x.bfloat16().float(),
                           lin.weight.bfloat16().float())
            self.assertTrue(torch.allclose(y, ref, atol=1e-6))

    def test_a_latent_outlier_is_seen_by_the_quantizers_only(self):
        torch.manual_seed(5)
        x = torch.randn(4, 64)
        exact = QuantLinear(64, 16, bias=False, low="int8-row",
                            high="exact").train()
        exact.recovery = True
        ref = exact(x).detach()
        low_err = exact.low_error
        exact.latent = ([3, 40], 512.0)
        # the exact path computes what it did: the product is unchanged
        self.assertTrue(torch.equal(exact(x).detach(), ref))
        # ... while the int8 rows lose their precision (measured on the
        # recovery path too) and the low path's output moves
        self.assertGreater(exact.low_error, 10 * low_err)
        exact.recovery = False
        y_low = exact(x).detach()
        exact.latent = None
        y_plain = exact(x).detach()
        self.assertGreater(float((y_low - ref).norm()),
                           10 * float((y_plain - ref).norm()))
        # bf16 scales by the latent factor and back: its own rounding only
        bf = QuantLinear(64, 16, bias=False, low="int8-row", high="bf16")
        bf.load_state_dict(exact.state_dict())
        bf.train().recovery = True
        plain = bf(x).detach()
        bf.latent = ([3, 40], 512.0)
        self.assertTrue(torch.allclose(bf(x).detach(), plain, rtol=0.02,
                                       atol=0.02))
        # a storage-only recipe keeps its forward exact under a latent too
        st = QuantLinear(64, 16, bias=False, low="int4-g32",
                         high="int8-g32").train()
        st.latent = ([7], 300.0)
        xg = x.clone().requires_grad_(True)
        y = st(xg)
        self.assertTrue(torch.allclose(y, F.linear(x, st.weight)))
        y.sum().backward()
        self.assertGreater(st.low_error, 0.3)

    def test_a_frozen_weight_gets_no_gradient(self):
        lin = QuantLinear(32, 4, low="int8-row", high="bf16").train()
        lin.weight.requires_grad_(False)
        x = torch.randn(2, 32, requires_grad=True)
        lin(x).sum().backward()
        self.assertIsNone(lin.weight.grad)
        self.assertEqual(x.grad.shape, x.shape)

    def test_evaluation_measures_nothing(self):
        lin = QuantLinear(32, 4).eval()
        with torch.no_grad():
            lin(torch.randn(2, 32) * 100)
        self.assertEqual(lin.low_error, 0.0)

    def test_compiled_it_runs_eagerly_with_the_same_numbers(self):
        """Issue 63: QuantLinear's forward is torch.compiler.disable (said
        in docs/python.md): under torch.compile the rest of the model is
        compiled around it and it runs as in eager mode, each route as
        switched, the numbers eager's."""
        torch.manual_seed(4)
        model = torch.nn.Sequential(
            torch.nn.Linear(32, 32), torch.nn.ReLU(),
            QuantLinear(32, 32, low="nvfp4", high="bf16"),
            torch.nn.ReLU(), torch.nn.Linear(32, 4)).train()
        x = torch.randn(6, 32)
        compiled = torch.compile(model, backend="eager")
        q = model[2]
        for high in (False, True, False):
            switch("q", q, high)
            outs = []
            for m in (model, compiled):
                model.zero_grad()
                y = m(x)
                y.square().sum().backward()
                outs.append((y.detach(), q.weight.grad.clone(),
                             q.low_error))
            self.assertTrue(torch.equal(outs[0][0], outs[1][0]), high)
            self.assertTrue(torch.equal(outs[0][1], outs[1][1]), high)
            self.assertEqual(outs[0][2], outs[1][2])
        # the two routes differ: the switch reached the compiled model
        switch("q", q, False)
        low = compiled(x).detach()
        switch("q", q, True)
        self.assertFalse(torch.equal(low, compiled(x).detach()))


if __name__ == "__main__":
    unittest.main()
