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
  ``learned_controller.py`` and the communities from sort-and-cut; like ``"projected"``,
  the first plan is one community.
- *Measured* (``count == "progress"``, the option ``communities="auto"``): the count comes
  from measured batches and loss decrease per second (``casp_progress``: explore ASP, the
  projection's count and BSP, then commit); the first plan is one community per worker,
  and the communities from sort-and-cut.
"""
from __future__ import annotations

import dataclasses
from typing import AbstractSet, Dict, List, Optional, Sequence, Set, Tuple

from . import casp_progress
from .casp_scoring import (AUTO, DEFAULT_TRAFFIC_PENALTY, EMA_ALPHA, LEARNED, PROGRESS,
                           PROJECTED, Communities, choose, contiguous, controller_count, ema,
                           from_labels, labels, normalize, projected_score, sort_and_cut,
                           weighs_by_size)

__all__ = ["AUTO", "Communities", "Controller", "DEFAULT_TRAFFIC_PENALTY", "EMA_ALPHA",
           "LEARNED", "PROGRESS", "PROJECTED", "choose", "contiguous", "controller_count",
           "ema", "from_labels", "labels", "normalize", "observe", "paused_after",
           "projected_score", "regroup", "sort_and_cut", "weighs_by_size"]


@dataclasses.dataclass
class Controller:
    """Where the community controller stands (kept by server 0).

    ``count`` (``controller_count`` of the option): a fixed number of communities, None to
    choose it by the projection (``"projected"``), ``"learned"`` to let the learned policy
    choose it (kept in ``learned``) or ``"progress"`` to choose it from measured progress
    (``"auto"``, kept in ``progress``);
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
    progress: Optional[casp_progress.Progress] = None

    def __post_init__(self):
        if not self.plan:
            self.plan = contiguous(self.num_workers, self.count or 1)
        if self.count == PROGRESS and self.progress is None:
            self.progress = casp_progress.Progress(self.num_workers)
        self.history.append((self.version, self.plan))


def observe(state: Controller, version: int, members: Sequence[int],
            times: Dict[int, float], losses: Sequence[float] = (), now: float = 0.0) -> None:
    """Record one community push made under plan ``version`` with the compute times of its
    training members (one batch each) and the training losses they reported (``now``: the
    server's clock, in seconds)."""
    state.times.update(times)
    if version == state.version:
        key = tuple(members)
        state.rounds[key] = state.rounds.get(key, 0) + 1
        if state.progress is not None:
            casp_progress.record(state.progress, now, members, len(times), losses)


def regroup(state: Controller) -> bool:
    """Issue a new plan if it is time and the measured speeds call for a different one.
    Returns True when ``state.plan`` changed."""
    fewest = min(state.rounds.get(c, 0) for c in state.plan)
    if fewest < 1 or len(state.times) < state.num_workers:
        if state.progress is not None and casp_progress.starved_before_every_push(
                state.progress, list(state.times.values())):
            state.progress.starved_early = True
            return _issue(state, contiguous(state.num_workers, 1))
        return False
    times = [state.times[w] for w in range(state.num_workers)]
    # An exploring progress controller may end a window early, by time (casp_progress),
    # but only once every community has pushed under the plan: then every worker has
    # adopted it, and no plan is skipped.
    if fewest < state.regroup_every and not (
            state.progress is not None
            and casp_progress.window_due(state.progress, times, state.regroup_every)):
        return False
    if state.count == LEARNED:
        plan = _learned_plan(state, times)
    elif state.count == PROGRESS:
        plan = sort_and_cut(times, casp_progress.boundary(state.progress, times))
    elif state.count:
        plan = sort_and_cut(times, state.count)
    else:
        plan = choose(times, state.traffic_penalty)
    return _issue(state, plan)


def _issue(state: Controller, plan: Communities) -> bool:
    """Make ``plan`` the current one, unless it is the current one already; the rounds
    under the plan are counted anew either way."""
    state.rounds = {}
    if plan == state.plan:
        return False
    state.version += 1
    state.plan = plan
    state.history.append((state.version, plan))
    return True


def paused_after(paused: AbstractSet[int], members: Sequence[int],
                 paused_now: Sequence[int], leaving: AbstractSet[int]) -> Set[int]:
    """The workers paused (serving rounds before a collective of the script) after a push
    of community ``members`` in which ``paused_now`` were paused: a worker is paused from
    its paused round until a round in which it trains (neither paused nor leaving)."""
    trained = set(members) - set(paused_now) - leaving
    return (paused | set(paused_now)) - trained


def _learned_plan(state: Controller, times: List[float]) -> Communities:
    from . import learned_controller  # torch is loaded only by runs that ask for it
    if state.learned is None:
        state.learned = learned_controller.LearnedPolicy(traffic_penalty=state.traffic_penalty)
    return state.learned.choose(times, state.plan)
