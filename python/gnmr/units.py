# SPDX-License-Identifier: MIT
"""Which modules are units, and who this rank is (gnmr.pytorch.Controller's
unit selection)."""
import re

from . import _layout
from ._warn import warn as _warn


def identity(global_rank=None, tp_size=None, tp_group=None):
    """(rank, world size, tp_rank, tp_size) without a model: torch.distributed
    first, then the launcher's environment (Controller reads a model's
    DeviceMesh too: gnmr._layout)."""
    lay = _layout.layout([], global_rank, tp_size, tp_group)
    return lay.rank, lay.world, lay.index, lay.reporters


def select_units(model, select, pattern, experts=False):
    """[(name, module, params)]: outermost match first, each parameter in
    one unit; a clear error when nothing usable matches. With experts,
    a module holding fused expert weights (_layout.fused_experts) is
    matched too, as one unit per expert named NAME.E."""
    rx = re.compile(pattern) if pattern else None
    matched = [(n, m) for n, m in _layout.plain_named_modules(model)
               if ((not select or isinstance(m, tuple(select)))
                   and (rx is None or rx.search(n)))
               or (experts and _layout.fused_experts(m))]
    owner, units, empty = {}, [], []
    for name, m in matched:
        n = experts and _layout.fused_experts(m)
        if n:
            ps = [p for p in m.parameters(recurse=False)
                  if id(p) not in owner]
            for p in ps:
                owner[id(p)] = (name, lambda _: True)
            if ps:
                units.extend((f"{name}.{e}", m,
                              [_layout.ExpertSlice(p, e) for p in ps])
                             for e in range(n))
            continue
        params = []
        for pname, p in m.named_parameters():
            full = f"{name}.{pname}" if name else pname
            if id(p) in owner:
                prev, inside = owner[id(p)]
                if not inside(name):  # a tied parameter, not a nesting
                    _warn(f"gnmr: parameter {full} is shared with unit "
                          f"{prev}: counted once, in {prev}")
                continue
            owner[id(p)] = (name, lambda n, root=name:
                            n == root or n.startswith(root + ".") or
                            root == "")
            params.append(p)
        if params:
            units.append((name, m, params))
        else:
            empty.append(name or "(the model)")
    if not units:
        what = (f"select={tuple(t.__name__ for t in select or ())} "
                f"pattern={pattern!r}")
        if matched:
            raise ValueError(
                f"{what} matched {len(matched)} module(s) ("
                f"{', '.join(empty[:6])}{', ...' if len(empty) > 6 else ''})"
                " but none has parameters a unit could report: select the "
                "block that contains them (a container is a unit too), or "
                "a module type with weights")
        kinds = sorted({type(m).__name__ for m in model.modules()})
        raise ValueError(f"{what} matched no module; the model has "
                         f"{', '.join(kinds)}")
    return units
