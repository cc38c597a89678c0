# SPDX-License-Identifier: MIT
"""torchao's float8 training as a low-cost path GNMR can switch
(gnmr.recovery re-exports torchao_float8 and torchao_recipes): a
Float8Linear whose recovery path is the same weights in high precision."""
import re

import torch
import torch.nn.functional as F

from .recovery import _autocast_dtype, _replace, _Routed

_TORCHAO_CLASS = None


def _torchao():
    """torchao.float8, or a clear error naming what is missing."""
    try:
        import torchao.float8 as f8
        from torchao.float8.float8_linear import Float8Linear
    except ImportError as e:
        raise ValueError(f"recipe 'torchao-float8' needs torchao's float8 "
                         f"training (pip install torchao): {e}") from None
    return f8, Float8Linear


def _torchao_class():
    """SwitchableFloat8Linear, made once torchao is imported."""
    global _TORCHAO_CLASS
    if _TORCHAO_CLASS is None:
        _, Float8Linear = _torchao()

        class SwitchableFloat8Linear(_Routed, Float8Linear):
            """torchao's Float8Linear (its float8 forward and backward
            GEMMs, its scaling recipe) on the low-cost path; on the
            recovery path (`recovery` True) the same weight and bias in
            their own precision, F.linear, autocast as for nn.Linear.

            Compiled, the choice is a torch.cond on the route held as a
            0-dim CPU tensor, inside the graph: a route change never
            recompiles and torchao's float8 path compiles with the rest
            of the model. cond's backward recomputes the taken path from
            its inputs, which costs no memory here: torchao's float8
            linear keeps its high-precision input for backward too.
            Under autocast (which cond's branches cannot run under, and
            whose casts torchao makes its own way) the choice is made
            outside the graph, a graph break at each such linear."""

            def forward(self, x):
                if not torch.compiler.is_compiling():
                    return self._eager(x)
                if _autocast_dtype(x.device.type) is not None:
                    return _outside_graph(self, x)
                if self._route is None:
                    self.recovery = self._recovery
                low = super().forward
                return torch.cond(
                    self._route,
                    lambda x: F.linear(x, self.weight, self.bias),
                    lambda x: low(x), (x,))

            def _eager(self, x):
                if self.recovery:
                    return F.linear(x, self.weight, self.bias)
                return super().forward(x)

            def extra_repr(self):
                return super().extra_repr() + \
                    f", recovery={bool(self.recovery)}"

        _TORCHAO_CLASS = SwitchableFloat8Linear
    return _TORCHAO_CLASS


@torch.compiler.disable
def _outside_graph(module, x):
    return module._eager(x)


def torchao_recipes():
    """The float8 recipe names the installed torchao has."""
    f8, _ = _torchao()
    return [r.value for r in f8.Float8LinearRecipeName]


def torchao_float8(model, recipe="tensorwise", config=None,
                   module_filter_fn=None, pattern=None, emulate=None):
    """Converts, in place, the model's nn.Linear modules to torchao float8
    training linears that GNMR can switch (`switch` sets `recovery`):
    the low-cost path is torchao's float8 (recipe: one of
    torchao_recipes(), or config= a Float8LinearConfig), the recovery
    path the same weights in high precision. `module_filter_fn(module,
    fqn)` and `pattern` (a regular expression on the name) choose the
    modules, as convert_to_float8_training's filter does. emulate=None
    emulates the float8 GEMMs where there is no CUDA (the CPU), as
    torchao's emulate=True does. Returns the names converted.

    FSDP2's float8 all-gather (enable_fsdp_float8_all_gather) is refused:
    it gathers the weight in float8, so a unit on its recovery path
    would compute with a float8 weight; gather in high precision."""
    import dataclasses
    f8, _ = _torchao()
    cls = _torchao_class()
    if config is None:
        names = torchao_recipes()
        if recipe not in names:
            raise ValueError(f"torchao {_version('torchao')} has no float8 "
                             f"recipe {recipe!r}; it has {', '.join(names)}")
        config = f8.Float8LinearConfig.from_recipe_name(recipe)
    if emulate is None:
        emulate = not torch.cuda.is_available()
    if emulate != config.emulate:
        config = dataclasses.replace(config, emulate=emulate)
    if config.enable_fsdp_float8_all_gather:
        raise ValueError(
            "enable_fsdp_float8_all_gather gathers weights in float8: a "
            "unit on its recovery path needs its high-precision weight. "
            "Leave it False with GNMR's torchao recipe")
    rx = re.compile(pattern) if pattern else None
    done = []
    for name, mod in list(model.named_modules()):
        if type(mod) is not torch.nn.Linear or (rx and not rx.search(name)) \
                or (module_filter_fn and not module_filter_fn(mod, name)):
            continue
        new = cls.from_float(mod, config=config)
        new.recovery = False  # its route tensor made here, not in a graph
        _replace(model, name, mod, new)
        done.append(name)
    if not done:
        raise ValueError(f"torchao_float8: no nn.Linear matches pattern "
                         f"{pattern!r} and module_filter_fn")
    return done


def _version(dist):
    try:
        from importlib.metadata import version
        return version(dist)
    except Exception:  # noqa: BLE001 - a version is only for a message
        return "(unknown version)"
