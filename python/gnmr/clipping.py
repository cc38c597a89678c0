# SPDX-License-Identifier: MIT
"""The Controller's gradient clip (gnmr.pytorch.Controller is a Clipping):
torch's clip_grad_norm_ with the sums of squares of this step's report
standing in for torch's norms of the units' gradients."""
import torch

__all__ = ["Clipping"]


class Clipping:
    """clip_grad_norm_ for a Controller (its _pending, _reduction, _params
    and _last)."""

    def clip_grad_norm_(self, parameters, max_norm, norm_type=2.0,
                        error_if_nonfinite=False, foreach=None):
        """torch.nn.utils.clip_grad_norm_(parameters, max_norm, ...), called
        after step() (or finish()) and before optimizer.step(): the sums of
        squares this step's report computed stand in for torch's norms of
        the units' gradients, so that the clip reads only the gradients of
        parameters in no unit, and the gradients are scaled only when the
        total norm is over max_norm (torch multiplies them by 1.0
        otherwise, a pass that changes nothing).

        GNMR sees the gradients before the clip, as it should: a clip
        scales every gradient by the same factor when one unit spikes,
        which hides the spike from the units' ratios.

        The total is GNMR's fp64 sum (torch sums the norms in the
        gradients' dtype), so it and the scaled gradients equal torch's to
        about 1e-7 relative. It is torch's own clip_grad_norm_, unchanged,
        where the sums cannot stand in: the first call (the sums are kept
        from the next step on), norm_type other than 2, gradients that are
        not fp32 on the host (CUDA, bf16), a unit whose gradients are not
        all among `parameters`, a gradient changed since the report
        (GradScaler.unscale_ after step(): unscale first), a non-finite
        gradient in a unit, a step not reported (an observer replica,
        report_async() of a later step), and error_if_nonfinite or foreach
        given. Returns the total norm as a tensor, as torch does."""
        if self._pending is not None:  # the pass must not race the clip
            self._pending[1].exception()
        if isinstance(parameters, torch.Tensor):
            parameters = [parameters]
        parameters = list(parameters)
        first = not self._reduction.clipping
        self._reduction.clipping = True
        total = None
        if not first and norm_type == 2.0 and not error_if_nonfinite and \
                foreach is None:
            total = self._total_from_report(parameters)
        if total is None:
            kw = {} if foreach is None else {"foreach": foreach}
            return torch.nn.utils.clip_grad_norm_(
                parameters, max_norm, norm_type,
                error_if_nonfinite=error_if_nonfinite, **kw)
        total_t = torch.tensor(total, dtype=torch.float32)
        # torch's own scaling (clip_grads_with_norm_), skipped when it
        # would multiply by 1.0; a NaN total scales (to NaN) as torch does
        if not max_norm / (total + 1e-6) >= 1.0:
            torch.nn.utils.clip_grads_with_norm_(parameters, max_norm,
                                                 total_t)
        return total_t

    def _total_from_report(self, parameters):
        """The total 2-norm of the gradients of `parameters` from the last
        report's sums (units) and torch (the rest), or None where the
        report's sums do not stand in (clip_grad_norm_ says when)."""
        red = self._reduction
        if red.reduced is None or red.local is None or \
                red.reduced[0] != self._last:
            return None
        sumsq, nonfinite, _ = red.local
        reduced = {id(p): (u, g, v) for u, p, g, v in red.reduced[1]}
        per_unit = [0] * len(self._params)
        for _, (u, _, _) in reduced.items():
            per_unit[u] += 1
        covered = [0] * len(self._params)
        rest, ids = [], set()
        for p in parameters:
            g = p.grad
            if g is None:
                continue
            if id(p) in ids:  # listed twice: torch counts it twice
                return None
            ids.add(id(p))
            if g.is_cuda or g.dtype != torch.float32:
                return None
            r = reduced.get(id(p))
            if r is None:
                rest.append(g)
            elif r[1] is not g or r[2] != g._version:
                return None  # changed since the report read it
            else:
                covered[r[0]] += 1
        total = 0.0
        for u, n in enumerate(covered):
            if n == 0:
                continue
            if n != per_unit[u] or nonfinite[u]:
                return None  # part of a unit, or NaN/Inf: torch's clip
            total += sumsq[u]
        if rest:
            rest_norm = torch.nn.utils.get_total_norm(rest, 2.0)
            total += float(rest_norm.double()) ** 2
        return total ** 0.5
