"""Who goes on after a failure: the ranks that still reach each other, if they are a majority.

Open MPI's fault tolerance (``failures.shrink``) rebuilds the world without the ranks it
knows died. A rank that is frozen, or on a host cut off from the network, is not dead to
MPI: its connections stay open, and a shrink would wait for it for good. Both sides of such
a cut see the other side silent, and if both went on, each would train and checkpoint as
if it were the job (split brain). So, under ``Config.fault_tolerant``, recovery first runs
a membership round on the liveness communicator (never revoked, answered by each rank's
responder thread whatever its main thread does):

1. each rank asks every other how it is (``Liveness.probe``); the ranks that answer,
   itself included, are the ones it reaches; those MPI reports dead are dead; the rest are
   silent;
2. the lowest rank it reaches coordinates: it sends its view (the decision) to the ranks it
   reaches and a notice to the silent ones; the others take the decision of their
   coordinator;
3. the members go on only with a quorum (``has_quorum``): more members than silent ranks,
   or as many and the lowest of them among the members. Dead ranks do not count: they
   cannot form another side. The other side, and a rank left out, stop (``stop_here``):
   they never reach the script again, so they never write over the majority's checkpoints.

A decision with no silent rank keeps Open MPI's shrink; one with silent ranks builds the new
world with ``MPI_Comm_create_group``, which only its members take part in.
"""
from __future__ import annotations

import os
import time
from typing import List, NamedTuple, Sequence

from mpi4py import MPI

from ripples.comm import fail_fast, failures, outbox
from ripples.comm.liveness import MEMBERSHIP_TAGS, Liveness, answer_wait_s

_DECISION, _LEFT_OUT = MEMBERSHIP_TAGS
EXIT_STATUS = 1


class Decision(NamedTuple):
    """The coordinator's view, in ranks of the world that failed."""

    generation: int
    members: List[int]  # reach each other: the new world, in this order
    silent: List[int]   # did not answer: frozen, hung, or cut off
    dead: List[int]     # reported dead by MPI


def has_quorum(members: Sequence[int], silent: Sequence[int]) -> bool:
    """Whether ``members`` may go on without the ``silent`` ranks: they are more, or as many
    and hold the lowest of all. Two sides of one cut never both have it."""
    if len(members) != len(silent):
        return len(members) > len(silent)
    return bool(members) and min(members) < min(silent)


def decide(me: int, generation: int, answered: Sequence[int], dead: Sequence[int],
           size: int) -> Decision:
    """The decision of a coordinator ``me`` that reached ``answered`` among ``size`` ranks."""
    members = sorted({me, *answered} - set(dead))
    silent = sorted(set(range(size)) - set(members) - set(dead))
    return Decision(generation, members, silent, sorted(dead))


def agree(liveness: Liveness, generation: int, describe_hosts=lambda ranks: "") -> Decision:
    """Run the membership round (module docstring) and return the decision this rank is
    part of; a rank left out, or on the side without a quorum, stops here.

    ``generation``: the failed world's count, equal on all its members (tells rounds apart).
    ``describe_hosts(ranks)``: text naming where ``ranks`` run, for the messages.
    """
    comm = liveness.comm
    me, size = comm.Get_rank(), comm.Get_size()
    excluded = set()  # coordinators found silent while this rank waited for their decision
    while True:
        _stop_if_left_out(comm, generation)
        answers = liveness.probe([r for r in range(size) if r != me and r not in excluded])
        dead = failures.acknowledge(comm)
        answered = [r for r, state in answers.items() if state is not None]
        view = decide(me, generation, answered, dead, size)
        coordinator = view.members[0]
        if coordinator == me:
            _announce(comm, view)
            decision = view
            break
        decision = _await_decision(comm, liveness, coordinator, generation)
        if decision is not None:
            break
        excluded.add(coordinator)
    if me not in decision.members:
        stop_here(f"rank {me} was left out of the world by rank {decision.members[0]}'s "
                  f"membership round (it did not answer in time)")
    if not has_quorum(decision.members, decision.silent):
        stop_here(
            f"rank {me} reaches only rank(s) {decision.members} of the {size}-rank world; "
            f"rank(s) {decision.silent}{describe_hosts(decision.silent)} do not answer (a "
            "network partition, or frozen ranks). Without a majority this side stops, so that "
            "the other side can go on alone (no split brain: this side writes no checkpoint)")
    return decision


def new_world(comm: MPI.Comm, decision: Decision) -> MPI.Comm:
    """The members of ``decision`` as a communicator (collective over them only)."""
    group = comm.Get_group().Incl(decision.members)
    try:
        return comm.Create_group(group, tag=1000 + decision.generation % 30000)
    finally:
        group.Free()


def stop_here(message: str) -> None:
    """End this process after a membership round left it out: print why and exit non-zero,
    without finalizing MPI (that would wait for the ranks it cannot reach)."""
    fail_fast.say(message)
    os._exit(EXIT_STATUS)


def _announce(comm: MPI.Comm, decision: Decision) -> None:
    """Send the decision to the other members and a notice to the silent ranks. The sends
    are not waited for: a silent rank may never take its notice."""
    for rank in decision.members[1:]:
        outbox.keep_until_complete(comm.isend(tuple(decision), dest=rank, tag=_DECISION))
    for rank in decision.silent:
        outbox.keep_until_complete(comm.isend(decision.generation, dest=rank, tag=_LEFT_OUT))


def _await_decision(comm: MPI.Comm, liveness: Liveness, coordinator: int, generation: int):
    """The coordinator's decision for ``generation``; None once it stops answering. A
    coordinator that answers but has not reached its round yet (busy) is waited for."""
    check_every = answer_wait_s(liveness.timeout_s)
    next_check = time.monotonic() + check_every
    while True:
        try:
            while comm.iprobe(source=coordinator, tag=_DECISION):
                decision = Decision(*comm.recv(source=coordinator, tag=_DECISION))
                if decision.generation == generation:
                    return decision
        except MPI.Exception as error:  # the coordinator died
            if not failures.is_process_failure(error):
                raise
            return None
        _stop_if_left_out(comm, generation)
        if time.monotonic() >= next_check:
            if liveness.probe([coordinator])[coordinator] is None:
                return None
            next_check = time.monotonic() + check_every
        time.sleep(0.005)


def _stop_if_left_out(comm: MPI.Comm, generation: int) -> None:
    """Stop if a coordinator of this round's world already left this rank out."""
    status = MPI.Status()
    while True:
        failures.acknowledge(comm)  # else a death fails the wildcard probe
        try:
            if not comm.iprobe(source=MPI.ANY_SOURCE, tag=_LEFT_OUT, status=status):
                return
            source = status.Get_source()
            notice = comm.recv(source=source, tag=_LEFT_OUT)
        except MPI.Exception as error:  # a death since the acknowledgement
            if not failures.is_process_failure(error):
                raise
            continue
        if notice == generation:
            stop_here(f"rank {comm.Get_rank()} was left out of the world by rank {source}'s "
                      "membership round: it did not answer in time (frozen, or cut off)")
