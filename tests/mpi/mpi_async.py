"""Asynchronous collectives, matching by name, and join, on real MPI ranks.

Run by tests/test_async_mpi.py under mpiexec at 1, 2 and 4 ranks (RIPPLES_TIMEOUT_S=5).
Expected values are computed from rank and size, with integer-valued inputs.
"""
import time

import pytest
import torch

import ripples.torch as hvd
from ripples.core.errors import MismatchError

hvd.init()
R, N = hvd.rank(), hvd.size()
RANKS = range(N)


def test_poll_is_local_and_false_while_a_peer_delays():
    """Rank 0 submits first; the others arrive 0.3 s later. Until they do, rank 0's poll
    says False without blocking; afterwards the background progress completes it with
    no synchronize call."""
    if R != 0:
        time.sleep(0.3)
    handle = hvd.allreduce_async(torch.full((3,), float(R)), name="delayed", op=hvd.Sum)
    start = time.monotonic()
    first = hvd.poll(handle)
    assert time.monotonic() - start < 0.1  # poll never waits (the submission may: thread start)
    if R == 0 and N > 1:
        assert first is False
    while not hvd.poll(handle):  # Horovod's idiom: progress happens in the background
        time.sleep(0.001)
    assert hvd.synchronize(handle).tolist() == [float(sum(RANKS))] * 3


def test_names_match_whatever_the_submission_order():
    names = [f"tensor{i}" for i in range(5)]
    order = names if R % 2 == 0 else names[::-1]
    handles = {n: hvd.allreduce_async(torch.full((2,), float(R + i)), name=n, op=hvd.Sum)
               for i, n in ((names.index(n), n) for n in order)}
    for i, n in enumerate(names):
        assert hvd.synchronize(handles[n]).tolist() == [float(sum(r + i for r in RANKS))] * 2


def test_a_name_submitted_late_by_some_ranks_still_meets():
    """Odd ranks submit 'late' only after their 'early' collective completed."""
    if R % 2 == 0:
        late = hvd.allreduce_async(torch.ones(1), name="late", op=hvd.Sum)
        early = hvd.allreduce_async(torch.ones(1), name="early", op=hvd.Sum)
    else:
        early = hvd.allreduce_async(torch.ones(1), name="early", op=hvd.Sum)
        hvd.synchronize(early)
        late = hvd.allreduce_async(torch.ones(1), name="late", op=hvd.Sum)
    assert hvd.synchronize(early).item() == N and hvd.synchronize(late).item() == N


def test_duplicate_in_flight_name_raises_and_the_name_is_reusable_after():
    if N == 1:
        pytest.skip("needs a peer that delays, to keep the first collective in flight")
    if R != 0:
        time.sleep(0.3)
    handle = hvd.allreduce_async(torch.ones(1), name="dup")
    if R == 0:  # the others have not submitted yet: "dup" is in flight here
        with pytest.raises(ValueError, match="'dup' is already in flight"):
            hvd.allreduce_async(torch.ones(1), name="dup")
    hvd.synchronize(handle)
    assert hvd.synchronize(hvd.allreduce_async(torch.ones(1), name="dup")).item() == 1


def test_different_names_raise_mismatch_on_every_rank():
    if N == 1:
        pytest.skip("needs two ranks")
    with pytest.raises(MismatchError, match="different names") as info:
        hvd.allreduce(torch.ones(4), name=f"only_on_rank_{R}")
    assert "only_on_rank_0" in str(info.value) and "only_on_rank_1" in str(info.value)
    hvd.barrier()


def test_same_name_different_shapes_raise_mismatch_naming_both():
    if N == 1:
        pytest.skip("needs two ranks")
    with pytest.raises(MismatchError) as info:
        hvd.allreduce(torch.ones(R + 1), name="shapes")
    assert "'shapes'" in str(info.value) and "(1,)" in str(info.value) and "(2,)" in str(info.value)


def test_async_variants():
    root = N - 1
    value = torch.tensor([R, 10 * R], dtype=torch.int64)
    in_place = value.clone()
    b1 = hvd.broadcast_async(value, root)
    b2 = hvd.broadcast_async_(in_place, root)
    g = hvd.allgather_async(torch.full((R + 1, 2), R))
    rows = torch.arange(2 * N, dtype=torch.float32).reshape(N, 2) + 100 * R
    a = hvd.alltoall_async(rows)
    rs = hvd.reducescatter_async(torch.arange(2 * N, dtype=torch.float64) * (R + 1), op=hvd.Sum)
    gg = hvd.grouped_allgather_async([torch.full((1,), R), torch.full((2, 1), -R)])
    gr = hvd.grouped_reducescatter_async([torch.ones(N, 2), torch.ones(2 * N)], op=hvd.Sum)
    expected_root = torch.tensor([root, 10 * root])
    assert torch.equal(hvd.synchronize(b1), expected_root)
    assert hvd.synchronize(b2) is in_place and torch.equal(in_place, expected_root)
    assert torch.equal(hvd.synchronize(g), torch.cat([torch.full((r + 1, 2), r) for r in RANKS]))
    received, splits = hvd.synchronize(a)
    assert splits.tolist() == [1] * N
    assert torch.equal(received, torch.stack([torch.tensor([2. * R, 2. * R + 1]) + 100 * r
                                              for r in RANKS]))
    total = sum(r + 1 for r in RANKS)
    assert hvd.synchronize(rs).tolist() == [float((2 * R + j) * total) for j in range(2)]
    first, second = hvd.synchronize(gg)
    assert first.tolist() == list(RANKS) and second.reshape(-1).tolist() == \
        [-r for r in RANKS for _ in range(2)]
    s1, s2 = hvd.synchronize(gr)
    assert torch.equal(s1, torch.full((1, 2), float(N)))
    assert torch.equal(s2, torch.full((2,), float(N)))
    assert hvd.grouped_allgather([torch.ones(1)])[0].tolist() == [1.0] * N
    assert [t.tolist() for t in hvd.grouped_reducescatter([torch.ones(N)], op=hvd.Sum)] == \
        [[float(N)]]


def test_sparse_allreduce_async_sums_by_index():
    dense = torch.zeros(2 * N, 3)
    dense[R] = R + 1.0          # a row of its own
    dense[2 * N - 1] = 1.0      # a row every rank has
    handle = hvd.sparse_allreduce_async(dense.to_sparse(), op=hvd.Sum)
    result = hvd.synchronize(handle)
    assert result.is_sparse
    expected = torch.zeros(2 * N, 3)
    for r in RANKS:
        expected[r] = r + 1.0
    expected[2 * N - 1] = float(N)
    assert torch.equal(result.to_dense(), expected)
    averaged = hvd.synchronize(hvd.sparse_allreduce_async(dense.to_sparse(), op=hvd.Average))
    assert torch.allclose(averaged.to_dense(), expected / N)


def test_allgather_and_broadcast_after_join():
    """Rank r takes r + 1 steps of an all-reduce, an all-gather and a broadcast, then joins;
    joined ranks add no rows to all-gathers and receive broadcasts."""
    for step in range(R + 1):
        active = [r for r in RANKS if r >= step]
        assert hvd.allreduce(torch.full((2,), float(R)), op=hvd.Sum).tolist() == \
            [float(sum(active))] * 2
        gathered = hvd.allgather(torch.full((1, 2), R))
        assert gathered[:, 0].tolist() == active
        root = N - 1  # the last rank joins last, so it is always active
        assert hvd.broadcast(torch.tensor([R]), root).tolist() == [root]
    assert hvd.join() == N - 1


def test_other_collectives_after_join_raise_on_the_active_ranks():
    if N == 1:
        pytest.skip("needs two ranks")
    if R == 0:
        assert hvd.join() == N - 1
    else:
        with pytest.raises(MismatchError, match="after join"):
            hvd.alltoall(torch.ones(N))
        assert hvd.join() == N - 1
