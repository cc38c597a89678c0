# SPDX-License-Identifier: MIT
"""The recovery recipes by name: one registry, read by the trainer
callbacks' `recipe=` and by a loop of one's own alike.

A recipe is what a unit's two paths are: how the selected nn.Linear
modules become two-path modules (`convert`), how a unit's route switches
them (`switch`, an on_route for Controller), and, where the recipe can
measure its low path's error, the `measure` Controller sends as the
measured signal (recovery.low_error for fp8, int4, nvfp4 and mxfp4).

    from gnmr import recipes
    r = recipes.get("fp8")
    names = r.convert(model, pattern=r"layers\\.")   # the linears converted
    with Controller(model, job="j", select=r.select, on_route=r.switch,
                    measure=r.measure) as ctl: ...

Names: "fp8" (FP8 activation storage with delayed scaling, FP8Linear),
"int4" (4-bit activation storage, KBitLinear), "nvfp4" and "mxfp4" (NVIDIA's
NVFP4 and OCP's MXFP4 in all three GEMMs, BF16 to recover:
gnmr.quant.QuantLinear, emulated), "torchao-float8" and
"torchao-float8-RECIPE" (torchao's float8 training, one of
recovery.torchao_recipes()), "te" (Transformer Engine's debug API: it
converts nothing, gnmr.integrations.te binds the Controller).

`gnmr.quant.Recipe` is another thing: the numeric formats of
`gnmr.quant.QuantLinear`, the experiments' fine-grained recipes
(docs/python.md); "nvfp4" and "mxfp4" here are two of them as the
callbacks' recipes.
"""
import dataclasses

import torch

from . import recovery

__all__ = ["Recipe", "get", "names"]


@dataclasses.dataclass(frozen=True)
class Recipe:
    """A recovery recipe (see the module doc). `convert(model,
    pattern=None)` converts the nn.Linear modules whose names match
    `pattern` (all when None) and returns their names, or is None for a
    recipe that converts nothing; `select` is the converted modules'
    type, for Controller(select=...)."""
    name: str
    convert: object = None
    switch: object = recovery.switch
    shadow: object = None
    select: tuple = (torch.nn.Linear,)
    binds: bool = False   # "te": gnmr.integrations.te binds the Controller
    measure: object = None  # Controller's measure= (the measured signal)


def _fp8(model, pattern=None):
    return recovery.convert(model, recovery.FP8Linear, pattern=pattern)


def _int4(model, pattern=None):
    return recovery.convert(model, recovery.KBitLinear, pattern=pattern,
                            low_bits=4)


def _torchao(which):
    def convert(model, pattern=None):
        return recovery.torchao_float8(model, recipe=which, pattern=pattern)
    return convert


def _quant(low):
    def convert(model, pattern=None):
        from .quant import QuantLinear
        return recovery.convert(model, QuantLinear, pattern=pattern,
                                low=low, high="bf16")
    return convert


def _quant_class():
    from .quant import QuantLinear
    return QuantLinear


_FIXED = {
    # each measures its low path (low_error) as the measured signal; the
    # shadow (an FP8 overflow as a non-finite norm) is Controller's
    # shadow= for who asks, no recipe's default (issue 61: with it a
    # 2-step spike was held 22 steps and clean steps filled the budget)
    "fp8": Recipe("fp8", _fp8, select=(recovery.FP8Linear,),
                  measure=recovery.low_error),
    "int4": Recipe("int4", _int4, select=(recovery.KBitLinear,),
                   measure=recovery.low_error),
    "te": Recipe("te", None, switch=None, binds=True),
    "nvfp4": Recipe("nvfp4", _quant("nvfp4"), select=(_quant_class(),),
                    measure=recovery.low_error),
    "mxfp4": Recipe("mxfp4", _quant("mxfp4"), select=(_quant_class(),),
                    measure=recovery.low_error),
}
_TORCHAO = "torchao-float8"
_MADE = {}  # torchao's, made on first use (torchao is imported then)


def names():
    """The recipe names, torchao's as the installed torchao has them (none
    listed without torchao)."""
    out = list(_FIXED)
    try:
        have = recovery.torchao_recipes()
    except ImportError:
        return out + [_TORCHAO]
    return out + [_TORCHAO] + [f"{_TORCHAO}-{r}" for r in have]


def get(name):
    """The Recipe called `name`; ValueError naming the known ones."""
    if name in _FIXED:
        return _FIXED[name]
    if isinstance(name, str) and (name == _TORCHAO or
                                  name.startswith(_TORCHAO + "-")):
        which = name[len(_TORCHAO) + 1:] or "tensorwise"
        have = recovery.torchao_recipes()  # a clear error without torchao
        if which not in have:
            raise ValueError(f"recipe={name!r}: the installed torchao has "
                             f"the float8 recipes {', '.join(have)}")
        if name not in _MADE:  # one object a name, as the others
            _MADE[name] = Recipe(name, _torchao(which),
                                 select=(recovery._torchao_class(),))
        return _MADE[name]
    raise ValueError(f"recipe={name!r}: one of {', '.join(_FIXED)}, "
                     f"{_TORCHAO}[-RECIPE]")
