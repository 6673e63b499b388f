"""Group schedules for decentralized training: which ranks P-Reduce together after each step.

``make_schedule(kind, ...)`` builds one of:

* ``"static"``: the generalized Prague schedule (:func:`static_partition`), no communication;
* ``"random"``: a random partition per step from a shared seed (:func:`random_partition`);
* ``"generator"``: groups from the Group Generator service (:class:`GeneratorSchedule`);
  ``"generator-node"`` divides within nodes first (``GroupGenerator(ranks_per_node=...)``);
* ``"adpsgd"``: AD-PSGD pairs with the active/passive split (:func:`adpsgd_pairs`).

All of them follow :class:`Schedule`: ``groups_for_step(step)``, ``leave()``, ``close()``.
"""
from __future__ import annotations

from .adpsgd import AdpsgdSchedule, adpsgd_pairs
from .base import KINDS, POLICIES, Assignment, Group, Schedule, check_choice, check_int, check_world
from .generator import GroupGenerator
from .static import RandomSchedule, StaticSchedule, random_partition, static_partition

__all__ = ["Schedule", "make_schedule", "static_partition", "random_partition", "adpsgd_pairs",
           "GroupGenerator", "StaticSchedule", "RandomSchedule", "AdpsgdSchedule",
           "GeneratorSchedule", "KINDS", "POLICIES", "Group", "Assignment"]


def make_schedule(kind: str, rank: int, size: int, local_size: int = 1, group_size: int = 2,
                  seed: int = 0, comm=None, timeout_s: float = 60.0, policy: str = "ready",
                  batch: int = 1, free_comm: bool = False) -> Schedule:
    """Build the schedule ``kind`` for ``rank`` of ``size`` ranks.

    Args:
        kind: one of ``"static"``, ``"random"``, ``"generator"``, ``"generator-node"``,
            ``"adpsgd"``.
        local_size: ranks per node (``"static"``, ``"generator-node"``; ranks numbered node
            by node).
        group_size: ranks per group (``"random"``, ``"generator"``), ``1..size``.
        seed: seed shared by all ranks (``"random"``, ``"generator"``, ``"adpsgd"``).
        comm: mpi4py communicator private to the generator (``"generator"`` only; its rank
            and size must equal ``rank`` and ``size``).
        timeout_s: bound of every wait on the generator.
        policy: Group Division policy, ``"ready"`` or ``"all"`` (``"generator"``).
        batch: groups fetched per request (``"generator"``).
        free_comm: the schedule frees ``comm`` at ``close()`` (``"generator"``).
    """
    check_choice("kind", kind, KINDS)
    check_choice("policy", policy, POLICIES)
    check_world(rank, size)
    check_int("local_size", local_size, low=1)
    check_int("group_size", group_size, low=1, high=size, high_name="size")
    check_int("seed", seed, low=0)
    if kind == "static":
        return StaticSchedule(rank, size, local_size)
    if kind == "random":
        return RandomSchedule(rank, size, group_size, seed)
    if kind == "adpsgd":
        return AdpsgdSchedule(rank, size, seed)
    if comm is None:
        raise ValueError("comm must be an mpi4py communicator for kind='generator' "
                         "(e.g. MPI.COMM_WORLD.Dup()), got None")
    if (comm.Get_rank(), comm.Get_size()) != (rank, size):
        raise ValueError(f"comm has rank {comm.Get_rank()} of {comm.Get_size()} but rank={rank}, "
                         f"size={size} were given; pass a duplicate of the world communicator")
    from .service import GeneratorSchedule
    by_node = {"ranks_per_node": local_size} if kind == "generator-node" else {}
    return GeneratorSchedule(comm, group_size, seed=seed, policy=policy, timeout_s=timeout_s,
                             batch=batch, free_comm=free_comm, **by_node)


def __getattr__(name):
    # The service imports mpi4py; load it only when asked so pure schedules need no MPI.
    if name == "GeneratorSchedule":
        from .service import GeneratorSchedule
        return GeneratorSchedule
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
