# SPDX-License-Identifier: MIT
"""GNMR where training loops live: `hf` (transformers.Trainer), `lightning`
(Lightning), `te` (Transformer Engine's debug API, nvdlfw-inspect). Each
is imported on its own, so that none needs the others installed."""
