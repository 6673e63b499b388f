"""Synchronization policies of the parameter server, as pure logic (no MPI, no tensors).

Clocks: a worker's clock is the number of pushes it has made. The server keeps one count
per worker; a *round* (BSP, Sync-opt) is the set of pushes made at the same clock.

- ``bsp``: round ``c`` is applied (average of its gradients) once every active worker has
  pushed at clock ``c``; a pull asking for the state after round ``c`` waits for it. A
  worker that has joined is no longer active: later rounds average the remaining pushes.
- ``asp``: every push is applied on arrival with scale 1; pulls never wait.
- ``ssp``: applied on arrival; a worker with ``n`` pushes may start its next step only when
  ``n - min_j n_j <= staleness`` over active workers ``j`` (SSP's ``c - min_j c_j <= s``
  with ``c = n - 1``). ``staleness = 0`` runs in lockstep.
- ``dynsgd``: applied on arrival, scaled by ``1 / (d + 1)`` where ``d`` is the number of
  updates the server applied since the version the gradient was computed on.
- ``consgd``: applied on arrival with the constant scale ``1 / num_workers``, so that
  one pass over all workers moves the model as far as one BSP round.
- ``syncopt``: ``N + b`` workers; round ``c`` is applied as the average of the first ``N``
  pushes at clock ``c``; later pushes for a closed round are dropped (and counted). A
  worker whose push was dropped resumes at the servers' current round. With several
  servers each decides its first ``N`` on its own (as per-variable accumulators do).
- ``eager``: applied on arrival, scaled by the factor the worker sends, computed from the
  staleness it expects (see ``expected_tau`` and ``eager_factor``).
- ``casp``: communities of workers average their gradients by P-Reduce and their leader
  pushes one update, applied on arrival with scale 1 (``casp.py``, ``community.py``);
  ``communities`` is ``"auto"`` (the count measured, ``casp_progress``; ``"progress"`` is
  its older name), ``"projected"`` (the analytic projection's count), ``"learned"`` or a
  fixed count, ``regroup_every`` the rounds between regroupings, ``staleness`` an optional
  bound on how many rounds a worker may lead the slowest active one (SSP's gate on
  rounds). Under ``"auto"`` the members' gradients are summed and divided by the number of
  workers, so that one community is BSP and one per worker is ASP at ``lr / n``; otherwise
  a community pushes its members' mean.
- ``epsp`` and ``flexrr``: a clock's global batch is ``tasks_per_clock`` micro-batch tasks;
  a clock's round is applied, as the average over its tasks, once every task has been
  computed exactly once (``tasks.py``); ``staleness = s`` lets a worker start clock
  ``c + 1`` once round ``c - s`` is applied. EPSP rebalances shares by speed every
  ``rebalance_every`` clocks and moves tasks by straggler projection (``epsp.py``);
  FlexRR-lite keeps equal shares and moves tasks by count (``tasks.py``, rule
  ``"most_remaining"``).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Dict, Iterable, List, Optional, Set

POLICIES = ("bsp", "asp", "ssp", "dynsgd", "consgd", "syncopt", "eager", "casp", "epsp",
            "flexrr")
ROUND_POLICIES = ("bsp", "syncopt")
TASK_POLICIES = ("epsp", "flexrr")
STALENESS_POLICIES = ("ssp", "casp", "epsp", "flexrr")
EAGER_SCALES = ("inverse", "sqrt", "constant")


@dataclasses.dataclass(frozen=True)
class PolicySpec:
    """A validated policy with its knobs (see ``make_spec``)."""

    name: str
    num_workers: int
    staleness: Optional[int] = None
    backup_workers: int = 0
    eager_scale: str = "inverse"
    max_lag: Optional[int] = None
    coupled: bool = False
    communities: object = None
    regroup_every: Optional[int] = None
    tasks_per_clock: Optional[int] = None
    rebalance_every: Optional[int] = None

    @property
    def quorum(self) -> int:
        """Pushes needed to close a round (Sync-opt's N; all workers for BSP)."""
        return self.num_workers - self.backup_workers

    @property
    def decoupled(self) -> bool:
        """True when the worker overlaps its pull with the next step (eager, not coupled)."""
        return self.name == "eager" and not self.coupled


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def make_spec(policy, num_workers: int, staleness=None, backup_workers: int = 1,
              eager_scale: str = "inverse", max_lag=None, coupled: bool = False,
              communities=None, regroup_every=None, tasks_per_clock=None,
              rebalance_every=None) -> PolicySpec:
    """Validate the policy arguments; raise ValueError naming the argument and valid values.

    ``staleness``: required for ``"ssp"``; optional for ``"casp"`` (None: unbounded) and
    for ``"epsp"``/``"flexrr"`` (default 0). ``communities`` (``"auto"``, ``"projected"``,
    ``"learned"`` or an integer in ``[1, num_workers]``, default ``"auto"``) and
    ``regroup_every`` (rounds, default 20) belong to ``"casp"``; ``tasks_per_clock``
    (default ``4 * num_workers``) to ``"epsp"`` and ``"flexrr"``; ``rebalance_every``
    (clocks, default 5; the first rebalance comes as soon as every worker is measured) to
    ``"epsp"``.
    """
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {list(POLICIES)}, got {policy!r}")
    if staleness is not None and not (_count(staleness) and staleness >= 0):
        raise ValueError(f"staleness must be an integer >= 0 (0 is lockstep), "
                         f"got staleness={staleness!r}")
    if policy == "ssp" and staleness is None:
        raise ValueError("policy='ssp' needs staleness=<integer >= 0> (0 is lockstep), "
                         "got staleness=None")
    if policy not in STALENESS_POLICIES and staleness is not None:
        raise ValueError(f"staleness applies only to policy in {list(STALENESS_POLICIES)}, got "
                         f"staleness={staleness!r} with policy={policy!r}; pass staleness=None")
    if policy in TASK_POLICIES and staleness is None:
        staleness = 0
    for name, value, owners in (("communities", communities, ("casp",)),
                                ("regroup_every", regroup_every, ("casp",)),
                                ("tasks_per_clock", tasks_per_clock, TASK_POLICIES),
                                ("rebalance_every", rebalance_every, ("epsp",))):
        if value is not None and policy not in owners:
            raise ValueError(f"{name} applies only to policy in {list(owners)}, got "
                             f"{name}={value!r} with policy={policy!r}")
    if policy == "casp":
        communities = "auto" if communities is None else communities
        if communities not in ("auto", "projected", "learned", "progress") and not (
                _count(communities) and 1 <= communities <= num_workers):
            raise ValueError(f"communities must be 'auto', 'projected', 'learned' or an "
                             f"integer in [1, {num_workers}] for {num_workers} workers, got "
                             f"communities={communities!r}")
        regroup_every = 20 if regroup_every is None else regroup_every
        if not (_count(regroup_every) and regroup_every >= 1):
            raise ValueError(f"regroup_every must be an integer >= 1 (rounds), "
                             f"got regroup_every={regroup_every!r}")
    if policy in TASK_POLICIES:
        tasks_per_clock = 4 * num_workers if tasks_per_clock is None else tasks_per_clock
        if not (_count(tasks_per_clock) and tasks_per_clock >= num_workers):
            raise ValueError(f"tasks_per_clock must be an integer >= {num_workers} (one task "
                             f"per worker at least), got tasks_per_clock={tasks_per_clock!r}")
    if policy == "epsp":
        rebalance_every = 5 if rebalance_every is None else rebalance_every
        if not (_count(rebalance_every) and rebalance_every >= 1):
            raise ValueError(f"rebalance_every must be an integer >= 1 (clocks), "
                             f"got rebalance_every={rebalance_every!r}")
    if eager_scale not in EAGER_SCALES:
        raise ValueError(f"eager_scale must be one of {list(EAGER_SCALES)}, got {eager_scale!r}")
    if max_lag is not None and (not isinstance(max_lag, int) or max_lag < 0):
        raise ValueError(f"max_lag must be None or an integer >= 0, got {max_lag!r}")
    backups = backup_workers if policy == "syncopt" else 0
    if policy == "syncopt" and not (isinstance(backups, int) and 0 <= backups < num_workers):
        raise ValueError(f"backup_workers must be an integer in [0, {num_workers - 1}] for "
                         f"{num_workers} workers, got {backup_workers!r}")
    return PolicySpec(policy, num_workers, staleness, backups, eager_scale, max_lag, bool(coupled),
                      communities, regroup_every, tasks_per_clock, rebalance_every)


def ssp_may_start(own_pushes: int, active_pushes: Iterable[int], staleness: int) -> bool:
    """SSP gate: may a worker that has pushed ``own_pushes`` times start its next step?"""
    slowest = min(active_pushes, default=own_pushes)
    return own_pushes - min(slowest, own_pushes) <= staleness


def dynsgd_factor(delay: int) -> float:
    """DynSGD: scale of an update computed ``delay`` versions ago."""
    if delay < 0:
        raise ValueError(f"delay must be >= 0, got {delay}")
    return 1.0 / (delay + 1)


def expected_tau(newest_seen: int, computed_on: int, in_flight: int) -> int:
    """Staleness an eager worker expects for the gradient it is about to push:
    ``(newest version seen - version computed on) + own pushes in flight + 1``."""
    return max(0, newest_seen - computed_on) + max(0, in_flight) + 1


def eager_factor(tau: int, kind: str = "inverse") -> float:
    """Learning-rate factor for expected staleness ``tau >= 1``: 1/tau, 1/sqrt(tau) or 1."""
    if tau < 1:
        raise ValueError(f"tau must be >= 1, got {tau}")
    if kind == "inverse":
        return 1.0 / tau
    if kind == "sqrt":
        return 1.0 / math.sqrt(tau)
    if kind == "constant":
        return 1.0
    raise ValueError(f"eager_scale must be one of {list(EAGER_SCALES)}, got {kind!r}")


def apply_factor(spec: PolicySpec, delay: int, worker_factor: float) -> float:
    """The learning-rate factor the server uses for one update applied on arrival."""
    if spec.name == "dynsgd":
        return dynsgd_factor(delay)
    if spec.name == "consgd":
        return 1.0 / spec.num_workers
    if spec.name == "eager":
        return worker_factor
    return 1.0


def pull_ready(spec: PolicySpec, after_round: int, rounds_applied: int, own_pushes: int,
               active_pushes: Iterable[int]) -> bool:
    """May the server answer a pull now? ``after_round`` is the pulling worker's clock."""
    if spec.name in ROUND_POLICIES:
        return rounds_applied >= after_round
    if spec.name in TASK_POLICIES:
        return rounds_applied >= after_round - spec.staleness
    if spec.name == "casp":
        return spec.staleness is None or ssp_may_start(own_pushes, active_pushes, spec.staleness)
    if spec.name == "ssp":
        return ssp_may_start(own_pushes, active_pushes, spec.staleness)
    return True


class Rounds:
    """Which worker pushed at which clock, and when a round may be applied (BSP, Sync-opt).

    ``offer`` records a push (False: dropped because its round is already applied);
    ``ready`` says whether the next round can be applied given the active workers;
    ``close`` returns the workers whose pushes form that round (the first ``quorum``) and
    those beyond the quorum, which are dropped, and advances to the next round.
    """

    def __init__(self, quorum: int):
        self.quorum = quorum
        self.applied = 0
        self.pushers: Dict[int, List[int]] = {}

    def offer(self, worker: int, clock: int) -> bool:
        if clock < self.applied:
            return False
        members = self.pushers.setdefault(clock, [])
        if worker in members:
            raise ValueError(f"worker {worker} pushed twice at clock {clock}")
        members.append(worker)
        return True

    def ready(self, active: Set[int]) -> bool:
        members = self.pushers.get(self.applied, [])
        if not members:
            return False
        return len(members) >= self.quorum or active.issubset(members)

    def missing(self, active: Set[int]) -> List[int]:
        """Active workers that have not pushed for the next round."""
        return sorted(active.difference(self.pushers.get(self.applied, [])))

    def close(self):
        members = self.pushers.pop(self.applied, [])
        self.applied += 1
        return members[: self.quorum], members[self.quorum:]
