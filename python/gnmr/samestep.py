# SPDX-License-Identifier: MIT
"""The same-step mode (docs/policy.md, "Same-step mode"): a unit whose
recipe measures its low-cost path's error before its GEMM takes its
recovery path in the step itself when that measure is above the bound
gnmrd's latest decision gave it, within the budget that decision left.

Controller(..., measure=fn, same_step=True) sets one `Gate` on every
module of a unit that has a `same_step_gate` attribute
(gnmr.quant.QuantLinear), and arms the gates after each decision with
its bounds and spare budget (Agent.bounds()). In the forward, such a
module asks its gate with its measure of the current input; the gate
says whether to run the recovery path for this step. A unit switched
once in a step stays switched for the rest of that step (all its
modules, and their backward). The units switched are StepResult's
`same_step`; gnmrd sees their measures as any other and decides the
next steps as usual.

Each rank switches at most `spare` units a step from its own measures
(ranks of a data-parallel job see different data and may switch
different units; each one's cost stays within the budget); the bounds
are advisory: not sealed, never stored.
"""
import math

__all__ = ["Gate", "Budget"]


class Budget:
    """The spare budget of one step: `arm(n)` at each decision, `take()`
    a unit's place. `step` counts the armings (what a gate's grant
    belongs to)."""

    __slots__ = ("left", "step")

    def __init__(self):
        self.left, self.step = 0, 0

    def arm(self, spare):
        self.left = max(0, int(spare))
        self.step += 1

    def take(self):
        if self.left <= 0:
            return False
        self.left -= 1
        return True


class Gate:
    """One unit's gate: `bound` (inf: never), its unit's name, and whether
    it switched the unit in the current step."""

    __slots__ = ("name", "bound", "budget", "_granted")

    def __init__(self, name, budget):
        self.name, self.budget = name, budget
        self.bound = math.inf
        self._granted = -1

    def __call__(self, measure):
        """Whether the unit takes its recovery path in this step, its
        module's measure of the current input being `measure`."""
        if self._granted == self.budget.step:
            return True
        if measure > self.bound and self.budget.take():
            self._granted = self.budget.step
            return True
        return False

    @property
    def switched(self):
        return self._granted == self.budget.step
