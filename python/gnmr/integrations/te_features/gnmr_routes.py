# SPDX-License-Identifier: MIT
"""Loaded by nvdlfw-inspect from feature_dirs during debug_api.initialize()
(its logger exists then): registers gnmr.integrations.te.GnmrRoutes under
TE's namespace. The class lives in gnmr.integrations.te, imported once,
so that bind() and the feature share their state."""
from nvdlfw_inspect.registry import Registry

from gnmr.integrations.te import GnmrRoutes

Registry.register_feature(namespace="transformer_engine")(GnmrRoutes)
