"""One simulated job: workers, their speeds and compute, the network, the problem, the
mode, and how it is measured. Validated at construction; the engine reads nothing else."""
from __future__ import annotations

import dataclasses
from typing import Optional

from ..ps.policies import STALENESS_POLICIES, TASK_POLICIES, make_spec
from ..schedule.base import POLICIES
from .network import Network
from .stats import Problem
from .workers import Compute, Speed

PS_POLICIES = ("bsp", "ssp", "asp", "dynsgd", "consgd", "syncopt", "eager", "casp", "epsp",
               "flexrr")
PS_MODES = tuple(f"ps-{policy}" for policy in PS_POLICIES)
MODES = ("allreduce", "static", "random", "generator", "generator-node", "adpsgd",
         "adpsgd-sync") + PS_MODES
LOCKSTEP_MODES = ("static", "random", "adpsgd-sync")  # the modes barrier_every applies to
TARGET_ON = ("worker0", "average")


@dataclasses.dataclass(frozen=True)
class Scenario:
    """A simulated training job.

    mode: ``"allreduce"`` (gradients averaged over all workers every step), ``"static"``
        (Prague's schedule with ``network.workers_per_node`` per node), ``"random"``
        (random partition per step from a shared seed), ``"generator"`` (the Group
        Generator), ``"generator-node"`` (the Group Generator dividing within nodes of
        ``network.workers_per_node`` first), ``"adpsgd"`` (asynchronous AD-PSGD: after
        each step an active worker averages with a passive one, which answers while it
        computes, as ``sync="adpsgd"``), ``"adpsgd-sync"`` (AD-PSGD's pairs run in lock
        step after every step, as ``sync="adpsgd-sync"``); ``"ps-<policy>"`` (parameter
        servers under ``ripples.ps`` policy ``<policy>``, see :mod:`.ps`).
    group_size, policy, batch: of the random partition and the generator (``batch`` =
        groups per generator request).
    cross_node_every: ``"generator-node"``: every this-many-th division ignores the nodes.
    model_bytes: bytes every collective averages (parameters or gradients).
    horizon_s: simulated seconds; the run ends there, or at the target when
        ``stop_at_target``.
    target_loss: test loss to reach; ``target_on`` says whose: worker 0's model
        (as ``benchmarks/train.py`` measures rank 0) or the average of all models.
    eval_every: worker 0's steps between evaluations.
    barrier_every: static/random/adpsgd-sync only: all workers meet in a small all-reduce before
        every ``barrier_every``-th step (``benchmarks/train.py`` does this to stop those
        modes together); 0 = never.
    overlap: allreduce only: fraction of a step's compute during which the gradient
        all-reduce can already run (backward overlap); 0 = none.
    ps_servers: parameter-server modes: servers, each holding an equal shard of the model
        behind its own inter-node link.
    staleness, backup_workers, communities, regroup_every, tasks_per_clock,
        rebalance_every: the policy's knobs, as ``sync="ps"`` takes them
        (``ripples.ps.policies.make_spec``; None: its default).
    push_lr_scale: learning-rate factor of ``ps-asp``, ``ps-ssp`` and ``ps-eager``, which
        apply every push alone; None = ``1 / workers`` (as ``benchmarks/ps.py`` runs them).
    """
    mode: str
    workers: int
    compute: Compute
    speed: Speed = Speed()
    network: Network = Network()
    model_bytes: float = 4e6
    problem: Problem = Problem()
    group_size: int = 4
    policy: str = "ready"
    batch: int = 1
    cross_node_every: int = 4
    seed: int = 0
    horizon_s: float = 60.0
    stop_at_target: bool = False
    target_loss: Optional[float] = None
    target_on: str = "worker0"
    eval_every: int = 5
    barrier_every: int = 0
    overlap: float = 0.0
    ps_servers: int = 1
    staleness: Optional[int] = None
    backup_workers: int = 1
    communities: object = "auto"
    regroup_every: int = 20
    tasks_per_clock: Optional[int] = None
    rebalance_every: Optional[int] = None
    push_lr_scale: Optional[float] = None

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {self.policy!r}")
        if self.target_on not in TARGET_ON:
            raise ValueError(f"target_on must be one of {TARGET_ON}, got {self.target_on!r}")
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers!r}")
        if not 1 <= self.group_size <= self.workers:
            raise ValueError(f"group_size must be in [1, workers], got {self.group_size!r}")
        if self.batch < 1 or self.eval_every < 1 or self.barrier_every < 0:
            raise ValueError("batch and eval_every must be >= 1 and barrier_every >= 0")
        if not self.horizon_s > 0 or not self.model_bytes >= 0:
            raise ValueError("horizon_s must be > 0 and model_bytes >= 0")
        if not 0 <= self.overlap <= 1:
            raise ValueError(f"overlap must be in [0, 1], got {self.overlap!r}")
        if self.ps_servers < 1:
            raise ValueError(f"ps_servers must be >= 1, got {self.ps_servers!r}")
        if self.push_lr_scale is not None and not self.push_lr_scale > 0:
            raise ValueError(f"push_lr_scale must be > 0 or None, got {self.push_lr_scale!r}")
        if self.mode in PS_MODES:
            self.policy_spec()  # raises ValueError naming a bad knob

    def policy_spec(self):
        """The ``ripples.ps.policies.PolicySpec`` of a parameter-server mode."""
        policy = self.mode[len("ps-"):]
        return make_spec(
            policy, self.workers,
            staleness=self.staleness if policy in STALENESS_POLICIES else None,
            backup_workers=self.backup_workers,
            communities=self.communities if policy == "casp" else None,
            regroup_every=self.regroup_every if policy == "casp" else None,
            tasks_per_clock=self.tasks_per_clock if policy in TASK_POLICIES else None,
            rebalance_every=self.rebalance_every if policy == "epsp" else None)

    def ceiling_steps_per_s(self) -> float:
        """``sum_i v_i``: every worker stepping at its own mean speed, never waiting."""
        factors = self.speed.expected_factors(self.workers, self.seed)
        return float((1.0 / (self.compute.seconds * factors + self.compute.update_s)).sum())
