# SPDX-License-Identifier: MIT
"""A real training run under GNMR, for the GPU machine (and, small, on the
CPU in `make check`):

    python scripts/gpu_train.py --out DIR [--agents tcp://127.0.0.1:PORT
        --admin ipc://DIR/admin.sock] [--device cuda|cpu]
        [--steps 200] [--overlap-steps 100] [--base-steps 50]
        [--profile-steps 20] [--size gpu|tiny]

A small Llama (transformers' LlamaForCausalLM built from a config; no hub)
trains in bf16 on byte tokens of the repository's own text. Every linear
layer of its decoder is one GNMR unit with two paths: the low-cost path
runs its forward GEMM in FP8 (E4M3, per-tensor scales from the tensors
themselves, saturating, through torch._scaled_mm: Hopper's FP8 tensor
cores on CUDA; torch's reference on the CPU), the recovery path in bf16.
The backward pass is bf16 on both paths. gnmrd (given by --agents) decides
every step (a gnmrd started from GNMR_BIN_DIR for the run when
--agents is not given); on CUDA, libgnmr-agent's CUDA backend reduces the gradients
(no host copy: `cuda_backend` in the result says which backend ran).

Measured in one run, written to DIR/train.json and printed:
- the step without GNMR (`--base-steps` steps of the same model, routes
  all on the low path, in blocks of 5 between GNMR's steps; also before
  and after them) and with it, and the time inside Controller.step()
  after the backward has finished (a synchronisation first, so the call's
  own cost is timed, not the GPU's backlog); step() waits for gnmrd's
  decision, so this holds the round trip to gnmrd;
- then `--overlap-steps` more steps as a training loop that does not wait
  for the decision: report_async() after the backward, the optimizer
  step, then finish(); the time inside those two calls (finish after a
  synchronisation, for the same reason);
- where the time inside step() goes: cProfile over `--profile-steps`
  steps, printed;
- on CUDA, the backend's pass alone (CUDA events around 50 reports of the
  last gradients, through a second agent and job) against the gradients'
  bytes at this device's copy bandwidth measured in the same run;
- the decisions gnmrd made against `gnmrctl replay` of the trace the run
  recorded (Controller(trace=...): on CUDA the kernel's own sums, read
  back), which must be equal.
Exit status 0 when the decisions are equal, the loss is finite and fell,
and, on CUDA, the CUDA backend reduced the gradients; 1 otherwise.
"""
import argparse
import csv
import glob
import io
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "python"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import gnmr  # noqa: E402
from gnmr.agent import Agent, CudaReducer, cuda_device_count  # noqa: E402
from gnmr.pytorch import Controller  # noqa: E402
from gnmr.recovery import switch  # noqa: E402

E4M3_MAX = 448.0
SIZES = {  # hidden, intermediate, layers, heads, batch, sequence
    "gpu": (1024, 2816, 8, 16, 16, 256),
    "tiny": (64, 128, 2, 4, 4, 32),
}
PARAMS = dict(warmup_steps=10, max_active=4, lock_steps=4, alpha=1.5,
              beta=1.5)


def to_e4m3(t):
    """(t in E4M3 with a per-tensor scale taken from t, saturating; the
    scale to multiply the product by)."""
    amax = t.detach().abs().amax().float().clamp(min=1e-12)
    scale = E4M3_MAX / amax
    q = (t.float() * scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q, (1.0 / scale).to(torch.float32)


class _FP8Gemm(torch.autograd.Function):
    """y = x w^T with x and w in E4M3 (torch._scaled_mm); bf16 backward."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        x2 = x.reshape(-1, x.shape[-1]).contiguous()
        qx, sx = to_e4m3(x2)
        qw, sw = to_e4m3(w)
        # _scaled_mm wants its second operand column-major: w^T of a
        # row-major w is
        y = torch._scaled_mm(qx, qw.t(), scale_a=sx, scale_b=sw,
                             out_dtype=x.dtype)
        return y.reshape(*x.shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, gy):
        x, w = ctx.saved_tensors
        g2 = gy.reshape(-1, gy.shape[-1])
        gx = (g2 @ w).reshape(x.shape)
        gw = g2.t() @ x.reshape(-1, x.shape[-1])
        return gx, gw


class FP8GemmLinear(torch.nn.Linear):
    """A Linear (no bias) whose low-cost path is an FP8 GEMM and whose
    recovery path (`recovery = True`, set by gnmr.recovery.switch) is
    bf16."""

    recovery = False

    def forward(self, x):
        if self.recovery or not self.training:
            return F.linear(x, self.weight)
        return _FP8Gemm.apply(x, self.weight)


def build_model(size, device):
    import transformers
    h, inter, layers, heads, _, seq = SIZES[size]
    cfg = transformers.LlamaConfig(
        vocab_size=256, hidden_size=h, intermediate_size=inter,
        num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=heads, max_position_embeddings=seq,
        attention_bias=False, mlp_bias=False, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg)
    for layer in model.model.layers:  # every projection: an FP8 unit
        for parent in (layer.self_attn, layer.mlp):
            for name, m in list(parent.named_children()):
                if type(m) is torch.nn.Linear:
                    new = FP8GemmLinear(m.in_features, m.out_features,
                                        bias=False)
                    new.weight = m.weight
                    setattr(parent, name, new)
    return model.to(device=device, dtype=torch.bfloat16)


def corpus(device):
    """Byte tokens of the repository's text (docs, sources): shipped, never
    downloaded."""
    data = bytearray()
    for pat in ("README.md", "docs/*.md", "daemon/*.c", "python/gnmr/*.py"):
        for f in sorted(glob.glob(os.path.join(ROOT, pat))):
            with open(f, "rb") as fh:
                data += fh.read()
    return torch.frombuffer(bytes(data), dtype=torch.uint8).to(
        device=device, dtype=torch.long)


def batches(tokens, batch, seq, seed):
    g = torch.Generator().manual_seed(seed)
    n = tokens.numel() - seq
    while True:
        idx = torch.randint(0, n, (batch,), generator=g).to(tokens.device)
        rows = idx[:, None] + torch.arange(seq, device=tokens.device)
        yield tokens[rows]


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def device_copy_gbps(device, nbytes):
    """Device-to-device copy bandwidth (bytes read + written per second)
    of an nbytes buffer, median of 20 copies after 3 warm-ups."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    times = []
    for i in range(23):
        a, b = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        a.record()
        dst.copy_(src)
        b.record()
        b.synchronize()
        if i >= 3:
            times.append(a.elapsed_time(b) / 1000)
    return 2 * nbytes / statistics.median(times) / 1e9


def cuda_pass(model, units, endpoint, job, device):
    """The CUDA backend's pass alone over the last gradients: median time
    of 50 reports (CUDA events on the training stream), and the gradients'
    bytes."""
    names = [n for n, _ in units]
    grads = [[p.grad for p in m.parameters() if p.grad is not None]
             for _, m in units]
    buffers = []
    dtypes = {torch.bfloat16: "bfloat16", torch.float32: "float32",
              torch.float16: "float16"}
    for u, gs in enumerate(grads):
        for g in gs:
            buffers.append((u, g.data_ptr(), g.numel(), dtypes[g.dtype]))
    nbytes = sum(g.numel() * g.element_size() for gs in grads for g in gs)
    agent = Agent(endpoint, job, names)
    red = CudaReducer(agent, device=device.index or 0)
    stream = torch.cuda.current_stream(device)
    times = []
    for i in range(1, 61):
        a, b = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        a.record(stream)
        red.report(i, buffers, stream.cuda_stream)
        b.record(stream)
        b.synchronize()
        if i > 10:
            times.append(a.elapsed_time(b) / 1000)
    red.flush(2000)
    stats = red.stats()
    red.close()
    agent.close()
    t = statistics.median(times)
    return {"grad_bytes": nbytes, "pass_ms": round(t * 1e3, 4),
            "pass_gbps": round(nbytes / t / 1e9, 1),
            "launches": stats["launches"], "grid": stats["grid"]}


def foreach_pass(units, device):
    """What a loop would run without GNMR's kernel for the same per-unit
    norms: torch._foreach_norm over every gradient, then each unit's sum
    of squares (index_add_). Median time of 50 runs after 10 warm-ups
    (CUDA events on CUDA, the wall clock on the CPU)."""
    grads = [[p.grad for p in m.parameters() if p.grad is not None]
             for _, m in units]
    flat = [g for gs in grads for g in gs]
    owner = torch.tensor([u for u, gs in enumerate(grads) for _ in gs],
                         device=device)

    def once():
        sq = torch.stack(torch._foreach_norm(flat)).float() ** 2
        return torch.zeros(len(grads), device=device).index_add_(0, owner,
                                                                 sq)
    times = []
    for i in range(60):
        if device.type == "cuda":
            a, b = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            a.record()
            once()
            b.record()
            b.synchronize()
            t = a.elapsed_time(b) / 1000
        else:
            t0 = time.perf_counter()
            once()
            t = time.perf_counter() - t0
        if i >= 10:
            times.append(t)
    nbytes = sum(g.numel() * g.element_size() for g in flat)
    t = statistics.median(times)
    return {"foreach_ms": round(t * 1e3, 4),
            "foreach_gbps": round(nbytes / t / 1e9, 1)}


def gnmrctl(binary, admin, *args):
    return subprocess.run([binary, "--admin", admin, *args],
                          capture_output=True, text=True, timeout=120,
                          check=True).stdout


def replay_flags():
    flags = []
    for k, v in PARAMS.items():
        flags += ["--" + k.replace("_", "-"), str(v)]
    return flags


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--agents", help="gnmrd's agents endpoint (default: "
                    "a gnmrd started here from GNMR_BIN_DIR, stopped after)")
    ap.add_argument("--admin", help="its admin endpoint (with --agents)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available()
                    else "cpu")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--overlap-steps", type=int, default=100)
    ap.add_argument("--profile-steps", type=int, default=20)
    ap.add_argument("--base-steps", type=int, default=50)
    ap.add_argument("--warm-steps", type=int, default=5)
    ap.add_argument("--size", choices=sorted(SIZES), default=None)
    ap.add_argument("--job", default="gpu-train")
    ap.add_argument("--gnmrctl", default=os.path.join(
        os.environ.get("GNMR_BIN_DIR", os.path.join(ROOT, "build", "bin")),
        "gnmrctl"))
    a = ap.parse_args(argv)
    if a.steps < 1 or a.base_steps < 1 or min(
            a.warm_steps, a.overlap_steps, a.profile_steps) < 0:
        ap.error("--steps and --base-steps are 1 or more, --warm-steps, "
                 "--overlap-steps and --profile-steps 0 or more")
    if bool(a.agents) != bool(a.admin):
        ap.error("--agents and --admin go together (or neither: a gnmrd "
                 "is started here)")
    if not a.agents:
        with own_gnmrd(os.path.dirname(a.gnmrctl)) as (a.agents, a.admin):
            return run(a, ap)
    return run(a, ap)


class own_gnmrd:
    """A gnmrd in a temporary directory, on a loopback port, for the run."""

    def __init__(self, bin_dir):
        import tempfile
        self.dir = tempfile.mkdtemp(prefix="gnmr-train-")
        self.err = open(os.path.join(self.dir, "gnmrd.log"), "wb")
        self.proc = subprocess.Popen(
            [os.path.join(bin_dir, "gnmrd"), "--data-dir",
             os.path.join(self.dir, "data"), "--agents", "tcp://127.0.0.1:*",
             "--admin", f"ipc://{self.dir}/admin.sock"],
            stdout=subprocess.PIPE, stderr=self.err, text=True)

    def __enter__(self):
        agents = None
        for line in self.proc.stdout:
            if line.startswith("gnmrd: agents "):
                agents = line.split()[2]
            if line.startswith("gnmrd: admin"):
                break
        if agents is None:
            self.__exit__()
            raise SystemExit("gpu_train: gnmrd did not start")
        return agents, f"ipc://{self.dir}/admin.sock"

    def __exit__(self, *exc):
        import shutil
        self.proc.terminate()
        self.proc.wait(timeout=20)
        self.proc.stdout.close()
        self.err.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def run(a, ap):
    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda, but torch sees no CUDA device")
    size = a.size or ("gpu" if device.type == "cuda" else "tiny")
    os.makedirs(a.out, exist_ok=True)
    trace = os.path.join(a.out, "train_trace.csv")

    model = build_model(size, device)
    batch, seq = SIZES[size][4], SIZES[size][5]
    data = batches(corpus(device), batch, seq, seed=1)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)

    def train_step():
        x = next(data)
        # labels = inputs: the model shifts them (token t+1 from 0..t)
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        return loss

    def base_steps(n, warm, into=None):
        """n steps without GNMR, every unit on its low path, after warm
        untimed ones: their median (their times appended to into)."""
        saved = [m.recovery for m in model.modules()
                 if isinstance(m, FP8GemmLinear)]
        for m in model.modules():
            if isinstance(m, FP8GemmLinear):
                m.recovery = False
        times = [] if into is None else into
        for i in range(warm + n):
            sync(device)
            t0 = time.perf_counter()
            train_step()
            opt.step()
            opt.zero_grad(set_to_none=True)
            sync(device)
            if i >= warm:
                times.append(time.perf_counter() - t0)
        for m, r in zip((m for m in model.modules()
                         if isinstance(m, FP8GemmLinear)), saved):
            m.recovery = r  # the routes gnmrd decided, back
        return statistics.median(times)

    # The step time drifts within a run (on an H200 the median of 50 steps
    # without GNMR was 49 ms at the start and 53 ms at the end, 46 ms in
    # between: docs/results/gpu-2026-12-04/run4/train.json), so the base
    # that GNMR's steps are set against is measured between them: blocks
    # of 5 steps without GNMR, every 20 steps of the synchronous loop
    # (--base-steps in all); before and after, for the record.
    base_before = base_steps(a.base_steps, a.warm_steps)
    base = []
    every = max(1, a.steps // max(1, a.base_steps // 5))

    ctl = Controller(model, a.agents, a.job, select=(FP8GemmLinear,),
                     on_route=switch,
                     params=gnmr.default_params(**PARAMS),
                     trace=trace, wait_ms=5000, join_wait_ms=10000)
    if not ctl.agent.joined:
        print(f"gpu_train: the agent did not join gnmrd at {a.agents}",
              file=sys.stderr)
        return 1
    inside, steps, losses, active, late = [], [], [], 0, 0
    for step in range(1, a.steps + 1):
        if step % every == 0 and len(base) < a.base_steps:
            base_steps(min(5, a.base_steps - len(base)), 0, base)
        sync(device)
        t0 = time.perf_counter()
        loss = train_step()
        sync(device)  # the backward done: what follows is GNMR's
        t1 = time.perf_counter()
        res = ctl.step(step)
        t2 = time.perf_counter()
        late += not res.on_time
        active += len(res.active)
        if not res.nonfinite:
            opt.step()
        opt.zero_grad(set_to_none=True)
        sync(device)
        t3 = time.perf_counter()
        losses.append(loss.item())
        if step > a.warm_steps:
            inside.append(t2 - t1)
            steps.append(t3 - t0)
    # a loop that does not wait for the decision: it arrives while the
    # optimizer steps (so a non-finite step could not be skipped here as
    # the loop above skips it: a recipe that skips them waits, as above)
    o_inside, o_steps = [], []
    for step in range(a.steps + 1, a.steps + a.overlap_steps + 1):
        sync(device)
        t0 = time.perf_counter()
        loss = train_step()
        sync(device)
        t1 = time.perf_counter()
        ctl.report_async(step)
        t2 = time.perf_counter()
        opt.step()
        sync(device)  # the optimizer done: what follows is GNMR's
        t3 = time.perf_counter()
        res = ctl.finish(step)
        t4 = time.perf_counter()
        late += not res.on_time
        active += len(res.active)
        opt.zero_grad(set_to_none=True)
        sync(device)
        losses.append(loss.item())
        if step > a.steps + a.warm_steps:
            o_inside.append((t2 - t1) + (t4 - t3))
            o_steps.append(time.perf_counter() - t0)
    # where the time inside step() goes (after the timed loops)
    profile = None
    if a.profile_steps:
        import cProfile
        import pstats
        prof = cProfile.Profile()
        first = a.steps + a.overlap_steps + 1
        for step in range(first, first + a.profile_steps):
            loss = train_step()
            sync(device)
            prof.enable()
            res = ctl.step(step)
            prof.disable()
            late += not res.on_time
            active += len(res.active)
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item())
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(25)
        profile = buf.getvalue()
        print(f"== cProfile of Controller.step() over {a.profile_steps} "
              f"steps (cumulative)\n{profile}")
    total = a.steps + a.overlap_steps + a.profile_steps
    base_after = base_steps(a.base_steps, 0)
    backend = ctl.cuda_backend if device.type == "cuda" else \
        "host (CPU tensors: libgnmr-agent's CPU reduction)"
    units = ctl.units
    ctl.close()

    result = {
        "device": str(device),
        "device_name": (torch.cuda.get_device_name(device)
                        if device.type == "cuda" else platform.processor()
                        or platform.machine()),
        "torch": torch.__version__, "python": platform.python_version(),
        "model": {"size": size, "params": sum(p.numel() for p in
                                              model.parameters()),
                  "units": len(units), "batch": batch, "sequence": seq},
        "low_path": "FP8 E4M3 GEMM (torch._scaled_mm), per-tensor scales, "
                    "saturating; recovery: bf16",
        "cuda_backend": backend,
        "steps": total, "timed_steps": len(steps),
        "base_step_ms": round(statistics.median(base) * 1e3, 3),
        "base_steps_between": len(base),
        "base_step_ms_first": round(base_before * 1e3, 3),
        "base_step_ms_last": round(base_after * 1e3, 3),
        "gnmr_step_ms": round(statistics.median(steps) * 1e3, 3)
        if steps else None,
        "inside_step_ms": round(statistics.median(inside) * 1e3, 4)
        if inside else None,
        "overlap_steps": a.overlap_steps,
        "overlap_step_ms": round(statistics.median(o_steps) * 1e3, 3)
        if o_steps else None,
        "overlap_inside_ms": round(statistics.median(o_inside) * 1e3, 4)
        if o_inside else None,
        "profile_steps": a.profile_steps,
        "late_decisions": late,
        "active_share": round(active / (total * len(units)), 4),
        "loss_first": round(losses[0], 4), "loss_last": round(losses[-1], 4),
    }
    if inside:
        result["inside_pct_of_base_step"] = round(
            100 * result["inside_step_ms"] / result["base_step_ms"], 3)
    if o_inside:
        result["overlap_inside_pct_of_base_step"] = round(
            100 * result["overlap_inside_ms"] / result["base_step_ms"], 3)
    # the CUDA backend's pass against the gradients' bytes at copy speed
    if device.type == "cuda" and cuda_device_count() > 0:
        train_step()  # gradients to reduce
        sync(device)
        p = cuda_pass(model, units, a.agents, a.job + "-pass", device)
        copy = device_copy_gbps(device, max(p["grad_bytes"], 1 << 30))
        copy_same = device_copy_gbps(device, p["grad_bytes"])
        p["copy_gbps_1gib"] = round(copy, 1)
        p["copy_gbps_same_size"] = round(copy_same, 1)
        p["pass_share_of_copy"] = round(p["pass_gbps"] / copy, 3)
        f = foreach_pass(units, device)
        p.update(f)
        p["foreach_share_of_copy"] = round(f["foreach_gbps"] / copy, 3)
        result["cuda_pass"] = p
    # gnmrd's decisions against the trace's, replayed offline
    live = gnmrctl(a.gnmrctl, a.admin, "decisions", a.job, "--csv")
    replay = subprocess.run([a.gnmrctl, "replay", *replay_flags(), trace],
                            capture_output=True, text=True, timeout=120,
                            check=True).stdout

    def rows(text):
        return [(int(r["step"]), sorted(int(x) for x in
                                        (r.get("active") or "").split()))
                for r in csv.DictReader(io.StringIO(text))]
    got, want = rows(live), rows(replay)
    result["decisions"] = len(got)
    result["decisions_equal_replay"] = got == want
    result["steps_with_recovery"] = sum(1 for _, act in got if act)
    if got != want:
        diff = [(g, w) for g, w in zip(got, want) if g != w][:5]
        result["first_differences"] = diff
    with open(os.path.join(a.out, "train.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result, indent=1))
    ok = (result["decisions_equal_replay"] and len(got) == total and
          all(math.isfinite(x) for x in losses) and
          result["loss_last"] < result["loss_first"] and
          (device.type != "cuda" or backend == "gnmr"))
    print("gpu_train:", "passed" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
