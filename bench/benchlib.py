# SPDX-License-Identifier: MIT
"""bench/benchlib.py — what the Python benchmarks share: a gnmrd of their
own, and the model of the torch benchmarks."""
import os
import re
import subprocess
import sys
import tempfile


def start_gnmrd(name):
    """Starts gnmrd (from GNMR_BIN_DIR, else build/bin) on a free loopback
    port, its data and admin socket in a new temporary directory. Returns
    (process, agents endpoint, directory); exits saying so when gnmrd
    does not print its endpoint."""
    bindir = os.environ.get("GNMR_BIN_DIR", "build/bin")
    tmp = tempfile.mkdtemp(prefix=f"gnmr-bench-{name}-")
    d = subprocess.Popen([os.path.join(bindir, "gnmrd"), "--data-dir",
                          tmp + "/data", "--agents", "tcp://127.0.0.1:*",
                          "--admin", f"ipc://{tmp}/admin.sock",
                          "--log-level", "warn"],
                         stdout=subprocess.PIPE, text=True)
    for line in d.stdout:
        m = re.match(r"gnmrd: agents (\S+)", line)
        if m:
            return d, m.group(1), tmp
    d.wait()
    sys.exit(f"{name}: gnmrd ({bindir}/gnmrd) did not start")


def mlp():
    """12 Linear layers of 512x512 with GELU, then 512 -> 10: 13 units,
    13.6 MB of fp32 gradients. The same weights every call."""
    import torch
    torch.manual_seed(0)
    layers = []
    for _ in range(12):
        layers += [torch.nn.Linear(512, 512), torch.nn.GELU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(512, 10))
