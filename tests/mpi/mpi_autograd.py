"""Gradients of the differentiable collectives on real MPI ranks; holds for any world size.

Run by tests/test_conformance_mpi.py under mpiexec at 1, 2 and 4 ranks. Every rank's input and
loss weights are functions of its rank, so each rank can rebuild all of them and compute
the reference gradient in one process: plain torch ops reproduce the collective on the
stacked inputs, the global objective is the sum over ranks of ``(weight * output).sum()``,
and autograd differentiates it. Horovod's conventions then fix a known factor per
collective (1 for all-reduce, all-to-all and P-Reduce; 1/k for all-gather and broadcast,
which average; k for reduce-scatter). One test checks all-reduce by finite differences.
"""
import pytest
import torch

import ripples.torch as hvd
from ripples.ops import collectives as plain

hvd.init()
R, N = hvd.rank(), hvd.size()
F64 = torch.float64
OPS = [hvd.Average, hvd.Sum]
SCALES = [(1.0, 1.0), (2.0, 0.25)]


def data(rank, shape, salt=0.0):
    """A float64 input that differs per rank and per element."""
    numel = int(torch.tensor(shape).prod())
    return (torch.arange(numel, dtype=F64).reshape(shape) * 0.37 + rank * 1.3 + salt + 0.5)


def weight(rank, shape, salt=0.0):
    """The loss weights of ``rank``: the local loss is ``(weight * output).sum()``."""
    numel = int(torch.tensor(shape).prod())
    return torch.cos(torch.arange(numel, dtype=F64) * 0.7 + rank + salt).reshape(shape)


def local_grads(inputs, run, weights):
    """Run the collective on leaf copies of ``inputs``, back-propagate the local loss and
    return the inputs' gradients (checking the outputs are in the graph)."""
    leaves = [x.clone().requires_grad_() for x in inputs]
    outputs = run(leaves)
    for out in outputs:
        assert out.grad_fn is not None and out.requires_grad
    sum((w * y).sum() for w, y in zip(weights, outputs)).backward()
    return [leaf.grad for leaf in leaves]


def reference_grads(all_inputs, all_outputs, all_weights, factor=1.0):
    """Gradients of this rank's inputs under the global objective, in one process.

    ``all_inputs[r]``: rank r's list of inputs; ``all_outputs(leaves)`` returns, for each
    rank taking part, its list of outputs computed with torch from everyone's leaves;
    ``all_weights[r]``: rank r's list of loss weights.
    """
    leaves = {r: [x.clone().requires_grad_() for x in xs] for r, xs in all_inputs.items()}
    outputs = all_outputs(leaves)
    sum((w * y).sum() for r, ys in outputs.items() for w, y in zip(all_weights[r], ys)).backward()
    return [leaf.grad * factor if leaf.grad is not None else torch.zeros_like(leaf)
            for leaf in leaves[R]]


def assert_close(got, expected):
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.dtype == e.dtype and g.shape == e.shape
        assert torch.allclose(g, e, rtol=1e-12, atol=1e-12), (g, e)


def reduced(stack, op):
    total = torch.stack(stack).sum(dim=0)
    return total / len(stack) if op is hvd.Average else total


# ---------------------------------------------------------------- all-reduce

@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("pre,post", SCALES)
def test_allreduce_gradient(op, pre, post):
    shape = (3, 2)
    inputs = {r: [data(r, shape)] for r in range(N)}
    weights = {r: [weight(r, shape)] for r in range(N)}

    def everyone(leaves):
        out = reduced([leaves[r][0] * pre for r in range(N)], op) * post
        return {r: [out] for r in range(N)}

    got = local_grads(inputs[R], lambda xs: [hvd.allreduce(
        xs[0], op=op, prescale_factor=pre, postscale_factor=post)], weights[R])
    assert_close(got, reference_grads(inputs, everyone, weights))


def test_allreduce_matches_finite_differences_of_the_global_objective():
    """Global objective: sum over ranks of (w_r * y_r**2).sum(), y = allreduce(x) with
    Average and scaling; each rank's input is perturbed in turn and the objective summed over
    ranks with an all-reduce."""
    shape, h = (3,), 1e-4  # the objective is quadratic: central differences are exact
    x0, w = data(R, shape), weight(R, shape)

    def objective(x):
        y = hvd.allreduce(x, op=hvd.Average, prescale_factor=1.5, postscale_factor=0.5)
        return (w * y * y).sum()

    x = x0.clone().requires_grad_()
    objective(x).backward()
    with torch.no_grad():
        for owner in range(N):
            for e in range(shape[0]):
                values = []
                for step in (h, -h):
                    moved = x0.clone()
                    if owner == R:
                        moved[e] += step
                    values.append(float(hvd.allreduce(objective(moved).reshape(1),
                                                      op=hvd.Sum)))
                if owner == R:
                    fd = (values[0] - values[1]) / (2 * h)
                    assert abs(fd - float(x.grad[e])) < 1e-8 * max(1.0, abs(fd)), (fd, x.grad)


@pytest.mark.parametrize("op", OPS)
def test_grouped_allreduce_gradient_with_a_constant_member(op):
    shapes = [(2, 3), (4,), (1,)]
    inputs = {r: [data(r, s, salt=i) for i, s in enumerate(shapes)] for r in range(N)}
    weights = {r: [weight(r, s, salt=i) for i, s in enumerate(shapes)] for r in range(N)}

    def everyone(leaves):
        out = [reduced([leaves[r][i] for r in range(N)], op) for i in range(len(shapes))]
        return {r: out for r in range(N)}

    leaves = [x.clone().requires_grad_() for x in inputs[R]]
    constant = torch.ones(2, dtype=F64)  # needs no gradient, reduced with the others
    outputs = hvd.grouped_allreduce([leaves[0], constant, leaves[1], leaves[2]], op=op)
    assert outputs[1].grad_fn is not None and torch.equal(outputs[1].detach(),
                                                          reduced([constant] * N, op))
    sum((w * y).sum() for w, y in zip(weights[R], [outputs[0], outputs[2], outputs[3]])).backward()
    assert constant.grad is None
    assert_close([leaf.grad for leaf in leaves], reference_grads(inputs, everyone, weights))


def test_compression_keeps_the_gradient_path():
    x = data(R, (4,)).requires_grad_()
    y = hvd.allreduce(x, op=hvd.Sum, compression=hvd.Compression.fp16)
    assert y.dtype == F64 and y.grad_fn is not None
    y.sum().backward()
    assert x.grad.dtype == F64 and torch.equal(x.grad, torch.full((4,), float(N), dtype=F64))


def test_second_derivative_through_the_backward_collective():
    x = data(R, (3,)).requires_grad_()
    y = hvd.allreduce(x, op=hvd.Sum)
    (g,) = torch.autograd.grad((y * y).sum(), x, create_graph=True)  # g = allreduce(2 y) = 2 N y
    (gg,) = torch.autograd.grad(g.sum(), x)  # allreduce(2 N) = 2 N N
    assert torch.allclose(gg, torch.full((3,), 2.0 * N * N, dtype=F64))


@pytest.mark.parametrize("op", [hvd.Min, hvd.Max, hvd.Product])
def test_non_linear_ops_reduce_forward_but_refuse_backward(op):
    x = data(R, (2,)).requires_grad_()
    y = hvd.allreduce(x, op=op)
    assert torch.equal(y.detach(), plain.allreduce(x.detach(), op=op))
    with pytest.raises(NotImplementedError, match="no gradient"):
        y.sum().backward()


# ---------------------------------------------------------------- all-gather, broadcast

def rows_of(rank, i=0):
    return rank + 1 + i  # first dimensions differ per rank


def test_allgather_gradient_with_uneven_first_dimensions():
    inputs = {r: [data(r, (rows_of(r), 2))] for r in range(N)}
    total = sum(rows_of(r) for r in range(N))
    weights = {r: [weight(r, (total, 2))] for r in range(N)}

    def everyone(leaves):
        out = torch.cat([leaves[r][0] for r in range(N)])
        return {r: [out] for r in range(N)}

    got = local_grads(inputs[R], lambda xs: [hvd.allgather(xs[0])], weights[R])
    assert_close(got, reference_grads(inputs, everyone, weights, factor=1 / N))


def test_grouped_allgather_gradient():
    row_shapes = [(2,), (3, 1)]
    inputs = {r: [data(r, (rows_of(r, i), *s), salt=i) for i, s in enumerate(row_shapes)]
              for r in range(N)}
    totals = [sum(rows_of(r, i) for r in range(N)) for i in range(len(row_shapes))]
    weights = {r: [weight(r, (t, *s), salt=i)
                   for i, (t, s) in enumerate(zip(totals, row_shapes))] for r in range(N)}

    def everyone(leaves):
        out = [torch.cat([leaves[r][i] for r in range(N)]) for i in range(len(row_shapes))]
        return {r: out for r in range(N)}

    got = local_grads(inputs[R], hvd.grouped_allgather, weights[R])
    assert_close(got, reference_grads(inputs, everyone, weights, factor=1 / N))


@pytest.mark.parametrize("root", sorted({0, N - 1}))
def test_broadcast_gradient_goes_to_the_root_only(root):
    inputs = {r: [data(r, (2, 2))] for r in range(N)}
    weights = {r: [weight(r, (2, 2))] for r in range(N)}

    def everyone(leaves):
        return {r: [leaves[root][0] * 1.0] for r in range(N)}

    got = local_grads(inputs[R], lambda xs: [hvd.broadcast(xs[0], root_rank=root)], weights[R])
    assert_close(got, reference_grads(inputs, everyone, weights, factor=1 / N))
    if R != root:
        assert torch.count_nonzero(got[0]) == 0


# ---------------------------------------------------------------- all-to-all

def splits_of(rank):
    return [(rank + i) % 3 + 1 for i in range(N)]  # rows rank sends to member i


def alltoall_reference(leaves):
    pieces = {r: leaves[r][0].split(splits_of(r)) for r in range(N)}
    return {r: [torch.cat([pieces[j][r] for j in range(N)])] for r in range(N)}


@pytest.mark.parametrize("as_tensor", [False, True])
def test_alltoall_gradient_with_explicit_splits(as_tensor):
    inputs = {r: [data(r, (sum(splits_of(r)), 2))] for r in range(N)}
    received = [splits_of(j)[R] for j in range(N)]
    weights = {r: [weight(r, (sum(splits_of(j)[r] for j in range(N)), 2))] for r in range(N)}
    splits = torch.tensor(splits_of(R), dtype=torch.int32) if as_tensor else splits_of(R)

    def run(xs):
        out, got_splits = hvd.alltoall(xs[0], splits=splits)
        assert got_splits.tolist() == received and not got_splits.requires_grad
        return [out]

    got = local_grads(inputs[R], run, weights[R])
    assert_close(got, reference_grads(inputs, alltoall_reference, weights))


def test_alltoall_gradient_with_even_division():
    inputs = {r: [data(r, (2 * N, 3))] for r in range(N)}
    weights = {r: [weight(r, (2 * N, 3))] for r in range(N)}

    def everyone(leaves):
        pieces = {r: leaves[r][0].split(2) for r in range(N)}
        return {r: [torch.cat([pieces[j][r] for j in range(N)])] for r in range(N)}

    got = local_grads(inputs[R], lambda xs: [hvd.alltoall(xs[0])], weights[R])
    assert_close(got, reference_grads(inputs, everyone, weights))


# ---------------------------------------------------------------- reduce-scatter

def scatter_rows(dim0, k):
    return [dim0 // k + (1 if i < dim0 % k else 0) for i in range(k)]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("pre,post", SCALES)
def test_reducescatter_gradient_with_uneven_rows(op, pre, post):
    dim0 = 2 * N + 1
    rows = scatter_rows(dim0, N)
    inputs = {r: [data(r, (dim0, 2))] for r in range(N)}
    weights = {r: [weight(r, (rows[r], 2))] for r in range(N)}

    def everyone(leaves):
        total = reduced([leaves[r][0] * pre for r in range(N)], op) * post
        return {r: [part] for r, part in enumerate(total.split(rows))}

    got = local_grads(inputs[R], lambda xs: [hvd.reducescatter(
        xs[0], op=op, prescale_factor=pre, postscale_factor=post)], weights[R])
    assert_close(got, reference_grads(inputs, everyone, weights, factor=N))


@pytest.mark.parametrize("op", OPS)
def test_grouped_reducescatter_gradient(op):
    dims = [N + 1, 3 * N]
    inputs = {r: [data(r, (d, 2), salt=i) for i, d in enumerate(dims)] for r in range(N)}
    weights = {r: [weight(r, (scatter_rows(d, N)[r], 2), salt=i) for i, d in enumerate(dims)]
               for r in range(N)}

    def everyone(leaves):
        parts = [reduced([leaves[r][i] for r in range(N)], op).split(scatter_rows(d, N))
                 for i, d in enumerate(dims)]
        return {r: [p[r] for p in parts] for r in range(N)}

    got = local_grads(inputs[R], lambda xs: hvd.grouped_reducescatter(xs, op=op), weights[R])
    assert_close(got, reference_grads(inputs, everyone, weights, factor=N))


# ---------------------------------------------------------------- P-Reduce, process sets

@pytest.mark.parametrize("op", OPS)
def test_partial_allreduce_gradient_over_a_subgroup(op):
    """Evens and odds reduce separately; each group's objective involves its members only."""
    mine = tuple(r for r in range(N) if r % 2 == R % 2)
    inputs = {r: [data(r, (3,))] for r in mine}
    weights = {r: [weight(r, (3,))] for r in mine}

    def members(leaves):
        out = reduced([leaves[r][0] for r in mine], op)
        return {r: [out] for r in mine}

    got = local_grads(inputs[R], lambda xs: [hvd.partial_allreduce(xs[0], iter(mine), op=op)],
                      weights[R])
    assert_close(got, reference_grads(inputs, members, weights))


def test_collectives_over_a_process_set():
    members = list(range((N + 1) // 2))
    process_set = hvd.add_process_set(members) if len(members) < N else hvd.global_process_set
    try:
        if R in members:
            check_collectives_over(process_set, members)
    finally:  # other modules of the same job register sets of these ranks
        hvd.remove_process_set(process_set)


def check_collectives_over(process_set, members):
    """The gradients of the four collectives over ``process_set`` (on a member)."""
    k = len(members)
    inputs = {r: [data(r, (2,)), data(r, (rows_of(r), 2), salt=1), data(r, (2 * k + 1,), 2)]
              for r in members}
    total = sum(rows_of(r) for r in members)
    rows = scatter_rows(2 * k + 1, k)
    weights = {r: [weight(r, (2,)), weight(r, (total, 2), 1), weight(r, (2,), 2),
                   weight(r, (rows[i],), 3)] for i, r in enumerate(members)}

    def run(xs):
        return [hvd.allreduce(xs[0], op=hvd.Sum, process_set=process_set),
                hvd.allgather(xs[1], process_set=process_set),
                hvd.broadcast(xs[0], root_rank=members[-1], process_set=process_set),
                hvd.reducescatter(xs[2], process_set=process_set)]

    got = local_grads(inputs[R], run, weights[R])
    expected = [torch.zeros_like(x) for x in inputs[R]]

    def add(i, w, everyone, factor):
        """Add the reference gradient of input ``i`` through one collective, weighted by
        weight ``w``, with that collective's Horovod factor."""
        picked = {r: [inputs[r][i]] for r in members}
        only = {r: [weights[r][w]] for r in members}
        expected[i] += reference_grads(picked, everyone, only, factor)[0]

    add(0, 0, lambda lv: {r: [reduced([lv[j][0] for j in members], hvd.Sum)]
                          for r in members}, 1.0)
    add(1, 1, lambda lv: {r: [torch.cat([lv[j][0] for j in members])] for r in members}, 1 / k)
    add(0, 2, lambda lv: {r: [lv[members[-1]][0] * 1.0] for r in members}, 1 / k)
    add(2, 3, lambda lv: {r: [part] for r, part in zip(members, reduced(
        [lv[j][0] for j in members], hvd.Average).split(rows))}, float(k))
    assert_close(got, expected)


# ---------------------------------------------------------------- the plain path

@pytest.mark.parametrize("name", ["allreduce", "allgather", "broadcast", "alltoall",
                                  "reducescatter", "partial_allreduce"])
def test_inputs_without_grad_take_the_plain_path(name, monkeypatch):
    from ripples.torch import mpi_ops

    def refuse(*args):
        raise AssertionError("the autograd path ran for an input that needs no gradient")

    for function in ("_GroupedAllreduce", "_GroupedAllgather", "_Broadcast", "_Alltoall",
                     "_GroupedReducescatter", "_PartialAllreduce"):
        monkeypatch.setattr(getattr(mpi_ops, function), "apply", staticmethod(refuse))
    calls = {
        "allreduce": lambda t: hvd.allreduce(t),
        "allgather": lambda t: hvd.allgather(t),
        "broadcast": lambda t: hvd.broadcast(t, root_rank=0),
        "alltoall": lambda t: hvd.alltoall(t),
        "reducescatter": lambda t: hvd.reducescatter(t),
        "partial_allreduce": lambda t: hvd.partial_allreduce(t, range(N)),
    }
    x = data(R, (N, 2))
    plain_result = calls[name](x)
    assert plain_result.grad_fn is None and not plain_result.requires_grad
    with torch.no_grad():
        assert calls[name](x.clone().requires_grad_()).grad_fn is None
    assert hvd.grouped_allreduce([x, x])[0].grad_fn is None
    assert hvd.grouped_allgather([x])[0].grad_fn is None
    assert hvd.grouped_reducescatter([x])[0].grad_fn is None
