"""The shared epoch's pure parts: torch's order and lengths, the pool's exactly-once
hand-out across passes, chunk sizing."""
import math
import random

import pytest
import torch.utils.data.distributed as torch_distributed

from ripples.schedule.shared_epoch import (FIRST_CHUNK, ChunkSizer, EpochMismatch, EpochPool,
                                           chunk_cap, pool_length, undrawn)
from ripples.torch.sampler import epoch_order


class _Sized:
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n


@pytest.mark.parametrize("length,replicas", [(10, 3), (12, 4), (7, 7), (1000, 8), (5, 2)])
@pytest.mark.parametrize("drop_last", [False, True])
def test_pool_length_is_what_torch_keeps(length, replicas, drop_last):
    reference = torch_distributed.DistributedSampler(_Sized(length), num_replicas=replicas,
                                                     rank=0, drop_last=drop_last)
    expected = reference.total_size if drop_last else length  # no padding repeats
    assert pool_length(length, replicas, drop_last) == expected


@pytest.mark.parametrize("shuffle", [True, False])
def test_epoch_order_is_torch_samplers_order(shuffle):
    # With one replica and no padding torch's sampler yields exactly its epoch order.
    reference = torch_distributed.DistributedSampler(_Sized(50), num_replicas=1, rank=0,
                                                     shuffle=shuffle, seed=7)
    for epoch in (0, 3):
        reference.set_epoch(epoch)
        assert epoch_order(50, shuffle, 7, epoch) == list(reference)
    if shuffle:
        assert epoch_order(50, True, 7, 0) != epoch_order(50, True, 7, 1)


def test_every_position_is_handed_out_once_in_random_interleavings():
    rng = random.Random(3)
    for trial in range(200):
        length, ranks = rng.randint(1, 60), rng.randint(1, 5)
        pool = EpochPool(length)
        got = {r: [] for r in range(ranks)}
        active = set(range(ranks))
        while active:
            r = rng.choice(sorted(active))
            chunk = pool.draw(r, 1, 0, rng.randint(1, 7))
            if chunk is None:
                active.discard(r)
            else:
                got[r].extend(range(*chunk))
        positions = sorted(p for ps in got.values() for p in ps)
        assert positions == list(range(length)), trial


def test_passes_open_end_and_report_over():
    pool = EpochPool(5)
    assert pool.draw(0, 1, 0, 3) == (0, 3)
    assert pool.draw(1, 1, 0, 3) == (3, 5)
    assert pool.draw(0, 1, 0, 3) is None  # used up
    assert pool.draw(1, 2, 1, 2) == (0, 2)  # rank 1 opens pass 2 with its epoch
    assert pool.draw(0, 1, 0, 2) is None  # pass 1 is over for a rank still in it
    assert pool.draw(0, 2, 1, 2) == (2, 4)
    assert (pool.pass_no, pool.epoch, pool.opened_by) == (2, 1, 1)


def test_a_draw_at_another_epoch_names_both_ranks_and_the_fix():
    pool = EpochPool(8)
    pool.draw(2, 1, 4, 2)
    with pytest.raises(EpochMismatch, match=r"rank 0 iterates pass 1 .* at epoch 3, but rank 2 "
                                            r"started that pass at epoch 4: call sampler.set_epoch"):
        pool.draw(0, 1, 3, 2)


def test_returned_chunks_are_handed_out_first_and_late_ones_are_reported():
    pool = EpochPool(10)
    assert pool.draw(0, 1, 0, 3) == (0, 3)
    assert pool.draw(1, 1, 0, 3) == (3, 6)
    assert pool.draw(0, 1, 0, 3) == (6, 9)  # rank 0 finished (0, 3)
    assert pool.return_chunks([1, 5]) == [(3, 6)]  # rank 1 died holding (3, 6); 5 held none
    assert pool.draw(0, 1, 0, 3) == (3, 6)
    assert pool.draw(2, 1, 0, 3) == (9, 10)
    assert pool.draw(0, 1, 0, 3) is None  # rank 0 is done with the pass
    assert pool.return_chunks([2]) == [(9, 10)]  # too late for anyone in this pass
    assert pool.draw(0, 2, 1, 4) == (0, 4) and pool.dropped == [(9, 10)]  # reported


def test_chunk_sizer_fixed_batch_and_adaptive_rate():
    now = [0.0]
    assert ChunkSizer(cap=100, batch_size=32, clock=lambda: now[0]).next_size() == 32
    sizer = ChunkSizer(cap=1000, target_s=0.025, clock=lambda: now[0])
    sizer.start_pass()
    assert sizer.next_size() == FIRST_CHUNK  # no rate known yet
    sizer.drew((0, 16))
    now[0] = 0.05  # 16 positions in 50 ms: 320 positions/s -> 8 per 25 ms
    assert sizer.next_size() == 8
    sizer.drew((16, 24))
    now[0] = 0.075  # 24 positions over 75 ms: same rate
    assert sizer.next_size() == 8
    sizer.start_pass()  # the next pass starts from the rate it knows
    assert sizer.next_size() == 8
    fast = ChunkSizer(cap=20, target_s=0.025, clock=lambda: now[0])
    fast.start_pass()
    fast.next_size()
    fast.drew((0, 16))
    now[0] += 0.03  # 16 per 30 ms is 13 per 25 ms, within the cap of 20
    assert fast.next_size() == 13
    fast.drew((16, 29))
    now[0] += 0.001  # 29 in 31 ms would be 23 per 25 ms: capped
    assert fast.next_size() == 20


@pytest.mark.parametrize("length,replicas,expected", [(1400, 4, 43), (10, 4, 1), (10 ** 6, 8,
                                                                                  15625)])
def test_chunk_cap_gives_every_rank_several_chunks(length, replicas, expected):
    assert chunk_cap(length, replicas) == expected
    assert math.ceil(length / chunk_cap(length, replicas)) >= min(length, replicas * 8)


@pytest.mark.parametrize("position,drawn,expected", [
    (0, [], []),
    (12, [], [(0, 12)]),
    (20, [(16, 20), (4, 8)], [(0, 4), (8, 16)]),
    (24, [(0, 4), (4, 8), (20, 24)], [(8, 20)]),
    (10, [(0, 10)], []),
    (10, [(2, 6), (3, 5), (8, 10)], [(0, 2), (6, 8)])])  # an overlap is covered once
def test_what_no_survivor_drew_before_the_furthest_position(position, drawn, expected):
    assert undrawn(position, drawn) == expected


def test_a_pool_rebuilt_without_its_keeper_hands_out_every_position_once():
    """Survivors drew [4, 8) and [16, 20) of 24; the pool rebuilt from the furthest (20)
    with the gaps handed back gives every other position exactly once."""
    drawn = [(4, 8), (16, 20)]
    pool = EpochPool(24, pass_no=1, epoch=0, position=20, returned=undrawn(20, drawn))
    chunks = []
    while (chunk := pool.draw(rank=0, pass_no=1, epoch=0, amount=4)) is not None:
        chunks.append(chunk)
    handed = [p for start, stop in chunks + drawn for p in range(start, stop)]
    assert sorted(handed) == list(range(24))
