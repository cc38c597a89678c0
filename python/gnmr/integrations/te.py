# SPDX-License-Identifier: MIT
"""GNMR as a Transformer Engine debug feature (nvdlfw-inspect).

TE's debug API asks, per layer, GEMM and iteration, whether a GEMM runs
in FP8 (`fp8_gemm_enabled(config, layer_name, gemm, iteration)`). The
feature `GnmrRoutes` answers from GNMR's latest routes: a layer whose
unit is on its recovery path runs its GEMMs in high precision, the others
in FP8; it returns the next iteration with its answer, so that TE asks
again at every step (a route can change at any step).

    import nvdlfw_inspect.api as debug_api
    from gnmr.integrations import te
    debug_api.initialize(config_file=te.CONFIG, feature_dirs=[te.FEATURES])
    debug_api.infer_and_assign_layer_names(model)   # TE layers get names
    ctl = Controller(model, job="my-run", select=(te_pytorch.Linear,))
    te.bind(ctl)                  # the feature reads this controller
    ... loss.backward(); ctl.step(step); debug_api.step(); optimizer.step()

or the callbacks' recipe="te". The feature is registered when
nvdlfw-inspect loads te.FEATURES (initialize(feature_dirs=...)), after
TE's namespace; importing this module registers nothing. Layer names: nvdlfw-inspect names a layer
"model." + its path in the model (infer_and_assign_layer_names); GNMR's
unit is that path, so the map is "model." stripped (te.bind's
`layer_to_unit` replaces it). A layer that is not a unit is left to TE's
default (FP8).

Costs, from TE's documentation: a debug layer runs outside CUDA graphs
and without communication/GEMM overlap, so enable the feature only on
the layers GNMR should control (the YAML's `layers`); TE ORs the answers
of several features enabled on one layer for fp8_gemm_enabled, so
another feature answering True keeps a GEMM in FP8 whatever GNMR says.

Tested here on the CPU through nvdlfw-inspect's real registry and YAML
parsing, with a stand-in for TE's namespace API (TE needs CUDA); the
end-to-end check against TE itself is in scripts/gpu_check.sh.
"""
import copy
import os

import nvdlfw_inspect.api as _debug_api
from nvdlfw_inspect.base import BaseConfigAPIMapper
from nvdlfw_inspect.registry import api_method

# nvdlfw_inspect.api's module __getattr__ raises for any missing name
# before initialize(), __warningregistry__ included, which breaks
# warnings.catch_warnings()/unittest's assertWarns in the whole process
# once it is imported: give it the attribute they look for
if "__warningregistry__" not in vars(_debug_api):
    _debug_api.__warningregistry__ = {}

HERE = os.path.dirname(os.path.abspath(__file__))
FEATURES = os.path.join(HERE, "te_features")  # for feature_dirs=
CONFIG = os.path.join(HERE, "gnmr_te.yaml")    # every layer, every GEMM
GEMMS = ("fprop", "dgrad", "wgrad")

_BOUND = {"ctl": None, "map": None}


def default_layer_to_unit(layer_name):
    """nvdlfw-inspect's layer name -> GNMR's unit name."""
    return layer_name[len("model."):] if layer_name.startswith("model.") \
        else layer_name


def bind(controller, layer_to_unit=default_layer_to_unit):
    """The controller whose routes the feature answers from (one per
    process: the training job's)."""
    if _BOUND["ctl"] is not None and _BOUND["ctl"] is not controller:
        raise ValueError("gnmr.integrations.te: another Controller is bound "
                         "in this process; unbind() it first")
    _BOUND["ctl"], _BOUND["map"] = controller, layer_to_unit
    _BOUND["index"] = {n: i for i, (n, _) in enumerate(controller.units)}


def unbind(controller=None):
    if controller is None or _BOUND["ctl"] is controller:
        _BOUND.update(ctl=None, map=None, index={})


def recovery_route(layer_name):
    """True when the layer's unit is on its recovery path now; False for
    a layer that is no unit, or with no controller bound."""
    ctl = _BOUND["ctl"]
    if ctl is None:
        return False
    u = _BOUND["index"].get(_BOUND["map"](layer_name))
    return bool(u is not None and ctl.high[u])


class GnmrRoutes(BaseConfigAPIMapper):
    """GEMMs of a layer whose GNMR unit is on its recovery path run in high
    precision; the others in FP8.

    YAML (gnmr_te.yaml):

        gnmr:
          enabled: True
          layers:
            layer_name_regex_pattern: .*
          transformer_engine:
            GnmrRoutes:
              enabled: True
              gemms: [fprop, dgrad, wgrad]
    """

    def parse_config_and_api(self, config, **kwargs):
        """TE's GEMM parsing: the call's gemm must be in `gemms` (all
        three when absent); any other key is an error."""
        cfg = copy.deepcopy(config)
        cfg.pop("enabled", None)
        gemms = cfg.pop("gemms", list(GEMMS))
        if cfg:
            raise ValueError(f"GnmrRoutes: unexpected key(s) "
                             f"{sorted(cfg)} (it takes enabled, gemms)")
        if not isinstance(gemms, list) or any(g not in GEMMS for g in gemms):
            raise ValueError(f"GnmrRoutes: gemms={gemms!r}: a list of "
                             f"{', '.join(GEMMS)}")
        if kwargs.get("gemm_parsing") and kwargs.get("gemm") not in gemms:
            return False, None
        return True, {"gemm": kwargs.get("gemm")}

    @api_method
    def fp8_gemm_enabled(self, config, layer_name, gemm, iteration):
        return not recovery_route(layer_name), iteration + 1
