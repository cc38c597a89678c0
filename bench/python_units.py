# SPDX-License-Identifier: MIT
"""bench/python_units.py [PYTHON_ROOT] — Controller.step on a model of
10,000 units (bench/torch_overhead.py's many_units) with the gnmr package
found under PYTHON_ROOT (default: this checkout's python/), so that two
versions of the package can be compared on the same library and gnmrd:

    git worktree add /tmp/gnmr-old OLD_COMMIT
    python3 bench/python_units.py /tmp/gnmr-old/python
    python3 bench/python_units.py

GNMR_AGENT_LIB and GNMR_BIN_DIR as for bench/torch_overhead.py."""
import os
import signal
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                       os.path.join(HERE, "..", "python"))
sys.path.insert(0, ROOT)
sys.path.insert(1, HERE)
import torch  # noqa: E402

import gnmr  # noqa: E402
import gnmr.pytorch  # noqa: E402
import torch_overhead  # noqa: E402
from benchlib import start_gnmrd  # noqa: E402

# torch_overhead imported this package too (sys.path order): say which
assert gnmr.__file__.startswith(ROOT), (gnmr.__file__, ROOT)


def main():
    d, ep, tmp = start_gnmrd("units")
    torch.set_num_threads(1)
    # 80 steps, 75 timed: more than one in 64 (Reduction.rewatch)
    runs = [("", torch_overhead.many_units(ep, steps=80)),
            (", new gradient tensors each step",
             torch_overhead.many_units(ep, steps=80, fresh=True)),
            (", main_grad views of one flat buffer",
             torch_overhead.many_units(ep, steps=80, main_grad=True))]
    d.send_signal(signal.SIGTERM)
    d.wait()
    d.stdout.close()
    for what, (t, floor, wait, slowest) in runs:
        print(f"python_units {os.path.relpath(gnmr.pytorch.__file__)}: "
              f"10000 units{what}, Controller.step {t * 1e3:.2f} ms "
              f"(waiting for gnmrd's decision {wait * 1e3:.2f} ms; the "
              f"slowest of 75 steps {slowest * 1e3:.1f} ms); one "
              f"Python pass over the gradients' pointers "
              f"{floor * 1e3:.2f} ms: {t / floor:.2f}x")


if __name__ == "__main__":
    main()
