# SPDX-License-Identifier: MIT
"""Tests of the gnmr Python package against a real gnmrd.

Run by `make check` (scripts/pytests.py: each module of python/tests in
its own process, as `python -m unittest -v MODULE` from python/ with tests/
on the path) with GNMR_AGENT_LIB and GNMR_BIN_DIR set by the Makefile.
"""
import csv
import ctypes
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch  # noqa: E402

import gnmr  # noqa: E402
from gnmr.pytorch import Controller  # noqa: E402

BIN = os.environ.get("GNMR_BIN_DIR", os.path.join(
    os.path.dirname(__file__), "..", "..", "build", "bin"))


class Daemon:
    """A gnmrd in a temporary directory, on a loopback TCP port."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="gnmr-py-")
        with open(self.dir + "/err", "wb") as err:
            self.proc = subprocess.Popen(
                [os.path.join(BIN, "gnmrd"), "--data-dir",
                 self.dir + "/data", "--agents", "tcp://127.0.0.1:*",
                 "--admin", f"ipc://{self.dir}/admin.sock"],
                stdout=subprocess.PIPE, stderr=err, text=True)
        self.agents = None
        for line in self.proc.stdout:
            m = re.match(r"gnmrd: agents (\S+)", line)
            if m:
                self.agents = m.group(1)
            if line.startswith("gnmrd: admin"):
                break
        assert self.agents, "gnmrd did not start"

    def log(self):
        """What gnmrd has logged so far (its standard error)."""
        with open(self.dir + "/err", errors="replace") as f:
            return f.read()

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=10)
        self.proc.stdout.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        return code


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Linear(8, 16)
        self.b = torch.nn.Linear(16, 16)
        self.c = torch.nn.Linear(16, 4)
        self.frozen = torch.nn.Linear(4, 4)
        for p in self.frozen.parameters():
            p.requires_grad_(False)

    def forward(self, x):
        return self.frozen(self.c(torch.relu(self.b(torch.relu(self.a(x))))))


class NormsTest(unittest.TestCase):
    def test_reduction_equals_torch_per_unit_norms(self):
        torch.manual_seed(1)
        for dtype, tol in ((torch.float32, 1e-12), (torch.float64, 1e-12),
                           (torch.bfloat16, 1e-12), (torch.float16, 1e-12)):
            tensors = [torch.randn(n).to(dtype) for n in (1, 7, 4097, 10000)]
            buffers = [(i % 2, t.data_ptr(), t.numel(), str(dtype)[6:])
                       for i, t in enumerate(tensors)]
            sumsq, nonfinite = gnmr.reduce_cpu(buffers, 2)
            for unit in (0, 1):
                ref = torch.cat([t.double() for i, t in enumerate(tensors)
                                 if i % 2 == unit])
                want = float(torch.linalg.vector_norm(ref)) ** 2
                self.assertAlmostEqual(sumsq[unit] / want, 1.0,
                                       delta=tol * 10, msg=str(dtype))
                self.assertEqual(nonfinite[unit], 0)

    def test_torch_sums_for_device_gradients(self):
        # the path CUDA gradients take when the agent's kernel does not
        # (device-agnostic: run here on host tensors)
        from gnmr._layout import sums_on_device
        torch.manual_seed(4)
        grads = [[torch.randn(300), torch.randn(7, 5).bfloat16()],
                 [torch.randn(1000) * 1e3, torch.empty(0)], [],
                 [torch.randn(50)]]
        grads[3][0][[3, 9]] = torch.tensor([float("nan"), float("inf")])
        sumsq, nonfinite = sums_on_device(grads)
        for u, gs in enumerate(grads):
            flat = torch.cat([g.double().flatten() for g in gs]) if gs \
                else torch.zeros(0, dtype=torch.float64)
            fin = torch.isfinite(flat)
            want = float(flat[fin].square().sum())
            self.assertAlmostEqual(sumsq[u], want, delta=want * 1e-12)
            self.assertEqual(nonfinite[u], int((~fin).sum()))
        self.assertEqual(nonfinite, [0, 0, 0, 2])
        self.assertEqual(sums_on_device([[], []]), ([0.0, 0.0], [0, 0]))

    def test_nonfinite_elements_are_counted(self):
        t = torch.ones(5000)
        t[0], t[4096], t[4999] = float("nan"), float("inf"), float("-inf")
        sumsq, nonfinite = gnmr.reduce_cpu(
            [(0, t.data_ptr(), t.numel(), "float32")], 1)
        self.assertEqual(nonfinite[0], 3)
        self.assertEqual(sumsq[0], 4997.0)

    def test_threads_give_the_same_sums_bit_for_bit(self):
        torch.manual_seed(2)
        tensors = [torch.randn(n) * 3 for n in (300001, 4096 * 16 + 1, 5)]
        tensors.append(torch.randn(200000).to(torch.bfloat16))
        tensors[0][123456] = float("nan")
        buffers = [(i % 3, t.data_ptr(), t.numel(), str(t.dtype)[6:])
                   for i, t in enumerate(tensors)]
        want = gnmr.reduce_cpu(buffers, 3)
        self.assertEqual(want[1][0], 1)
        for threads in (0, 2, 3, 8):
            self.assertEqual(gnmr.reduce_cpu(buffers, 3, threads), want,
                             msg=f"threads={threads}")
        with self.assertRaisesRegex(ValueError, "threads"):
            gnmr.reduce_cpu(buffers, 3, -1)
        with self.assertRaisesRegex(ValueError, "out of range"):
            gnmr.reduce_cpu(buffers, 2, 2)

    def test_fp8_and_per_tensor_scale(self):
        # every byte of both OCP FP8 formats, the reference from their
        # definitions (torch's own float8 dtypes may be absent)
        raw = torch.arange(256, dtype=torch.uint8)

        def value(b, ebits, mbits, bias):
            e, m = (b >> mbits) & ((1 << ebits) - 1), b & ((1 << mbits) - 1)
            if e == 0:
                return m * 2.0 ** (1 - bias - mbits)
            return (1 + m / 2 ** mbits) * 2.0 ** (e - bias)

        for name, ebits, mbits, bias, bad in (
                ("float8_e4m3fn", 4, 3, 7, {0x7f, 0xff}),
                ("float8_e5m2", 5, 2, 15,
                 {b for b in range(256) if (b >> 2) & 31 == 31})):
            want = sum(value(b, ebits, mbits, bias) ** 2
                       for b in range(256) if b not in bad)
            (s1,), (n1,) = gnmr.reduce_cpu(
                [(0, raw.data_ptr(), 256, name)], 1)
            (s2,), _ = gnmr.reduce_cpu(
                [(0, raw.data_ptr(), 256, name, 0.5)], 1)
            self.assertEqual(n1, len(bad), msg=name)
            self.assertAlmostEqual(s1 / want, 1.0, delta=1e-12, msg=name)
            self.assertEqual(s2, s1 * 0.25)


class CudaTest(unittest.TestCase):
    def test_cuda_backend_without_a_device_is_a_clear_error(self):
        if gnmr.cuda_device_count() > 0:
            self.skipTest("a CUDA device is present (GPU tests cover it)")
        a = gnmr.Agent("tcp://127.0.0.1:1", "job", ["u"])
        with self.assertRaises(gnmr.GnmrError) as cm:
            gnmr.CudaReducer(a, device=0)
        self.assertIn(cm.exception.name, ("GNMR_E_CUDA",
                                          "GNMR_E_UNSUPPORTED"))
        a.close()

    @unittest.skipUnless(torch.cuda.is_available() and
                         gnmr.cuda_device_count() > 0,
                         "no CUDA device for torch and libgnmr-agent")
    def test_controller_reports_cuda_gradients_through_the_kernel(self):
        d = Daemon()
        try:
            net = Net().cuda()
            ctl = Controller(net, d.agents, "cuda-job", select=(torch.nn.Linear,))
            self.assertEqual(ctl.cuda_backend, None)  # opened at first step
            for step in range(1, 6):
                net.zero_grad()
                net(torch.randn(4, 8, device="cuda")).pow(2).mean().backward()
                self.assertTrue(ctl.step(step, wait_ms=5000))
            self.assertEqual(ctl.cuda_backend, "gnmr")
            # counts are final
            self.assertTrue(ctl._reduction.cuda.flush(5000))
            st = ctl._reduction.cuda.stats()
            self.assertEqual(st["launches"], 5)
            self.assertEqual(st["delivered"], 5)
            ctl.close()
        finally:
            self.assertEqual(d.stop(), 0)

    @unittest.skipUnless(torch.cuda.is_available() and
                         gnmr.cuda_device_count() > 0,
                         "no CUDA device for torch and libgnmr-agent")
    def test_cuda_tables_are_uploaded_only_when_a_gradient_moves(self):
        d = Daemon()
        try:
            net = Net().cuda()
            ctl = Controller(net, d.agents, "cuda-moves",
                             select=(torch.nn.Linear,))
            for step in range(1, 5):  # gradients kept in place
                net.zero_grad(set_to_none=False)
                net(torch.randn(4, 8, device="cuda")).pow(2).mean() \
                    .backward()
                self.assertTrue(ctl.step(step, wait_ms=5000))
            self.assertEqual(ctl._reduction.cuda.stats()["uploads"], 1)
            # one gradient moves to new memory: uploaded again, and the
            # kernel reads the new memory
            name, m = ctl.units[0]
            p = next(p for p in m.parameters() if p.grad is not None)
            p.grad = torch.full_like(p.grad, 3.0)
            self.assertTrue(ctl.step(5, wait_ms=5000))
            self.assertEqual(ctl._reduction.cuda.stats()["uploads"], 2)
            want = sum(q.grad.double().pow(2).sum().item()
                       for q in m.parameters() if q.grad is not None)
            sumsq, _, _ = ctl._reduction.cuda.read(
                torch.cuda.current_stream().cuda_stream)
            self.assertAlmostEqual(sumsq[0], want, delta=1e-5 * want)
            ctl.close()
        finally:
            self.assertEqual(d.stop(), 0)

    @unittest.skipUnless(torch.cuda.is_available() and
                         gnmr.cuda_device_count() > 0,
                         "no CUDA device for torch and libgnmr-agent")
    def test_cuda_gradients_are_read_from_the_kept_table(self):
        """Issue 49: gradients all on one CUDA device go to the kernel
        from the kept table (no per-unit Python a step): the same table
        while they stay, rewritten when they move (set_to_none), and
        main_grad views of one CUDA buffer checked by the buffer; the
        kernel's sums are torch's each time."""
        d = Daemon()
        try:
            torch.manual_seed(8)
            net = torch.nn.Sequential(torch.nn.Linear(8, 8),
                                      torch.nn.Linear(8, 4)).cuda()
            ctl = Controller(net, d.agents, "cuda-kept",
                             select=(torch.nn.Linear,))
            red = ctl._reduction
            stream = torch.cuda.current_stream().cuda_stream

            def check(grad_of):
                sumsq, _, _ = red.cuda.read(stream)
                for u, (_, m) in enumerate(ctl.units):
                    want = sum(grad_of(p).double().pow(2).sum().item()
                               for p in m.parameters())
                    self.assertAlmostEqual(sumsq[u], want,
                                           delta=1e-5 * want)
            x = torch.randn(4, 8, device="cuda")
            tables = []
            for step, none in ((1, False), (2, False), (3, True)):
                net.zero_grad(set_to_none=none)
                net(x * step).pow(2).sum().backward()
                self.assertTrue(ctl.step(step, wait_ms=5000))
                self.assertEqual(ctl.cuda_backend, "gnmr")
                self.assertEqual(red._hcache.device.type, "cuda")
                # read by the kernel: no longer held (released once the
                # decision is in, not at the next report)
                self.assertEqual(red._keep, [])
                tables.append(red._hcache)
                check(lambda p: p.grad)
            self.assertIs(tables[0], tables[2])  # kept; pointers rewritten
            ctl.close()

            params = list(net.parameters())
            buf = torch.randn(sum(p.numel() for p in params),
                              device="cuda")
            off = 0
            for p in params:
                p.main_grad = buf[off:off + p.numel()].view_as(p)
                off += p.numel()
            ctl = Controller(net, d.agents, "cuda-kept-main",
                             select=(torch.nn.Linear,))
            red = ctl._reduction
            for step in (1, 2):
                buf.mul_(2.0)
                self.assertTrue(ctl.step(step, wait_ms=5000))
                self.assertEqual(len(red._hcache.storages), 1)
                check(lambda p: p.main_grad)
            ctl.close()
        finally:
            self.assertEqual(d.stop(), 0)

    @unittest.skipUnless(torch.cuda.is_available() and
                         gnmr.cuda_device_count() > 0,
                         "no CUDA device for torch and libgnmr-agent")
    def test_a_trace_of_cuda_gradients_holds_the_kernels_sums(self):
        d = Daemon()
        try:
            net = Net().cuda()
            trace = os.path.join(d.dir, "trace.csv")
            ctl = Controller(net, d.agents, "cuda-trace",
                             select=(torch.nn.Linear,), trace=trace)
            want = []
            units = [m for _, m in ctl.units]
            for step in range(1, 7):
                net.zero_grad()
                net(torch.randn(4, 8, device="cuda")).pow(2).mean() \
                    .backward()
                want.append([math.sqrt(sum(
                    p.grad.double().pow(2).sum().item()
                    for p in m.parameters() if p.grad is not None))
                    for m in units])
                res = ctl.step(step, wait_ms=5000)
                self.assertTrue(res)
                self.assertEqual(ctl.cuda_backend, "gnmr")
                # the kernel's sums, read back, are the result's norms too
                self.assertEqual(sorted(res.norms), sorted(
                    n for n, _ in ctl.units))
            ctl.close()
            rows = list(csv.DictReader(open(trace)))
            got = {}
            for r in rows:
                got.setdefault(int(r["step"]), {})[int(r["unit"])] = \
                    float(r["norm"])
            # the Controller's unit ids are 0..n-1; units with no
            # gradient (the frozen one) are not in the trace
            self.assertEqual(sorted(got), list(range(1, 7)))
            for step, norms in got.items():
                for u, norm in norms.items():
                    self.assertAlmostEqual(norm, want[step - 1][u],
                                           delta=1e-5 * want[step - 1][u])
            r = subprocess.run([os.path.join(BIN, "gnmrctl"), "replay",
                                trace], capture_output=True, text=True,
                               timeout=60)
            self.assertEqual(r.returncode, 0, r.stderr)
        finally:
            self.assertEqual(d.stop(), 0)


class BindingTest(unittest.TestCase):
    """The ctypes structs follow the C header's tables."""

    def test_stats_follow_the_agent_stats_table(self):
        from gnmr import _lib
        header = os.path.join(os.path.dirname(__file__), "..", "..",
                              "include", "gnmr", "agent.h")
        with open(header) as f:
            text = f.read()
        table = text[text.index("#define GNMR_AGENT_STATS(XX)"):]
        table = table[:table.index("\n\n")]
        rows = re.findall(r"XX\((\w+), (\w+),", table)
        self.assertGreater(len(rows), 5)
        ctype = {"uint64_t": ctypes.c_uint64, "int32_t": ctypes.c_int32}
        self.assertEqual([(n, ctype[t]) for t, n in rows],
                         list(_lib.Stats._fields_))


    def test_every_struct_and_constant_matches_the_c_headers(self):
        """Issue 51: the ctypes mirrors of the public structs were kept by
        hand and checked nowhere but Stats: a C program built from the
        headers prints each struct's size and each field's offset, by the
        names ctypes has, and the enum values; ctypes must agree. A field
        C lacks does not compile; one ctypes lacks changes the size."""
        from gnmr import _lib
        root = os.path.join(os.path.dirname(__file__), "..", "..")
        structs = [("gnmr_params", _lib.Params),
                   ("gnmr_agent_config", _lib.AgentConfig),
                   ("gnmr_tensor", _lib.Tensor),
                   ("gnmr_agent_stats", _lib.Stats),
                   ("gnmr_cuda_config", _lib.CudaConfig),
                   ("gnmr_cuda_stats", _lib.CudaStats)]
        consts = {"GNMR_ROUTE_LOW": _lib.ROUTE_LOW,
                  "GNMR_ROUTE_HIGH": _lib.ROUTE_HIGH,
                  "GNMR_DTYPE_F32": _lib.DTYPE_F32,
                  "GNMR_DTYPE_F16": _lib.DTYPE_F16,
                  "GNMR_DTYPE_BF16": _lib.DTYPE_BF16,
                  "GNMR_DTYPE_F64": _lib.DTYPE_F64,
                  "GNMR_DTYPE_F8E4M3": _lib.DTYPE_F8E4M3,
                  "GNMR_DTYPE_F8E5M2": _lib.DTYPE_F8E5M2}
        lines = ["#include <stddef.h>", "#include <stdio.h>",
                 '#include "gnmr/agent.h"', '#include "gnmr/agent_cuda.h"',
                 "int main(void) {"]
        want = []
        for cname, cls in structs:
            lines.append(f'  printf("{cname} %zu\\n", sizeof({cname}));')
            want.append(f"{cname} {ctypes.sizeof(cls)}")
            for field, _ in cls._fields_:
                lines.append(f'  printf("{cname}.{field} %zu\\n", '
                             f"offsetof({cname}, {field}));")
                want.append(f"{cname}.{field} {getattr(cls, field).offset}")
        for k, v in consts.items():
            lines.append(f'  printf("{k} %d\\n", (int){k});')
            want.append(f"{k} {v}")
        lines += ["  return 0;", "}"]
        tmp = tempfile.mkdtemp(prefix="gnmr-abi-")
        self.addCleanup(shutil.rmtree, tmp, True)
        src, exe = os.path.join(tmp, "abi.c"), os.path.join(tmp, "abi")
        with open(src, "w") as f:
            f.write("\n".join(lines) + "\n")
        cc = subprocess.run(["cc", "-std=c11", "-Wall", "-Werror", "-I",
                             os.path.join(root, "include"), src, "-o", exe],
                            capture_output=True, text=True, timeout=120)
        self.assertEqual(cc.returncode, 0, cc.stderr)
        got = subprocess.run([exe], capture_output=True, text=True,
                             check=True, timeout=60).stdout.split("\n")
        self.assertEqual(got[:-1], want)


class ErrorsTest(unittest.TestCase):
    def test_bad_arguments_raise_gnmr_errors_with_codes(self):
        with self.assertRaises(gnmr.GnmrError) as cm:
            gnmr.Agent("tcp://127.0.0.1:1", "job", ["u"], rank=2, reporters=1)
        self.assertEqual(cm.exception.name, "GNMR_E_INVAL")
        self.assertEqual(cm.exception.code, -1)
        with self.assertRaises(gnmr.GnmrError):
            gnmr.Agent("tcp://127.0.0.1:1", "job", ["u"],
                       params=gnmr.default_params(alpha=0.0))
        with self.assertRaises(ValueError):
            gnmr.default_params(nosuch=1)
        with self.assertRaises(ValueError):
            gnmr.Agent("tcp://127.0.0.1:1", "job", [])
        a = gnmr.Agent("tcp://127.0.0.1:1", "job", ["u"])
        with self.assertRaises(gnmr.GnmrError) as cm:
            a.report_sums(0, [1.0])  # steps start at 1
        self.assertEqual(cm.exception.name, "GNMR_E_INVAL")
        with self.assertRaises(ValueError):
            a.report_sums(1, [1.0, 2.0])
        a.close()
        a.close()  # twice is fine

    def test_environment_overrides_and_bad_values_are_named(self):
        os.environ["GNMR_MAX_ACTIVE"] = "x"
        try:
            with self.assertRaises(gnmr.GnmrError) as cm:
                gnmr.Agent("tcp://127.0.0.1:1", "job", ["u"], from_env=True)
            self.assertIn("GNMR_MAX_ACTIVE", str(cm.exception))
        finally:
            del os.environ["GNMR_MAX_ACTIVE"]

    def test_no_daemon_means_fallback_routes_within_the_deadline(self):
        a = gnmr.Agent("ipc:///nonexistent/gnmr.sock", "job", ["u", "v"],
                       fallback_route="high")
        t0 = time.monotonic()
        for step in range(1, 6):
            a.report_sums(step, [1.0, 2.0])
            self.assertFalse(a.wait(step, 10))
        self.assertLess(time.monotonic() - t0, 2.0)
        self.assertEqual(a.routes(), [True, True])
        self.assertEqual(a.stats()["late_decisions"], 5)
        a.close()


class ControllerTest(unittest.TestCase):
    def setUp(self):
        self.d = Daemon()

    def tearDown(self):
        self.assertEqual(self.d.stop(), 0)

    def expect_grad_norms(self, ctl, res):
        """res.norms are the fp64 norms of each unit's p.grad (None for a
        unit without one)."""
        for name, module in ctl.units:
            gs = [p.grad for p in module.parameters() if p.grad is not None]
            if not gs:
                self.assertIsNone(res.norms[name])
                continue
            want = sum(float(g.double().pow(2).sum()) for g in gs)
            self.assertAlmostEqual(res.norms[name], want ** 0.5,
                                   delta=1e-6 * want ** 0.5)

    def train_step(self, net, x, step, ctl, scale=None):
        net.zero_grad()
        net(x).pow(2).mean().backward()
        if scale is not None:  # a transient spike in one unit's gradient
            name, factor = scale
            for p in dict(net.named_modules())[name].parameters():
                p.grad.mul_(factor)
        return ctl.step(step, wait_ms=5000)

    def test_routes_reach_the_modules_at_the_next_step(self):
        net = Net()
        calls = []
        ctl = Controller(net, self.d.agents, "torch-job",
                         on_route=lambda n, m, h: calls.append((n, h)),
                         params=gnmr.default_params(warmup_steps=0,
                                                    max_active=1,
                                                    lock_steps=0,
                                                    confirm_steps=1))
        # the frozen module has no gradient: it is still a unit
        self.assertEqual([n for n, _ in ctl.units], ["a", "b", "c", "frozen"])
        x = torch.randn(32, 8)
        for step in range(1, 8):
            res = self.train_step(net, x, step, ctl)
            self.assertTrue(res)
            self.assertEqual(res.risky, {})  # calm: nothing exceeded
        self.assertEqual(ctl.high, [False] * 4)
        calls.clear()
        res = self.train_step(net, x, 8, ctl, scale=("b", 50.0))
        self.assertTrue(res)
        self.assertEqual(calls, [("b", True)])  # only the change is applied
        self.assertEqual(ctl.high, [False, True, False, False])
        # why: b exceeded, with its GNMR (about 50x its mean), Delta-GNMR
        # and score, from gnmrd's decision
        self.assertEqual(list(res.risky), ["b"])
        g, d, s = res.risky["b"]
        self.assertGreater(g, 10)
        self.assertGreater(d, 1)
        self.assertGreater(s, 0)
        calls.clear()
        self.assertTrue(self.train_step(net, x, 9, ctl))
        self.assertEqual(calls, [("b", False)])  # back after a calm step
        ctl.close()

    def test_report_async_then_finish_gives_the_same_routes(self):
        net = Net()
        ctl = Controller(net, self.d.agents, "torch-async",
                         params=gnmr.default_params(warmup_steps=0,
                                                    max_active=1,
                                                    lock_steps=0,
                                                    confirm_steps=1))
        x = torch.randn(32, 8)
        opt = torch.optim.SGD(net.parameters(), lr=0.0)  # grads unchanged
        for step in range(1, 10):
            net.zero_grad()
            net(x).pow(2).mean().backward()
            if step == 8:  # a spike in b, as in the synchronous test
                for p in net.b.parameters():
                    p.grad.mul_(50.0)
            ctl.report_async(step)
            opt.step()
            self.assertTrue(ctl.finish(step, wait_ms=5000))
            self.assertEqual(ctl.high, [False, step == 8, False, False],
                             msg=f"step {step}")
        # a repeated step is a no-op with a warning, never an exception
        with self.assertWarnsRegex(RuntimeWarning, r"step\(9\) again"):
            ctl.report_async(9)
        res = ctl.finish(9, wait_ms=10)
        self.assertTrue(res.repeated)
        self.assertFalse(res)
        # a report that fails on the worker raises in finish()
        def boom(t, stream=None, threads=None):
            raise gnmr.GnmrError(-1, "report")
        ctl._report = boom
        ctl.report_async(10)
        with self.assertRaises(gnmr.GnmrError):
            ctl.finish(10, wait_ms=10)
        ctl.close()

    def test_threaded_pass_gives_the_norms_of_one_thread(self):
        torch.manual_seed(3)
        net = torch.nn.Sequential(torch.nn.Linear(1024, 512),
                                  torch.nn.Linear(512, 600))
        with self.assertRaisesRegex(ValueError, "reduce_threads"):
            Controller(net, self.d.agents, "threads-bad", reduce_threads=-1)
        ctl = Controller(net, self.d.agents, "threads-job", reduce_threads=3,
                         params=gnmr.default_params(warmup_steps=0))
        x = torch.randn(8, 1024)
        for step in range(1, 4):
            res = self.train_step(net, x, step, ctl)
            self.assertTrue(res)
            for name, module in ctl.units:
                grads = [p.grad for p in module.parameters()]
                (s,), _ = gnmr.reduce_cpu(
                    [(0, g.data_ptr(), g.numel(), "float32")
                     for g in grads], 1)
                self.assertEqual(res.norms[name], s ** 0.5)
        ctl.close()

    def test_the_kept_table_follows_every_change_of_the_gradients(self):
        """The host pass keeps its table between steps (reduction.py,
        _HostTable); each way the gradients can change under it gives the
        norms a fresh pass gives: values changed in place, new tensors
        (set_to_none), a gradient made non-contiguous, a missing one, the
        model's dtype changed after the Controller was made (with and
        without gradients present), a gradient replaced while the old one
        is still held."""
        torch.manual_seed(5)
        net = torch.nn.Sequential(torch.nn.Linear(6, 6),
                                  torch.nn.Linear(6, 3))
        ctl = Controller(net, self.d.agents, "kept-table",
                         params=gnmr.default_params(warmup_steps=0))
        x = torch.randn(5, 6)

        def expect(res):
            self.expect_grad_norms(ctl, res)
            self.assertEqual(res.as_dict()["norms"], res.norms)

        net(x).pow(2).sum().backward()
        expect(ctl.step(1, wait_ms=5000))
        for p in net.parameters():  # in place: same tensors, same memory
            p.grad.mul_(3.0)
        expect(ctl.step(2, wait_ms=5000))
        net.zero_grad(set_to_none=True)  # new tensors
        net(x * 2).pow(2).sum().backward()
        expect(ctl.step(3, wait_ms=5000))
        w = net[0].weight
        w.grad = torch.randn(6, 6).t()  # not contiguous
        self.assertFalse(w.grad.is_contiguous())
        expect(ctl.step(4, wait_ms=5000))
        net[1].bias.grad = None  # one unit's part missing
        expect(ctl.step(5, wait_ms=5000))
        net.zero_grad(set_to_none=True)
        net.double()  # float64 parameters, after the Controller
        net(x.double()).pow(2).sum().backward()
        expect(ctl.step(6, wait_ms=5000))
        for p in net.parameters():
            p.grad = None
        net[0].weight.grad = torch.ones(6, 6, dtype=torch.float64)
        res = ctl.step(7, wait_ms=5000)
        expect(res)
        self.assertEqual(res.norms[ctl.units[1][0]], None)
        net(x.double()).pow(2).sum().backward()
        expect(ctl.step(8, wait_ms=5000))
        # the dtype changed with the gradients present: the same gradient
        # tensors, each given new float32 storage in place
        grads = [p.grad for p in net.parameters()]
        net.float()
        self.assertTrue(all(p.grad is g and g.dtype == torch.float32
                            for p, g in zip(net.parameters(), grads)))
        del grads
        expect(ctl.step(9, wait_ms=5000))
        # a gradient replaced while the old one lives on (held here): new
        # memory, read from the new tensor
        held = net[0].weight.grad
        net[0].weight.grad = held * 5
        expect(ctl.step(10, wait_ms=5000))
        del held
        # new tensors step after step: no longer watched (weak references
        # by the thousand bring the garbage collector's full passes), each
        # read and checked; kept ones again: watched again within
        # `rewatch` steps, then read by their pointers alone
        red = ctl._reduction
        red.rewatch = 4
        for step in range(11, 14):
            net.zero_grad(set_to_none=True)
            net(x * step).pow(2).sum().backward()
            expect(ctl.step(step, wait_ms=5000))
        self.assertGreaterEqual(red._fresh, 2)
        self.assertEqual(red._hcache.refs, [])
        for step in range(14, 20):
            for p in net.parameters():
                p.grad.mul_(0.5)
            expect(ctl.step(step, wait_ms=5000))
        self.assertEqual(red._fresh, 0)
        self.assertEqual(len(red._hcache.refs), 4)
        ctl.close()

    def test_parameters_without_gradients_are_left_out_of_the_kept_table(
            self):
        """Issue 49: frozen parameters (LoRA's base weights) and units out
        of the loss no longer make every step walk the parameters: they
        are left out of the kept table while their gradient is None, and
        one that gets a gradient (unfrozen, or set by hand) is counted
        from that step on, as the walk counts it."""
        torch.manual_seed(9)
        net = torch.nn.Sequential(torch.nn.Linear(5, 5),
                                  torch.nn.Linear(5, 5),
                                  torch.nn.Linear(5, 2))
        net[0].weight.requires_grad_(False)  # an adapter's frozen base
        for p in net[1].parameters():  # a frozen unit
            p.requires_grad_(False)
        ctl = Controller(net, self.d.agents, "kept-frozen",
                         params=gnmr.default_params(warmup_steps=0))
        red = ctl._reduction
        x = torch.randn(4, 5)

        def step(t, after_backward=lambda: None):
            net.zero_grad(set_to_none=False)
            net(x * t).pow(2).sum().backward()
            after_backward()
            res = ctl.step(t, wait_ms=5000)
            self.expect_grad_norms(ctl, res)
            return res

        for t in (1, 2, 3):
            step(t)
        self.assertEqual(red.walks, 0)  # never walked
        self.assertEqual(len(red._flat), 3)  # bias 0, weight and bias 2
        net[0].weight.requires_grad_(True)  # unfrozen: counted at once
        step(4)
        self.assertEqual(red.walks, 1)
        step(5)
        step(6)
        self.assertEqual(red.walks, 1)  # kept again, with it
        self.assertEqual(len(red._flat), 4)
        # a gradient set by hand while frozen
        res = step(7, lambda: setattr(net[1].weight, "grad",
                                      torch.ones(5, 5)))
        self.assertEqual(res.norms[ctl.units[1][0]], 5.0)
        self.assertEqual(red.walks, 2)
        ctl.close()

    def test_main_grad_views_of_one_buffer_are_read_from_a_kept_table(self):
        """Megatron-style: every parameter's main_grad a view of one flat
        fp32 buffer. The host pass keeps its table for them too (issue
        49): each change gives the norms a fresh pass gives (the buffer
        written in place, a main_grad moved to a new buffer, one None and
        its p.grad read instead), and p.grad is never read while main_grad
        is set."""
        torch.manual_seed(6)
        net = torch.nn.Sequential(torch.nn.Linear(6, 6),
                                  torch.nn.Linear(6, 3))
        params = list(net.parameters())

        def attach(buf):
            off = 0
            for p in params:
                p.main_grad = buf[off:off + p.numel()].view_as(p)
                off += p.numel()
        total = sum(p.numel() for p in params)
        attach(torch.zeros(total))
        ctl = Controller(net, self.d.agents, "main-grad-kept",
                         params=gnmr.default_params(warmup_steps=0))
        self.assertIsNotNone(ctl._reduction._kept)  # not walked each step

        def expect(res):
            for name, module in ctl.units:
                gs = [p.main_grad if p.main_grad is not None else p.grad
                      for p in module.parameters()]
                want = sum(float(g.double().pow(2).sum()) for g in gs
                           if g is not None)
                self.assertAlmostEqual(res.norms[name], want ** 0.5,
                                       delta=1e-6 * want ** 0.5)

        for p in params:  # a p.grad that must not be read
            p.grad = torch.full_like(p, 1e6)
        tables = []
        for step, scale in ((1, 1.0), (2, 3.0)):
            for p in params:  # accumulated in place into the buffer
                p.main_grad.copy_(torch.randn_like(p) * scale)
            expect(ctl.step(step, wait_ms=5000))
            tables.append(ctl._reduction._hcache)
        self.assertIsNotNone(tables[0])
        self.assertIs(tables[0], tables[1])  # kept, not made again
        attach(torch.randn(total))  # a new buffer: every view moved
        expect(ctl.step(3, wait_ms=5000))
        params[1].main_grad = None  # read from p.grad instead
        expect(ctl.step(4, wait_ms=5000))
        attach(torch.randn(total, dtype=torch.float64))  # another dtype
        expect(ctl.step(5, wait_ms=5000))
        ctl.close()

    def test_main_grad_buffers_are_checked_each_step_and_views_in_turn(
            self):
        """Issue 49: main_grad views of a few buffers are checked by each
        buffer's pointer and size every step and `spot` views a step in
        turn (reduction.py, _static): a buffer given new memory in place
        is read from it at the next step; a view moved in place is read
        from its buffer's memory (kept allocated) for at most
        len(views) / spot steps, then from where it went; views that are
        not of a few buffers are checked one by one every step."""
        torch.manual_seed(7)
        net = torch.nn.Sequential(torch.nn.Linear(6, 6),
                                  torch.nn.Linear(6, 3),
                                  torch.nn.Linear(3, 3))
        params = list(net.parameters())  # 6 views
        total = sum(p.numel() for p in params)
        buf = torch.randn(total)
        off = 0
        for p in params:
            p.main_grad = buf[off:off + p.numel()].view_as(p)
            off += p.numel()
        ctl = Controller(net, self.d.agents, "main-grad-static",
                         params=gnmr.default_params(warmup_steps=0))
        red = ctl._reduction
        red.spot = 2

        def norms_of(gs):
            return [sum(float(g.double().pow(2).sum()) for g in u) ** 0.5
                    for u in gs]

        def got(res):  # rounded: the library sums in its own order
            return [round(res.norms[name], 9) for name, _ in ctl.units]

        def want():
            return [round(x, 9) for x in norms_of(
                [[p.main_grad for p in m.parameters()]
                 for _, m in ctl.units])]

        self.assertEqual(got(ctl.step(1, wait_ms=5000)), want())
        self.assertEqual(len(red._hcache.storages), 1)
        # the buffer's storage given new memory in place (as an offload
        # and reload does): every view moved with it
        st = buf.untyped_storage()
        nbytes = st.nbytes()
        old_ptr = buf.data_ptr()
        st.resize_(0)
        st.resize_(nbytes)
        self.assertNotEqual(buf.data_ptr(), old_ptr)
        buf.copy_(torch.randn(total) * 3)
        self.assertEqual(got(ctl.step(2, wait_ms=5000)), want())
        # the last view moved in place to memory of its own
        region = params[5].main_grad.clone()  # what its buffer holds
        params[5].main_grad.set_(torch.full((3,), 7.0))
        stale = round(norms_of([[params[4].main_grad, region]])[0], 9)
        last = ctl.units[2][0]
        seen = []
        for step in range(3, 7):
            res = ctl.step(step, wait_ms=5000)
            self.assertEqual(got(res)[:2], want()[:2])
            seen.append(round(res.norms[last], 9))
        self.assertIn(seen[0], (stale, want()[2]))
        k = seen.index(want()[2])  # found within 6 / 2 steps
        self.assertLessEqual(k, 2, seen)
        self.assertEqual(seen[:k], [stale] * k)
        self.assertEqual(seen[k:], [want()[2]] * (4 - k))
        self.assertEqual(len(red._hcache.storages), 2)
        for step in range(7, 10):  # moved at every step: from the third,
            before = buf.data_ptr()  # every view is checked every step
            st.resize_(0)
            # the freed block taken meanwhile, so that the buffer's new
            # memory is elsewhere (the allocator gave the same block back
            # once, and nothing had moved)
            hold = torch.empty(total)
            st.resize_(nbytes)
            self.assertNotEqual(buf.data_ptr(), before)
            del hold
            buf.copy_(torch.randn(total))
            self.assertEqual(got(ctl.step(step, wait_ms=5000)), want())
        self.assertEqual(red.spot, 0)
        self.assertIsNone(red._hcache.storages)
        ctl.close()

        # main_grads of their own: no buffers to check, each view checked
        # every step
        net = torch.nn.Sequential(*[torch.nn.Linear(2, 2)
                                    for _ in range(6)])
        for p in net.parameters():
            p.main_grad = torch.randn_like(p)
        ctl = Controller(net, self.d.agents, "main-grad-own",
                         params=gnmr.default_params(warmup_steps=0))
        ctl._reduction.spot = 1
        self.assertEqual(got(ctl.step(1, wait_ms=5000)), want())
        self.assertIsNone(ctl._reduction._hcache.storages)
        net[3].bias.main_grad.set_(torch.full((2,), 5.0))
        self.assertEqual(got(ctl.step(2, wait_ms=5000)), want())
        ctl.close()

    def test_nonfinite_gradient_is_selected_and_idle_unit_is_not(self):
        net = Net()
        ctl = Controller(net, self.d.agents, "nan-job",
                         params=gnmr.default_params(warmup_steps=0,
                                                    max_active=2,
                                                    lock_steps=0))
        x = torch.randn(16, 8)
        for step in range(1, 4):
            self.assertTrue(self.train_step(net, x, step, ctl))
        net.zero_grad()
        net(x).pow(2).mean().backward()
        net.c.weight.grad[0, 0] = float("nan")
        self.assertTrue(ctl.step(4, wait_ms=5000))
        self.assertEqual(ctl.high, [False, False, True, False])
        ctl.close()

    def test_shadow_keeps_a_recovered_unit_while_its_low_path_would_fail(
            self):
        with self.assertRaisesRegex(ValueError, "shadow"):
            Controller(Net(), self.d.agents, "shadow-bad", shadow=3)
        x = torch.randn(16, 8)
        held, decided = {}, {}
        trace = os.path.join(self.d.dir, "shadow.csv")
        for use_shadow in (False, True):
            net, damaged = Net(), set()
            ctl = Controller(
                net, self.d.agents, f"shadow-{use_shadow}",
                shadow=(lambda n, m: n in damaged) if use_shadow else None,
                trace=trace if use_shadow else None,
                on_decision=lambda r: decided.__setitem__(
                    r.step, " ".join(str("abc".index(n)) for n in r.active)),
                params=gnmr.default_params(warmup_steps=0, max_active=1,
                                           lock_steps=1))
            for step in range(1, 4):
                self.assertEqual(self.train_step(net, x, step, ctl).shadowed,
                                 [])
            # b's low-cost path fails: a NaN in its gradient
            net.zero_grad()
            net(x).pow(2).mean().backward()
            net.b.weight.grad[0, 0] = float("nan")
            res = ctl.step(4, wait_ms=5000)
            self.assertEqual((res.nonfinite, res.shadowed), (["b"], []))
            self.assertEqual(ctl.high, [False, True, False, False])
            # on its recovery path b's gradient is clean, but its low-cost
            # path would still fail for three steps (a's would too, but a
            # is on its low-cost path: its own gradient would say so)
            damaged |= {"a", "b"}
            held[use_shadow] = []
            for step in range(5, 11):
                if step == 8:
                    damaged.clear()
                res = self.train_step(net, x, step, ctl)
                self.assertTrue(res)
                self.assertEqual(res.nonfinite, [])  # no real NaN/Inf
                self.assertEqual(res.shadowed,
                                 ["b"] if use_shadow and step < 8 and
                                 ctl.high[1] else [], msg=step)
                if res.shadowed:  # gnmrd saw a non-finite norm
                    self.assertEqual(list(res.risky), ["b"])
                    self.assertTrue(math.isinf(res.risky["b"][2]))
                held[use_shadow].append(ctl.high[1])
            ctl.close()
        # without shadow, b is released after its lock (one calm step);
        # with it, b stays while the damage lasts, then for its lock
        self.assertEqual(held[False], [True, False, False, False, False,
                                       False])
        self.assertEqual(held[True], [True, True, True, True, False, False])
        # the trace holds what gnmrd decided from (shadowed units as NaN):
        # replayed offline, it gives the same decisions
        r = subprocess.run([os.path.join(BIN, "gnmrctl"), "replay",
                            "--warmup-steps", "0", "--max-active", "1",
                            "--lock-steps", "1", trace],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        rows = r.stdout.splitlines()
        self.assertEqual(rows[0], "step,active")
        self.assertEqual(rows[1:], [f"{t},{decided[t]}"
                                    for t in range(1, 11)])

    def test_shadow_low_promotes_what_the_low_path_damaged(self):
        with self.assertRaisesRegex(ValueError, "shadow_low"):
            Controller(Net(), self.d.agents, "shadow-low-bad",
                       shadow_low=True)
        x = torch.randn(16, 8)
        damaged = set()
        net = Net()
        ctl = Controller(net, self.d.agents, "shadow-low",
                         shadow=lambda n, m: n in damaged, shadow_low=True,
                         params=gnmr.default_params(warmup_steps=0,
                                                    max_active=1,
                                                    lock_steps=1))
        for step in range(1, 4):
            res = self.train_step(net, x, step, ctl)
            self.assertEqual((res.active, res.shadowed), ([], []))
        # c's low-cost path damages it at steps 4-5 (its gradient is
        # calm): the measure alone promotes it, and holds it while it lasts
        damaged.add("c")
        active = []
        for step in range(4, 9):
            if step == 6:
                damaged.clear()
            res = self.train_step(net, x, step, ctl)
            self.assertEqual(res.nonfinite, [])  # no real NaN: no skip
            self.assertEqual(res.shadowed, ["c"] if step < 6 else [])
            active.append(res.active)
        # decided at 4 (c on its low path), held at 5, then its lock
        self.assertEqual(active, [["c"], ["c"], ["c"], [], []])
        ctl.close()

    def test_measure_judges_each_unit_against_its_own_measure(self):
        """measure= (docs/policy.md, "Measured signal"): a unit whose
        measure trebles is promoted though its gradient is calm; a unit
        whose measure is always coarse is not; the history's exceed says
        which signal; a bad measure is a clear error."""
        with self.assertRaisesRegex(ValueError, "measure=0.5: a function"):
            Controller(Net(), self.d.agents, "measure-bad", measure=0.5)
        x = torch.randn(16, 8)
        level = {"a": 0.01, "b": 0.02, "c": 0.4}  # c: always coarse
        net = Net()
        ctl = Controller(net, self.d.agents, "measure-job",
                         measure=lambda n, m: level.get(n),
                         params=gnmr.default_params(
                             warmup_steps=0, max_active=1, lock_steps=1,
                             confirm_steps=1, measure_alpha=2.0))
        for step in range(1, 5):
            res = self.train_step(net, x, step, ctl)
            self.assertEqual(res.active, [])
        # a x3; c x1.25 (still far above a): the step's median ratio is
        # c's 1.25 (job-relative), so a scores 3 / (2 x 1.25) = 1.2
        level["a"], level["c"] = 0.03, 0.5
        res = self.train_step(net, x, 5, ctl)
        self.assertEqual((res.active, res.nonfinite), (["a"], []))
        level["a"] = -1.0
        with self.assertRaisesRegex(Exception, "negative"):
            self.train_step(net, x, 6, ctl)
        ctl.close()
        r = subprocess.run([os.path.join(BIN, "gnmrctl"), "--admin",
                            f"ipc://{self.d.dir}/admin.sock", "history",
                            "measure-job", "--kind", "exceed"],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 0, r.stderr)
        rows = [ln for ln in r.stdout.splitlines() if "exceed" in ln]
        self.assertEqual(len(rows), 1, r.stdout)
        self.assertIn("signal=measure measure=0.03 gm=3", rows[0])

    def test_same_step_moves_a_unit_within_the_step_its_measure_jumps(self):
        """same_step=True (docs/policy.md, "Same-step mode"): a unit whose
        low path's measure, taken before its GEMM, is above the bound of
        gnmrd's latest decision takes its recovery path in that very step,
        within the spare budget; gnmrd then promotes it as usual."""
        from gnmr.quant import QuantLinear
        from gnmr.recovery import switch
        with self.assertRaisesRegex(ValueError, "give measure="):
            Controller(Net(), self.d.agents, "same-bad", same_step=True)
        with self.assertRaisesRegex(ValueError, "same_step_gate"):
            Controller(Net(), self.d.agents, "same-bad2", same_step=True,
                       measure=lambda n, m: 0.1)

        class QNet(torch.nn.Module):
            def __init__(self):
                super().__init__()
                torch.manual_seed(1)
                self.a = QuantLinear(32, 32, low="int8-row", high="exact")
                self.b = QuantLinear(32, 32, low="int8-row", high="exact")

            def forward(self, x):
                return self.b(torch.relu(self.a(x)))

        for budget in (2, 0):
            net = QNet().train()
            ctl = Controller(
                net, self.d.agents, f"same-step-{budget}",
                select=(QuantLinear,), on_route=switch, same_step=True,
                measure=lambda n, m: m.low_error,
                params=gnmr.default_params(
                    warmup_steps=0, max_active=budget, lock_steps=1,
                    confirm_steps=1, measure_alpha=3.0, same_step=1))
            x = torch.randn(64, 32)
            for step in range(1, 6):
                res = self.train_step(net, x, step, ctl)
                self.assertEqual((res.active, res.same_step), ([], []))
            step, spare, bounds = ctl.agent.bounds()
            self.assertEqual((step, spare), (5, budget))
            self.assertTrue(all(0 < b < 1 for b in bounds), bounds)
            net.a.latent = ([3], 512.0)   # a's low path loses its rows
            res = self.train_step(net, x, 6, ctl)
            if budget:
                # switched at step 6 itself, and promoted for step 7 on
                self.assertEqual(res.same_step, ["a"])
                self.assertEqual(res.active, ["a"])
            else:  # no spare budget: nobody moves within a step
                self.assertEqual((res.same_step, res.active), ([], []))
            net.a.latent = None
            res = self.train_step(net, x, 7, ctl)
            self.assertEqual(res.same_step, [])
            ctl.close()

    def test_observer_replicas_get_the_same_routes(self):
        net = Net()
        p = gnmr.default_params(warmup_steps=0, max_active=1, lock_steps=3,
                                confirm_steps=1)  # a one-step spike
        reporter = Controller(net, self.d.agents, "dp-job", params=p,
                              global_rank=0)
        replica = Controller(Net(), self.d.agents, "dp-job", params=p,
                             global_rank=1)  # tp_size 1: replica 1 observes
        self.assertTrue(replica.agent.observer)
        for _ in range(200):
            if reporter.agent.joined and replica.agent.joined:
                break
            time.sleep(0.02)
        x = torch.randn(16, 8)
        for step in range(1, 10):
            net.zero_grad()
            net(x).pow(2).mean().backward()
            if step == 7:
                for q in net.a.parameters():
                    q.grad.mul_(100.0)
            reporter.report(step)
            replica.report(step)
            self.assertTrue(reporter.agent.wait(step, 5000))
            self.assertTrue(replica.agent.wait(step, 5000))
            self.assertEqual(reporter.apply_routes(), replica.apply_routes())
        self.assertTrue(reporter.high[0])
        self.assertEqual(replica.agent.stats()["reports_sent"], 0)
        reporter.close()
        replica.close()


class RelayTest(unittest.TestCase):
    """A node relay between the Controller and gnmrd (docs/protocol.md,
    "Node relays"): the Controller finds it as it finds a gnmrd, and the
    node's ranks per node come from the launcher."""

    def test_node_ranks_come_from_the_launcher_when_every_rank_reports(self):
        from gnmr._layout import Layout, node_ranks
        keep = dict(os.environ)
        try:
            for var in ("LOCAL_WORLD_SIZE", "LOCAL_RANK",
                        "SLURM_NTASKS_PER_NODE", "SLURM_LOCALID"):
                os.environ.pop(var, None)
            every = Layout(5, 8, 5, 8, False)  # rank 5 of 8, all report
            self.assertEqual(node_ranks(every), 0)  # no launcher said
            os.environ.update(LOCAL_WORLD_SIZE="4", LOCAL_RANK="1")
            self.assertEqual(node_ranks(every), 4)  # torchrun: 5 = 4 + 1
            os.environ["LOCAL_RANK"] = "2"  # not a node at a time
            self.assertEqual(node_ranks(every), 0)
            os.environ["LOCAL_RANK"] = "1"
            # replica 0 reports its 2 shards, the others observe: the
            # reporters are not the launcher's ranks
            self.assertEqual(node_ranks(Layout(1, 8, 1, 2, False)), 0)
            self.assertEqual(node_ranks(Layout(0, 1, 0, 1, False)), 0)
            os.environ.update(LOCAL_WORLD_SIZE="3")  # 8 % 3 != 0
            self.assertEqual(node_ranks(every), 0)
            for var in ("LOCAL_WORLD_SIZE", "LOCAL_RANK"):
                os.environ.pop(var)
            os.environ.update(SLURM_NTASKS_PER_NODE="2", SLURM_LOCALID="1")
            self.assertEqual(node_ranks(every), 2)
            os.environ["SLURM_NTASKS_PER_NODE"] = "4(x2)"
            self.assertEqual(node_ranks(every), 0)
        finally:
            os.environ.clear()
            os.environ.update(keep)
        with self.assertRaisesRegex(ValueError, "node_ranks=4097: an "
                                    "integer from 0 to 4096"):
            Controller(Net(), "ipc:///nonexistent/x", "j", node_ranks=4097)

    def test_a_controller_steps_through_a_relay(self):
        d = Daemon()
        ep = f"ipc://{d.dir}/node0.sock"
        with open(d.dir + "/relay.err", "wb") as err:
            relay = subprocess.Popen(
                [os.path.join(BIN, "gnmrd"), "--relay-to", d.agents,
                 "--agents", ep], stderr=err)
        try:
            net, x = Net(), torch.randn(32, 8)
            ctl = Controller(net, ep, "relayed-job", join_wait_ms=10000,
                             params=gnmr.default_params(
                                 warmup_steps=0, max_active=1, lock_steps=0,
                                 confirm_steps=1, mean_horizon=0,
                                 job_relative=0))
            for step in range(1, 12):
                net.zero_grad()
                net(x).pow(2).mean().backward()
                if step == 8:  # a spike in b
                    for p in net.b.parameters():
                        p.grad.mul_(1e3)
                res = ctl.step(step, wait_ms=10000)
                self.assertTrue(res, f"no decision of step {step}")
                if step == 8:
                    self.assertIn("b", res.risky)
            ctl.close()
            out = subprocess.run(
                [os.path.join(BIN, "gnmrctl"), f"--admin=ipc://{d.dir}/"
                 "admin.sock", "status", "relayed-job", "--json"],
                capture_output=True, text=True, timeout=30)
            self.assertEqual(out.returncode, 0, out.stderr)
            st = json.loads(out.stdout)
            self.assertEqual((st["step"], st["reporters"]), (11, 1))
        finally:
            relay.send_signal(signal.SIGTERM)
            self.assertEqual(relay.wait(timeout=30), 0)
            self.assertEqual(d.stop(), 0)


class ClipNet(torch.nn.Module):
    """Three units (a, b, c) and parameters in no unit (the norm, a bias
    of the root)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.a = torch.nn.Linear(8, 16)
        self.norm = torch.nn.LayerNorm(16)
        self.b = torch.nn.Linear(16, 16)
        self.c = torch.nn.Linear(16, 4)
        self.shift = torch.nn.Parameter(torch.randn(4))

    def forward(self, x):
        h = self.norm(torch.relu(self.a(x)))
        return self.c(torch.relu(self.b(h))) + self.shift


class ClipTest(unittest.TestCase):
    """Controller.clip_grad_norm_ against torch's, on twin models."""

    def setUp(self):
        self.d = Daemon()
        self.net, self.twin = ClipNet(), ClipNet()
        self.ctl = Controller(self.net, self.d.agents, "clip-job",
                              join_wait_ms=5000)
        self.x = torch.randn(32, 8)
        self.step = 0

    def tearDown(self):
        self.ctl.close()
        self.assertEqual(self.d.stop(), 0)

    def backward(self, scale=1.0):
        for m in (self.net, self.twin):
            m.zero_grad()
            (m(self.x).pow(2).mean() * scale).backward()
        self.step += 1
        return self.ctl.step(self.step, wait_ms=5000)

    def assert_like_torch(self, got, params=None, **kw):
        want = torch.nn.utils.clip_grad_norm_(
            self.twin.parameters() if params is None else params(self.twin),
            **kw)
        if math.isnan(want.item()):
            self.assertTrue(math.isnan(got.item()))
        else:
            self.assertAlmostEqual(got.item(), want.item(),
                                   delta=1e-6 * want.item())
        for (n, p), q in zip(self.net.named_parameters(),
                             self.twin.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-6, atol=0,
                                       equal_nan=True, msg=n)
        return want

    def test_the_report_sums_stand_in_for_torch_norms(self):
        self.backward()
        # the first call is torch's own; the sums are kept from then on
        self.assert_like_torch(
            self.ctl.clip_grad_norm_(self.net.parameters(), 0.1),
            max_norm=0.1)
        real = torch.nn.utils.clip_grad_norm_
        for scale, max_norm in ((1.0, 0.05), (3.0, 0.05), (1.0, 1e6)):
            res = self.backward(scale)
            before = {n: p.grad.norm().item()
                      for n, p in self.net.named_parameters()}
            from unittest import mock
            with mock.patch.object(torch.nn.utils, "clip_grad_norm_",
                                   side_effect=AssertionError("torch's")):
                got = self.ctl.clip_grad_norm_(self.net.parameters(),
                                               max_norm)
            want = self.assert_like_torch(got, max_norm=max_norm)
            self.assertIs(torch.nn.utils.clip_grad_norm_, real)
            if max_norm > want.item():  # untouched, as torch leaves them
                for n, p in self.net.named_parameters():
                    self.assertEqual(p.grad.norm().item(), before[n])
            # GNMR saw the gradients before the clip
            bw = math.sqrt(before["b.weight"] ** 2 + before["b.bias"] ** 2)
            self.assertAlmostEqual(res.norms["b"], bw, delta=1e-5 * bw)
        # NaN in a parameter of no unit: NaN total, every gradient NaN,
        # as torch makes them (its factor is NaN)
        self.backward()
        for m in (self.net, self.twin):
            m.norm.weight.grad[0] = math.nan
        from unittest import mock
        with mock.patch.object(torch.nn.utils, "clip_grad_norm_",
                               side_effect=AssertionError("torch's")):
            got = self.ctl.clip_grad_norm_(self.net.parameters(), 1.0)
        self.assertTrue(math.isnan(got.item()))
        self.assert_like_torch(got, max_norm=1.0)
        self.assertTrue(self.net.a.weight.grad.isnan().all())

    def test_torch_clips_where_the_sums_cannot_stand_in(self):
        self.backward()
        self.ctl.clip_grad_norm_(self.net.parameters(), 1e6)  # the first
        def twin_only(m):
            return m.parameters()
        cases = [
            # changed after the report (GradScaler.unscale_ after step())
            ("changed", lambda: [p.grad.mul_(0.5) for p in (
                self.net.b.weight, self.twin.b.weight)], twin_only, {}),
            # part of unit b only
            ("part", None, lambda m: [q for n, q in m.named_parameters()
                                      if n != "b.bias"], {}),
            ("norm_type", None, twin_only, {"norm_type": 1.0}),
            ("listed twice", None,
             lambda m: list(m.parameters()) + [m.a.weight], {}),
            ("NaN", lambda: [p.grad.view(-1).__setitem__(0, math.nan)
                             for p in (self.net.c.bias, self.twin.c.bias)],
             twin_only, {}),
        ]
        for why, change, params, kw in cases:
            with self.subTest(why):
                if why == "NaN":  # non-finite when reduced: a fresh step
                    self.backward()
                    change()
                    self.step += 1
                    self.ctl.step(self.step, wait_ms=5000)
                    self.assertEqual(self.ctl._reduction.local[1][2], 1)
                else:
                    self.backward()
                    if change is not None:
                        change()
                calls = []
                real = torch.nn.utils.clip_grad_norm_

                def spy(*a, **k):
                    calls.append(1)
                    return real(*a, **k)
                from unittest import mock
                with mock.patch.object(torch.nn.utils, "clip_grad_norm_",
                                       spy):
                    got = self.ctl.clip_grad_norm_(
                        params(self.net), 0.05, **kw)
                self.assertEqual(calls, [1])
                self.assert_like_torch(got, params, max_norm=0.05, **kw)


class ExampleTest(unittest.TestCase):
    """experiments/stress.py on a tiny model: every variant, the JSON,
    and the same numbers from a subset of seeds and variants."""
    SMALL = ["--steps", "40", "--warmup", "5", "--eval-every", "20",
             "--eval-batches", "2", "--d", "32", "--layers", "1",
             "--heads", "2", "--ctx", "16", "--batch", "4",
             "--episode-rate", "0.08", "--gnmrd-bin", BIN]

    @classmethod
    def setUpClass(cls):
        sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..",
                                        "..", "experiments"))
        import stress as quant_stress
        cls.qs = quant_stress

    def main(self, args):
        import io
        import contextlib
        out = io.StringIO()
        det, threads = (torch.are_deterministic_algorithms_enabled(),
                        torch.get_num_threads())
        try:
            with contextlib.redirect_stdout(out):
                res = self.qs.main(self.SMALL + args)  # args win
        finally:  # the example sets both for the process it runs in
            torch.use_deterministic_algorithms(det)
            torch.set_num_threads(threads)
        return res, out.getvalue()

    def test_every_variant_json_and_reruns_of_one_seed_and_variant(self):
        tmp = tempfile.mkdtemp(prefix="gnmr-stress-test-")
        try:
            js = os.path.join(tmp, "stress.json")
            res, text = self.main(["--seed-list", "1,2", "--jobs", "2",
                                   "--json", js])
            for v in self.qs.DEFAULT_VARIANTS:
                self.assertEqual(len(res[v]), 2, v)
                self.assertTrue(all(math.isfinite(r["val"]) for r in res[v]))
                self.assertRegex(text, rf"\n\| {v} \| \d+\.\d+ ± ")
            for r in res["low"] + res["fp"]:
                self.assertEqual(r["share"], 0.0)
            for r in res["high"]:
                self.assertEqual((r["share"], r["skipped"]), (1.0, 0))
            # the episodes overflow the low path's stale FP8 scale
            self.assertGreater(sum(r["skipped"] for r in res["low"]), 0)
            for i in range(2):
                g, now = res["gnmr"][i], res["oracle_now"][i]
                # rawnorm recovers as many units as GNMR at every step
                self.assertEqual(res["rawnorm"][i]["share"], g["share"])
                self.assertAlmostEqual(res["random"][i]["share"],
                                       g["share"], delta=0.1)
                # the same-step oracle recovers only damaged unit-steps
                self.assertEqual(now["precision"], 1.0)
                self.assertLessEqual(now["skipped"], res["low"][i]["skipped"])
                self.assertTrue(all(len(a) <= 2 for a in now["active"]))
                self.assertTrue(all(len(a) <= 2 for a in
                                    res["oracle"][i]["active"]))
            with open(js) as f:
                doc = json.load(f)
            self.assertEqual(doc["seeds"], [1, 2])
            self.assertRegex(doc["commit"],
                             r"^([0-9a-f]{40}(-dirty)?|unknown)$")
            self.assertIn("--seed-list 1,2", doc["command"])
            for v in self.qs.DEFAULT_VARIANTS:
                for key in ("val", "share", "precision", "coverage"):
                    self.assertEqual(len(doc["variants"][v][key]), 2)
            self.assertIn("oracle-random", doc["paired"])
            # every damage unit-step not recovered has one cause
            for v in self.qs.DEFAULT_VARIANTS:
                d = doc["variants"][v]
                for i in range(2):
                    n = d["damage_unit_steps"][i]
                    missed = sum(d["misses_by_cause"][c][i]
                                 for c in self.qs.MISS_CAUSES)
                    self.assertAlmostEqual(
                        missed, n * (1 - d["coverage"][i]) if n else 0,
                        delta=1e-3 * max(n, 1), msg=v)
            self.assertEqual(doc["variants"]["high"]["misses_by_cause"]
                             ["first"], [0, 0])
            self.assertRegex(text, r"\| gnmr \| \d\.\d\d \| \d\.\d\d \|")
            for i in range(2):
                nan = res["nanonly"][i]
                # nanonly recovers a unit only in the lock's steps after a
                # non-finite norm of it, within the budget, never in
                # warm-up (5 steps here; the first decision acts at 7)
                self.assertTrue(all(len(a) <= 2 for a in nan["active"]))
                self.assertEqual(nan["active"][1:7], [[]] * 6)
                self.assertGreater(nan["share"], 0)
                # its random fill brings it to GNMR's share
                self.assertAlmostEqual(res["nanonly_random"][i]["share"],
                                       res["gnmr"][i]["share"], delta=0.01)
                # every variant sees the non-finite norms its low path gave
                self.assertEqual(res["high"][i]["nonfinite"], 0.0)
                self.assertGreater(res["low"][i]["nonfinite"], 0.0)
            for v in ("nanonly", "nanonly_random"):
                self.assertIn(v, doc["gap_closed"])
            self.assertIn("gnmr-nanonly", doc["paired"])
            self.assertTrue(os.path.getsize(os.path.join(tmp, "stress.md")))
            # one seed and two variants again, in one process: the same
            again, _ = self.main(["--seed-list", "2", "--variants",
                                  "oracle,rawnorm"])
            for v in ("oracle", "rawnorm"):
                self.assertEqual(again[v][0]["val"], res[v][1]["val"], v)
                self.assertEqual(again[v][0]["active"], res[v][1]["active"])
            # gnmr_shadow (not a default variant) beside gnmr: gnmr's
            # numbers again; GNMR now holds what its recovery hid
            shadow, text = self.main(["--seed-list", "1", "--variants",
                                      "gnmr,gnmr_shadow"])
            g, sh = shadow["gnmr"][0], shadow["gnmr_shadow"][0]
            self.assertEqual(g["val"], res["gnmr"][0]["val"])
            self.assertIn("| gnmr_shadow-gnmr |", text)
            self.assertGreater(g["misses"]["hidden"], 0)
            self.assertLess(sh["misses"]["hidden"], g["misses"]["hidden"])
            self.assertGreaterEqual(sh["share"], g["share"])
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def test_validation_is_measured_with_no_episode_active(self):
        """Episodes scale 2 token positions of every unit's input by 1e4
        (every other step, the last one included); what the projections
        see while evaluate() runs is the model's own activations."""
        from unittest import mock
        seen = []
        real = self.qs.evaluate

        def evaluate(model, val, args):
            big = [0.0]

            def hook(module, inputs):
                big[0] = max(big[0], float(inputs[0].abs().max()))
            hs = [m.register_forward_pre_hook(hook) for m in model.modules()
                  if isinstance(m, torch.nn.Linear)]
            try:
                return real(model, val, args)
            finally:
                for h in hs:
                    h.remove()
                seen.append(big[0])
        with mock.patch.object(self.qs, "evaluate", evaluate):
            res, _ = self.main(["--seed-list", "1", "--variants", "fp",
                                "--episode-rate", "1", "--episode-scales",
                                "10000", "--steps", "41"])
        self.assertEqual(len(seen), 3)         # steps 20, 40 and 41
        self.assertLess(max(seen), 1000.0, seen)
        self.assertTrue(math.isfinite(res["fp"][0]["val"]))

    def test_a_saturating_cast_gives_no_nan_for_nanonly_to_see(self):
        res, _ = self.main(["--seed-list", "1", "--variants",
                            "low,nanonly", "--saturate"])
        self.assertEqual(res["low"][0]["skipped"], 0)
        self.assertEqual(res["low"][0]["nonfinite"], 0.0)
        self.assertGreater(res["low"][0]["damage"], 0.0)  # clipped, silently
        self.assertEqual(res["nanonly"][0]["share"], 0.0)
        self.assertEqual(res["nanonly"][0]["val"], res["low"][0]["val"])

    def test_each_miss_has_its_cause(self):
        import argparse
        args = argparse.Namespace(warmup=1, lock_steps=1)
        hit = {1, 2, 3, 4, 5, 7, 10}  # damage of unit 0 (unit 1: none)
        damage = [[t in hit, False] for t in range(11)]
        active = [set() for _ in range(11)]
        active[4] = {0}               # recovered at 4: no miss there
        got = self.qs.misses_by_cause(damage, active, args)
        # 1, 2: decided in warm-up; 3: damaged at 2 on the low path;
        # 5: damaged at 4 on the recovery path; 7: damaged at 5, not 6;
        # 10: nothing in 8, 9
        self.assertEqual(got, {"warmup": 2, "not_chosen": 1, "hidden": 1,
                               "gap": 1, "first": 1})
        self.assertEqual(sum(got.values()), len(hit) - 1)

    def test_the_docs_quote_the_committed_results(self):
        """Every table row of each setting's docs/results/<setting>.md
        (what `make experiment` wrote) is in docs/experiments.md, in the
        same order, and each json holds the variants the table shows."""
        root = os.path.join(os.path.dirname(__file__), "..", "..")
        with open(os.path.join(root, "docs", "experiments.md")) as f:
            readme = f.read().splitlines()
        for setting in ("stress", "stress_saturate"):
            base = os.path.join(root, "docs", "results", setting)
            with open(base + ".md") as f:
                rows = [ln for ln in f.read().splitlines()
                        if ln.startswith("|")]
            with open(base + ".json") as f:
                doc = json.load(f)
            self.assertLessEqual({"low", "high", "gnmr", "random", "oracle",
                                  "rawnorm", "global", "nanonly",
                                  "nanonly_random"}, set(doc["variants"]),
                                 setting)
            self.assertEqual(doc["seeds"], [21, 22, 23, 24, 25], setting)
            self.assertGreater(len(rows), 10)
            at = 0
            for row in rows:
                self.assertIn(row, readme[at:], "docs/experiments.md does "
                              f"not quote docs/results/{setting}.md's row, "
                              "in order")
                at = readme.index(row, at) + 1

    def test_bad_arguments_are_clear_errors(self):
        import io
        import contextlib
        for args, msg in ((["--variants", "low,best"], "unknown variant"),
                          (["--seed-list", "1,x"], "bad number list"),
                          (["--episode-scales", "2,,4"], "bad number list"),
                          (["--steps", "0"], "must be >= 1"),
                          (["--episode-tokens", "99"], "in 1..--ctx"),
                          (["--episode-rate", "2"], "in [0, 1]"),
                          (["--recipe", "fp4"], "invalid choice")):
            err = io.StringIO()
            with contextlib.redirect_stderr(err), \
                    self.assertRaises(SystemExit) as cm:
                self.qs.parse_args(args)
            self.assertEqual(cm.exception.code, 2)
            self.assertIn(msg, err.getvalue())


if __name__ == "__main__":
    unittest.main()
