"""Random collective calls, the same on every rank but for deliberate differences.

Run under mpiexec: ``python fuzz_collectives.py CASES SEED [FIRST]``, with RIPPLES_TIMEOUT_S
small. Every rank draws the same cases from the seed; a case is one of

- valid calls (every kind of collective, dtype, shape, op, root, group; named or not;
  blocking, or several asynchronous calls submitted and waited for in a different order
  on each rank), whose results are checked against values computed here;
- a mismatch (one rank passes another shape, dtype, op or collective under the same name,
  or its own names), which must raise ``MismatchError`` on every member;
- bad arguments passed by every rank, which must raise ``TypeError``/``ValueError`` at
  the call, before anything is sent;
- a member that never calls (rare: it costs a timeout), which must raise
  ``RipplesTimeoutError`` on the members that called.

After each case an all-reduce checks that the runtime is still usable. A wrong result, a
missing or unexpected error, or a case that runs past its bound fails the rank (and so the
job). Rank 0 prints ``FUZZ {json}``: cases per kind and errors raised per class.
"""
import collections
import json
import random
import sys
import time

import torch

import ripples.torch as hvd
from ripples.errors import MismatchError, RipplesTimeoutError
from ripples.runtime import current

hvd.init()
R, N = hvd.rank(), hvd.size()
TIMEOUT = current().config.timeout_s
FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
INTS = (torch.int32, torch.int64, torch.uint8)
KINDS = ("allreduce", "allgather", "broadcast", "alltoall", "partial_allreduce")


def data(case: int, rank: int, shape, dtype) -> torch.Tensor:
    """Rank ``rank``'s input of case ``case``: small integers, exact in every dtype."""
    gen = torch.Generator().manual_seed(case * 1009 + rank)
    values = torch.randint(0, 4, shape, generator=gen)
    return values.bool() if dtype is torch.bool else values.to(dtype)


def close(actual: torch.Tensor, expected: torch.Tensor, dtype) -> bool:
    if actual.dtype != dtype or actual.shape != expected.shape:
        return False
    if dtype.is_floating_point:  # sums of small integers are exact; averages round once
        eps = torch.finfo(dtype).eps
        return torch.allclose(actual.double(), expected.double(), rtol=2 * eps, atol=0)
    return torch.equal(actual, expected.to(dtype))


def reduced(inputs, op, dtype) -> torch.Tensor:
    stacked = torch.stack([t.double() for t in inputs])
    if op is hvd.Sum:
        result = stacked.sum(0)
    elif op is hvd.Average:
        result = stacked.mean(0)
    elif op is hvd.Min:
        result = stacked.min(0).values
    else:
        result = stacked.max(0).values
    return (result != 0) if dtype is torch.bool else result


class Case:
    """One case drawn from ``rng`` (the same on every rank)."""

    def __init__(self, index: int, rng: random.Random):
        self.index = index
        self.kind = rng.choice(KINDS)
        self.dtype = rng.choice(FLOATS + INTS + (torch.bool,))
        self.ops = [hvd.Sum, hvd.Min, hvd.Max] + (
            [hvd.Average] if self.dtype.is_floating_point else [])
        if self.dtype is torch.bool:
            self.ops = [hvd.Sum, hvd.Min, hvd.Max]
        self.op = rng.choice(self.ops)
        rows = rng.choice([0, 1, 3, 17])
        self.shape = rng.choice([(), (rows,), (rows, 2), (2, rows, 3)])
        self.named = rng.random() < 0.5
        self.root = rng.randrange(N)
        members = rng.sample(range(N), rng.randint(1, N))
        self.group = tuple(sorted(members))
        self.rows = [rng.randint(0, 3) for _ in range(N)]  # allgather rows per rank
        self.splits = [[rng.randint(0, 2) for _ in range(N)] for _ in range(N)]
        self.odd_rank = rng.randrange(N)
        self.n_async = rng.randint(2, 4)
        self.order_seed = rng.random()


def run_valid(case: Case, rank_offset: int = 0):
    """One valid blocking call of ``case``; checks its result."""
    kind, dtype, shape, i = case.kind, case.dtype, case.shape, case.index + rank_offset
    name = f"fuzz.{i}" if case.named else None
    if kind == "allreduce":
        mine = data(i, R, shape, dtype)
        out = hvd.allreduce(mine, op=case.op, name=name)
        assert close(out, reduced([data(i, r, shape, dtype) for r in range(N)], case.op, dtype),
                     dtype), (case.__dict__, out)
    elif kind == "partial_allreduce":
        if R not in case.group:
            return
        mine = data(i, R, shape, dtype)
        out = hvd.partial_allreduce(mine, case.group, op=case.op, name=name)
        expected = reduced([data(i, r, shape, dtype) for r in case.group], case.op, dtype)
        assert close(out, expected, dtype), (case.__dict__, out)
    elif kind == "allgather":
        row_shape = shape[1:] if shape else ()
        parts = [data(i, r, (case.rows[r], *row_shape), dtype) for r in range(N)]
        out = hvd.allgather(parts[R], name=name)
        assert close(out, torch.cat(parts).double(), dtype), (case.__dict__, out)
    elif kind == "broadcast":
        out = hvd.broadcast(data(i, R, shape, dtype), root_rank=case.root, name=name)
        assert close(out, data(i, case.root, shape, dtype).double(), dtype), case.__dict__
    else:  # alltoall: rank r sends splits[r][j] rows to rank j
        row_shape = shape[1:] if len(shape) > 1 else ()
        mine = data(i, R, (sum(case.splits[R]), *row_shape), dtype)
        received, counts = hvd.alltoall(mine, splits=case.splits[R], name=name)
        expected = []
        for r in range(N):
            start = sum(case.splits[r][:R])
            expected.append(data(i, r, (sum(case.splits[r]), *row_shape),
                                 dtype)[start:start + case.splits[r][R]])
        assert close(received, torch.cat(expected).double(), dtype), case.__dict__
        assert counts.tolist() == [case.splits[r][R] for r in range(N)]


def run_async(case: Case):
    """Several named asynchronous all-reduces, submitted and waited for in rank-specific
    orders: they meet by name."""
    shape, dtype = case.shape, case.dtype
    indices = list(range(case.n_async))
    random.Random(case.order_seed + R).shuffle(indices)
    handles = {k: hvd.allreduce_async(data(case.index * 10 + k, R, shape, dtype), op=case.op,
                                      name=f"fuzz.async.{case.index}.{k}") for k in indices}
    random.Random(case.order_seed * 3 + R).shuffle(indices)
    for k in indices:
        out = hvd.synchronize(handles[k])
        expected = reduced([data(case.index * 10 + k, r, shape, dtype) for r in range(N)],
                           case.op, dtype)
        assert close(out, expected, dtype), (case.__dict__, k, out)


def run_mismatch(case: Case, what: str):
    """Rank ``odd_rank`` differs in ``what``; every rank must raise MismatchError."""
    odd = R == case.odd_rank
    shape, dtype, op = case.shape, case.dtype, case.op
    name = f"fuzz.mismatch.{case.index}"
    if what == "shape" and odd:
        shape = (*shape, 2)
    elif what == "dtype" and odd:
        dtype = torch.float64 if dtype is not torch.float64 else torch.float32
        op = op if op is not hvd.Average else hvd.Sum
    elif what == "op" and odd:
        op = hvd.Max if op is not hvd.Max else hvd.Min
    elif what == "name":
        name = f"{name}.rank{R}"  # every rank blocks on a name only it has
    tensor = data(case.index, R, shape, dtype)
    try:
        if what == "kind" and odd:
            hvd.broadcast(tensor, root_rank=0, name=name)
        else:
            hvd.allreduce(tensor, op=op, name=name)
    except MismatchError:
        return "MismatchError"
    raise AssertionError(f"no MismatchError for a {what} mismatch: {case.__dict__}")


def run_bad_argument(case: Case, rng: random.Random):
    """Every rank passes the same bad argument: a local error, nothing sent."""
    tensor = data(case.index, R, (3,), torch.float32)
    calls = [
        (TypeError, lambda: hvd.allreduce([1.0, 2.0])),
        (ValueError, lambda: hvd.broadcast(tensor, root_rank=N)),
        (TypeError, lambda: hvd.broadcast(tensor, root_rank="0")),
        (ValueError, lambda: hvd.partial_allreduce(tensor, [r for r in range(N) if r != R])),
        (ValueError, lambda: hvd.partial_allreduce(tensor, [R, R])),
        (ValueError, lambda: hvd.allreduce(tensor, op="Median")),
        (ValueError, lambda: hvd.allreduce(tensor, op=hvd.Sum, average=True)),
        (ValueError, lambda: hvd.allgather(torch.tensor(1.0))),
        (ValueError, lambda: hvd.alltoall(tensor, splits=[4] + [0] * (N - 1))),
        (ValueError, lambda: hvd.allreduce(torch.ones(2, dtype=torch.bool), op=hvd.Average)),
        (TypeError, lambda: hvd.allreduce(tensor, name=5)),
        (TypeError, lambda: hvd.allreduce(tensor, prescale_factor="2")),
    ]
    error, call = rng.choice(calls)
    try:
        call()
    except error:
        return error.__name__
    raise AssertionError(f"no {error.__name__} for a bad argument (case {case.index})")


def run_missing(case: Case):
    """Rank ``odd_rank`` never calls the all-reduce: the others time out, naming it. It
    joins the next case once every other rank has given up (a leaf waits for its parent's
    answer longer than the timeout), and they wait for it."""
    rejoin = time.monotonic() + 2 * TIMEOUT + 2
    outcome = "skipped"
    if R != case.odd_rank:
        try:
            hvd.allreduce(data(case.index, R, (2,), torch.float32),
                          name=f"fuzz.missing.{case.index}")
        except RipplesTimeoutError as exc:
            assert f"[{case.odd_rank}]" in str(exc) or f"rank {case.odd_rank}" in str(exc), \
                str(exc)
            outcome = "RipplesTimeoutError"
        else:
            raise AssertionError(f"no timeout with rank {case.odd_rank} missing "
                                 f"(case {case.index})")
    time.sleep(max(0.0, rejoin - time.monotonic()))
    return outcome


def main(cases: int, seed: int, first: int = 0) -> None:
    rng = random.Random(seed)
    counts = collections.Counter()
    errors = collections.Counter()
    slowest = 0.0
    for index in range(first, first + cases):
        case = Case(index, rng)
        draw = rng.random()
        start = time.monotonic()
        if draw < 0.55:
            kind = "valid " + case.kind
            run_valid(case)
        elif draw < 0.70:
            kind = "async allreduce"
            run_async(case)
        elif N > 1 and draw < 0.85:
            what = rng.choice(["shape", "dtype", "op", "kind", "name"])
            kind = "mismatch " + what
            errors[run_mismatch(case, what)] += 1
        elif N > 1 and draw < 0.86:
            kind = "missing member"
            errors[run_missing(case)] += 1
        else:
            kind = "bad argument"
            errors[run_bad_argument(case, rng)] += 1
        counts[kind] += 1
        try:
            check = hvd.allreduce(torch.tensor([float(index)]), op=hvd.Sum,
                                  name=f"fuzz.check.{index}")
        except Exception as exc:
            raise AssertionError(f"runtime unusable after case {index} ({kind}, "
                                 f"{time.monotonic() - start:.2f} s)") from exc
        assert check.item() == index * N, f"wrong check after case {index} ({kind})"
        elapsed = time.monotonic() - start
        slowest = max(slowest, elapsed)
        assert elapsed < 3 * TIMEOUT + 5, f"case {index} took {elapsed:.1f} s"
    errors.pop("skipped", None)
    if R == 0:
        print("FUZZ " + json.dumps({"ranks": N, "cases": cases, "seed": seed, "hangs": 0,
                                    "kinds": dict(sorted(counts.items())),
                                    "errors": dict(sorted(errors.items())),
                                    "slowest_case_s": round(slowest, 3)}), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 0)
