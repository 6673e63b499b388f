"""The ring all-reduce of groups (``Config.group_allreduce="ring"``).

The schedule and its executor are pure logic: they are checked here by playing every
member's steps against lists of numbers, and by running the executor in one thread per
member with queues for links, in one process. The data movement runs under mpiexec
(``tests/mpi/mpi_ring_allreduce.py``) at 4 ranks (at 2 the only group of two is the world).
"""
import queue
import sys
import threading

import pytest
import torch

from mpi_launch import run_mpi, run_pytest_under_mpi
from ripples.core.config import Config
from ripples.ops.half_allreduce import chunks
from ripples.ops.ring_allreduce import ring_allreduce_, ring_schedule


def play_ring(values, numel_per_member):
    """Run every member's schedule in lockstep on per-member lists of chunk sums: member
    ``p`` starts with ``values[p]`` in every element; returns every member's final lists
    and the chunks each member sent."""
    size = len(values)
    counts, offsets = chunks(numel_per_member, size)
    state = [[[values[p]] * c for c in counts] for p in range(size)]
    schedules = [ring_schedule(p, size) for p in range(size)]
    sent = [[] for _ in range(size)]
    for number in range(2 * (size - 1)):
        outgoing = [list(state[p][schedules[p][number].send]) for p in range(size)]
        for p in range(size):
            step = schedules[p][number]
            sender = (p - 1) % size
            assert schedules[sender][number].send == step.recv, \
                "a member must receive the chunk its predecessor sends in the same step"
            sent[sender].append(schedules[sender][number].send)
            received = outgoing[sender]
            if step.reduce:
                state[p][step.recv] = [a + b for a, b in zip(state[p][step.recv], received)]
            else:
                state[p][step.recv] = received
    return state, sent


@pytest.mark.parametrize("size", [2, 3, 4, 5, 8])
def test_every_member_ends_with_the_sum_of_every_chunk(size):
    values = [10 ** p for p in range(size)]  # each member's contribution is visible
    state, _ = play_ring(values, numel_per_member=2 * size + 1)
    for member in state:
        for chunk in member:
            assert all(v == sum(values) for v in chunk)


@pytest.mark.parametrize("size", [2, 3, 5])
def test_each_phase_sends_each_chunk_but_one_once(size):
    """Reduce-scatter: a member sends every chunk but the one it ends up owning; all-gather:
    every chunk but the one it receives last."""
    _, sent = play_ring(list(range(size)), numel_per_member=size)
    for p in range(size):
        scatter, gather = sent[p][:size - 1], sent[p][size - 1:]
        assert len(set(scatter)) == size - 1 and (p + 1) % size not in scatter
        assert len(set(gather)) == size - 1


def run_members_in_threads(buffers, combine):
    """``ring_allreduce_`` on every member's buffer, each member a thread, links as queues."""
    size = len(buffers)
    links = [queue.Queue() for _ in range(size)]  # links[p]: what member p receives

    def member(position):
        def exchange(number, send, receive):
            links[(position + 1) % size].put((number, send.clone()))
            got_number, data = links[position].get(timeout=10)
            assert got_number == number
            receive.copy_(data)
        ring_allreduce_(buffers[position], position, size, exchange, combine)

    threads = [threading.Thread(target=member, args=(p,)) for p in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not any(thread.is_alive() for thread in threads)


@pytest.mark.parametrize("size,numel", [(2, 9), (3, 2), (3, 10), (4, 4), (5, 17)])
@pytest.mark.parametrize("combine,reference", [
    (torch.add, lambda stack: stack.sum(0)), (torch.maximum, lambda stack: stack.max(0).values),
    (torch.minimum, lambda stack: stack.min(0).values), (torch.mul, lambda stack: stack.prod(0))])
def test_the_executor_reduces_exactly_and_every_member_gets_the_same(size, numel, combine,
                                                                     reference):
    inputs = [(torch.arange(numel) * (p + 1) % 7 + 1).to(torch.int64) for p in range(size)]
    buffers = [x.clone() for x in inputs]
    run_members_in_threads(buffers, combine)
    expected = reference(torch.stack(inputs))
    for buffer in buffers:
        assert torch.equal(buffer, expected)


def test_a_ring_of_one_has_no_steps_and_bad_positions_raise():
    assert ring_schedule(0, 1) == []
    with pytest.raises(ValueError, match="position 3"):
        ring_schedule(3, 3)


def test_ring_group_allreduce_under_mpi():
    # 4 ranks: rings of 2 and of 3 members (uneven chunks), disjoint groups at once
    run_pytest_under_mpi("mpi_ring_allreduce.py", 4, env={"RIPPLES_GROUP_ALLREDUCE": "ring"})


def test_ranks_that_disagree_on_the_transport_fail_at_init_on_every_rank():
    script = (
        "import os\n"
        "from mpi4py import MPI\n"
        "rank = MPI.COMM_WORLD.Get_rank()\n"
        "os.environ['RIPPLES_GROUP_ALLREDUCE'] = 'ring' if rank == 1 else 'communicator'\n"
        "import ripples.torch as hvd\n"
        "try:\n"
        "    hvd.init()\n"
        "except ValueError as error:\n"
        "    print(f'rank {rank} refused: {error}', flush=True)\n"
        "else:\n"
        "    print(f'rank {rank} started', flush=True)\n")
    result = run_mpi([sys.executable, "-c", script], 3, timeout=60)
    refusals = [line for line in result.stdout.splitlines() if "refused" in line]
    assert len(refusals) == 3, result.stdout
    assert all("rank(s) [1]" in line and "RIPPLES_GROUP_ALLREDUCE" in line for line in refusals)
    assert "started" not in result.stdout


def test_group_allreduce_setting_is_validated_and_auto_follows_fault_tolerance_and_size():
    with pytest.raises(ValueError, match="Config.group_allreduce must be 'auto' or "
                                         "'communicator' or 'ring', got 'rings'"):
        Config.load(environ={"RIPPLES_GROUP_ALLREDUCE": "rings"})
    mib = 1 << 20
    auto = Config.load(environ={})
    assert auto.group_transport == "by size"
    assert not auto.ring_carries(16 * mib - 1) and auto.ring_carries(16 * mib)
    tolerant = Config.load(environ={"RIPPLES_FAULT_TOLERANT": "1"})
    assert tolerant.group_transport == "ring" and tolerant.ring_carries(8)
    pinned = Config.load(environ={"RIPPLES_FAULT_TOLERANT": "1",
                                  "RIPPLES_GROUP_ALLREDUCE": "communicator"})
    assert pinned.group_transport == "communicator" and not pinned.ring_carries(64 * mib)
    assert Config.load(environ={"RIPPLES_GROUP_ALLREDUCE": "ring"}).ring_carries(8)


def test_across_hosts_the_ring_carries_from_256_kib_and_the_world_goes_by_size():
    kib = 1 << 10
    auto = Config.load(environ={})
    assert not auto.ring_carries(256 * kib - 1, across_hosts=True)
    assert auto.ring_carries(256 * kib, across_hosts=True)
    assert not auto.ring_carries(256 * kib, across_hosts=False)
    assert auto.ring_carries(16 * kib * kib, world=True)
    assert not auto.ring_carries(16 * kib * kib - 1, world=True)
    # Fault tolerant, groups always take the ring; the world still goes by size.
    tolerant = Config.load(environ={"RIPPLES_FAULT_TOLERANT": "1"})
    assert tolerant.ring_carries(8) and not tolerant.ring_carries(8, world=True)
    assert tolerant.ring_carries(256 * kib, across_hosts=True, world=True)
    pinned = Config.load(environ={"RIPPLES_GROUP_ALLREDUCE": "communicator"})
    assert not pinned.ring_carries(64 * kib * kib, across_hosts=True, world=True)
