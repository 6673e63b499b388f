"""Collectives and Partial All-Reduce on real MPI ranks; holds for any world size.

Run by tests/test_collectives_mpi.py under mpiexec at 1, 2 and 4 ranks. Inputs are
integer-valued so every expected value is exact and computed from rank and size.
The runtime is initialized with a communicator cache of 3 groups, so eviction happens
constantly and every P-Reduce test also exercises the members' cache agreement.
"""
import random

import pytest
import torch

import ripples.torch as hvd
from ripples.core.errors import MismatchError
from ripples.runtime import current

hvd.init(cache_capacity=3)
R, N = hvd.rank(), hvd.size()
RANKS = range(N)

FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
INTS = [torch.int8, torch.uint8, torch.int32, torch.int64]


def value(rank, dtype, shape=(3, 2)):
    """An integer-valued tensor that differs per rank and per element."""
    t = (torch.arange(int(torch.tensor(shape).prod())).reshape(shape) % 3) + rank + 1
    return t.to(dtype)


def test_rank_facts():
    assert 0 <= R < N
    assert hvd.local_size() * hvd.cross_size() == N  # one node here
    assert hvd.is_initialized() and hvd.mpi_threads_supported()
    assert hvd.allgather_object(R) == list(RANKS)


@pytest.mark.parametrize("dtype", FLOATS + INTS)
def test_allreduce_sum_min_max_exact(dtype):
    ranks_sum = sum(value(r, torch.float64) for r in RANKS)
    got = hvd.allreduce(value(R, dtype), op=hvd.Sum)
    assert got.dtype == dtype
    assert torch.equal(got.double(), ranks_sum.to(dtype).double())
    assert torch.equal(hvd.allreduce(value(R, dtype), op=hvd.Min), value(0, dtype))
    assert torch.equal(hvd.allreduce(value(R, dtype), op=hvd.Max), value(N - 1, dtype))


@pytest.mark.parametrize("dtype", FLOATS)
def test_allreduce_average_and_scaling(dtype):
    expected = sum(value(r, torch.float64) for r in RANKS) / N
    got = hvd.allreduce(value(R, dtype))
    assert torch.allclose(got.double(), expected, rtol=1e-2 if dtype in FLOATS[:2] else 1e-12)
    scaled = hvd.allreduce(value(R, dtype), op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5)
    assert torch.equal(scaled.double(), (expected * N).to(dtype).double())


def test_allreduce_product_and_bool():
    got = hvd.allreduce(torch.full((4,), 2, dtype=torch.int64), op=hvd.Product)
    assert torch.equal(got, torch.full((4,), 2 ** N, dtype=torch.int64))
    flags = torch.tensor([R == 0, True, False])
    assert hvd.allreduce(flags, op=hvd.Sum).tolist() == [True, True, False]      # or
    assert hvd.allreduce(flags, op=hvd.Min).tolist() == [N == 1, True, False]    # and


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.int8])
def test_integer_average_and_scaling_truncate_toward_zero_as_horovod(dtype):
    """Horovod scales integer results in float64 and truncates toward zero."""
    import math
    mine = [7 * R + 1, -(5 * R + 3), 2]
    got = hvd.allreduce(torch.tensor(mine, dtype=dtype), op=hvd.Average)
    sums = [sum(7 * r + 1 for r in RANKS), -sum(5 * r + 3 for r in RANKS), 2 * N]
    assert got.dtype == dtype and got.tolist() == [math.trunc(s / N) for s in sums]
    scaled = hvd.allreduce(torch.tensor(mine, dtype=dtype), op=hvd.Sum, prescale_factor=0.5,
                           postscale_factor=3.0)
    pre = [sum(math.trunc([7 * r + 1, -(5 * r + 3), 2][i] * 0.5) for r in RANKS)
           for i in range(3)]
    assert scaled.tolist() == [math.trunc(p * 3.0) for p in pre]


def test_adasum_is_not_implemented():
    with pytest.raises(NotImplementedError, match="Adasum"):
        hvd.allreduce(torch.ones(2), op=hvd.Adasum)


def test_in_place_and_non_contiguous():
    base = torch.stack([value(R, torch.float32, (4,))] * 3, dim=1)  # (4, 3)
    view = base.t()  # non-contiguous
    assert not view.is_contiguous()
    hvd.allreduce_(view, op=hvd.Sum)
    expected = sum(value(r, torch.float32, (4,)) for r in RANKS)
    assert torch.equal(base[:, 1], expected)
    fresh = torch.stack([value(R, torch.float32, (4,))] * 3, dim=1)
    out = hvd.allreduce(fresh.t()[1:], op=hvd.Max)
    assert out.is_contiguous() and torch.equal(out[0], value(N - 1, torch.float32, (4,)))


def test_fusion_matches_unfused():
    tensors = [value(R, dtype, (i + 1, 3)) for i, dtype in
               enumerate([torch.float32, torch.float16, torch.float32, torch.bfloat16, torch.int64])]
    unfused = [hvd.allreduce(t, op=hvd.Sum) for t in tensors]
    handles = [hvd.allreduce_async(t, op=hvd.Sum) for t in tensors]
    fused = [hvd.synchronize(h) for h in reversed(handles)][::-1]
    for a, b in zip(unfused, fused):
        assert a.dtype == b.dtype and torch.equal(a, b)
    grouped = hvd.grouped_allreduce(tensors, op=hvd.Sum)
    assert all(torch.equal(a, b) for a, b in zip(unfused, grouped))
    in_place = [t.clone() for t in tensors]
    handle = hvd.grouped_allreduce_async_(in_place, op=hvd.Sum)
    result = hvd.synchronize(handle)
    assert hvd.poll(handle) and all(a is b for a, b in zip(result, in_place))
    assert all(torch.equal(a, b) for a, b in zip(unfused, in_place))


def test_compression():
    x = value(R, torch.float32)
    for compression in (hvd.Compression.fp16, hvd.Compression.bf16):
        got = hvd.allreduce(x, op=hvd.Sum, compression=compression)
        assert got.dtype == torch.float32
        assert torch.equal(got, sum(value(r, torch.float32) for r in RANKS))


@pytest.mark.parametrize("dtype", FLOATS + INTS + [torch.bool])
def test_broadcast_allgather_alltoall(dtype):
    root = N - 1
    assert torch.equal(hvd.broadcast(value(R, dtype), root), value(root, dtype))
    t = value(R, dtype, (R + 1, 2))  # first dimension differs per rank
    gathered = hvd.allgather(t)
    assert torch.equal(gathered, torch.cat([value(r, dtype, (r + 1, 2)) for r in RANKS]))
    splits = [(R + j) % 2 + 1 for j in RANKS]  # rows this rank sends to rank j
    rows = torch.cat([torch.full((s, 2), j) for j, s in enumerate(splits)]).to(dtype)
    received, received_splits = hvd.alltoall(rows, splits=splits)
    from_splits = [(r + R) % 2 + 1 for r in RANKS]
    assert received_splits.tolist() == from_splits
    assert torch.equal(received, torch.full((sum(from_splits), 2), R).to(dtype))


def test_broadcast_object_and_in_place():
    assert hvd.broadcast_object({"from": R, "list": [R]}, root_rank=0) == {"from": 0, "list": [0]}
    t = value(R, torch.float32)
    hvd.broadcast_(t, 0)
    assert torch.equal(t, value(0, torch.float32))


def test_reducescatter():
    t = torch.arange(2 * N + 1, dtype=torch.float32).reshape(-1, 1) * (R + 1)
    got = hvd.reducescatter(t, op=hvd.Sum)
    rows = [(2 * N + 1) // N + (1 if i < (2 * N + 1) % N else 0) for i in RANKS]
    start = sum(rows[:R])
    expected = torch.arange(start, start + rows[R], dtype=torch.float32).reshape(-1, 1)
    assert torch.equal(got, expected * sum(r + 1 for r in RANKS))


def test_process_set_of_the_first_half():
    members = list(range(max(1, N // 2)))
    ps = hvd.add_process_set(members) if len(members) < N else hvd.global_process_set
    if R in members:
        got = hvd.allreduce(torch.full((2,), float(R)), op=hvd.Sum, process_set=ps)
        assert got.tolist() == [float(sum(members))] * 2
        assert ps.rank() == members.index(R) and ps.size() == len(members)
    else:
        with pytest.raises(ValueError, match="does not contain it"):
            hvd.allreduce(torch.ones(1), process_set=ps)
        assert ps.rank() == -1
    hvd.barrier()


# ------------------------------------------------------------------ Partial All-Reduce

def test_partial_group_of_one_is_a_local_copy():
    x = value(R, torch.float32)
    assert torch.equal(hvd.partial_allreduce(x, [R]), x)


def test_partial_hypercube_rounds_reach_the_mean():
    """Rounds of pairs r ^ 2^i ({0,1},{2,3} then {0,2},{1,3} at 4 ranks) leave every rank
    at the mean (N-1)/2 when N is a power of two."""
    if N & (N - 1):
        pytest.skip("needs a power-of-two world")
    x = torch.full((5,), float(R))
    bit = 1
    while bit < N:
        hvd.partial_allreduce_(x, {R, R ^ bit})
        bit <<= 1
    assert torch.equal(x, torch.full((5,), (N - 1) / 2))


@pytest.mark.skipif(N < 3, reason="a group that is not the world needs 3 ranks")
def test_a_group_all_reduce_of_16_mib_goes_around_the_ring_and_a_small_one_does_not(
        monkeypatch):
    # group_allreduce="auto" (no fault tolerance): the ring from RING_MIN_BYTES on
    from ripples.core.config import RING_MIN_BYTES
    from ripples.ops import reduction
    assert current().config.group_transport == "by size"
    group = (0, 1, 2)
    if R not in group:
        return
    rounds = []
    around_the_ring = reduction._reduce_over_ring
    monkeypatch.setattr(reduction, "_reduce_over_ring",
                        lambda *args: rounds.append(1) or around_the_ring(*args))
    big = torch.full((RING_MIN_BYTES // 4,), float(R + 1))
    hvd.partial_allreduce_(big, group, op=hvd.Sum)
    assert torch.equal(big, torch.full_like(big, 6.0)) and len(rounds) == 1
    small = hvd.partial_allreduce(torch.full((4,), float(R + 1)), group, op=hvd.Sum)
    assert torch.equal(small, torch.full((4,), 6.0)) and len(rounds) == 1


def count_ring_rounds(monkeypatch):
    """The groups (as the ring sees them) of every all-reduce that goes around a ring."""
    from ripples.ops.ring_allreduce import PeerRing
    rounds = []
    around = PeerRing.allreduce_
    monkeypatch.setattr(PeerRing, "allreduce_",
                        lambda ring, *args: rounds.append(ring.group) or around(ring, *args))
    return rounds


@pytest.mark.skipif(N < 2, reason="a ring needs 2 ranks")
def test_world_all_reduces_go_around_the_ring_from_16_mib_and_from_256_kib_across_hosts(
        monkeypatch):
    from ripples.core.config import RING_MIN_BYTES, RING_MIN_BYTES_ACROSS_HOSTS
    rounds = count_ring_rounds(monkeypatch)
    total = N * (N + 1) / 2
    big = torch.full((RING_MIN_BYTES // 4,), float(R + 1))
    hvd.allreduce_(big, op=hvd.Sum, name="world.big")
    assert torch.equal(big, torch.full_like(big, total)) and rounds == [tuple(RANKS)]
    # 16-bit floats keep the reduce-scatter of 16-bit values (half the ring's bytes)
    half = torch.full((RING_MIN_BYTES // 2,), float(R + 1), dtype=torch.bfloat16)
    hvd.allreduce_(half, op=hvd.Sum, name="world.half")
    assert torch.equal(half, torch.full_like(half, total)) and len(rounds) == 1
    across = torch.full((RING_MIN_BYTES_ACROSS_HOSTS // 4,), float(R + 1))
    hvd.allreduce_(across, op=hvd.Sum, name="world.across")
    assert torch.equal(across, torch.full_like(across, total)) and len(rounds) == 1
    # The same world, every rank on a node of its own: from 256 KiB on around the ring.
    monkeypatch.setattr(current(), "node_of", tuple(RANKS))
    hvd.allreduce_(across.fill_(R + 1), op=hvd.Sum, name="world.across_hosts")
    assert torch.equal(across, torch.full_like(across, total)) and len(rounds) == 2
    below = torch.full((RING_MIN_BYTES_ACROSS_HOSTS // 4 - 1,), float(R + 1))
    hvd.allreduce_(below, op=hvd.Sum, name="world.below")
    assert torch.equal(below, torch.full_like(below, total)) and len(rounds) == 2


@pytest.mark.skipif(N < 2, reason="a ring needs 2 ranks")
def test_a_gradient_bucket_of_16_mib_goes_around_the_ring_and_averages_exactly(monkeypatch):
    rounds = count_ring_rounds(monkeypatch)
    model = torch.nn.Linear(4096, 1024)  # a 16 MiB weight and its bias: one bucket
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0),
                                   named_parameters=model.named_parameters())
    for step in range(2):
        opt.zero_grad()
        (model(torch.ones(1, 4096)) * (R + 1)).sum().backward()
        opt.step()
        mean = (N + 1) / 2  # rank r's gradients are all r + 1
        assert torch.equal(model.weight.grad, torch.full_like(model.weight, mean))
        assert torch.equal(model.bias.grad, torch.full_like(model.bias, mean))
    assert rounds == [tuple(range(N))] * 2, rounds


def test_partial_sum_over_ranks_is_preserved_by_any_sequence():
    rng = random.Random(1234)  # the same on every rank: a shared schedule
    x = torch.full((8,), float(R * 4))
    for _ in range(20):
        ranks = list(RANKS)
        rng.shuffle(ranks)
        size = rng.randint(1, N)
        groups = [ranks[i:i + size] for i in range(0, N, size)]
        mine = next(g for g in groups if R in g)
        hvd.partial_allreduce_(x, mine)  # disjoint groups run at the same time
    total = hvd.allreduce(x, op=hvd.Sum)
    assert torch.allclose(total, torch.full((8,), 4.0 * sum(RANKS)), atol=1e-4)


def test_partial_outside_group_and_bad_groups_raise_value_error():
    if N > 1:
        other = (R + 1) % N
        with pytest.raises(ValueError, match=f"rank {R} .*does not contain it"):
            hvd.partial_allreduce(torch.ones(1), [other])
    with pytest.raises(ValueError, match="twice"):
        hvd.partial_allreduce(torch.ones(1), [R, R])
    with pytest.raises(ValueError, match="outside"):
        hvd.partial_allreduce(torch.ones(1), [R, N + 5])


def test_partial_cache_eviction_keeps_members_in_agreement():
    """Cycle through more groups than the cache holds (every subset of two or more ranks,
    in one global order), and drop entries on one rank only."""
    import itertools
    rt = current()
    evicted_before = rt.cache.evicted
    subsets = [g for k in range(2, N + 1) for g in itertools.combinations(RANKS, k)]
    mine = [g for g in subsets if R in g]
    for round_ in range(3):
        for group in mine:
            x = torch.full((3,), float(R + round_))
            hvd.partial_allreduce_(x, group)
            # thirds are not exact in float32: one rounding step of tolerance
            assert torch.allclose(x, torch.full((3,), sum(group) / len(group) + round_),
                                  rtol=1e-6, atol=0)
        if R == 0 and rt.cache.groups():
            rt.cache.discard(rt.cache.groups()[0])  # a purely local eviction
    assert len(rt.cache) <= 3
    cached_groups = len([g for g in mine if len(g) < N])  # the world is never cached
    if cached_groups > 3:
        assert rt.cache.evicted > evicted_before


def test_partial_shape_mismatch_raises_on_every_member():
    if N == 1:
        pytest.skip("needs two ranks")
    group = (0, 1)
    if R in group:
        shape = (3,) if R == 0 else (4,)
        with pytest.raises(MismatchError) as info:
            hvd.partial_allreduce(torch.ones(shape), group)
        assert "rank 0" in str(info.value) and "(3,)" in str(info.value) and "(4,)" in str(info.value)
    hvd.barrier()  # the job carries on after the error


def test_partial_async_is_fused_per_group():
    partner = R ^ 1 if (R ^ 1) < N else R
    group = {R, partner}
    xs = [torch.full((i + 1,), float(R)) for i in range(4)]
    handles = [hvd.partial_allreduce_async_(x, group) for x in xs]
    for h, x in zip(handles, xs):
        assert hvd.synchronize(h) is x
        assert torch.equal(x, torch.full_like(x, (R + partner) / 2))


def test_join_with_uneven_steps():
    """Rank r runs r + 1 all-reduces, then joins; joined ranks contribute zeros and an
    Average divides by the ranks still active."""
    for step in range(R + 1):
        active = [r for r in RANKS if r >= step]
        got = hvd.allreduce(torch.full((2,), float(R)))
        assert got.tolist() == [sum(active) / len(active)] * 2
    assert hvd.join() == N - 1
