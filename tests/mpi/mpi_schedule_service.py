"""Run under mpiexec: every rank agrees on static/random schedules, and the Group
Generator service hands out consistent groups over real MPI and shuts down cleanly."""
import random
import threading
import time

import pytest
from mpi4py import MPI

from ripples.schedule import make_schedule

WORLD = MPI.COMM_WORLD
RANK, SIZE = WORLD.Get_rank(), WORLD.Get_size()


@pytest.mark.parametrize("kind", ["static", "random", "adpsgd"])
def test_all_ranks_agree_on_communication_free_schedules(kind):
    sched = make_schedule(kind, rank=RANK, size=SIZE, local_size=2, group_size=2, seed=5)
    mine = {step: sched.groups_for_step(step) for step in range(100)}
    sched.close()
    views = WORLD.allgather(mine)
    for step in range(100):
        by_seq = {}
        for rank, view in enumerate(views):
            for seq, group in view[step]:
                assert rank in group
                by_seq.setdefault(seq, set()).add((group, rank))
        for seq, entries in by_seq.items():
            groups = {g for g, _ in entries}
            assert len(groups) == 1, (step, seq, groups)  # one group per seq on every member
            (group,) = groups
            assert {r for _, r in entries} == set(group)  # every member, and only members
        if kind != "adpsgd":
            covered = sorted(r for g in {g for v in views for _, g in v[step]} for r in g)
            assert covered == list(range(SIZE))  # disjoint and covering: a partition


@pytest.mark.parametrize("kind", ["generator", "generator-node"])
@pytest.mark.parametrize("policy", ["ready", "all"])
def test_generator_service_hands_out_consistent_groups(policy, kind):
    comm = WORLD.Dup()
    steps = 20 + 5 * RANK  # ranks stop at different times: exercises leave()
    rng = random.Random(RANK)
    sched = make_schedule(kind, rank=RANK, size=SIZE, local_size=2, group_size=2, seed=3,
                          comm=comm, timeout_s=20.0, policy=policy, batch=2)
    executed = []
    for step in range(steps):
        time.sleep(rng.uniform(0, 0.004))
        executed.extend(sched.groups_for_step(step))
    executed.extend(sched.leave())
    with pytest.raises(ValueError, match="has left"):
        sched.groups_for_step(steps)
    sched.close()
    sched.close()  # idempotent
    assert not any(t.name == "ripples-group-generator" for t in threading.enumerate())
    comm.Free()

    seqs = [seq for seq, _ in executed]
    assert seqs == sorted(set(seqs))  # strictly increasing per rank
    assert all(RANK in group for _, group in executed)
    views = WORLD.allgather(executed)
    by_seq = {}
    for rank, view in enumerate(views):
        for seq, group in view:
            by_seq.setdefault(seq, []).append((group, rank))
    for seq, entries in by_seq.items():
        (group,) = {g for g, _ in entries}
        # every member executed the group exactly once, nobody else did
        assert sorted(r for _, r in entries) == list(group), (seq, entries)


def test_request_without_company_times_out_then_closes_cleanly():
    from ripples.core.errors import RipplesTimeoutError
    from ripples.schedule.service import GeneratorSchedule

    comm = WORLD.Dup()
    # max_isolation=0: a lone worker must wait for company, and nobody else asks
    sched = GeneratorSchedule(comm, group_size=2, policy="ready", timeout_s=0.5,
                              max_isolation=0)
    if RANK == 1:
        start = time.monotonic()
        with pytest.raises(RipplesTimeoutError,
                           match="group generator .* from rank 1: gave up after 0.5 s"):
            sched.groups_for_step(0)
        assert time.monotonic() - start < 2.0
    WORLD.Barrier()
    assert sched.leave() == []
    sched.close()
    assert not any(t.name == "ripples-group-generator" for t in threading.enumerate())
    comm.Free()


def test_a_lone_request_is_answered_at_once_when_the_others_are_away():
    """The others told the generator they left the training step (a collective of the
    script, the end of their epoch): a rank that must have company by the isolation rule
    does not wait company_wait_s (30 s) for them."""
    from ripples.schedule.service import GeneratorSchedule

    comm = WORLD.Dup()
    sched = GeneratorSchedule(comm, group_size=2, policy="ready", timeout_s=20.0,
                              max_isolation=0, company_wait_s=30.0, first_wait_s=30.0)
    asker = SIZE - 1
    if RANK != asker:
        sched.away()
        sched.away()  # a second notice in the same absence sends nothing
    WORLD.Barrier()
    if RANK == asker:
        start = time.monotonic()
        assert sched.groups_for_step(0) == [(0, (asker,))]
        assert time.monotonic() - start < 10.0  # not the 30 s of company_wait_s
    WORLD.Barrier()
    assert sched.leave() == []
    sched.close()
    comm.Free()


def test_service_answers_after_idle_and_at_a_deadline_with_no_other_message():
    """After a silent 1.5 s (the service at its longest nap), a lone request is answered
    when the generator's company window (``first_wait_s``) ends: a deadline, with no other
    message arriving to wake the service."""
    from ripples.schedule.service import GeneratorSchedule

    comm = WORLD.Dup()
    sched = GeneratorSchedule(comm, group_size=2, policy="ready", timeout_s=20.0,
                              first_wait_s=0.3)
    WORLD.Barrier()
    time.sleep(1.5)  # longer than IDLE_AFTER_S: the service naps at its idle length
    asker = 0  # nothing is divided before rank 0's first request (or its restore)
    if RANK == asker:
        start = time.monotonic()
        assert sched.groups_for_step(0) == [(0, (asker,))]  # nobody came: a group of itself
        assert time.monotonic() - start >= 0.25  # released by the window, not at once
    WORLD.Barrier()  # the others stayed silent until the answer
    assert sched.leave() == []
    sched.close()
    assert not any(t.name == "ripples-group-generator" for t in threading.enumerate())
    comm.Free()


def test_a_requests_cost_leaves_out_the_time_the_generator_held_it_for_company():
    """Rank 0 asks alone: the generator holds its request for company until its window
    (``first_wait_s``) ends, and ``request_costs`` counts only what it cost beyond that."""
    from ripples.schedule.service import GeneratorSchedule

    comm = WORLD.Dup()
    sched = GeneratorSchedule(comm, group_size=2, policy="ready", timeout_s=20.0,
                              first_wait_s=0.3)
    WORLD.Barrier()
    if RANK == 0:
        assert sched.groups_for_step(0) == [(0, (0,))]
        (round_trip, held), = sched.request_times
        (cost,) = sched.request_costs()
        assert round_trip >= 0.25 and held >= 0.25, (round_trip, held)
        assert 0.0 <= cost < 0.1 and cost == round_trip - held, (round_trip, held)
        assert sched.division_reasons() == {"window ended": (1, 1)}  # rank 0 runs it
        (request, division) = sched.generator_events()
        assert request == ("request", 0.0, 0)
        assert division[0] == "division" and division[2:] == ("window ended", [(0,)])
        assert 0.3 <= division[1] < 1.0, division
    else:
        assert sched.request_costs() == [] and sched.division_reasons() == {}
        assert sched.generator_events() == []
    WORLD.Barrier()
    assert sched.leave() == []
    sched.close()
    comm.Free()


def test_an_idle_service_sleeps_on_its_doorbell_and_wakes_for_a_request():
    from ripples.comm.doorbell import MAX_WAIT_S

    comm = WORLD.Dup()
    sched = make_schedule("generator", rank=RANK, size=SIZE, group_size=SIZE, comm=comm,
                          policy="all", seed=1)
    service = sched._service
    WORLD.Barrier()
    time.sleep(0.1)  # past the grace period after set-up
    before = service.wakeups if RANK == 0 else 0
    time.sleep(1.0)  # nobody asks
    if RANK == 0:
        assert service.doorbell is not None
        # the nap loop wakes at least 100 times a second; the doorbell only at MAX_WAIT_S
        assert service.wakeups - before <= 1.0 / MAX_WAIT_S + 5, service.wakeups - before
    WORLD.Barrier()
    assert [group for _, group in sched.groups_for_step(0)] == [tuple(range(SIZE))]
    assert sched.leave() == []
    sched.close()
    comm.Free()


def test_stop_ends_an_idle_service_promptly():
    from ripples.schedule import GroupGenerator
    from ripples.schedule.service import GeneratorService

    comm = WORLD.Dup()
    if RANK == 0:
        service = GeneratorService(comm, GroupGenerator(SIZE, 2))
        service.start()
        time.sleep(0.5)  # idle: no rank sends anything
        began = time.monotonic()
        service.stop()
        service._thread.join(5.0)
        assert not service.is_alive() and service.error is None
        assert time.monotonic() - began < 1.0
    WORLD.Barrier()
    comm.Free()


def test_an_exception_in_the_service_ends_it_and_is_kept_in_error():
    from ripples.schedule import GroupGenerator
    from ripples.schedule.service import TAG_REQUEST, GeneratorService

    class Broken(GroupGenerator):
        def poll(self):
            raise RuntimeError("generator broke")

    comm = WORLD.Dup()
    if RANK == 0:
        service = GeneratorService(comm, Broken(SIZE, 2))
        service.start()
        comm.send(("groups", 0, 1), dest=0, tag=TAG_REQUEST)  # received by the service
        service._thread.join(5.0)
        assert not service.is_alive()
        assert isinstance(service.error, RuntimeError)
    WORLD.Barrier()
    comm.Free()


def test_rank_0s_generator_state_resumes_the_division_sequence():
    """Under "all" each division shuffles every rank with the generator's random state: a
    schedule restored from rank 0's state() hands out the groups that the saved schedule
    would have handed out next (every rank loads rank 0's state, as from one checkpoint),
    also when the other ranks ask for groups before rank 0 restored."""
    from ripples.schedule.service import GeneratorSchedule

    def groups(sched, steps):
        """This rank's group of each of ``steps`` steps (one per step under "all"), then
        those handed out on leaving (the generator may have divided ahead)."""
        handed = [group for step in range(steps) for _, group in sched.groups_for_step(step)]
        return handed, sched.leave()

    def finish(sched, comm):
        sched.close()
        comm.Free()

    comms = [WORLD.Dup() for _ in range(2)]
    scheds = [GeneratorSchedule(c, group_size=2, seed=5, policy="all", timeout_s=20.0)
              for c in comms]
    original, restored = scheds
    state = original.state()
    assert ("generator" in state) == (RANK == 0), state
    saved = WORLD.bcast(state, root=0)
    assert saved["generator"]["divisions"] == 0
    groups(original, 4)
    state = WORLD.bcast(original.state(), root=0)
    divisions = state["generator"]["divisions"]
    assert divisions >= 4
    if RANK == 0:
        time.sleep(0.3)  # rank 0 loads its checkpoint last: the others ask first
    restored.restore(state)
    after, _ = groups(restored, 4)
    for sched, comm in zip(scheds, comms):
        finish(sched, comm)
    # The divisions after the saved ones in a fresh run of the same seed (at 2 ranks every
    # division is the pair (0, 1); at 4 ranks each is one of 3 pairings). How many the
    # generator had made when saved depends on how far it divided ahead.
    reference_comm = WORLD.Dup()
    reference = GeneratorSchedule(reference_comm, group_size=2, seed=5, policy="all",
                                  timeout_s=20.0)
    fresh, _ = groups(reference, divisions + 4)
    finish(reference, reference_comm)
    assert after == fresh[divisions:], (divisions, after, fresh)
