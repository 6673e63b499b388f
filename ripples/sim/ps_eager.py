"""The simulator's ``ps-eager`` mode: decoupled push and pull, as ``policy="eager"`` runs
them, with the real staleness estimate and learning-rate factor
(:func:`ripples.ps.policies.expected_tau`, :func:`~ripples.ps.policies.eager_factor`).

At the end of step ``k`` a worker pushes its gradient, scaled by the factor of the
staleness it expects, then waits only for the pull it asked for after push ``k - 1`` (which
had a whole step to arrive), installs it, asks for the next pull and computes step
``k + 1``: it computes on parameters one push behind its own, and its pulls travel while it
computes. The servers apply every push on arrival (at ``push_lr_scale``, as ``ps-asp``) and
answer a pull once the push before it is applied. The staleness expected for a push is the
newest version seen in any answer minus the version computed on, plus this worker's pushes
not yet applied, plus one. Links, servers and the model are those of :mod:`.ps`.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import numpy as np

from ..ps.policies import eager_factor, expected_tau
from .ps import ParameterServerRun
from .scenario import Scenario


class EagerRun(ParameterServerRun):
    """One ``ps-eager`` run; see the module docstring."""

    def __init__(self, scenario: Scenario, progress):
        super().__init__(scenario, progress)
        n = scenario.workers
        self.newest_seen = [0] * n
        self.applied_mine = [0] * n  # this worker's pushes the servers had applied, as told
        self.applied_of = [0] * n    # ... as the servers count them
        self.asked = [False] * n     # a pull is on its way (asked after the last push)
        self.arrived: List[Optional[Tuple[np.ndarray, int]]] = [None] * n  # params, version
        self.waiting_pull = [False] * n  # the worker ended a step and waits for that pull
        self.factors: List[float] = []

    def handlers(self) -> dict:
        return {"computed": self.computed, "pushed": self.pushed, "pulled": self.pulled}

    def computed(self, w: int) -> None:
        self.step_ended(w)
        gradient = self.stats.gradient(w)
        in_flight = self.pushes[w] - self.applied_mine[w]
        tau = expected_tau(self.newest_seen[w], self.computed_on[w], in_flight)
        factor = eager_factor(tau, self.spec.eager_scale)
        self.factors.append(factor)
        self.pushes[w] += 1
        self.push(self.transfer(self.links_in), "pushed", w, gradient, factor)
        if self.asked[w] and self.arrived[w] is None:
            self.waiting_pull[w] = True  # the pull asked after the last push is not here
            return
        self.install_and_go_on(w)

    def install_and_go_on(self, w: int) -> None:
        """Install the pull that arrived (if any), ask for the next one, compute."""
        if self.arrived[w] is not None:
            params, version = self.arrived[w]
            self.stats.params[w] = params
            self.computed_on[w] = version
            self.arrived[w] = None
        self.asked[w] = True
        self.begin_step(w)

    def pushed(self, w: int, gradient: np.ndarray, factor: float) -> None:
        """A push reached the servers: apply it; the pull asked right after it leaves."""
        self.apply([gradient], factor * self.scale, 1)
        self.applied_of[w] += 1
        self.push(self.transfer(self.links_out), "pulled", w, self.server.params.copy(),
                  self.server.version, self.applied_of[w])

    def pulled(self, w: int, params: np.ndarray, version: int, applied: int) -> None:
        self.newest_seen[w] = max(self.newest_seen[w], version)
        self.applied_mine[w] = max(self.applied_mine[w], applied)
        self.arrived[w] = (params, version)
        if self.waiting_pull[w]:
            self.waiting_pull[w] = False
            self.install_and_go_on(w)
