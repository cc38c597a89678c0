# SPDX-License-Identifier: MIT
"""bench/report_async.py — where report_async()'s pass runs, the library's
thread or a Python worker, and what the training thread pays for each.

    GNMR_AGENT_LIB=build/lib/libgnmr-agent.so GNMR_BIN_DIR=build/bin \\
        /usr/bin/python3 bench/report_async.py [STEPS]

The model and loop of bench/torch_overhead.py (13 Linear units of 512x512,
batch 256, torch on one thread, SGD), one controller on a real gnmrd, each
step report_async() -> optimizer step -> finish(). The steps rotate
over the paths (the pass on the library's own thread,
gnmr_agent_report_begin; on a Python worker thread, the path device
gradients take, forced here by declining the host path; step()), so drift of the
machine's speed reaches both alike. Per path, the median of: the time the
training thread is blocked in report_async() + finish() (issue 14's
target: <= 1% of the step), each call's own share, the optimizer step's
time, and the whole step; the share is of the rest of the step (its
median less the time blocked). The synchronous step() of the same model
is printed for reference, on a third of the steps interleaved the same
way."""
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
import torch  # noqa: E402

from gnmr.pytorch import Controller  # noqa: E402
from benchlib import mlp, start_gnmrd  # noqa: E402

WARM = 20


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    if steps < 3 * WARM:
        sys.exit(f"usage: report_async.py [STEPS >= {3 * WARM}]")
    torch.set_num_threads(1)
    d, ep, tmp = start_gnmrd("async")
    net = mlp()
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)
    ctl = Controller(net, endpoint=ep, job="report-async", join_wait_ms=5000)
    host_path = ctl._begin_host
    x, y = torch.randn(256, 512), torch.randint(0, 10, (256,))
    paths = ("library thread", "Python worker", "step()")
    m = {p: {k: [] for k in ("blocked", "begin", "finish", "opt", "step")}
         for p in paths}
    for step in range(1, steps + 1):
        path = paths[step % 3]
        ctl._begin_host = (host_path if path == "library thread"
                           else (lambda t: None))
        t0 = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(net(x), y)
        opt.zero_grad()
        loss.backward()
        t1 = time.perf_counter()
        if path == "step()":
            res = ctl.step(step, wait_ms=50)
            t2 = t3 = time.perf_counter()
            opt.step()
            t4 = t5 = time.perf_counter()
        else:
            ctl.report_async(step)
            t2 = time.perf_counter()
            opt.step()
            t3 = time.perf_counter()
            res = ctl.finish(step, wait_ms=50)
            t4 = t5 = time.perf_counter()
        if not res:
            sys.exit(f"report_async: step {step} not decided on time")
        if step > WARM:
            r = m[path]
            r["blocked"].append(t2 - t1 + t4 - t3)
            r["begin"].append(t2 - t1)
            r["finish"].append(t4 - t3)
            r["opt"].append((t3 - t2) if path != "step()" else (t5 - t3))
            r["step"].append(t5 - t0)
    ctl.close()
    d.terminate()
    d.wait()
    print(f"report_async 13 Linear units (512x512, batch 256, torch 1 "
          f"thread, OpenBLAS "
          f"{os.environ.get('OPENBLAS_NUM_THREADS', 'default')}), "
          f"{steps} steps alternated over {len(paths)} paths, medians:")
    med = {p: {k: statistics.median(v) * 1e3 for k, v in m[p].items()}
           for p in paths}
    for p in paths:
        r = med[p]
        rest = r["step"] - r["blocked"]  # the step without the controller
        what = (f"inside step() {r['blocked']:.2f} ms" if p == "step()" else
                f"blocked {r['blocked']:.2f} ms (report_async "
                f"{r['begin']:.3f} + finish {r['finish']:.3f})")
        print(f"report_async {p:14s}: {what} = "
              f"{100 * r['blocked'] / rest:.2f}% of the rest of the step "
              f"(target <= 1%); optimizer {r['opt']:.2f} ms; "
              f"step {r['step']:.1f} ms")

if __name__ == "__main__":
    main()
