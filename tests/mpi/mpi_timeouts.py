"""A member that never arrives: the waiting ranks raise within the timeout, naming the
group, the operation and the missing rank. Run with RIPPLES_TIMEOUT_S=2 on 2+ ranks."""
import time

import pytest
import torch

import ripples.torch as hvd
from ripples.core.errors import NotInitializedError, RipplesTimeoutError
from ripples.runtime import current


def test_use_before_init_names_init():
    with pytest.raises(NotInitializedError, match=r"init\(\)"):
        hvd.allreduce(torch.ones(1))
    with pytest.raises(NotInitializedError, match=r"init\(\)"):
        hvd.rank()


def test_missing_member_times_out_on_the_waiting_ranks():
    hvd.init()
    timeout = current().config.timeout_s
    assert timeout <= 5, "run this module with RIPPLES_TIMEOUT_S small"
    if hvd.rank() == 0:
        start = time.monotonic()
        with pytest.raises(RipplesTimeoutError) as info:
            hvd.partial_allreduce(torch.ones(4), [0, 1])
        elapsed = time.monotonic() - start
        assert timeout <= elapsed < timeout + 5
        message = str(info.value)
        assert "partial_allreduce" in message and "(0, 1)" in message and "[1]" in message
    else:
        time.sleep(timeout + 0.3)  # rank 1 never calls it; meet rank 0 after its timeout
    hvd.barrier()


def test_missing_rank_in_a_world_allreduce_times_out_on_all_others():
    last = hvd.size() - 1
    if hvd.rank() != last:
        with pytest.raises(RipplesTimeoutError, match=f"rank|{last}"):
            hvd.allreduce(torch.ones(2))
    else:
        time.sleep(current().config.timeout_s + 0.3)
    hvd.barrier()


def test_a_different_collective_is_named_not_hung():
    """Rank 1 runs a barrier while rank 0 runs a P-Reduce with it: both learn it at once."""
    from ripples.core.errors import MismatchError
    if hvd.rank() == 0:
        with pytest.raises(MismatchError, match="barrier"):
            hvd.partial_allreduce(torch.ones(4), [0, 1])
    elif hvd.rank() == 1:
        with pytest.raises(MismatchError, match="partial_allreduce"):
            hvd.barrier()
    if hvd.rank() > 1:
        time.sleep(0.2)
    hvd.barrier()
