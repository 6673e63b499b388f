"""hvd.SyncBatchNorm against torch's BatchNorm on the concatenation of every member's batch.

Run by tests/test_conformance_mpi.py under mpiexec at 1, 2 and 4 ranks. Every rank
builds every member's batch from a per-rank seed, so each one computes the single-process
reference locally; float64 keeps the comparison tight. The reference loss is the sum of the
members' losses, whose weight and bias gradients are the sum of the members' local ones.
"""
import copy

import pytest
import torch

import ripples.torch as hvd

hvd.init()
R, N = hvd.rank(), hvd.size()
C = 3
TIGHT = dict(rtol=1e-10, atol=1e-10)

SHAPES = [pytest.param(torch.nn.BatchNorm1d, (C,), id="2-D"),
          pytest.param(torch.nn.BatchNorm1d, (C, 5), id="3-D"),
          pytest.param(torch.nn.BatchNorm2d, (C, 3, 4), id="4-D"),
          pytest.param(torch.nn.BatchNorm3d, (C, 2, 3, 2), id="5-D")]


@pytest.fixture(scope="module")
def halves():
    """The even and the odd ranks' process sets, registered for this module's tests and
    removed after them (other modules of the same job register sets of these ranks). At
    one rank the even ranks are the world, which is registered already (as in Horovod)."""
    evens = hvd.add_process_set(list(range(0, N, 2))) if N > 1 else hvd.global_process_set
    odds = hvd.add_process_set(list(range(1, N, 2))) if N > 1 else None
    yield evens, odds
    for process_set in (evens, odds):
        if process_set is not None:
            hvd.remove_process_set(process_set)


def uneven_rows(rank, step):
    return 2 + (3 * rank + step) % 4


def data(rank, rows, shape, seed, dtype=torch.float64, offset=3.0):
    generator = torch.Generator().manual_seed(seed * 1000 + rank)
    return torch.randn(rows, *shape, generator=generator, dtype=torch.float64).mul(2).add(
        offset).to(dtype)


def mine(full, ranks, rows):
    """This rank's rows of a tensor concatenated over ``ranks`` (rows[i] each)."""
    start = sum(rows[:ranks.index(R)])
    return full[start:start + rows[ranks.index(R)]]


def sum_over(tensor, process_set):
    return hvd.allreduce(tensor, op=hvd.Sum, process_set=process_set)


def compare_training(bn_class, shape, process_set=hvd.global_process_set, steps=3,
                     rows_of=uneven_rows, eval_after=True, **options):
    """Train a SyncBatchNorm and a BatchNorm (on the members' concatenated batches) side by
    side for ``steps`` steps and check everything that must match."""
    ranks = process_set.ranks
    sync = hvd.SyncBatchNorm(C, process_set=process_set, **options).double()
    ref = bn_class(C, **options).double()
    if sync.affine:
        with torch.no_grad():
            for module in (sync, ref):
                module.weight.copy_(torch.linspace(0.5, 1.5, C, dtype=torch.float64))
                module.bias.copy_(torch.linspace(-1.0, 1.0, C, dtype=torch.float64))
    for step in range(steps):
        rows = [rows_of(r, step) for r in ranks]
        inputs = [data(r, n, shape, step) for r, n in zip(ranks, rows)]
        upstream = torch.cat([data(r, n, shape, 100 + step) for r, n in zip(ranks, rows)])
        x = mine(torch.cat(inputs), ranks, rows).clone().requires_grad_()
        full = torch.cat(inputs).requires_grad_()
        for module in (sync, ref):
            module.zero_grad()

        out = sync(x)
        (out * mine(upstream, ranks, rows)).sum().backward()
        expected = ref(full)
        (expected * upstream).sum().backward()

        assert out.shape == x.shape and out.dtype == x.dtype
        assert torch.allclose(out, mine(expected.detach(), ranks, rows), **TIGHT)
        assert torch.allclose(x.grad, mine(full.grad, ranks, rows), **TIGHT)
        if sync.affine:
            assert torch.allclose(sum_over(sync.weight.grad, process_set), ref.weight.grad, **TIGHT)
            assert torch.allclose(sum_over(sync.bias.grad, process_set), ref.bias.grad, **TIGHT)
        if sync.track_running_stats:
            assert torch.allclose(sync.running_mean, ref.running_mean, **TIGHT)
            assert torch.allclose(sync.running_var, ref.running_var, **TIGHT)
            assert sync.num_batches_tracked.item() == ref.num_batches_tracked.item() == step + 1
        else:
            assert sync.running_mean is None and sync.running_var is None

    if eval_after:
        sync.eval()
        ref.eval()
        rows = [rows_of(r, steps) for r in ranks]
        inputs = [data(r, n, shape, steps) for r, n in zip(ranks, rows)]
        with torch.no_grad():
            assert torch.allclose(sync(mine(torch.cat(inputs), ranks, rows)),
                                  mine(ref(torch.cat(inputs)), ranks, rows), **TIGHT)
    return sync


@pytest.mark.parametrize("bn_class,shape", SHAPES)
def test_matches_batchnorm_on_concatenated_uneven_batches(bn_class, shape):
    compare_training(bn_class, shape)


@pytest.mark.parametrize("options", [dict(momentum=None), dict(affine=False),
                                     dict(track_running_stats=False), dict(momentum=0.5, eps=1e-3)],
                         ids=str)
def test_batchnorm_options(options):
    # Without running statistics, eval mode also normalizes with synchronized batch stats.
    compare_training(torch.nn.BatchNorm2d, (C, 2, 3), **options)


def test_members_with_empty_batches():
    compare_training(torch.nn.BatchNorm1d, (C, 4), rows_of=lambda r, step: 0 if r % 2 else 3)


def test_only_input_requires_no_grad():
    """Weight and bias gradients without an input gradient: no collective in backward."""
    sync = hvd.SyncBatchNorm(C).double()
    ref = torch.nn.BatchNorm1d(C).double()
    rows = [uneven_rows(r, 0) for r in range(N)]
    full = torch.cat([data(r, n, (C, 2), 0) for r, n in enumerate(rows)])
    (sync(mine(full, list(range(N)), rows)) ** 2).sum().backward()
    (ref(full) ** 2).sum().backward()
    assert torch.allclose(sum_over(sync.weight.grad, hvd.global_process_set), ref.weight.grad,
                          **TIGHT)
    assert torch.allclose(sum_over(sync.bias.grad, hvd.global_process_set), ref.bias.grad,
                          **TIGHT)


def test_subset_process_sets_run_side_by_side(halves):
    """Even ranks synchronize among themselves while odd ranks do among theirs."""
    mine_set = halves[0] if R % 2 == 0 else halves[1]
    compare_training(torch.nn.BatchNorm2d, (C, 2, 2), process_set=mine_set)


def test_process_set_of_one_rank_is_plain_batchnorm():
    alone = hvd.ProcessSet([R])
    compare_training(torch.nn.BatchNorm1d, (C, 3), process_set=alone,
                     rows_of=lambda r, step: 4 + r)


def test_non_member_is_refused_with_its_rank(halves):
    evens = halves[0]
    if R in evens.ranks:
        compare_training(torch.nn.BatchNorm1d, (C,), process_set=evens, steps=1,
                         eval_after=False)
        return
    sync = hvd.SyncBatchNorm(C, process_set=evens)
    with pytest.raises(ValueError, match=rf"rank {R} is not a member of its process_set"):
        sync(torch.randn(4, C))
    sync.eval()  # running statistics need no members: evaluating alone is allowed
    assert torch.equal(sync(torch.zeros(2, C)), torch.zeros(2, C))


def test_eval_with_running_stats_does_not_communicate():
    sync = hvd.SyncBatchNorm(C).double().eval()
    ref = torch.nn.BatchNorm1d(C).double().eval()
    with torch.no_grad():
        for module in (sync, ref):
            module.running_mean.fill_(2.0)
            module.running_var.fill_(4.0)
    if R == 0:  # a collective here would wait for ranks that never call it
        x = data(0, 5, (C,), 7)
        assert torch.allclose(sync(x), ref(x), **TIGHT)
    hvd.barrier()


def test_float32_with_a_large_mean_stays_accurate():
    rows = [uneven_rows(r, 0) for r in range(N)]
    full = torch.cat([data(r, n, (C, 8), 0, offset=1e4) for r, n in enumerate(rows)])
    sync = hvd.SyncBatchNorm(C)
    out = sync(mine(full, list(range(N)), rows).float())
    expected = torch.nn.BatchNorm1d(C).double()(full)
    assert out.dtype == torch.float32
    assert torch.allclose(out.double(), mine(expected, list(range(N)), rows), atol=2e-3)
    assert torch.allclose(sync.running_mean.double(), full.mean(dim=(0, 2)) * 0.1, rtol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_inputs_with_float32_parameters(dtype):
    """As BatchNorm: output and input gradient in the input's dtype, parameters' in theirs."""
    ranks, rows = list(range(N)), [uneven_rows(r, 0) for r in range(N)]
    full = torch.cat([data(r, n, (C, 4), 0) for r, n in enumerate(rows)]).to(dtype).double()
    x = mine(full, ranks, rows).to(dtype).requires_grad_()
    sync = hvd.SyncBatchNorm(C)
    out = sync(x)
    out.float().pow(2).sum().backward()
    full.requires_grad_()
    ref = torch.nn.BatchNorm1d(C).double()
    ref(full).pow(2).sum().backward()
    assert out.dtype == x.grad.dtype == dtype and sync.weight.grad.dtype == torch.float32
    loose = dict(rtol=0.02, atol=0.05)
    assert torch.allclose(out.double(), mine(ref(full.detach()), ranks, rows), **loose)
    assert torch.allclose(x.grad.double(), mine(full.grad, ranks, rows), **loose)


def test_bad_input_names_the_argument_and_rank():
    sync = hvd.SyncBatchNorm(C)
    with pytest.raises(ValueError, match=rf"rank {R}: input must be at least 2-D"):
        sync(torch.randn(C))
    with pytest.raises(ValueError, match=rf"rank {R}: input has 4 channels.*num_features=3"):
        sync(torch.randn(2, 4))
    with pytest.raises(TypeError, match="process_set"):
        hvd.SyncBatchNorm(C, process_set=[0])


def test_one_value_per_channel_in_total_is_refused_on_every_member():
    sync = hvd.SyncBatchNorm(C)
    with pytest.raises(ValueError, match="(?i)more than 1 value per channel"):
        sync(torch.randn(1 if R == 0 else 0, C))
    # The refusal came after the exchange on every member: the module still works.
    assert sync(torch.randn(2, C)).shape == (2, C)


def test_training_with_distributed_optimizer_matches_one_process():
    """A converted model trained with DistributedOptimizer (gradients averaged over ranks)
    follows one process training on the concatenated batches with the loss averaged over
    ranks; every replica stays identical."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(2, C, 1), torch.nn.BatchNorm2d(C),
                                torch.nn.Flatten(), torch.nn.Linear(C * 4, 1)).double()
    reference = copy.deepcopy(model)
    model = hvd.SyncBatchNorm.convert_sync_batchnorm(model)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    ranks = list(range(N))
    for step in range(3):
        rows = [uneven_rows(r, step) for r in ranks]
        inputs = [data(r, n, (2, 2, 2), step) for r, n in zip(ranks, rows)]
        opt.zero_grad()
        model(inputs[R]).pow(2).sum().backward()
        opt.step()
        ref_opt.zero_grad()
        (reference(torch.cat(inputs)).pow(2).sum() / N).backward()
        ref_opt.step()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert torch.allclose(p, q, **TIGHT), name
    assert torch.allclose(model[1].running_var, reference[1].running_var, **TIGHT)


def test_convert_sync_batchnorm_shares_parameters_and_matches(halves):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(2, C, 1), torch.nn.BatchNorm2d(C),
                                torch.nn.ReLU(), torch.nn.Sequential(torch.nn.BatchNorm2d(C)))
    model = model.double()
    reference = copy.deepcopy(model)
    original = model[1]
    converted = hvd.SyncBatchNorm.convert_sync_batchnorm(model, process_set=hvd.global_process_set)
    assert converted is model
    norms = [converted[1], converted[3][0]]
    assert all(type(m) is hvd.SyncBatchNorm for m in norms)
    assert norms[0].weight is original.weight and norms[0].running_mean is original.running_mean
    rows = [uneven_rows(r, 0) for r in range(N)]
    full = torch.cat([data(r, n, (2, 3, 3), 0) for r, n in enumerate(rows)])
    out = converted(mine(full, list(range(N)), rows))
    assert torch.allclose(out, mine(reference(full), list(range(N)), rows), **TIGHT)
    assert torch.allclose(norms[1].running_var, reference[3][0].running_var, **TIGHT)
    assert converted.state_dict().keys() == reference.state_dict().keys()

    bare = torch.nn.BatchNorm1d(C, momentum=None, affine=False).eval()
    single = hvd.SyncBatchNorm.convert_sync_batchnorm(bare, process_set=halves[0])
    assert isinstance(single, hvd.SyncBatchNorm) and single.process_set is halves[0]
    assert single.momentum is None and not single.affine and not single.training
    assert single.running_mean is bare.running_mean
