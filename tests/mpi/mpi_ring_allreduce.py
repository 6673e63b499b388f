"""Group all-reduces over the point-to-point ring, on real MPI ranks (3 or more).

Run by tests/test_ring_allreduce.py with ``RIPPLES_GROUP_ALLREDUCE=ring``. Every group is
a proper subset of the world (the world all-reduces over its own communicator), visited in
one global order; ranks outside a group skip it, so disjoint groups run at the same time.
Integer-valued inputs give exact expected values, computed from the member ranks.
"""
import itertools

import pytest
import torch

import ripples.torch as hvd
from ripples.runtime import current

hvd.init()
R, N = hvd.rank(), hvd.size()
assert N >= 3, "a group of two or more that is not the world needs 3 ranks"
GROUPS = [g for k in range(2, N) for g in itertools.combinations(range(N), k)]
MINE = [g for g in GROUPS if R in g]

FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
INTS = [torch.int8, torch.uint8, torch.int32, torch.int64]


def value(rank, dtype, numel=7):
    """Integer values that differ per rank and per element."""
    return ((torch.arange(numel) % 3) + rank + 1).to(dtype)


def test_no_group_communicator_is_made():
    created = current().cache.created
    for group in MINE:
        hvd.partial_allreduce(value(R, torch.float32), group)
    assert current().cache.created == created


@pytest.mark.parametrize("dtype", FLOATS + INTS)
def test_sum_min_max_product_are_exact(dtype):
    for group in MINE:
        inputs = [value(m, torch.float64) for m in group]
        for op, expected in [(hvd.Sum, sum(inputs)),
                             (hvd.Min, torch.stack(inputs).min(0).values),
                             (hvd.Max, torch.stack(inputs).max(0).values),
                             (hvd.Product, torch.stack(inputs).prod(0))]:
            got = hvd.partial_allreduce(value(R, dtype), group, op=op)
            assert got.dtype is dtype
            assert torch.equal(got.double(), expected), (group, op)


@pytest.mark.parametrize("dtype", FLOATS + INTS)
def test_average_divides_by_the_members_integers_truncate(dtype):
    for group in MINE:
        total = sum(value(m, torch.float64) for m in group)
        got = hvd.partial_allreduce(value(R, dtype), group)
        if dtype.is_floating_point:
            assert torch.allclose(got.double(), total / len(group), rtol=4e-3, atol=0)
        else:
            assert torch.equal(got, (total / len(group)).trunc().to(dtype))


def test_bool_sum_is_or_and_product_is_and():
    for group in MINE:
        lowest = min(group)
        mine = torch.tensor([R == lowest, True, False, R != lowest])
        assert hvd.partial_allreduce(mine, group, op=hvd.Sum).tolist() == [True, True, False, True]
        assert hvd.partial_allreduce(mine, group, op=hvd.Product).tolist() == [
            False, True, False, False]


@pytest.mark.parametrize("numel", [0, 1, 2, 5, 1_000_003])
def test_lengths_shorter_than_the_ring_and_long_ones(numel):
    for group in MINE[:3]:
        got = hvd.partial_allreduce(value(R, torch.float32, numel), group, op=hvd.Sum)
        assert torch.equal(got, sum(value(m, torch.float32, numel) for m in group))


def test_random_floats_give_every_member_the_same_bits_and_the_sum():
    for index, group in enumerate(GROUPS):
        x = torch.randn(1001, generator=torch.Generator().manual_seed(1000 * index + R))
        got = hvd.partial_allreduce(x, group, op=hvd.Sum) if R in group else None
        everyone = hvd.allgather_object((x.double(), None if got is None else got.numpy().tobytes()))
        if R in group:
            assert torch.allclose(got.double(), sum(everyone[m][0] for m in group), atol=1e-5)
            assert all(everyone[m][1] == everyone[R][1] for m in group), group


def test_16_bit_sums_are_rounded_once():
    def member_input(dtype, index, member):
        return torch.randn(4099, generator=torch.Generator().manual_seed(7 * index + member)
                           ).to(dtype)

    for dtype in (torch.float16, torch.bfloat16):
        for group in MINE:
            index = GROUPS.index(group)  # the same on every member
            got = hvd.partial_allreduce(member_input(dtype, index, R), group, op=hvd.Sum)
            exact = sum(member_input(dtype, index, m).double() for m in group)
            # float32 partial sums of 16-bit values are exact, so the one rounding to 16 bits
            # is within half a unit in the last place of the exact sum.
            ulp = (exact.to(dtype).double().abs() * (2.0 ** -10 if dtype is torch.float16
                                                     else 2.0 ** -7))
            assert ((got.double() - exact).abs() <= 0.5 * ulp + 1e-7).all(), (dtype, group)


def test_non_contiguous_and_fused_mixed_dtypes():
    for group in MINE:
        matrix = value(R, torch.float32, 12).reshape(3, 4).t()  # non-contiguous
        ints = value(R, torch.int32, 5)
        handles = [hvd.partial_allreduce_async(matrix, group, op=hvd.Sum, name="m"),
                   hvd.partial_allreduce_async(ints, group, op=hvd.Sum, name="i"),
                   hvd.partial_allreduce_async(matrix * 2, group, op=hvd.Sum, name="m2")]
        got = [hvd.synchronize(h) for h in handles]
        expected = sum(value(m, torch.float32, 12).reshape(3, 4).t() for m in group)
        assert torch.equal(got[0], expected) and torch.equal(got[2], 2 * expected)
        assert torch.equal(got[1], sum(value(m, torch.int32, 5) for m in group))


def test_process_set_scaling_and_its_other_collectives():
    """A process set's all-reduce goes around the ring with pre/postscale; its broadcast
    and all-gather still make the set's communicator (what the ring does not carry)."""
    members = list(range(N - 1))
    process_set = hvd.add_process_set(members)
    if R in members:
        got = hvd.allreduce(value(R, torch.float32), op=hvd.Sum, prescale_factor=2.0,
                            postscale_factor=0.25, process_set=process_set)
        assert torch.equal(got, sum(value(m, torch.float32) for m in members) * 0.5)
        assert hvd.broadcast(torch.full((2,), float(R)), root_rank=1,
                             process_set=process_set).tolist() == [1.0, 1.0]
        gathered = hvd.allgather(torch.tensor([R]), process_set=process_set)
        assert gathered.tolist() == members
    hvd.barrier()
    hvd.remove_process_set(process_set)


def test_the_world_still_reduces_over_its_communicator():
    got = hvd.allreduce(value(R, torch.float32), op=hvd.Sum)
    assert torch.equal(got, sum(value(m, torch.float32) for m in range(N)))
