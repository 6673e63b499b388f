"""Horovod API conformance on real MPI ranks, host (CPU) tensors only.

Run by tests/test_horovod_api_mpi.py under mpiexec at 2 and 4 ranks. Every test states, in
its docstring, the behaviour of ``horovod.torch`` (0.28, the last release) that it checks;
the expected values are those Horovod's own torch test-suite computes for the same inputs.
ripples additionally accepts bfloat16 and bool, which Horovod rejects; where those are
added to a dtype list, inputs are kept small enough to be exact in them.

Every test body runs under ``agreed``: each rank catches its own failure, the ranks then
exchange outcomes over plain mpi4py (not through ripples), and every rank fails with every
rank's message when any one failed. So a behaviour that breaks on one rank only still
fails (or, for a marked gap, xfails) on all ranks, and the ranks stay in step.
"""
from __future__ import annotations

import contextlib
import dataclasses
import faulthandler
import functools
import inspect
import itertools
import json
import math
import os
import sys
import tempfile
import time
import traceback
import warnings

import pytest
import torch
import torch.nn.functional as F
from mpi4py import MPI

import ripples.torch as hvd
from ripples import runtime as ripples_runtime

WORLD = MPI.COMM_WORLD
R, N = WORLD.Get_rank(), WORLD.Get_size()

# Horovod's static process sets: registered at init() on every rank.
EVEN_SET = hvd.ProcessSet([r for r in range(N) if r % 2 == 0])
ODD_SET = hvd.ProcessSet([r for r in range(N) if r % 2 == 1])
hvd.init(process_sets=[EVEN_SET, ODD_SET])

# Horovod's CPU dtype lists, and ripples' extras.
INT_TYPES = [torch.int32, torch.int64]
FLOAT_TYPES = [torch.float16, torch.float32, torch.float64]
ALL_TYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
             torch.float16, torch.float32, torch.float64]
EXTRA_TYPES = [torch.bfloat16]
DIMS = [1, 2, 3]
WATCHDOG_S = 120


def agreed(fn):
    """Run the test body, then fail on every rank if it failed on any rank."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        error = None
        # A collective that never returns would stall every rank: end the job instead.
        faulthandler.dump_traceback_later(WATCHDOG_S, exit=True, file=sys.__stderr__)
        try:
            fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - reported below, on every rank
            if isinstance(exc, pytest.skip.Exception):
                raise
            error = f"rank {R}: {type(exc).__name__}: {exc}\n" + "".join(
                traceback.format_exception(exc)[-6:])
        errors = [e for e in WORLD.allgather(error) if e]
        faulthandler.cancel_dump_traceback_later()
        if errors:
            raise AssertionError("failed on %d of %d ranks:\n%s" % (len(errors), N,
                                                                    "\n".join(errors)))
    return wrapper


def random_tensor(shape, dtype, low=-100, high=100, seed=1234):
    """The same random integer-valued tensor on every rank."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(low, high, tuple(shape), generator=gen).to(dtype)


def small_range(dtype):
    """Value range keeping sums over <= 4 ranks exact in ``dtype``."""
    return (-32, 32) if dtype == torch.bfloat16 else (-100, 100)


def assert_equal(got, expected, what=""):
    assert got.dtype == expected.dtype, f"{what}: dtype {got.dtype} != {expected.dtype}"
    assert got.shape == expected.shape, f"{what}: shape {tuple(got.shape)} != {tuple(expected.shape)}"
    if not torch.equal(got, expected):
        diff = (got.double() - expected.double()).abs()
        raise AssertionError(f"{what}: max abs difference {diff.max().item()}; "
                             f"got {got.flatten()[:6].tolist()} expected {expected.flatten()[:6].tolist()}")


def still_in_step():
    """After an expected error, a plain collective still works on every rank."""
    got = hvd.allreduce(torch.full((3,), float(R)), op=hvd.Sum, name=None)
    assert got.tolist() == [float(sum(range(N)))] * 3


def mpi_env_rank_and_size():
    rank = os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK"))
    size = os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("PMI_SIZE"))
    return int(rank), int(size)


# ================================================================= basics

@agreed
def test_rank_size_and_local_facts_match_the_launcher():
    """hvd.rank()/size() are MPI's; one node: local == global, one cross rank."""
    assert hvd.is_initialized()
    assert (hvd.rank(), hvd.size()) == mpi_env_rank_and_size()
    assert hvd.local_rank() == R and hvd.local_size() == N
    assert hvd.cross_rank() == 0 and hvd.cross_size() == 1


@agreed
def test_build_and_backend_queries_have_horovods_types():
    """Horovod: nccl_built() is an int (NCCL version code or 0), the others are bool;
    under MPI mpi_enabled()/mpi_built() are true; gloo, ccl and ddl are not built."""
    nccl = hvd.nccl_built()
    assert type(nccl) is int, f"nccl_built() returned {type(nccl).__name__} {nccl!r}"
    assert nccl >= 0
    assert hvd.mpi_enabled() is True and hvd.mpi_built() is True
    assert hvd.gloo_built() is False and hvd.gloo_enabled() is False
    assert hvd.ccl_built() is False and hvd.ddl_built() is False
    assert hvd.is_homogeneous() is True
    assert isinstance(hvd.mpi_threads_supported(), bool)
    assert isinstance(hvd.cuda_built(), bool) and isinstance(hvd.rocm_built(), bool)


@agreed
def test_average_argument_and_op_are_exclusive():
    """Horovod's deprecated ``average=`` still works; passing both it and ``op`` raises
    ValueError."""
    t = torch.full((4,), float(R))
    assert hvd.allreduce(t, average=False).tolist() == [float(sum(range(N)))] * 4
    assert hvd.allreduce(t, average=True).tolist() == [sum(range(N)) / N] * 4
    with pytest.raises(ValueError):
        hvd.allreduce(t, average=True, op=hvd.Sum)
    still_in_step()


# ================================================================= allreduce

@agreed
@pytest.mark.parametrize("dtype", INT_TYPES + FLOAT_TYPES + EXTRA_TYPES)
def test_allreduce_sum(dtype):
    """Sum of the same tensor on every rank is the tensor times size (1-3 dims)."""
    for dim in DIMS:
        tensor = random_tensor([17] * dim, dtype, *small_range(dtype))
        summed = hvd.allreduce(tensor, op=hvd.Sum)
        assert_equal(summed, (tensor.double() * N).to(dtype), f"dim {dim}")
        assert torch.equal(hvd.allreduce(tensor, average=False), summed)


@agreed
@pytest.mark.parametrize("dtype", INT_TYPES + FLOAT_TYPES + EXTRA_TYPES)
def test_allreduce_average(dtype):
    """Average of the same tensor on every rank is the tensor (default op)."""
    for dim in DIMS:
        tensor = random_tensor([17] * dim, dtype, *small_range(dtype))
        assert_equal(hvd.allreduce(tensor), tensor, f"dim {dim} default op")
        assert_equal(hvd.allreduce(tensor, op=hvd.Average), tensor, f"dim {dim}")


@agreed
@pytest.mark.parametrize("dtype", ALL_TYPES + EXTRA_TYPES)
def test_allreduce_min_max(dtype):
    """Min/Max: rank r reduces row r of one shared random tensor; the result is the
    element-wise min/max over rows."""
    for dim in DIMS:
        rows = random_tensor([N] + [17] * dim, dtype, *small_range(dtype))
        assert_equal(hvd.allreduce(rows[R], op=hvd.Min), rows.min(0).values, f"min dim {dim}")
        assert_equal(hvd.allreduce(rows[R], op=hvd.Max), rows.max(0).values, f"max dim {dim}")


@agreed
@pytest.mark.parametrize("dtype", ALL_TYPES + EXTRA_TYPES)
def test_allreduce_product(dtype):
    """Product: the element-wise product over ranks' rows (small values: exact)."""
    low = 0 if dtype == torch.uint8 else -3
    for dim in DIMS:
        rows = random_tensor([N] + [17] * dim, dtype, low, 4)
        expected = rows.double().prod(0).to(dtype)
        assert_equal(hvd.allreduce(rows[R], op=hvd.Product), expected, f"dim {dim}")


@agreed
@pytest.mark.parametrize("dtype", INT_TYPES + FLOAT_TYPES + EXTRA_TYPES)
def test_allreduce_in_place(dtype):
    """allreduce_ writes the sum into its argument and returns it."""
    for dim in DIMS:
        tensor = random_tensor([17] * dim, dtype, *small_range(dtype))
        expected = (tensor.double() * N).to(dtype)
        out = hvd.allreduce_(tensor, op=hvd.Sum)
        assert_equal(tensor, expected, f"dim {dim}")
        assert out.data_ptr() == tensor.data_ptr()


@agreed
def test_allreduce_async_fused_and_poll():
    """Many allreduce_async calls of mixed dtypes and shapes: results are right, and
    Horovod's check that the ops are asynchronous holds (poll() is False at least once
    before synchronize)."""
    pending = []
    poll_false_once = False
    for dtype, dim in itertools.product(INT_TYPES + FLOAT_TYPES + EXTRA_TYPES, DIMS):
        tensor = random_tensor([17] * dim, dtype, *small_range(dtype))
        handle = hvd.allreduce_async(tensor, op=hvd.Sum)
        if not hvd.poll(handle):
            poll_false_once = True
        pending.append((handle, (tensor.double() * N).to(dtype), dtype, dim))
    for handle, expected, dtype, dim in pending:
        assert_equal(hvd.synchronize(handle), expected, f"{dtype} dim {dim}")
    assert poll_false_once, "hvd.poll() returned True right after every allreduce_async"


@agreed
def test_allreduce_async_in_place():
    """allreduce_async_ reduces into its argument; synchronize returns that tensor."""
    tensors = [random_tensor([5, 3], torch.float32, seed=s) for s in range(4)]
    expected = [t * N for t in tensors]
    handles = [hvd.allreduce_async_(t, op=hvd.Sum) for t in tensors]
    for h, t, e in zip(handles, tensors, expected):
        out = hvd.synchronize(h)
        assert out.data_ptr() == t.data_ptr()
        assert_equal(t, e)


SCALE = 0.3719  # a factor whose products are not integers


def _scaled_reference(tensor, dtype, pre, post):
    """Horovod's scaling arithmetic on CPU: integers are scaled in float64 and truncated
    toward zero back to the integer type, float16 in float32, other floats in their own
    type; prescale acts on each rank's input, postscale on the sum."""
    math_type = (torch.float64 if not dtype.is_floating_point else
                 torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype)
    scaled = (tensor.to(math_type) * pre).to(dtype)
    total = (scaled.to(math_type) * N).to(dtype)
    return (total.to(math_type) * post).to(dtype)


def _close(dtype):
    return {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}.get(dtype, 1e-6)


@agreed
@pytest.mark.parametrize("dtype", INT_TYPES + FLOAT_TYPES + EXTRA_TYPES)
def test_allreduce_prescale(dtype):
    """Sum with prescale_factor: each input is scaled first (integers truncate toward
    zero after float64 scaling, so the result is size * trunc(x * f))."""
    for dim in DIMS:
        tensor = random_tensor([17] * dim, dtype, *small_range(dtype))
        got = hvd.allreduce(tensor, op=hvd.Sum, prescale_factor=SCALE)
        expected = _scaled_reference(tensor, dtype, SCALE, 1.0)
        if dtype.is_floating_point:
            assert got.dtype == dtype
            assert torch.allclose(got.double(), expected.double(), rtol=_close(dtype), atol=0), \
                f"dim {dim}: {got.flatten()[:4].tolist()} vs {expected.flatten()[:4].tolist()}"
        else:
            assert_equal(got, expected, f"dim {dim}")


@agreed
@pytest.mark.parametrize("dtype", INT_TYPES + FLOAT_TYPES + EXTRA_TYPES)
def test_allreduce_postscale(dtype):
    """Sum with postscale_factor: the sum is scaled (integers: trunc(size * x * f))."""
    for dim in DIMS:
        tensor = random_tensor([17] * dim, dtype, *small_range(dtype))
        got = hvd.allreduce(tensor, op=hvd.Sum, postscale_factor=SCALE)
        expected = _scaled_reference(tensor, dtype, 1.0, SCALE)
        if dtype.is_floating_point:
            assert got.dtype == dtype
            assert torch.allclose(got.double(), expected.double(), rtol=_close(dtype), atol=0)
        else:
            assert_equal(got, expected, f"dim {dim}")


@agreed
@pytest.mark.parametrize("dtype", [torch.int8, torch.int32, torch.int64])
def test_integer_average_and_scaling_truncate_toward_zero(dtype):
    """Integer Average divides the sum in float64 and truncates toward zero (negative
    sums round up); pre- and postscale do the same at their stage."""
    mine = torch.tensor([3 * R + 1, -(5 * R + 2), 7, -7], dtype=dtype)
    sums = [sum(3 * r + 1 for r in range(N)), -sum(5 * r + 2 for r in range(N)), 7 * N, -7 * N]
    got = hvd.allreduce(mine, op=hvd.Average)
    assert got.dtype == dtype
    assert got.tolist() == [math.trunc(s / N) for s in sums]
    pre, post = 0.5, 1.5
    got = hvd.allreduce(mine, op=hvd.Sum, prescale_factor=pre, postscale_factor=post)
    rows = [[3 * r + 1, -(5 * r + 2), 7, -7] for r in range(N)]
    expected = [math.trunc(sum(math.trunc(row[i] * pre) for row in rows) * post)
                for i in range(4)]
    assert got.tolist() == expected


@agreed
def test_allreduce_bool_is_logical():
    """ripples' extra: bool Sum/Max is a logical or, Min/Product a logical and."""
    flags = torch.tensor([R == 0, True, False])
    assert hvd.allreduce(flags, op=hvd.Sum).tolist() == [True, True, False]
    assert hvd.allreduce(flags, op=hvd.Max).tolist() == [True, True, False]
    assert hvd.allreduce(flags, op=hvd.Min).tolist() == [N == 1, True, False]
    assert hvd.allreduce(flags, op=hvd.Product).tolist() == [N == 1, True, False]


# ================================================================= grouped allreduce

@agreed
@pytest.mark.parametrize("dtype", INT_TYPES + FLOAT_TYPES + EXTRA_TYPES)
def test_grouped_allreduce_sum_average_in_place(dtype):
    """grouped_allreduce reduces each of five tensors; average gives the inputs back;
    grouped_allreduce_ works in place."""
    for dim in DIMS:
        tensors = [random_tensor([17] * dim, dtype, *small_range(dtype), seed=s)
                   for s in range(5)]
        summed = hvd.grouped_allreduce(tensors, op=hvd.Sum)
        assert isinstance(summed, list) and len(summed) == 5
        for got, t in zip(summed, tensors):
            assert_equal(got, (t.double() * N).to(dtype), f"sum dim {dim}")
        for got, t in zip(hvd.grouped_allreduce(tensors, average=True), tensors):
            assert_equal(got, t, f"average dim {dim}")
        copies = [t.clone() for t in tensors]
        hvd.grouped_allreduce_(copies, op=hvd.Sum)
        for got, t in zip(copies, tensors):
            assert_equal(got, (t.double() * N).to(dtype), f"in place dim {dim}")


@agreed
def test_grouped_allreduce_async_and_async_in_place():
    """grouped_allreduce_async returns a handle whose synchronize gives the list of
    results; grouped_allreduce_async_ reduces the inputs themselves."""
    tensors = [random_tensor([4, 3], torch.float32, seed=s) for s in range(5)]
    handle = hvd.grouped_allreduce_async(tensors, op=hvd.Sum)
    out = hvd.synchronize(handle)
    assert len(out) == 5
    for got, t in zip(out, tensors):
        assert_equal(got, t * N)
    copies = [t.clone() for t in tensors]
    handle = hvd.grouped_allreduce_async_(copies, op=hvd.Sum)
    out = hvd.synchronize(handle)
    for got, c, t in zip(out, copies, tensors):
        assert got.data_ptr() == c.data_ptr()
        assert_equal(c, t * N)


# ================================================================= mismatch errors

def _raises_runtime_error(call, what):
    try:
        call()
    except RuntimeError:
        return
    raise AssertionError(f"{what} did not raise a RuntimeError")


@agreed
def test_allreduce_shape_and_rank_mismatch_raise_runtime_error():
    """Different shapes, or the same element count with a different number of
    dimensions, raise a RuntimeError (Horovod: HorovodInternalError) on every rank."""
    _raises_runtime_error(lambda: hvd.allreduce(torch.ones([17 + R] * 3)), "shape mismatch")
    dims = [17, 23 * 57] if R == 0 else [17, 23, 57]
    _raises_runtime_error(lambda: hvd.allreduce(torch.ones(dims)), "rank mismatch")
    still_in_step()


@agreed
def test_allreduce_type_mismatch_raises_runtime_error():
    """int32 on even ranks, float32 on odd ranks: RuntimeError on every rank."""
    tensor = torch.ones([17] * 3, dtype=torch.int32 if R % 2 == 0 else torch.float32)
    _raises_runtime_error(lambda: hvd.allreduce(tensor), "dtype mismatch")
    still_in_step()


@agreed
def test_allgather_and_broadcast_mismatch_raise_runtime_error():
    """allgather: a differing non-first dimension or dtype raises; broadcast: a differing
    shape or dtype raises; reducescatter: the same; all on every rank."""
    shape = [17, 10 * (R + 1), 17]
    _raises_runtime_error(lambda: hvd.allgather(torch.ones(shape)), "allgather shape")
    odd_type = torch.int32 if R % 2 == 0 else torch.float32
    _raises_runtime_error(lambda: hvd.allgather(torch.ones([17] * 3, dtype=odd_type)),
                          "allgather dtype")
    _raises_runtime_error(lambda: hvd.broadcast(torch.ones(shape), 0), "broadcast shape")
    _raises_runtime_error(lambda: hvd.broadcast(torch.ones([17] * 3, dtype=odd_type), 0),
                          "broadcast dtype")
    _raises_runtime_error(lambda: hvd.reducescatter(torch.ones([17 + R] * 3)),
                          "reducescatter shape")
    _raises_runtime_error(lambda: hvd.reducescatter(torch.ones([17] * 3, dtype=odd_type)),
                          "reducescatter dtype")
    still_in_step()


@agreed
def test_broadcast_root_rank_mismatch_raises_runtime_error():
    """Every rank names itself as root: RuntimeError on every rank."""
    _raises_runtime_error(lambda: hvd.broadcast(torch.ones([17] * 3), R), "root mismatch")
    still_in_step()


@agreed
def test_grouped_allreduce_mismatch_raises_runtime_error():
    """A grouped all-reduce whose second tensor differs in shape across ranks raises."""
    tensors = [torch.ones(5), torch.ones(3 + R)]
    _raises_runtime_error(lambda: hvd.grouped_allreduce(tensors), "grouped shape")
    still_in_step()


def _duplicate_name(submit):
    """Horovod: a second in-flight op with the name of a pending one raises ValueError.

    The tester submits twice before the others submit at all, so its first op cannot have
    finished (and freed the name) in between; first rank 0 tests, then the last rank."""
    for tester in sorted({0, N - 1}):
        if R == tester:
            first = submit()
            with pytest.raises(ValueError, match="already in flight"):
                submit()
        WORLD.Barrier()
        if R != tester:
            first = submit()
        hvd.synchronize(first)


@agreed
def test_duplicate_name_raises_value_error_for_every_async_op():
    """allreduce_async, allgather_async, broadcast_async, alltoall_async and
    reducescatter_async all refuse a name already in flight with ValueError."""
    t = torch.ones([N * 2, 3])
    _duplicate_name(lambda: hvd.allreduce_async(t, name="duplicate_name"))
    _duplicate_name(lambda: hvd.allgather_async(t, name="duplicate_name"))
    _duplicate_name(lambda: hvd.broadcast_async(t, root_rank=0, name="duplicate_name"))
    _duplicate_name(lambda: hvd.alltoall_async(t, name="duplicate_name"))
    _duplicate_name(lambda: hvd.reducescatter_async(t, name="duplicate_name"))
    still_in_step()


@agreed
def test_adasum_is_refused_with_a_runtime_error():
    """Horovod's reducescatter refuses Adasum with a RuntimeError; ripples refuses Adasum
    everywhere with NotImplementedError, a RuntimeError subclass."""
    _raises_runtime_error(lambda: hvd.reducescatter(torch.ones(N * 2), op=hvd.Adasum),
                          "reducescatter Adasum")
    _raises_runtime_error(lambda: hvd.allreduce(torch.ones(4), op=hvd.Adasum), "allreduce Adasum")
    still_in_step()


# ================================================================= gradients

FLOAT_GRAD_TYPES = [torch.float32, torch.float64]


@agreed
@pytest.mark.parametrize("dtype", FLOAT_GRAD_TYPES)
def test_allreduce_grad_sum_and_average(dtype):
    """d(sum over ranks)/dx is size (the gradient is all-reduced with the same op);
    for Average it is 1; prescale and postscale are applied to the gradient as well."""
    for dim in DIMS:
        x = random_tensor([17] * dim, dtype).requires_grad_()
        hvd.allreduce(x, op=hvd.Sum).backward(torch.ones([17] * dim, dtype=dtype))
        assert_equal(x.grad, torch.full([17] * dim, float(N), dtype=dtype), f"sum dim {dim}")
        x.grad = None
        hvd.allreduce(x, average=True).backward(torch.ones([17] * dim, dtype=dtype))
        assert_equal(x.grad, torch.ones([17] * dim, dtype=dtype), f"average dim {dim}")
        x.grad = None
        hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.25).backward(
            torch.ones([17] * dim, dtype=dtype))
        assert_equal(x.grad, torch.full([17] * dim, N * 0.5, dtype=dtype), f"scaled dim {dim}")


@agreed
@pytest.mark.parametrize("dtype", FLOAT_GRAD_TYPES)
def test_grouped_allreduce_grad_sum_and_average(dtype):
    """Each of five grouped inputs gets size (Sum) or 1 (Average) as its gradient."""
    for dim in DIMS:
        xs = [random_tensor([17] * dim, dtype, seed=s).requires_grad_() for s in range(5)]
        for out in hvd.grouped_allreduce(xs, op=hvd.Sum):
            out.backward(torch.ones([17] * dim, dtype=dtype))
        for x in xs:
            assert_equal(x.grad, torch.full([17] * dim, float(N), dtype=dtype), f"sum dim {dim}")
            x.grad = None
        for out in hvd.grouped_allreduce(xs, average=True):
            out.backward(torch.ones([17] * dim, dtype=dtype))
        for x in xs:
            assert_equal(x.grad, torch.ones([17] * dim, dtype=dtype), f"average dim {dim}")


GATHER_ROWS = [3, 2, 7, 4]


@agreed
@pytest.mark.parametrize("dtype", FLOAT_GRAD_TYPES)
def test_allgather_grad(dtype):
    """Rows of rank r get gradient r on every rank; Horovod averages the output gradient
    over ranks and returns each rank its own rows: r * ones."""
    for dim in DIMS:
        rows = GATHER_ROWS[:N]
        x = torch.full([rows[R]] + [17] * (dim - 1), float(R), dtype=dtype).requires_grad_()
        grad_ys = torch.cat([torch.full([n] + [17] * (dim - 1), float(r), dtype=dtype)
                             for r, n in enumerate(rows)])
        hvd.allgather(x).backward(grad_ys)
        assert_equal(x.grad, torch.full(x.shape, float(R), dtype=dtype), f"dim {dim}")


@agreed
def test_grouped_allgather_grad():
    """As allgather's gradient, for each tensor of a grouped allgather."""
    rows = GATHER_ROWS[:N]
    xs = [torch.full([rows[R], 3], float(R)).requires_grad_() for _ in range(3)]
    outs = hvd.grouped_allgather(xs)
    grad_ys = torch.cat([torch.full([n, 3], float(r)) for r, n in enumerate(rows)])
    torch.autograd.backward(outs, [grad_ys] * 3)
    for x in xs:
        assert_equal(x.grad, torch.full(x.shape, float(R)))


@agreed
@pytest.mark.parametrize("dtype", FLOAT_GRAD_TYPES)
def test_broadcast_grad(dtype):
    """The root's input gets the average of the output gradients (1 for ones), every
    other rank's input gets 0."""
    for dim, root in itertools.product(DIMS, range(N)):
        x = torch.full([17] * dim, float(R), dtype=dtype).requires_grad_()
        hvd.broadcast(x, root).backward(torch.ones([17] * dim, dtype=dtype))
        expected = torch.full([17] * dim, 1.0 if R == root else 0.0, dtype=dtype)
        assert_equal(x.grad, expected, f"dim {dim} root {root}")


def _alltoall_input(dim, dtype, rows_each):
    """``rows_each`` rows for each destination rank i, holding i."""
    t = torch.tensor([float(i) for i in range(N) for _ in range(rows_each)])
    for _ in range(dim - 1):
        t = torch.stack([t, t], dim=1) if t.dim() == 1 else torch.stack([t, t], dim=-1)
    return t.to(dtype)


@agreed
@pytest.mark.parametrize("dtype", FLOAT_GRAD_TYPES)
def test_alltoall_grad(dtype):
    """The gradient returns by the reverse all-to-all: ones in, ones back (with and
    without splits)."""
    for dim in DIMS:
        x = _alltoall_input(dim, dtype, R + 1).requires_grad_()
        splits = torch.tensor([R + 1] * N, dtype=torch.int32)
        collected, received = hvd.alltoall(x, splits)
        collected.backward(torch.ones_like(collected))
        assert_equal(x.grad, torch.ones_like(x), f"splits dim {dim}")
        y = _alltoall_input(dim, dtype, 2).requires_grad_()
        out = hvd.alltoall(y)
        out.backward(torch.ones_like(out))
        assert_equal(y.grad, torch.ones_like(y), f"equal split dim {dim}")


@agreed
@pytest.mark.parametrize("dtype", FLOAT_GRAD_TYPES)
def test_reducescatter_grad(dtype):
    """Sum: every input element's gradient is size; Average: 1."""
    for dim in DIMS:
        shape = [N * 4] * dim
        x = random_tensor(shape, dtype).requires_grad_()
        out = hvd.reducescatter(x, op=hvd.Sum)
        out.backward(torch.ones([4] + shape[1:], dtype=dtype))
        assert_equal(x.grad, torch.full(shape, float(N), dtype=dtype), f"sum dim {dim}")
        x.grad = None
        out = hvd.reducescatter(x, op=hvd.Average)
        out.backward(torch.ones([4] + shape[1:], dtype=dtype))
        assert_equal(x.grad, torch.ones(shape, dtype=dtype), f"average dim {dim}")


@agreed
def test_grouped_reducescatter_grad():
    """As reducescatter's gradient, for each tensor of a grouped reducescatter."""
    xs = [random_tensor([N * 4, 5], torch.float32, seed=s).requires_grad_() for s in range(3)]
    outs = hvd.grouped_reducescatter(xs, op=hvd.Sum)
    torch.autograd.backward(outs, [torch.ones(4, 5)] * 3)
    for x in xs:
        assert_equal(x.grad, torch.full([N * 4, 5], float(N)))


# ================================================================= allgather

@agreed
@pytest.mark.parametrize("dtype", ALL_TYPES + EXTRA_TYPES + [torch.bool])
def test_allgather(dtype):
    """17 rows of value r from each rank r, concatenated in rank order."""
    for dim in DIMS:
        x = torch.full([17] * dim, R % 2 if dtype == torch.bool else R).to(dtype)
        got = hvd.allgather(x)
        assert list(got.shape) == [17 * N] + [17] * (dim - 1)
        for r in range(N):
            assert torch.equal(got[r * 17:(r + 1) * 17],
                               torch.full([17] * dim, r % 2 if dtype == torch.bool else r).to(dtype))


@agreed
@pytest.mark.parametrize("dtype", ALL_TYPES + EXTRA_TYPES)
def test_allgather_variable_first_dimension(dtype):
    """Ranks send 17, 32, 81, 12 rows: the result has their sum, in rank order."""
    sizes = [17, 32, 81, 12][:N]
    for dim in DIMS:
        x = torch.full([sizes[R]] + [17] * (dim - 1), R).to(dtype)
        got = hvd.allgather(x)
        assert list(got.shape) == [sum(sizes)] + [17] * (dim - 1)
        for r in range(N):
            part = got[sum(sizes[:r]):sum(sizes[:r + 1])]
            assert part.shape[0] == sizes[r] and bool((part == r).all())


@agreed
def test_allgather_async_fused_and_poll():
    """allgather_async over dtypes and dims: poll() is False at least once, and every
    handle's result is right."""
    pending, poll_false_once = [], False
    for dtype, dim in itertools.product(ALL_TYPES, DIMS):
        handle = hvd.allgather_async(torch.full([17] * dim, R).to(dtype))
        poll_false_once |= not hvd.poll(handle)
        pending.append((handle, dtype, dim))
    for handle, dtype, dim in pending:
        got = hvd.synchronize(handle)
        assert got.dtype == dtype and list(got.shape) == [17 * N] + [17] * (dim - 1)
        for r in range(N):
            assert bool((got[r * 17:(r + 1) * 17] == r).all())
    assert poll_false_once, "hvd.poll() returned True right after every allgather_async"


@agreed
def test_grouped_allgather():
    """grouped_allgather gathers each tensor of the list (variable first dimension)."""
    xs = [torch.full([R + 1, 2], float(R + 10 * i)) for i in range(3)]
    outs = hvd.grouped_allgather(xs)
    for i, got in enumerate(outs):
        assert torch.equal(got, torch.cat([torch.full([r + 1, 2], float(r + 10 * i))
                                           for r in range(N)]))


@agreed
@pytest.mark.parametrize("in_sets", [False, True])
def test_sparse_allreduce_async_handle_is_callable(in_sets):
    """Horovod's sparse_allreduce_async returns a function: handle() waits and returns the
    sparse result (synchronize(handle) works too). Rank r puts r + 1 in row r and 1 in the
    last row of a (N + 2) x 3 tensor; over the k members of its set (all ranks, or those
    of its parity) Average gives (m + 1) / k in each member m's row, 1 in the last row,
    0 elsewhere; Sum gives m + 1 and k."""
    process_set = (EVEN_SET if R % 2 == 0 else ODD_SET) if in_sets else hvd.global_process_set
    members = [r for r in range(N) if not in_sets or r % 2 == R % 2]
    dense = torch.zeros(N + 2, 3)
    dense[R] = R + 1.0
    dense[N + 1] = 1.0
    averaged = hvd.sparse_allreduce_async(dense.to_sparse(), op=hvd.Average, name="sp.avg",
                                          process_set=process_set)
    summed = hvd.sparse_allreduce_async(dense.to_sparse(), op=hvd.Sum, name="sp.sum",
                                        process_set=process_set)
    got_average = averaged()
    got_sum = hvd.synchronize(summed)
    assert callable(averaged) and got_average.is_sparse and got_sum.is_sparse
    want_average, want_sum = torch.zeros(N + 2, 3), torch.zeros(N + 2, 3)
    for m in members:
        want_average[m] = (m + 1.0) / len(members)
        want_sum[m] = m + 1.0
    want_average[N + 1], want_sum[N + 1] = 1.0, float(len(members))
    assert torch.equal(got_average.to_dense(), want_average), got_average.to_dense()
    assert torch.equal(got_sum.to_dense(), want_sum), got_sum.to_dense()


# ================================================================= broadcast

@agreed
@pytest.mark.parametrize("dtype", ALL_TYPES + EXTRA_TYPES + [torch.bool])
def test_broadcast_from_every_root(dtype):
    """Every root, 1-3 dims: the result is the root's tensor and the input is untouched."""
    for dim, root in itertools.product(DIMS, range(N)):
        fill = (lambda r: r % 2) if dtype == torch.bool else (lambda r: r)
        x = torch.full([17] * dim, fill(R)).to(dtype)
        before = x.clone()
        got = hvd.broadcast(x, root)
        assert_equal(got, torch.full([17] * dim, fill(root)).to(dtype), f"dim {dim} root {root}")
        assert torch.equal(x, before), "broadcast modified its input"


@agreed
@pytest.mark.parametrize("dtype", ALL_TYPES + EXTRA_TYPES)
def test_broadcast_in_place_from_every_root(dtype):
    """broadcast_ overwrites its argument with the root's tensor and returns it."""
    for dim, root in itertools.product(DIMS, range(N)):
        x = torch.full([17] * dim, R).to(dtype)
        got = hvd.broadcast_(x, root)
        assert_equal(x, torch.full([17] * dim, root).to(dtype), f"dim {dim} root {root}")
        assert got.data_ptr() == x.data_ptr()


@agreed
def test_broadcast_async_forms():
    """broadcast_async returns a new tensor at synchronize; broadcast_async_ fills its
    argument."""
    x = torch.full((4, 2), float(R))
    assert torch.equal(hvd.synchronize(hvd.broadcast_async(x, N - 1)), torch.full((4, 2), N - 1.0))
    assert torch.equal(x, torch.full((4, 2), float(R)))
    hvd.synchronize(hvd.broadcast_async_(x, N - 1))
    assert torch.equal(x, torch.full((4, 2), N - 1.0))


@agreed
def test_broadcast_object_and_allgather_object():
    """broadcast_object returns root's object on every rank; allgather_object returns
    every rank's object in rank order (objects may differ in structure)."""
    expected = {"hello": 123, 0: [1, 2]}
    got = hvd.broadcast_object(expected if R == 0 else {}, root_rank=0)
    assert got == expected
    got = hvd.broadcast_object(None if R != N - 1 else ("last", N - 1), root_rank=N - 1)
    assert got == ("last", N - 1)
    mine = {"metric_val_1": R}
    if R == 1:
        mine["metric_val_2"] = 42
    gathered = hvd.allgather_object(mine)
    assert len(gathered) == N
    for r, obj in enumerate(gathered):
        want = {"metric_val_1": r}
        if r == 1:
            want["metric_val_2"] = 42
        assert obj == want


# ================================================================= alltoall

@agreed
@pytest.mark.parametrize("dtype", ALL_TYPES + EXTRA_TYPES)
def test_alltoall_with_splits(dtype):
    """Rank r sends r + 1 rows to each rank: rank r receives only rows holding r, r' + 1
    of them from rank r', and received_splits says so."""
    for dim in DIMS:
        x = _alltoall_input(dim, dtype, R + 1)
        splits = torch.tensor([R + 1] * N, dtype=torch.int32)
        collected, received = hvd.alltoall(x, splits)
        assert bool((collected == R).all())
        assert collected.numel() == N * (N + 1) // 2 * 2 ** (dim - 1)
        assert received.tolist() == [r + 1 for r in range(N)]
        # splits as a plain list are accepted too
        collected2, received2 = hvd.alltoall(x, [R + 1] * N)
        assert torch.equal(collected, collected2) and received2.tolist() == received.tolist()


@agreed
@pytest.mark.parametrize("dtype", ALL_TYPES + EXTRA_TYPES)
def test_alltoall_equal_split_returns_a_tensor(dtype):
    """Without splits the first dimension is divided evenly and Horovod returns the
    received tensor alone (not a tuple)."""
    for dim in DIMS:
        x = _alltoall_input(dim, dtype, 2)
        got = hvd.alltoall(x)
        assert isinstance(got, torch.Tensor), f"alltoall(tensor) returned {type(got).__name__}"
        assert bool((got == R).all()) and got.shape[0] == 2 * N


@agreed
def test_alltoall_one_rank_sends_nothing():
    """Rank 0 sends no rows (all splits zero) while the others send r + 1 rows each."""
    if R == 0:
        x, splits = torch.empty((0, 2)), [0] * N
    else:
        x, splits = _alltoall_input(2, torch.float32, R + 1), [R + 1] * N
    collected, received = hvd.alltoall(x, splits)
    assert received.tolist() == [0] + [r + 1 for r in range(1, N)]
    assert collected.shape == (sum(r + 1 for r in range(1, N)), 2) and bool((collected == R).all())


@agreed
def test_alltoall_errors():
    """A first dimension not divisible by size without splits, splits that do not add up
    to the first dimension, and mismatched dtypes raise on every rank."""
    with pytest.raises((RuntimeError, ValueError)):
        hvd.alltoall(torch.ones(N + 1))
    with pytest.raises((RuntimeError, ValueError)):
        hvd.alltoall(torch.ones(N), splits=[2] * N)
    odd_type = torch.int32 if R % 2 == 0 else torch.float32
    _raises_runtime_error(lambda: hvd.alltoall(torch.ones([N * 2, 3], dtype=odd_type)),
                          "alltoall dtype")
    still_in_step()


@agreed
def test_alltoall_async():
    """alltoall_async with splits: synchronize gives (received, received_splits)."""
    x = _alltoall_input(1, torch.float32, R + 1)
    out = hvd.synchronize(hvd.alltoall_async(x, splits=[R + 1] * N))
    collected, received = out
    assert bool((collected == R).all()) and received.tolist() == [r + 1 for r in range(N)]


# ================================================================= reducescatter

@agreed
@pytest.mark.parametrize("dtype", INT_TYPES + FLOAT_TYPES + EXTRA_TYPES)
def test_reducescatter_sum_and_average(dtype):
    """Rank r gets rows 4r..4r+3 of the sum (size * tensor) or of the average (tensor)."""
    for dim in DIMS:
        x = random_tensor([N * 4] * dim, dtype, *small_range(dtype))
        mine = x[R * 4:(R + 1) * 4]
        assert_equal(hvd.reducescatter(x, op=hvd.Sum), (mine.double() * N).to(dtype), f"sum {dim}")
        assert_equal(hvd.reducescatter(x, op=hvd.Average), mine, f"average {dim}")


@agreed
def test_reducescatter_uneven_rows_go_to_the_first_ranks():
    """2N + 1 rows: the first rank(s) get one row more (Horovod's split)."""
    x = torch.arange(2 * N + 1, dtype=torch.float32).reshape(-1, 1) * (R + 1)
    got = hvd.reducescatter(x, op=hvd.Sum)
    rows = [(2 * N + 1) // N + (1 if i < (2 * N + 1) % N else 0) for i in range(N)]
    start = sum(rows[:R])
    expected = torch.arange(start, start + rows[R], dtype=torch.float32).reshape(-1, 1)
    assert_equal(got, expected * sum(r + 1 for r in range(N)))


@agreed
def test_reducescatter_async_fused_and_poll():
    """reducescatter_async over dtypes and dims: poll() False at least once, right results."""
    pending, poll_false_once = [], False
    for dtype, dim in itertools.product(INT_TYPES + FLOAT_TYPES, DIMS):
        x = random_tensor([N * 4] * dim, dtype)
        handle = hvd.reducescatter_async(x, op=hvd.Sum)
        poll_false_once |= not hvd.poll(handle)
        pending.append((handle, (x[R * 4:(R + 1) * 4].double() * N).to(dtype)))
    for handle, expected in pending:
        assert_equal(hvd.synchronize(handle), expected)
    assert poll_false_once, "hvd.poll() returned True right after every reducescatter_async"


@agreed
def test_reducescatter_scaling_and_grouped():
    """Horovod's reducescatter takes prescale/postscale; grouped_reducescatter scatters
    each tensor of a list."""
    x = random_tensor([N * 4, 3], torch.float64)
    got = hvd.reducescatter(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0)
    assert torch.allclose(got, x[R * 4:(R + 1) * 4] * N * 1.5)
    xs = [random_tensor([N * 2, 2], torch.float32, seed=s) for s in range(3)]
    for got, x in zip(hvd.grouped_reducescatter(xs, op=hvd.Sum), xs):
        assert_equal(got, x[R * 2:(R + 1) * 2] * N)


# ================================================================= join and barrier

def _all_same(value):
    values = WORLD.allgather(value)
    assert all(v == values[0] for v in values), f"ranks disagree: {values}"
    return values[0]


@agreed
@pytest.mark.parametrize("first_join_rank", [0, 1])
def test_join_with_allreduce(first_join_rank):
    """One rank joins at once; the others run two named async all-reduces (fused), with
    and without having run them before (Horovod's response cache), then join. A joined
    rank contributes zeros and, by default, Average divides by the ranks still active, so
    the active ranks get their (identical) tensors back (Horovod divides by every rank:
    see test_horovod_join_average_counts_the_joined_ranks). join() returns the same
    last-joined rank everywhere, never the one that joined first."""
    _join_with_two_async_allreduces(first_join_rank, [torch.float32, torch.float64])


def _join_with_two_async_allreduces(first_join_rank, dtypes):
    for dtype, dim, warm in itertools.product(dtypes, [1, 3], [False, True]):
        a = random_tensor([5] * dim, dtype, seed=1)
        b = random_tensor([17] * dim, dtype, seed=2)
        if warm:
            ha = hvd.allreduce_async(a, name="tensor_a", average=True)
            hb = hvd.allreduce_async(b, name="tensor_b", average=True)
            assert_equal(hvd.synchronize(ha), a)
            assert_equal(hvd.synchronize(hb), b)
        if R == first_join_rank:
            last = hvd.join()
        else:
            ha = hvd.allreduce_async(a, name="tensor_a", average=True)
            hb = hvd.allreduce_async(b, name="tensor_b", average=True)
            got_a, got_b = hvd.synchronize(ha), hvd.synchronize(hb)
            last = hvd.join()
            assert_equal(got_a, a, f"{dtype} dim {dim} warm {warm}")
            assert_equal(got_b, b, f"{dtype} dim {dim} warm {warm}")
        last = _all_same(last)
        assert last != first_join_rank and 0 <= last < N


@agreed
def test_join_with_allgather():
    """ripples extends Horovod here (Horovod raises 'Allgather is not supported with
    Join'): after rank 0 joined, an allgather of the others holds only their rows."""
    x = torch.full((2, 3), float(R))
    if R == 0:
        hvd.join()
    else:
        got = hvd.allgather(x)
        hvd.join()
        assert torch.equal(got, torch.cat([torch.full((2, 3), float(r)) for r in range(1, N)]))
    still_in_step()


@agreed
def test_join_with_broadcast():
    """ripples extends Horovod here (Horovod raises 'Broadcast is not supported with
    Join'): after rank 0 joined, a broadcast from rank 1 reaches the others."""
    x = torch.full((4,), float(R))
    if R == 0:
        hvd.join()
    else:
        got = hvd.broadcast(x, 1)
        hvd.join()
        assert got.tolist() == [1.0] * 4
    still_in_step()


@agreed
def test_join_with_reducescatter_raises_on_active_ranks():
    """Both Horovod and ripples refuse reducescatter once a rank has joined: the active
    ranks get a RuntimeError, then join; the job carries on."""
    if R == 0:
        hvd.join()
    else:
        _raises_runtime_error(lambda: hvd.reducescatter(torch.ones(N * 2)), "reducescatter")
        hvd.join()
    still_in_step()


@agreed
def test_blocking_allreduces_one_round_each_after_a_join():
    """After rank 0 joined, the others run three blocking float32 all-reduces, each in its
    own control round (the pattern that arms the repeated-call lane of a group, which a
    joined rank cannot take part in), then join. Rank r sends r + 1: Average over the
    ranks still active gives (N(N + 1)/2 - 1) / (N - 1)."""
    x = torch.full((4,), float(R + 1))
    if R == 0:
        hvd.join()
    else:
        got = [hvd.allreduce(x, name=f"after_join.{i}") for i in range(3)]
        hvd.join()
        expected = (N * (N + 1) / 2 - 1) / (N - 1)
        for g in got:
            assert g.tolist() == [expected] * 4, g
    still_in_step()


@contextlib.contextmanager
def horovod_join():
    """Config.horovod_join on this rank for the block (as init(horovod_join=True) or
    RIPPLES_HOROVOD_JOIN=1 set it); every rank enters it at the same point of the test."""
    rt = ripples_runtime.current()
    saved = rt.config
    rt.config = dataclasses.replace(saved, horovod_join=True)
    try:
        yield
    finally:
        rt.config = saved


@agreed
@pytest.mark.parametrize("first_join_rank", [0, 1])
def test_horovod_join_average_counts_the_joined_ranks(first_join_rank):
    """With horovod_join, as in Horovod: the joined rank contributes zeros and Average
    divides by all N ranks. Rank r sends [2(r+1), -(r+1)]; the active ranks' sum is
    S = T - t_j (T: the sum over all ranks, t_j: the joined rank's), divided by N.
    Integers truncate toward zero, as Horovod scales them."""
    total = N * (N + 1) // 2  # sum of r + 1 over all ranks
    active = total - (first_join_rank + 1)  # ... over the ranks that did not join
    with horovod_join():
        if R == first_join_rank:
            hvd.join()
        else:
            x = torch.tensor([2.0 * (R + 1), -(R + 1.0)], dtype=torch.float64)
            got = hvd.allreduce(x, name="hj.float")
            ints = hvd.allreduce(torch.tensor([R + 1, -(R + 1)]), name="hj.int")
            hvd.join()
            assert got.tolist() == [2.0 * active / N, -active / N], got
            assert ints.tolist() == [math.trunc(active / N), math.trunc(-active / N)], ints
    still_in_step()


@agreed
def test_horovod_join_refuses_allgather_and_broadcast():
    """With horovod_join, as in Horovod ('not supported with Join'): after rank 0 joined,
    the others' allgather and broadcast raise a RuntimeError (MismatchError); the job
    carries on, and without the setting the same calls run (test_join_with_allgather)."""
    x = torch.full((2, 3), float(R))
    with horovod_join():
        if R == 0:
            hvd.join()
        else:
            _raises_runtime_error(lambda: hvd.allgather(x), "allgather after join")
            _raises_runtime_error(lambda: hvd.broadcast(x, 1, name="hj.bcast"),
                                  "broadcast after join")
            hvd.join()
    still_in_step()


@agreed
def test_barrier():
    """barrier() returns once every rank reached it, also for a process set."""
    hvd.barrier()
    hvd.barrier(process_set=hvd.global_process_set)
    if R in (EVEN_SET.ranks or []):
        hvd.barrier(process_set=EVEN_SET)
    still_in_step()


# ================================================================= process sets

@agreed
def test_static_process_sets_from_init():
    """init(process_sets=[even, odd]) registers both: included/size/rank describe this
    rank, and collectives within each set reduce over its members only."""
    for ps in (EVEN_SET, ODD_SET):
        members = [r for r in range(N) if r % 2 == (0 if ps is EVEN_SET else 1)]
        assert ps.ranks == members
        assert ps.process_set_id is not None, f"{ps} has no id after init()"
        assert ps.included() == (R in members)
        assert ps.size() == len(members)
        assert ps.rank() == (members.index(R) if R in members else -1)
    mine = EVEN_SET if R % 2 == 0 else ODD_SET
    members = mine.ranks
    got = hvd.allreduce(torch.full((3,), float(R)), op=hvd.Sum, process_set=mine)
    assert got.tolist() == [float(sum(members))] * 3
    gathered = hvd.allgather(torch.full((1, 2), float(R)), process_set=mine)
    assert gathered[:, 0].tolist() == [float(m) for m in members]
    root = members[-1]
    assert hvd.broadcast(torch.full((2,), float(R)), root, process_set=mine).tolist() == [float(root)] * 2
    grouped = hvd.grouped_allreduce([torch.ones(2), torch.full((3,), float(R))], op=hvd.Sum,
                                    process_set=mine)
    assert grouped[0].tolist() == [float(len(members))] * 2
    assert grouped[1].tolist() == [float(sum(members))] * 3
    hvd.barrier(process_set=mine)
    still_in_step()


@contextlib.contextmanager
def _free_ranks(ranks):
    """Lend ``ranks`` to a test: a set of those ranks registered at init (the odd set at
    two ranks) is removed for the duration, as Horovod allows one set per ranks."""
    taken = [p for p in hvd.process_sets() if p.ranks == ranks]
    for p in taken:
        hvd.remove_process_set(p)
    try:
        yield
    finally:
        for p in taken:
            hvd.add_process_set(p)


@agreed
def test_dynamic_process_set_add_use_remove():
    """add_process_set([0, size-1]) ([1] at two ranks; called on every rank, as Horovod requires) gives a
    set for allreduce/allgather/broadcast/alltoall/reducescatter among its members;
    remove_process_set returns True."""
    ranks = [0, N - 1] if N > 2 else [1]  # never all ranks: that set is the global one
    with _free_ranks(ranks):
        _use_a_dynamic_process_set(ranks)
    still_in_step()


def _use_a_dynamic_process_set(ranks):
    ps = hvd.add_process_set(ranks)
    try:
        assert isinstance(ps, hvd.ProcessSet) and ps.ranks == ranks
        if R in ranks:
            k = len(ranks)
            assert ps.included() and ps.size() == k and ps.rank() == ranks.index(R)
            assert hvd.allreduce(torch.full((2,), float(R)), op=hvd.Sum,
                                 process_set=ps).tolist() == [float(sum(ranks))] * 2
            assert hvd.allgather(torch.full((1,), float(R)), process_set=ps).tolist() == \
                [float(r) for r in ranks]
            assert hvd.broadcast(torch.full((2,), float(R)), ranks[-1],
                                 process_set=ps).tolist() == [float(ranks[-1])] * 2
            x = torch.tensor([float(i) for i in range(k)])  # row i goes to member i
            got, splits = hvd.alltoall(x, splits=[1] * k, process_set=ps)
            assert got.tolist() == [float(ranks.index(R))] * k and splits.tolist() == [1] * k
            got = hvd.reducescatter(torch.ones(k * 2), op=hvd.Sum, process_set=ps)
            assert got.tolist() == [float(k)] * 2
        else:
            assert not ps.included() and ps.rank() == -1
    finally:
        assert hvd.remove_process_set(ps) is True


@agreed
def test_adding_the_same_process_set_twice_raises_value_error():
    """Horovod refuses to register a second set with the same ranks: ValueError."""
    ranks = [0, N - 1] if N > 2 else [1]
    with _free_ranks(ranks):
        ps = hvd.add_process_set(ranks)
        extra = []
        try:
            with pytest.raises(ValueError, match="already registered"):
                extra.append(hvd.add_process_set(ranks))
            assert hvd.add_process_set(ps) is ps  # the same object again is no duplicate
        finally:
            for p in [ps] + extra:
                hvd.remove_process_set(p)
    still_in_step()


# ================================================================= parameters and optimizers

def _model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(10, 6), torch.nn.ReLU(), torch.nn.Linear(6, 3))


@agreed
def test_broadcast_parameters_from_state_dict_and_named_parameters():
    """broadcast_parameters accepts a state_dict or named_parameters() and makes every
    rank's model equal to the root's."""
    model = _model(seed=R)
    root_model = _model(seed=N - 1)
    hvd.broadcast_parameters(model.state_dict(), root_rank=N - 1)
    for (name, p), q in zip(model.state_dict().items(), root_model.state_dict().values()):
        assert torch.equal(p, q), name
    model = _model(seed=R)
    hvd.broadcast_parameters(model.named_parameters(), root_rank=0)
    for (name, p), q in zip(model.named_parameters(), _model(seed=0).parameters()):
        assert torch.equal(p, q), name


OPTIMIZERS = ["SGD", "Adam", "AdamW", "Adagrad", "Adadelta", "Adamax", "ASGD", "NAdam",
              "RAdam", "RMSprop", "Rprop"]
OPTION_SETS = [dict(lr=0.2, momentum=0.9, weight_decay=0.1, centered=True), dict(lr=0.2)]


def _accepted(opt_class, options):
    names = inspect.signature(opt_class.__init__).parameters
    return {k: v for k, v in options.items() if k in names}


def _train_once(model, opt, x, y):
    opt.zero_grad()
    F.mse_loss(model(x), y, reduction="sum").backward()
    opt.step()


def _state_values(opt):
    """(key, value) of every state entry in parameter order, tensors cloned."""
    sd = opt.state_dict()
    out = []
    for group in sd["param_groups"]:
        for pid in group["params"]:
            for k, v in sorted(sd["state"].get(pid, {}).items()):
                out.append((pid, k, v.clone() if torch.is_tensor(v) else v))
    return out


@agreed
@pytest.mark.parametrize("opt_name", OPTIMIZERS)
def test_broadcast_optimizer_state_restores_root_checkpoint(opt_name):
    """Horovod's checkpoint pattern: train a step, save on rank 0, rebuild model and
    optimizer everywhere, load on rank 0 only, then broadcast_parameters and
    broadcast_optimizer_state make every rank hold rank 0's parameters and optimizer
    state (4 state entries, none for plain SGD), values and types alike."""
    opt_class = getattr(torch.optim, opt_name)
    torch.manual_seed(7)
    x, y = torch.randn(8, 10), torch.randn(8, 3)
    for options in OPTION_SETS:
        kwargs = _accepted(opt_class, options)
        model = _model(seed=R)
        opt = hvd.DistributedOptimizer(opt_class(model.parameters(), **kwargs),
                                       named_parameters=model.named_parameters())
        _train_once(model, opt, x + R, y)
        checkpoint = {"model": model.state_dict(), "optimizer": opt.state_dict()} if R == 0 else None
        reference = hvd.broadcast_object(
            (_state_values(opt), {k: v.clone() for k, v in model.state_dict().items()})
            if R == 0 else None, root_rank=0)
        model = _model(seed=100 + R)
        opt = hvd.DistributedOptimizer(opt_class(model.parameters(), **kwargs),
                                       named_parameters=model.named_parameters())
        if R == 0:
            model.load_state_dict(checkpoint["model"])
            opt.load_state_dict(checkpoint["optimizer"])
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        ref_state, ref_params = reference
        for name, p in model.state_dict().items():
            assert torch.equal(p, ref_params[name]), f"{opt_name} {kwargs}: parameter {name}"
        expected_entries = 0 if opt_class is torch.optim.SGD and "momentum" not in kwargs else 4
        assert len(opt.state_dict()["state"]) == expected_entries, \
            f"{opt_name} {kwargs}: {len(opt.state_dict()['state'])} state entries"
        got = _state_values(opt)
        assert [(pid, k) for pid, k, _ in got] == [(pid, k) for pid, k, _ in ref_state]
        for (pid, k, v), (_, _, w) in zip(got, ref_state):
            assert type(v) is type(w), f"{opt_name} state {k}: {type(v)} vs {type(w)}"
            assert (torch.equal(v, w) if torch.is_tensor(v) else v == w), f"{opt_name} state {k}"
        _train_once(model, opt, x, y)  # the restored state is usable


@agreed
@pytest.mark.parametrize("opt_name", OPTIMIZERS)
def test_broadcast_optimizer_state_options(opt_name):
    """Hyperparameters differ per rank; after broadcast_optimizer_state every rank holds
    rank 0's, with the same Python types (tuples of floats, bools), and can step."""
    opt_class = getattr(torch.optim, opt_name)
    params_0 = dict(lr=0.1, momentum=0.8, weight_decay=0.2, nesterov=True,
                    betas=(0.9, 0.999), etas=(0.8, 2.4), step_sizes=(1e-5, 100.0))
    params_1 = dict(lr=0.2, momentum=0.9, weight_decay=0.1, nesterov=False,
                    betas=(0.8, 0.9), etas=(0.25, 1.75), step_sizes=(1e-7, 5.0))
    torch.manual_seed(3)
    x, y = torch.randn(8, 10), torch.randn(8, 3)
    model = _model(seed=0)
    opt = hvd.DistributedOptimizer(
        opt_class(model.parameters(), **_accepted(opt_class, params_0 if R == 0 else params_1)),
        named_parameters=model.named_parameters())
    _train_once(model, opt, x, y)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    for k, want in _accepted(opt_class, params_0).items():
        have = opt.param_groups[0][k]
        pairs = list(zip(have, want)) if isinstance(want, tuple) else [(have, want)]
        for h, w in pairs:
            assert type(h) is type(w), f"{opt_name} {k}: {type(h).__name__} vs {type(w).__name__}"
            assert abs(h - w) <= 1e-5, f"{opt_name} {k}: {h} vs {w}"
    _train_once(model, opt, x, y)


class Indexed(torch.nn.Module):
    """A frozen int32 index ``a`` = [1, 3] into a float parameter ``b``."""

    def __init__(self, b):
        super().__init__()
        self.a = torch.nn.Parameter(torch.tensor([1, 3], dtype=torch.int32), requires_grad=False)
        self.b = torch.nn.Parameter(b)

    def forward(self, x):
        return torch.index_select(self.b, 0, self.a.long()) * x


@agreed
def test_broadcast_state_with_a_frozen_integer_parameter():
    """A parameter that does not require grad (an int index) survives
    broadcast_parameters/broadcast_optimizer_state and keeps grad None."""
    model = Indexed(torch.rand(4))
    opt = torch.optim.SGD(model.parameters(), lr=0.001, weight_decay=1e-6, momentum=0.9,
                          nesterov=True)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    assert opt.param_groups[0]["params"][0].grad is None
    b = model.b.detach().clone()
    assert torch.equal(hvd.broadcast(b, 0), b)


@agreed
def test_broadcast_optimizer_state_before_any_step_gives_zero_gradients():
    """Before any step (no optimizer state), Horovod leaves every parameter that requires
    grad with a zero gradient and frozen ones with None. Here: b (4 floats) gets zeros
    that broadcast like any tensor, the frozen index a keeps None, the parameters are
    unchanged (ripples takes no step), and the first backward then accumulates onto the
    zeros: x = r + 1 at indices 1 and 3 gives b.grad = [0, m, 0, m], m = (N + 1) / 2."""
    model = Indexed(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    opt = torch.optim.SGD(model.parameters(), lr=0.001, weight_decay=1e-6, momentum=0.9,
                          nesterov=True)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    assert model.a.grad is None
    assert torch.equal(model.b.grad, torch.zeros(4))
    assert torch.equal(hvd.broadcast(model.b.grad, root_rank=0), torch.zeros(4))
    assert model.b.tolist() == [1.0, 2.0, 3.0, 4.0]
    assert opt.state_dict()["state"] == {}
    model(torch.full((2,), float(R + 1))).sum().backward()
    m = (N + 1) / 2
    assert model.b.grad.tolist() == [0.0, m, 0.0, m]
    opt.step()
    # Once there is state (momentum), gradients are left as they are.
    opt.zero_grad()
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    assert model.b.grad is None and opt.state_dict()["state"] != {}


@agreed
def test_distributed_optimizer_averages_gradients():
    """A rank-dependent loss: after step() the gradients are the average over ranks and
    every rank applied the same update."""
    model = _model(seed=0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    x = torch.full((4, 10), float(R + 1))
    reference = _model(seed=0)  # this rank's own gradients
    reference(x).sum().backward()
    local = [p.grad.clone() for p in reference.parameters()]
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()
    expected = [sum(WORLD.allgather(g.numpy())) / N for g in local]
    assert any(not torch.allclose(torch.from_numpy(e), g) for e, g in zip(expected, local))
    for p, e in zip(model.parameters(), expected):
        assert torch.allclose(p.grad, torch.from_numpy(e), rtol=1e-5, atol=1e-6)
    params = [p.detach().numpy().copy() for p in model.parameters()]
    for theirs in WORLD.allgather(params):
        for a, b in zip(theirs, params):
            assert (a == b).all()


@agreed
def test_distributed_optimizer_sum_and_predivide():
    """op=Sum sums gradients; gradient_predivide_factor keeps Average's result."""
    for kwargs, scale in (({"op": hvd.Sum}, N), ({"gradient_predivide_factor": 2.0}, 1)):
        model = _model(seed=0)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0),
                                       named_parameters=model.named_parameters(), **kwargs)
        reference = _model(seed=0)  # this rank's own gradients (the wrapped ones are averaged
        reference(torch.full((2, 10), float(R + 1))).sum().backward()  # by backward's end)
        local = [p.grad.clone() for p in reference.parameters()]
        opt.zero_grad()
        model(torch.full((2, 10), float(R + 1))).sum().backward()
        opt.step()
        for p, g in zip(model.parameters(), local):
            mean = sum(WORLD.allgather(g.numpy())) / N
            assert torch.allclose(p.grad, torch.from_numpy(mean) * scale, rtol=1e-5, atol=1e-6), kwargs


@agreed
def test_no_named_parameters():
    """Leaving named_parameters out works and still averages."""
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 1), torch.nn.Conv2d(4, 1, 1))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    opt.zero_grad()
    model(torch.rand(1, 1, 8, 8) + R).sum().backward()
    opt.step()
    for theirs in WORLD.allgather([p.detach().numpy().copy() for p in model.parameters()]):
        for a, p in zip(theirs, model.parameters()):
            assert (a == p.detach().numpy()).all()


@agreed
def test_parameter_names_without_named_parameters():
    """Horovod names unnamed parameters allreduce.noname.<group>.<index> and keeps the
    map in optimizer._parameter_names: two groups of one Linear each give 0.0, 0.1 (the
    first layer's weight and bias), 1.0, 1.1, the same on every rank. With
    named_parameters, the given names; a frozen parameter is named too."""
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 3))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(
        [{"params": model[0].parameters()}, {"params": model[1].parameters()}], lr=0.1))
    names = opt._parameter_names
    assert names == {model[0].weight: "allreduce.noname.0.0",
                     model[0].bias: "allreduce.noname.0.1",
                     model[1].weight: "allreduce.noname.1.0",
                     model[1].bias: "allreduce.noname.1.1"}, names
    _all_same(sorted(names.values()))
    model[1].bias.requires_grad_(False)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    assert opt._parameter_names == {model[0].weight: "0.weight", model[0].bias: "0.bias",
                                    model[1].weight: "1.weight", model[1].bias: "1.bias"}


@agreed
def test_missing_named_parameters_raise_value_error():
    """Naming only some of the optimizer's parameters raises ValueError."""
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 1), torch.nn.Conv2d(4, 1, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError):
        hvd.DistributedOptimizer(opt, named_parameters=list(model.named_parameters())[0:1])
    still_in_step()


@agreed
def test_duplicate_parameter_names_raise_value_error():
    """Two modules' 'weight'/'bias' chained together: duplicate names, ValueError."""
    net1, net2 = torch.nn.Conv2d(1, 1, 1), torch.nn.Conv2d(1, 1, 1)
    opt = torch.optim.SGD(itertools.chain(net1.parameters(), net2.parameters()), lr=0.1)
    with pytest.raises(ValueError):
        hvd.DistributedOptimizer(opt, named_parameters=itertools.chain(
            net1.named_parameters(), net2.named_parameters()))
    still_in_step()


@agreed
def test_dynamic_requires_grad():
    """GAN pattern: two wrapped optimizers, parameters switched on and off between steps;
    only the trained half gets gradients and steps."""
    torch.manual_seed(0)
    gen, disc = torch.nn.Conv2d(1, 10, 1), torch.nn.Conv2d(10, 1, 1)
    inp = torch.rand(1, 1, 16, 16)
    gen_opt = hvd.DistributedOptimizer(torch.optim.SGD(gen.parameters(), lr=0.1),
                                       named_parameters=gen.named_parameters())
    disc_opt = hvd.DistributedOptimizer(torch.optim.SGD(disc.parameters(), lr=0.1),
                                        named_parameters=disc.named_parameters())

    def train_step(train_generator=False, train_discriminator=False):
        for p in gen.parameters():
            p.requires_grad_(train_generator)
        for p in disc.parameters():
            p.requires_grad_(train_discriminator)
        gen_opt.zero_grad()
        disc_opt.zero_grad()
        disc(gen(inp)).sum().backward()
        for p in gen.parameters():
            assert train_generator == bool(p.grad is not None and p.grad.abs().max() > 0)
        for p in disc.parameters():
            assert train_discriminator == bool(p.grad is not None and p.grad.abs().max() > 0)
        if train_generator:
            gen_opt.step()
        if train_discriminator:
            disc_opt.step()

    for _ in range(4):
        train_step(train_generator=True)
        train_step(train_discriminator=True)


@agreed
def test_unused_parameters_on_some_ranks_do_not_hang():
    """Rank 0's loss uses one head, the others' both: step() still reduces every
    gradient (missing ones count as zero) and all ranks finish the step alike."""
    class TwoHeads(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = torch.nn.Linear(10, 6)
            self.fc2 = torch.nn.Linear(6, 3)
            self.fc3 = torch.nn.Linear(3, 3)

        def forward(self, x):
            h = self.fc2(F.relu(self.fc1(x)))
            return h, self.fc3(F.relu(h))

    for opt_class, kwargs in ((torch.optim.SGD, dict(lr=0.2, momentum=0.9)),
                              (torch.optim.Adam, dict(lr=0.2))):
        torch.manual_seed(0)
        model = TwoHeads()
        opt = hvd.DistributedOptimizer(opt_class(model.parameters(), **kwargs),
                                       named_parameters=model.named_parameters())
        y1, y2 = model(torch.randn(8, 10))
        loss = y1.sum() if R == 0 else (y1.sum() + y2.sum())
        opt.zero_grad()
        loss.backward()
        opt.step()
        params = [p.detach().numpy().copy() for p in model.parameters()]
        for theirs in WORLD.allgather(params):
            for a, b in zip(theirs, params):
                assert (a == b).all()


def _clip_model():
    model = torch.nn.Linear(1, 1)
    with torch.no_grad():
        model.weight.fill_(0.5)
        model.bias.zero_()
    return model


@agreed
def test_gradient_clipping_with_synchronize_and_skip_synchronize():
    """synchronize() averages now; gradients edited afterwards (clipped, then scaled per
    rank) are what step() inside skip_synchronize() applies, without reducing again."""
    model = _clip_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    x, y = torch.full((1, 1), float(R + 1)), torch.ones(1, 1)
    opt.zero_grad()
    F.mse_loss(model(x), y).backward()
    opt.synchronize()
    # d/dw (0.5 x - 1)^2 = 2 (0.5 x - 1) x, averaged over x = r + 1
    expected = sum(2 * (0.5 * (r + 1) - 1) * (r + 1) for r in range(N)) / N
    prior = model.weight.grad.item()
    assert abs(prior - expected) < 1e-6, (prior, expected)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
    clipped = model.weight.grad.item()
    assert abs(clipped) < abs(prior)
    with torch.no_grad():
        model.weight.grad.mul_(R + 1)  # differs per rank: a second reduction would show
    with opt.skip_synchronize():
        opt.step()
    assert abs(model.weight.item() - (0.5 - 0.1 * clipped * (R + 1))) < 1e-6


@agreed
def test_step_after_synchronize_without_skip_warns_once():
    """synchronize(), clip, then step() outside skip_synchronize(): exactly one warning,
    'optimizer.step() called without optimizer.skip_synchronize()'."""
    model = _clip_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    opt.zero_grad()
    F.mse_loss(model(torch.zeros(1, 1)), torch.ones(1, 1)).backward()
    opt.synchronize()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt.step()
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1, messages
    assert "optimizer.step() called without optimizer.skip_synchronize()" in messages[0], messages


@agreed
def test_zero_grad_between_backward_and_step_raises_assertion_error():
    """zero_grad() after backward() but before step()/synchronize() raises
    AssertionError (it would race with the reduction)."""
    model = _clip_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    opt.zero_grad()
    F.mse_loss(model(torch.ones(1, 1)), torch.ones(1, 1)).backward()
    try:
        with pytest.raises(AssertionError):
            opt.zero_grad()
    finally:
        opt.step()
    opt.zero_grad()  # allowed again after step()


@agreed
def test_backward_passes_per_step_accumulates_locally():
    """backward_passes_per_step=2: two backward passes accumulate locally (the first pass's
    gradient is this rank's own), step() applies the average over ranks of their sum; a
    third pass before step() raises AssertionError."""
    model = _clip_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0),
                                   named_parameters=model.named_parameters(),
                                   backward_passes_per_step=2)
    opt.zero_grad()
    local = 0.0
    for k in range(2):
        x = torch.full((1, 1), float(R + k + 1))
        F.mse_loss(model(x), torch.ones(1, 1)).backward()
        local += 2 * (0.5 * (R + k + 1) - 1) * (R + k + 1)
        if k == 0:
            assert abs(model.weight.grad.item() - local) < 1e-6  # not reduced yet
    opt.step()
    expected = sum(WORLD.allgather(local)) / N
    assert abs(model.weight.grad.item() - expected) < 1e-5, (model.weight.grad.item(), expected)
    opt.zero_grad()
    try:
        with pytest.raises(AssertionError):
            for _ in range(3):
                F.mse_loss(model(torch.ones(1, 1)), torch.ones(1, 1)).backward()
    finally:
        opt.step()
        opt.zero_grad()


@agreed
def test_horovod_join_averages_gradient_buckets_over_every_rank():
    """With horovod_join, a DistributedOptimizer step of the ranks still training divides
    the summed gradients by N too. loss = w * (r + 1) gives rank r the gradient r + 1;
    rank 0 joins at once, so the others get (sum of r + 1 for r >= 1) / N."""
    with horovod_join():
        model = torch.nn.Linear(1, 1, bias=False)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0),
                                       named_parameters=model.named_parameters())
        if R == 0:
            hvd.join()
        else:
            (model(torch.ones(1, 1)) * (R + 1)).sum().backward()
            opt.step()
            hvd.join()
            expected = (N * (N + 1) // 2 - 1) / N
            assert model.weight.grad.item() == pytest.approx(expected, abs=1e-6)
    still_in_step()


@pytest.mark.xfail(strict=True, reason="DistributedOptimizer returns an AllreduceOptimizer "
                   "(a torch.optim.Optimizer), not a subclass of the wrapped optimizer's class "
                   "as Horovod builds, so isinstance(opt, torch.optim.SGD) is False")
@agreed
def test_distributed_optimizer_is_an_instance_of_the_wrapped_class():
    """Horovod builds the wrapper as a subclass of the optimizer's own class, so
    isinstance(opt, torch.optim.SGD) still holds."""
    model = _clip_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    assert isinstance(opt, torch.optim.Optimizer)
    assert isinstance(opt, torch.optim.SGD), type(opt).__mro__


# ================================================================= compression

def test_compression_fp16_round_trip():
    """fp16 compression halves floats and restores their dtype; other dtypes pass."""
    for dtype in (torch.float32, torch.float64):
        t = torch.ones(5, 5, 5, dtype=dtype)
        c, ctx = hvd.Compression.fp16.compress(t)
        assert c.dtype == torch.float16
        d = hvd.Compression.fp16.decompress(c, ctx)
        assert d.dtype == dtype and torch.equal(d, t)
    for dtype in (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64):
        t = torch.ones(5, 5, 5, dtype=dtype)
        c, ctx = hvd.Compression.fp16.compress(t)
        assert c.dtype == dtype
        assert hvd.Compression.fp16.decompress(c, ctx).dtype == dtype


# ================================================================= SyncBatchNorm

@agreed
def test_sync_batch_norm_matches_batch_norm_over_the_global_batch():
    """Horovod's SyncBatchNorm test on host tensors (Horovod itself skips it without a
    GPU): rank r normalizes sample r; outputs, running statistics and (all-reduced)
    gradients equal BatchNorm1d over all ranks' samples."""
    assert hasattr(hvd, "SyncBatchNorm"), "ripples.torch has no SyncBatchNorm"
    batches = [
        torch.stack([torch.tensor([[r, r + 1], [r * 2, r * 2 + 1], [r * 3, r * 3 + 1],
                                   [r * 4, r * 4 + 1]]) for r in range(N)]),
        torch.stack([torch.tensor([[r + 1], [r * 2 + 1], [r * 3 + 1], [r * 4 + 1]])
                     for r in range(N)]),
    ]
    for ts in batches:
        sync_bn = hvd.SyncBatchNorm(num_features=4)
        bn = torch.nn.BatchNorm1d(num_features=4)
        ts = ts.float()
        ts1, ts2 = ts.clone().requires_grad_(), ts.clone().requires_grad_()
        sync_out = sync_bn(ts1[R].unsqueeze(0))
        bn_out = bn(ts2)
        assert (sync_out - bn_out[R].unsqueeze(0)).abs().sum() < 1e-5
        assert (sync_bn.running_mean - bn.running_mean).abs().sum() < 1e-5
        assert (sync_bn.running_var - bn.running_var).abs().sum() < 1e-5
        sync_out.sum().backward()
        bn_out.mean(dim=0).sum().backward()
        assert (hvd.allreduce(sync_bn.weight.grad, name="sync_bn.weight.grad")
                - bn.weight.grad).abs().sum() < 1e-5
        assert (hvd.allreduce(sync_bn.bias.grad, name="sync_bn.bias.grad")
                - bn.bias.grad).abs().sum() < 1e-5
        assert (hvd.allreduce(ts1.grad, name="ts1.grad") - ts2.grad).abs().sum() < 1e-5


# ================================================================= timeline

@agreed
def test_start_and_stop_timeline():
    """start_timeline(path, mark_cycles=True) records collectives until stop_timeline();
    rank 0 writes ``path`` itself, a JSON trace naming the op; a second start with
    another path works the same; after stop nothing more is recorded there."""
    directory = hvd.broadcast_object(tempfile.mkdtemp() if R == 0 else None, root_rank=0)
    for i in range(2):
        path = os.path.join(directory, f"timeline{i}.json")
        hvd.start_timeline(path, mark_cycles=True)
        hvd.allreduce(torch.tensor([1.0, 2.0, 3.0]), name=f"test_allreduce_{i}")
        time.sleep(0.2)
        hvd.stop_timeline()
        hvd.allreduce(torch.tensor([1.0]), name=f"after_stop_{i}")
        hvd.barrier()
        if R == 0:
            assert os.path.exists(path), f"{path} not written; directory has {os.listdir(directory)}"
            with open(path) as f:
                text = f.read()
            json.loads(text)
            assert f"test_allreduce_{i}" in text
            assert f"after_stop_{i}" not in text


# ================================================================= last: gaps that leave state behind
# A failure here leaves ripples' queues out of step between ranks, so these run last.

@agreed
@pytest.mark.parametrize("first_join_rank", [0, 1])
def test_join_with_fused_integer_allreduces(first_join_rank):
    """As test_join_with_allreduce, for int32 and int64 (Horovod's join test covers both)."""
    _join_with_two_async_allreduces(first_join_rank, [torch.int32, torch.int64])
