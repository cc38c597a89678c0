# SPDX-License-Identifier: MIT
"""GNMR: runtime stability control for low-precision training.

    from gnmr import Agent, default_params, GnmrError
    from gnmr.pytorch import Controller   # the PyTorch adapter
"""
from .agent import (Agent, CudaReducer, GnmrError, cuda_device_count,
                    default_params, reduce_cpu)

__all__ = ["Agent", "CudaReducer", "GnmrError", "cuda_device_count",
           "default_params", "reduce_cpu"]
__version__ = "0.1.0"
