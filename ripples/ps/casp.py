"""Community-aware synchronous parallel (CASP): pure logic of the community controller.

Workers of similar speed form *communities*. Inside a community the gradients are averaged
by one synchronous P-Reduce and one member (the lowest-numbered, the *leader*) pushes the
result; across communities pushes are applied on arrival, as in ASP. One community of all
workers is BSP; one community per worker is ASP.

This module holds no MPI and no tensors: the controller state that decides when to re-form
the communities. The speed estimate, sort-and-cut and the projection it optimizes live in
``casp_scoring`` (re-exported here). ``community.py`` runs the collectives on the workers;
the parameter server that hosts the controller (server 0) calls ``regroup``.

Choices where the published description is silent, and why (for the speed estimate, the
cut and the score, see ``casp_scoring``):

- *When*: a new plan is considered once every community of the current plan has pushed
  ``regroup_every`` rounds under it (so every community has fresh measurements and every
  worker has adopted the plan; plans are adopted one after the other, never skipped, which
  keeps members of a new community from waiting in different plans). A plan identical to
  the current one is not re-issued.
- *Learned* (``count == "learned"``): the count comes from the actor-critic of
  ``learned_controller.py`` and the communities from sort-and-cut; like ``"auto"``, the
  first plan is one community.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Sequence, Tuple

from .casp_scoring import (DEFAULT_TRAFFIC_PENALTY, EMA_ALPHA, LEARNED, Communities, choose,
                           contiguous, ema, from_labels, labels, normalize, projected_score,
                           sort_and_cut)

__all__ = ["Communities", "Controller", "DEFAULT_TRAFFIC_PENALTY", "EMA_ALPHA", "LEARNED",
           "choose", "contiguous", "ema", "from_labels", "labels", "normalize", "observe",
           "projected_score", "regroup", "sort_and_cut"]


@dataclasses.dataclass
class Controller:
    """Where the community controller stands (kept by server 0).

    ``count``: a fixed number of communities, None to choose it (``"auto"``) or
    ``"learned"`` to let the learned policy choose it (kept in ``learned``);
    ``plan``/``version``: the communities workers must use, numbered from 0;
    ``rounds``: pushes per community under the current plan; ``times``: the EMA of each
    worker's compute time per step, as its community's leader reported it.
    """

    num_workers: int
    count: Optional[int]
    regroup_every: int
    traffic_penalty: float = DEFAULT_TRAFFIC_PENALTY
    version: int = 0
    plan: Communities = ()
    rounds: Dict[Tuple[int, ...], int] = dataclasses.field(default_factory=dict)
    times: Dict[int, float] = dataclasses.field(default_factory=dict)
    history: List[Tuple[int, Communities]] = dataclasses.field(default_factory=list)
    learned: object = None

    def __post_init__(self):
        if not self.plan:
            self.plan = contiguous(self.num_workers, self.count or 1)
        self.history.append((self.version, self.plan))


def observe(state: Controller, version: int, members: Sequence[int],
            times: Dict[int, float]) -> None:
    """Record one community push made under plan ``version`` with its members' times."""
    state.times.update(times)
    if version == state.version:
        key = tuple(members)
        state.rounds[key] = state.rounds.get(key, 0) + 1


def regroup(state: Controller) -> bool:
    """Issue a new plan if it is time and the measured speeds call for a different one.
    Returns True when ``state.plan`` changed."""
    if any(state.rounds.get(c, 0) < state.regroup_every for c in state.plan):
        return False
    if len(state.times) < state.num_workers:
        return False
    times = [state.times[w] for w in range(state.num_workers)]
    if state.count == LEARNED:
        plan = _learned_plan(state, times)
    elif state.count:
        plan = sort_and_cut(times, state.count)
    else:
        plan = choose(times, state.traffic_penalty)
    state.rounds = {}
    if plan == state.plan:
        return False
    state.version += 1
    state.plan = plan
    state.history.append((state.version, plan))
    return True


def _learned_plan(state: Controller, times: List[float]) -> Communities:
    from . import learned_controller  # torch is loaded only by runs that ask for it
    if state.learned is None:
        state.learned = learned_controller.LearnedPolicy(traffic_penalty=state.traffic_penalty)
    return state.learned.choose(times, state.plan)
