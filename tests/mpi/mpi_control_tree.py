"""The control round over a tree deeper than one level: fan-out 2 on 5 ranks gives
0 -> (1, 2), 1 -> (3, 4). Run with RIPPLES_TIMEOUT_S=3.

Absent members, at the root, inside the tree and at a leaf, are named on every rank that
arrived, and the next collective still matches (no stale record or answer is used)."""
import time

import pytest
import torch

import ripples.torch as hvd
from ripples.comm import control_tree
from ripples.core.errors import MismatchError, RipplesTimeoutError
from ripples.runtime import current

control_tree.FANOUT = 2  # every rank sets it before any collective


def setup_module():
    hvd.init()
    assert hvd.size() == 5, "run with 5 ranks"
    assert current().config.timeout_s <= 5, "run with RIPPLES_TIMEOUT_S small"


def test_steady_state_allreduce_is_exact():
    for step in range(30):
        value = torch.full((1000,), float(hvd.rank() + step))
        result = hvd.allreduce(value, op=hvd.Sum)
        assert torch.equal(result, torch.full((1000,), float(sum(range(5)) + 5 * step)))


def test_partial_allreduce_over_a_subgroup():
    group = [0, 2, 3, 4]
    if hvd.rank() in group:
        result = hvd.partial_allreduce(torch.tensor([float(hvd.rank())]), group, op=hvd.Sum)
        assert result.item() == 9.0
    hvd.barrier()


def test_names_submitted_in_different_orders_still_meet():
    names = [f"t{i}" for i in range(6)]
    order = names if hvd.rank() % 2 == 0 else list(reversed(names))
    handles = {n: hvd.allreduce_async(torch.tensor([float(i)]), name=n, op=hvd.Sum)
               for i, n in sorted(enumerate(names), key=lambda p: order.index(p[1]))}
    for i, name in enumerate(names):
        assert hvd.synchronize(handles[name]).item() == 5.0 * i


def _arrival_after_everyone_gave_up(absent: int, timeout: float) -> float:
    """When the absent rank arrives: after every other rank gave up on the first
    collective, and before anyone gives up on the next one (the middle of that window)."""
    root_waits = control_tree._gather_s(timeout, 2)          # for its children
    answer_waits = root_waits + max(1.0, 0.5 * timeout)     # for a decision from above
    if absent == 4:    # rank 1 names it after the timeout; the error reaches all at once
        gave_up, next_gives_up = timeout, 2 * timeout
    elif absent == 1:  # the root names it; ranks 3 and 4 wait for rank 1's answer
        gave_up, next_gives_up = answer_waits, root_waits + root_waits
    else:              # everyone waits for the root's answer
        gave_up, next_gives_up = answer_waits, 2 * answer_waits
    assert next_gives_up - gave_up >= 2.0, "RIPPLES_TIMEOUT_S too small for this test"
    return (gave_up + next_gives_up) / 2


@pytest.mark.parametrize("absent", [4, 1, 0])  # a leaf, an inner node, the root
def test_an_absent_member_is_named_and_the_next_collective_matches(absent):
    timeout = current().config.timeout_s
    hvd.barrier()
    if hvd.rank() == absent:
        time.sleep(_arrival_after_everyone_gave_up(absent, timeout))
    else:
        with pytest.raises(RipplesTimeoutError) as info:
            hvd.allreduce(torch.ones(3), name=f"absent{absent}")
        message = str(info.value)
        # A member reporting to the absent rank names it as not answering; the others
        # name it as not having called.
        assert f"[{absent}]" in message or f"rank {absent} " in message, message
    result = hvd.allreduce(torch.full((2,), float(hvd.rank())), op=hvd.Sum, name="after")
    assert torch.equal(result, torch.full((2,), 10.0))
    hvd.barrier()


def test_a_different_collective_is_a_mismatch_on_every_member():
    if hvd.rank() == 3:
        with pytest.raises(MismatchError):
            hvd.broadcast(torch.zeros(2), root_rank=0, name="odd")
    else:
        with pytest.raises(MismatchError):
            hvd.allreduce(torch.zeros(2), name="odd")
    hvd.barrier()


def test_a_slow_member_within_the_timeout_is_waited_for():
    timeout = current().config.timeout_s
    if hvd.rank() == 3:
        time.sleep(0.6 * timeout)  # more than half the timeout: the full round decides
    result = hvd.allreduce(torch.ones(1), op=hvd.Sum, name="slow")
    assert result.item() == 5.0
