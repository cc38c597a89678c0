# SPDX-License-Identifier: MIT
"""GNMR's TE debug feature end to end, for a machine with a GPU and
Transformer Engine (scripts/gpu_check.sh runs it when both are there; it
has not run yet: no GPU has been lent). Two te.pytorch.Linear layers
under fp8_autocast with the debug API initialized from GNMR's YAML and
feature dir; a NaN in layer 1's gradient puts it on its recovery path;
then layer 1's output must be that of a high-precision GEMM (its error
against an fp32 reference far below layer 0's FP8 error), and TE must
have asked the feature about both layers at every iteration.

    python gpu_te_check.py ENDPOINT     (a running gnmrd's agents endpoint)
"""
import math
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch  # noqa: E402


def main():
    endpoint = sys.argv[1]
    import nvdlfw_inspect.api as debug_api
    import transformer_engine.pytorch as tep
    import gnmr
    from gnmr.integrations import te
    from gnmr.pytorch import Controller

    asked = {}
    orig = te.GnmrRoutes.fp8_gemm_enabled

    def counting(self, config, layer_name, gemm, iteration):
        asked[(layer_name, gemm)] = asked.get((layer_name, gemm), 0) + 1
        return orig(self, config, layer_name, gemm, iteration)
    counting.is_api = True
    te.GnmrRoutes.fp8_gemm_enabled = counting

    debug_api.initialize(config_file=te.CONFIG, feature_dirs=[te.FEATURES],
                         log_dir=tempfile.mkdtemp(prefix="gnmr-te-gpu-"))
    torch.manual_seed(0)
    model = torch.nn.Sequential(tep.Linear(256, 256), tep.Linear(256, 256))
    model = model.cuda()
    debug_api.infer_and_assign_layer_names(model)
    ctl = Controller(model, endpoint, "te-gpu", select=(tep.Linear,),
                     params=gnmr.default_params(warmup_steps=0, max_active=1,
                                                lock_steps=4))
    te.bind(ctl)
    x = torch.randn(64, 256, device="cuda")
    for step in (1, 2):
        with tep.fp8_autocast(enabled=True):
            y = model(x)
        y.float().sum().backward()
        if step == 2:
            model[1].weight.grad[0, 0] = math.nan
        res = ctl.step(step, wait_ms=5000)
        debug_api.step()
        model.zero_grad()
    assert ctl.high == [False, True], (ctl.high, res)
    with torch.no_grad():
        with tep.fp8_autocast(enabled=True):
            h = model[0](x)
            y1 = model[1](h)
        ref1 = h.float() @ model[1].weight.float().t() + model[1].bias.float()
        ref0 = x.float() @ model[0].weight.float().t() + model[0].bias.float()
    e1 = ((y1.float() - ref1).norm() / ref1.norm()).item()
    e0 = ((h.float() - ref0).norm() / ref0.norm()).item()
    print(f"relative error: layer 0 (FP8) {e0:.3g}, layer 1 (recovery) "
          f"{e1:.3g}; asked {dict(sorted(asked.items()))}")
    assert e1 < e0 / 10, "layer 1 did not leave FP8"
    assert any(k[0].endswith(".1") for k in asked), "TE never asked GNMR"
    te.unbind(ctl)
    ctl.close()
    debug_api.end_debug()
    print("te end to end: OK")


if __name__ == "__main__":
    main()
