"""16-bit all-reduce (ripples.ops.half_allreduce) on real MPI ranks: accuracy against a
float64 sum, the bytes handed to MPI, joined ranks, and 16-bit gradient buckets.

Run by tests/test_half_allreduce_mpi.py at 2 and 3 ranks with RIPPLES_BUCKET_BYTES=65536
(so the model below spans several buckets).
"""
import pytest
import torch
from mpi4py import MPI

import ripples.torch as hvd
from ripples.ops.half_allreduce import allreduce_16bit_, chunks
from ripples.ops.reduction import allreduce_wire, reduce_pairs
from ripples.core.reduce_ops import ReduceOp
from ripples.runtime import current

hvd.init()
R, N = hvd.rank(), hvd.size()
COMM = MPI.COMM_WORLD.Dup()  # direct calls here never meet the engine's traffic
HALVES = [torch.float16, torch.bfloat16]
SIZES = [0, 1, 7, 1000, 100_003]
LR = 0.1


def data(rank, numel, dtype, seed=0):
    """Rank ``rank``'s input: normal values, rounded to ``dtype``."""
    generator = torch.Generator().manual_seed(1000 * seed + rank)
    return torch.randn(numel, generator=generator).to(dtype)


def assert_close_16bit(got, reference, dtype, units=1.0):
    """Within ``units`` of ``dtype``'s relative precision (epsilon) of the float64
    ``reference``: a sum rounded once is within half a unit, each further rounding (an
    Average's division, a postscale) adds half a unit. The absolute term covers float16
    subnormals."""
    eps = torch.finfo(dtype).eps
    error = (got.double() - reference).abs()
    bound = units * eps * reference.abs() + 2.0 ** -23
    assert got.dtype == dtype
    assert bool((error <= bound).all()), f"max error {error.max():.3g}"


@pytest.mark.parametrize("numel", SIZES)
@pytest.mark.parametrize("dtype", HALVES)
def test_allreduce_16bit_is_the_rounded_float64_sum_on_every_rank(dtype, numel):
    buffer = data(R, numel, dtype)
    allreduce_16bit_(COMM, buffer)
    assert_close_16bit(buffer, sum(data(r, numel, dtype).double() for r in range(N)), dtype)
    bits = COMM.allgather(buffer.view(torch.int16).tolist())
    assert all(b == bits[0] for b in bits)


def test_allreduce_16bit_refuses_other_buffers():
    for bad in (torch.zeros(4), torch.zeros(2, 2, dtype=torch.float16),
                torch.zeros(8, dtype=torch.bfloat16)[::2]):
        with pytest.raises(ValueError, match="float16/bfloat16"):
            allreduce_16bit_(COMM, bad)


@pytest.mark.parametrize("numel", SIZES)
@pytest.mark.parametrize("op", [hvd.Sum, hvd.Average])
@pytest.mark.parametrize("dtype", HALVES)
def test_hvd_allreduce_of_16bit_tensors(dtype, op, numel):
    reference = sum(data(r, numel, dtype).double() for r in range(N))
    units = 1.0
    if op is hvd.Average:
        reference, units = reference / N, 1.5
    assert_close_16bit(hvd.allreduce(data(R, numel, dtype), op=op), reference, dtype, units)
    inplace = data(R, numel, dtype)
    hvd.allreduce_(inplace, op=op)
    assert_close_16bit(inplace, reference, dtype, units)


@pytest.mark.parametrize("dtype", HALVES)
def test_fused_16bit_allreduce_with_scaling(dtype):
    """Several tensors, one of them a non-contiguous view, fused into one 16-bit buffer;
    prescale and postscale still apply."""
    tensors = [data(R, 7, dtype, 1), data(R, 1000, dtype, 2).view(10, 100).t(),
               data(R, 1, dtype, 3)]
    references = [sum(data(r, 7, dtype, 1).double() for r in range(N)),
                  sum(data(r, 1000, dtype, 2).double() for r in range(N)).view(10, 100).t(),
                  sum(data(r, 1, dtype, 3).double() for r in range(N))]
    got = hvd.grouped_allreduce(tensors, op=hvd.Sum, prescale_factor=0.5,
                                postscale_factor=3.0)
    for g, reference in zip(got, references):
        assert g.shape == reference.shape
        # Halving the inputs is exact; the sum and the postscale round.
        assert_close_16bit(g, 1.5 * reference, dtype, units=1.5)


class CountingComm:
    """A communicator that notes, for every data call, the bytes of the elements this rank
    hands to MPI to send to other ranks, and forwards the call."""

    def __init__(self, comm):
        self._comm = comm
        self.calls = []

    def __getattr__(self, name):
        return getattr(self._comm, name)

    def Allreduce(self, send, receive, op):
        buffer = receive if send is MPI.IN_PLACE else send
        self.calls.append(("Allreduce", buffer.itemsize, buffer.nbytes))
        return self._comm.Allreduce(send, receive, op=op)

    def Alltoallv(self, send, receive):
        _, counts, _, datatype = send
        self.calls.append(("Alltoallv", datatype.Get_size(),
                           datatype.Get_size() * sum(counts)))
        return self._comm.Alltoallv(send, receive)

    def Allgatherv(self, send, receive):
        _, counts, _, datatype = receive
        me, others = self._comm.Get_rank(), self._comm.Get_size() - 1
        self.calls.append(("Allgatherv", datatype.Get_size(),
                           datatype.Get_size() * counts[me] * others))
        return self._comm.Allgatherv(send, receive)


def reduce_counting(tensor, op):
    comm = CountingComm(COMM)
    reduce_pairs(current(), comm, tuple(range(N)), N, [(tensor, tensor)], op)
    return comm.calls


@pytest.mark.parametrize("numel", [7, 100_003])
@pytest.mark.parametrize("dtype", HALVES)
def test_a_16bit_sum_hands_mpi_half_the_bytes(dtype, numel):
    """float32: one Allreduce of 4-byte elements, of which a bandwidth-optimal algorithm
    sends 2 (N-1) N elements over the group. 16 bits: only 2-byte elements, and exactly
    2 (N-1) N of them over the group (reduce-scatter, then all-gather): half the bytes."""
    full = reduce_counting(data(R, numel, torch.float32), ReduceOp.SUM)
    assert full == [("Allreduce", 4, 4 * numel)]
    half = reduce_counting(data(R, numel, dtype), ReduceOp.AVERAGE)
    assert [name for name, _, _ in half] == ["Alltoallv", "Allgatherv"]
    assert {size for _, size, _ in half} == {2}
    sent = COMM.allreduce(sum(nbytes for _, _, nbytes in half))
    assert sent == 2 * (N - 1) * numel * 2 == (2 * (N - 1) * numel * 4) // 2


@pytest.mark.parametrize("dtype", HALVES)
def test_min_max_product_of_16bit_tensors_stay_in_float32(dtype):
    for op in (ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PRODUCT):
        tensor = data(R, 10, dtype)
        assert reduce_counting(tensor, op) == [("Allreduce", 4, 40)]
        assert f"|{str(dtype)[6:]}|" not in allreduce_wire("allreduce", op, tensor, 1.0, 1.0)
    for op in (ReduceOp.SUM, ReduceOp.AVERAGE):
        wire = allreduce_wire("allreduce", op, data(R, 10, dtype), 1.0, 1.0)
        assert wire.split("|")[3:5] == [str(dtype)[6:], "10"]


def test_chunks_cover_every_element_once():
    for numel in (0, 1, 2, 7, 10):
        for size in (1, 2, 3, 4):
            counts, offsets = chunks(numel, size)
            assert sum(counts) == numel and max(counts) - min(counts) <= 1
            assert offsets == [sum(counts[:i]) for i in range(size)]


@pytest.mark.parametrize("dtype", HALVES)
def test_a_joined_rank_contributes_zeros_to_16bit_sums(dtype):
    """The last rank joins at once; the others all-reduce 16-bit tensors (one alone, three
    fused, Sum and Average): the joined rank takes the same 16-bit path with zeros."""
    if R == N - 1:
        assert hvd.join() in range(N - 1)
        return
    active = N - 1
    for op, divisor, units in ((hvd.Sum, 1, 1.0), (hvd.Average, active, 1.5)):
        got = hvd.allreduce(data(R, 1001, dtype), op=op)
        assert_close_16bit(got, sum(data(r, 1001, dtype).double()
                                    for r in range(active)) / divisor, dtype, units)
        sizes = [5, 1, 333]
        tensors = [data(R, n, dtype, seed) for seed, n in enumerate(sizes)]
        for seed, (n, g) in enumerate(zip(sizes, hvd.grouped_allreduce(tensors, op=op))):
            assert_close_16bit(g, sum(data(r, n, dtype, seed).double()
                                      for r in range(active)) / divisor, dtype, units)
    assert hvd.join() in range(N - 1)


# ---------------------------------------------------------------- 16-bit gradient buckets

def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 128), torch.nn.ReLU(),
                               torch.nn.Linear(128, 128), torch.nn.ReLU(),
                               torch.nn.Linear(128, 4))


def batch(rank, step):
    generator = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(8, 16, generator=generator), torch.randint(0, 4, (8,), generator=generator)


def loss_of(model, x, y):
    return torch.nn.functional.cross_entropy(model(x), y)


def averaged_grads(model, ranks, step):
    """The float32 average of the gradients ``ranks`` compute at ``step``, and the average
    of their absolute values (what bounds the rounding of the 16-bit sum)."""
    grads = []
    for rank in ranks:
        model.zero_grad()
        loss_of(model, *batch(rank, step)).backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    model.zero_grad()
    mean = [sum(g) / len(ranks) for g in zip(*grads)]
    mean_abs = [sum(x.abs() for x in g) / len(ranks) for g in zip(*grads)]
    return mean, mean_abs


def assert_16bit_average(model, expected, dtype):
    """Each rank's gradient rounded to ``dtype`` once, their float32 sum rounded once: each
    rounding within half a unit, so within one unit of the mean absolute gradient."""
    eps = torch.finfo(dtype).eps
    for p, mean, mean_abs in zip(model.parameters(), *expected):
        assert bool(((p.grad - mean).abs() <= eps * mean_abs + 1e-7).all())


def copy_params(source, target):
    with torch.no_grad():
        for p, q in zip(source.parameters(), target.parameters()):
            q.copy_(p)


@pytest.mark.parametrize("compression,dtype", [(hvd.Compression.bf16, torch.bfloat16),
                                               (hvd.Compression.fp16, torch.float16)])
def test_compressed_buckets_train_like_float32(compression, dtype):
    """SGD steps with 16-bit buckets: each step's gradients are the 16-bit rounding of the
    float32 average, and the parameters stay close to float32 training."""
    model, shadow, reference = make_model(), make_model(), make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                                   named_parameters=model.named_parameters(),
                                   compression=compression)
    reducer = opt._buckets.reducer  # buckets, not the by-name path
    assert reducer.wire_dtype is dtype
    assert len(reducer.buffers) > 1  # several 64 KiB buckets
    for step in range(4):
        copy_params(model, shadow)
        expected = averaged_grads(shadow, range(N), step)
        opt.zero_grad()
        loss_of(model, *batch(R, step)).backward()
        assert_16bit_average(model, expected, dtype)
        if N == 2:  # the average doubled is exactly the sum in 16 bits
            for p in model.parameters():
                assert torch.equal(p.grad * 2, (p.grad * 2).to(dtype).float())
        opt.step()
        float32_average = averaged_grads(reference, range(N), step)[0]
        with torch.no_grad():
            for q, e in zip(reference.parameters(), float32_average):
                q -= LR * e
    # Four steps of LR times gradient errors under half a unit (gradients are below 1 here).
    tolerance = 4 * LR * 0.5 * torch.finfo(dtype).eps
    for p, q in zip(model.parameters(), reference.parameters()):
        assert torch.allclose(p, q, rtol=0, atol=tolerance), (p - q).abs().max()
    opt.close()


class _UserCompressor(hvd.Compression.none):
    """A compressor of the user's own: its gradients go by name, not through buckets."""


@pytest.mark.parametrize("other", [hvd.Compression.bf16, _UserCompressor])
def test_ranks_with_different_compression_fail_on_every_rank(other):
    """Rank 0 without compression, the others with ``other``: a clear error on every rank,
    also when only some ranks would build buckets (their creation is collective)."""
    model = make_model()
    compression = hvd.Compression.none if R == 0 else other
    with pytest.raises(ValueError, match=r"different arguments.*compression"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                                 named_parameters=model.named_parameters(),
                                 compression=compression)
    hvd.barrier()


def test_a_joined_rank_contributes_zeros_to_16bit_buckets():
    """The last rank joins at once; the others train two steps on 16-bit buckets averaged
    over the ranks still training (the joined rank sums its share of zeros in 16 bits)."""
    model, shadow = make_model(), make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                                   named_parameters=model.named_parameters(),
                                   compression=hvd.Compression.bf16)
    assert opt._buckets.reducer.wire_dtype is torch.bfloat16
    if R == N - 1:
        assert hvd.join() in range(N - 1)
    else:
        for step in range(2):
            copy_params(model, shadow)
            expected = averaged_grads(shadow, range(N - 1), step)
            opt.zero_grad()
            loss_of(model, *batch(R, step)).backward()
            assert_16bit_average(model, expected, torch.bfloat16)
            opt.step()
        assert hvd.join() in range(N - 1)
    opt.zero_grad()  # every rank is in step again: one more step on the full group
    loss_of(model, *batch(R, 5)).backward()
    opt.step()
    opt.close()
