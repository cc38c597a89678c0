# SPDX-License-Identifier: MIT
"""GNMR: runtime stability control for low-precision training.

    from gnmr import Agent, default_params, GnmrError
    from gnmr.pytorch import Controller   # the PyTorch adapter
    from gnmr.recovery import FP8Linear   # recovery paths (no library needed)

The agent's names load libgnmr-agent when first used (PEP 562): a missing
library is an ImportError that says how to fix it, and gnmr.recovery works
without it.
"""
__all__ = ["Agent", "CudaReducer", "GnmrError", "Options",
           "cuda_device_count", "default_params", "reduce_cpu"]
__version__ = "0.1.0"


def __getattr__(name):
    if name == "Options":
        from .options import Options
        return Options
    if name in __all__:
        from . import agent
        return getattr(agent, name)
    raise AttributeError(f"module 'gnmr' has no attribute {name!r}")
