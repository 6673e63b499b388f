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
  ``RipplesTimeoutError`` on the members that called; in liveness mode
  (``RIPPLES_WAIT_FOR_BUSY_PEERS=1``) the member is busy for longer than the timeout
  instead, which must not fail anyone, then calls another collective, which must make every
  rank raise within a bound (``run_missing_live``);
- ``join()`` at random points: some ranks join after a few more collectives while the others
  go on with all-reduces, all-gathers and broadcasts (joined ranks contribute the op's
  identity, no rows, or receive), then join too; every rank must get the right result over
  the ranks still active and the same last rank to join. Or some ranks join at once and the
  others call an all-to-all, which must raise ``MismatchError`` on them;
- process sets: a random set added on every rank, a collective of its members with
  ``process_set=`` (non-members calling it must get ``ValueError`` at the call), adding the
  same ranks twice (``ValueError``), removing it; or, from 3 ranks, one rank calling a
  collective on a set while the others call it on the world under the same name, which
  must raise ``MismatchError`` on every rank (``RipplesTimeoutError`` where the set lacks
  rank 0: see ``run_set_mismatch``).

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
from ripples.core.errors import MismatchError, RipplesTimeoutError
from ripples.runtime import current

hvd.init()
R, N = hvd.rank(), hvd.size()
TIMEOUT = current().config.timeout_s
LIVE = current().config.wait_for_busy_peers  # liveness mode: a busy peer is waited for
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


def run_missing_live(case: Case):
    """Liveness mode: rank ``odd_rank`` stays busy outside ripples for longer than the
    timeout, which must not fail the others (slow is not dead), then calls another
    all-reduce: now every rank waits inside ripples on a collective the others never call,
    and every rank must raise, within a bound of that call."""
    busy_s = 2 * TIMEOUT + 1
    began = time.monotonic()
    try:
        if R == case.odd_rank:
            time.sleep(busy_s)
            began = time.monotonic()
            hvd.allreduce(data(case.index, R, (2,), torch.float32),
                          name=f"fuzz.late.{case.index}")
        else:
            hvd.allreduce(data(case.index, R, (2,), torch.float32),
                          name=f"fuzz.missing.{case.index}")
    except (MismatchError, RipplesTimeoutError) as exc:
        waited = time.monotonic() - began
        if R != case.odd_rank:
            assert waited >= busy_s - 0.1, \
                f"failed after {waited:.1f} s while rank {case.odd_rank} was busy: {exc}"
            waited -= busy_s
        assert waited < 2 * TIMEOUT + 3, f"error {waited:.1f} s after the late call: {exc}"
        return type(exc).__name__  # no realignment: the next call waits for busy peers
    raise AssertionError(f"no error with rank {case.odd_rank} calling another collective "
                         f"(case {case.index})")


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


JOIN_KINDS = ("allreduce", "allgather", "broadcast")


def join_step(rng: random.Random, active) -> dict:
    """One collective that the ranks in ``active`` issue while the others have joined."""
    dtype = rng.choice(FLOATS + INTS + (torch.bool,))
    ops = [hvd.Sum, hvd.Min, hvd.Max] + ([hvd.Average] if dtype.is_floating_point else [])
    rows = rng.choice([0, 1, 3])
    return {"kind": rng.choice(JOIN_KINDS), "dtype": dtype, "op": rng.choice(ops),
            "shape": rng.choice([(), (rows,), (rows, 2)]), "named": rng.random() < 0.5,
            "root": rng.choice(sorted(active)), "rows": [rng.randint(0, 2) for _ in range(N)]}


def run_join(case: Case, rng: random.Random):
    """Rank r issues ``calls[r]`` collectives, then joins. The joined ranks take part in
    the rest with neutral contributions: a reduction covers the active ranks only (an
    Average divides by their number), an all-gather has their rows only, a broadcast comes
    from an active root. ``join()`` returns a rank that issued the most, the same on every
    rank; an unnamed all-gather afterwards pairs up although the ranks issued different
    numbers of unnamed collectives before."""
    longest = rng.randint(1, 4)
    calls = [rng.randint(0, longest - 1) if rng.random() < 0.5 else longest for _ in range(N)]
    calls[rng.randrange(N)] = longest
    steps = [join_step(rng, [r for r in range(N) if calls[r] > s]) for s in range(longest)]
    for s in range(calls[R]):
        step, i = steps[s], case.index * 10 + s
        active = [r for r in range(N) if calls[r] > s]
        kind, dtype, shape = step["kind"], step["dtype"], step["shape"]
        name = f"fuzz.join.{case.index}.{s}" if step["named"] else None
        if kind == "allreduce":
            out = hvd.allreduce(data(i, R, shape, dtype), op=step["op"], name=name)
            expected = reduced([data(i, r, shape, dtype) for r in active], step["op"], dtype)
        elif kind == "allgather":
            row_shape = shape[1:] if shape else ()
            parts = {r: data(i, r, (step["rows"][r], *row_shape), dtype) for r in active}
            out = hvd.allgather(parts[R], name=name)
            expected = torch.cat([parts[r] for r in active]).double()
        else:
            out = hvd.broadcast(data(i, R, shape, dtype), root_rank=step["root"], name=name)
            expected = data(i, step["root"], shape, dtype).double()
        assert close(out, expected, dtype), (case.index, calls, s, step, out, expected)
    last = hvd.join()
    assert calls[last] == longest, (case.index, calls, last)
    everyone = hvd.allgather(torch.tensor([last]))
    assert everyone.tolist() == [last] * N, (case.index, calls, everyone)
    return "joined"


def run_join_disallowed(case: Case, rng: random.Random):
    """Some ranks join at once; the others call an all-to-all, which a joined rank cannot
    take part in: ``MismatchError`` on the active ranks, then they join too."""
    joined = set(rng.sample(range(N), rng.randint(1, N - 1)))
    outcome = "joined"
    if R not in joined:
        try:
            hvd.alltoall(data(case.index, R, (N,), case.dtype),
                         name=f"fuzz.join.a2a.{case.index}" if case.named else None)
        except MismatchError as exc:
            assert "join" in str(exc), str(exc)
            outcome = "MismatchError"
        else:
            raise AssertionError(f"no MismatchError for an alltoall after join "
                                 f"(case {case.index}, joined {sorted(joined)})")
    last = hvd.join()
    assert last not in joined, (case.index, sorted(joined), last)
    return outcome


def run_process_set(case: Case, rng: random.Random):
    """A set of random members, added on every rank: its members run ``case``'s collective
    (all-reduce, all-gather or broadcast) with ``process_set=``; a non-member that calls it
    gets ``ValueError`` at the call. Adding the same ranks again, or the world's ranks, is a
    ``ValueError``; the set is removed once (True), then no more (False)."""
    members = tuple(sorted(rng.sample(range(N), rng.randint(1, N))))
    kind = rng.choice(JOIN_KINDS)
    root = rng.choice(members)
    outsider_calls = rng.random() < 0.5
    outcome = "ok"
    if len(members) == N:
        process_set = hvd.global_process_set
        what = "add_process_set of every rank"
    else:
        process_set = hvd.add_process_set(list(members))
        assert process_set.process_set_id not in (None, 0) and process_set.ranks == list(
            members), process_set
        what = f"adding set {members} twice"
    try:  # the world's ranks, or a set already added: both refused
        hvd.add_process_set(list(members))
    except ValueError:
        outcome = "ValueError"
    else:
        raise AssertionError(f"{what} did not raise (case {case.index})")
    i, dtype, shape = case.index, case.dtype, case.shape
    name = f"fuzz.set.{i}" if case.named else None
    if R in members:
        if kind == "allreduce":
            out = hvd.allreduce(data(i, R, shape, dtype), op=case.op, name=name,
                                process_set=process_set)
            expected = reduced([data(i, r, shape, dtype) for r in members], case.op, dtype)
        elif kind == "allgather":
            row_shape = shape[1:] if shape else ()
            parts = {r: data(i, r, (case.rows[r], *row_shape), dtype) for r in members}
            out = hvd.allgather(parts[R], name=name, process_set=process_set)
            expected = torch.cat([parts[r] for r in members]).double()
        else:
            out = hvd.broadcast(data(i, R, shape, dtype), root_rank=root, name=name,
                                process_set=process_set)
            expected = data(i, root, shape, dtype).double()
        assert close(out, expected, dtype), (case.index, members, kind, out, expected)
    elif outsider_calls:
        try:
            hvd.allreduce(data(i, R, shape, dtype), name=name, process_set=process_set)
        except ValueError:
            outcome = "ValueError"
        else:
            raise AssertionError(f"rank {R} called on set {members} without an error")
    if not process_set.is_global():
        assert hvd.remove_process_set(process_set) is True
        assert hvd.remove_process_set(process_set) is False
        assert all(s.ranks != list(members) for s in hvd.process_sets()[1:])
    return outcome


def run_set_mismatch(case: Case, rng: random.Random):
    """A rank other than 0 calls an all-reduce on a set of 2 to N-1 ranks holding it, the
    others call it on the world, under one name. When the set holds rank 0 (the world's
    leader), the leader sees both groups: ``MismatchError`` on every rank. Otherwise the
    set's members wait for each other in two groups that never meet: every rank must
    raise ``RipplesTimeoutError``, then wait as after a missing member."""
    odd = 1 + case.odd_rank % (N - 1)
    others = [r for r in range(N) if r != odd]
    members = sorted([odd] + rng.sample(others, rng.randint(1, N - 2)))
    expected = MismatchError if 0 in members else RipplesTimeoutError
    rejoin = time.monotonic() + 2 * TIMEOUT + 2
    process_set = hvd.add_process_set(members)
    try:
        hvd.allreduce(data(case.index, R, (2,), torch.float32), name=f"fuzz.sets.{case.index}",
                      process_set=process_set if R == odd else hvd.global_process_set)
    except expected as exc:
        if expected is RipplesTimeoutError:
            time.sleep(max(0.0, rejoin - time.monotonic()))
        return type(exc).__name__
    finally:
        hvd.remove_process_set(process_set)
    raise AssertionError(f"no {expected.__name__} with rank {odd} on set {members} "
                         f"(case {case.index})")


def main(cases: int, seed: int, first: int = 0) -> None:
    rng = random.Random(seed)
    counts = collections.Counter()
    errors = collections.Counter()
    slowest = 0.0
    for index in range(first, first + cases):
        case = Case(index, rng)
        draw = rng.random()
        if LIVE and index % 25 == 7:
            # A missing member is rare in strict mode, where it costs two timeouts; in
            # liveness mode it costs the busy time only, and every 25th case is one.
            draw = 0.89
        start = time.monotonic()
        if draw < 0.45:
            kind = "valid " + case.kind
            run_valid(case)
        elif draw < 0.57:
            kind = "async allreduce"
            run_async(case)
        elif draw < 0.67:
            kind = "join"
            errors[run_join(case, rng)] += 1
        elif draw < 0.74:
            kind = "process set"
            errors[run_process_set(case, rng)] += 1
        elif N > 1 and draw < 0.76:
            kind = "join then alltoall"
            errors[run_join_disallowed(case, rng)] += 1
        elif N > 2 and draw < 0.77:
            kind = "process set mismatch"
            errors[run_set_mismatch(case, rng)] += 1
        elif N > 1 and draw < 0.89:
            what = rng.choice(["shape", "dtype", "op", "kind", "name"])
            kind = "mismatch " + what
            errors[run_mismatch(case, what)] += 1
        elif N > 1 and draw < 0.895:
            kind = "missing member"
            errors[(run_missing_live if LIVE else run_missing)(case)] += 1
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
    for outcome in ("skipped", "joined", "ok"):
        errors.pop(outcome, None)
    if R == 0:
        print("FUZZ " + json.dumps({"ranks": N, "cases": cases, "seed": seed, "hangs": 0,
                                    "kinds": dict(sorted(counts.items())),
                                    "errors": dict(sorted(errors.items())),
                                    "slowest_case_s": round(slowest, 3)}), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 0)
