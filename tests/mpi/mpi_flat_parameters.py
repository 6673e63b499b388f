"""Decentralized modes on flat parameter buffers, on real ranks: every sync leaves each
member holding exactly the mean of the group's values (checked against the values gathered
with plain mpi4py), with one in-place P-Reduce per flat buffer and no fusion-buffer copy."""
import numpy as np
import pytest
import torch
from mpi4py import MPI

import ripples.torch as hvd
from ripples.runtime import current

hvd.init()
R, N = hvd.rank(), hvd.size()

MODES = [dict(sync="ripples", schedule="static"),
         dict(sync="ripples", schedule="generator", group_size=N),
         dict(sync="ripples", schedule="generator", group_size=2),
         dict(sync="adpsgd-sync")]
MODE_IDS = ["static", "generator", "generator-pairs", "adpsgd-sync"]


class Net(torch.nn.Module):
    """float32 layers with BatchNorm buffers and a float64 parameter."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(5, 4)
        self.bn = torch.nn.BatchNorm1d(4)
        self.fc2 = torch.nn.Linear(4, 3)
        self.scale = torch.nn.Parameter(torch.ones(3, dtype=torch.float64))

    def forward(self, x):
        return self.fc2(torch.relu(self.bn(self.fc1(x)))).double() * self.scale


def averaged(model):
    return list(model.named_parameters()) + [
        (n, b) for n, b in model.named_buffers() if b.dtype.is_floating_point]


def wrap(model, mode, optimizer=None):
    optimizer = optimizer or torch.optim.SGD(model.parameters(), lr=0.1)
    return hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                    model=model, **mode)


def record_groups(opt):
    """Make ``opt`` remember every ``(seq, group)`` its schedule gives."""
    seen = []
    inner = opt.schedule.groups_for_step

    def groups_for_step(step):
        assignments = inner(step)
        seen.extend(assignments)
        return assignments

    opt.schedule.groups_for_step = groups_for_step
    return seen


def set_values(model, round_):
    """Integers congruent modulo 6 across ranks: the sum over any group of 1 to 3 ranks is
    exact and divisible by the group's size, so every mean is exact in float32."""
    gen = torch.Generator().manual_seed(round_)
    with torch.no_grad():
        for _, tensor in averaged(model):
            base = torch.randint(-50, 50, tensor.shape, generator=gen)
            mine = torch.randint(-20, 20, tensor.shape,
                                 generator=torch.Generator().manual_seed(1000 * round_ + R))
            tensor.copy_(base + 6 * mine)


def expected_after(before, assignments):
    """Every rank's values after running every rank's ``(seq, group)`` in ``seq`` order,
    each group's members replaced by their mean (computed in float64)."""
    values = [[np.asarray(v, dtype=np.float64) for v in rank_values] for rank_values in before]
    for seq, group in sorted(set(assignments)):
        for index in range(len(values[0])):
            mean = sum(values[r][index] for r in group) / len(group)
            for r in group:
                values[r][index] = mean
    return values


def gathered_step(model, opt, seen, round_):
    """One step with no gradients (so only the P-Reduce changes values); returns this
    rank's values before and after it and what every rank's should be after it."""
    set_values(model, round_)
    before = [t.detach().numpy().copy() for _, t in averaged(model)]
    seen.clear()
    opt.step()
    after = [t.detach().numpy().copy() for _, t in averaged(model)]
    everyone_before = MPI.COMM_WORLD.allgather(before)
    everyone_groups = MPI.COMM_WORLD.allgather(list(seen))
    expected = expected_after(everyone_before, [a for g in everyone_groups for a in g])[R]
    return after, expected


def assert_exact(model, after, expected):
    for (name, tensor), got, want in zip(averaged(model), after, expected):
        assert np.array_equal(got, want.astype(got.dtype)), (name, got, want)


def assert_views(model, opt):
    flat = opt.flat
    loose = {id(t) for t in flat.loose}
    for name, tensor in averaged(model):
        if id(tensor) in loose:
            continue
        owners = [b for b in flat.buffers
                  if tensor.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()]
        assert len(owners) == 1, name
    assert flat.stale() is None


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_each_sync_is_the_exact_mean_and_copies_nothing(mode):
    torch.manual_seed(0)
    model = Net()
    opt = wrap(model, mode)
    seen = record_groups(opt)
    flat = opt.flat
    assert [b.dtype for b in flat.buffers] == [torch.float64, torch.float32]
    assert flat.loose == []
    pointers = [b.data_ptr() for b in flat.buffers]
    rt = current()
    fusion_gets = []
    get = rt.buffers.get
    rt.buffers.get = lambda *args, **kwargs: fusion_gets.append(args) or get(*args, **kwargs)
    try:
        synced = 0
        for round_ in range(4):
            after, expected = gathered_step(model, opt, seen, round_)
            assert_exact(model, after, expected)
            synced += sum(len(group) > 1 for _, group in seen)
    finally:
        rt.buffers.get = get
    assert fusion_gets == []  # every flat buffer went to MPI where it lies
    assert opt.flat is flat and [b.data_ptr() for b in flat.buffers] == pointers
    assert_views(model, opt)
    assert MPI.COMM_WORLD.allreduce(synced) > 0  # some rank averaged with another
    opt.close()


def test_loose_tensors_are_averaged_too():
    torch.manual_seed(0)
    model = Net()
    model.odd = torch.nn.Parameter(torch.zeros(4, 3).t())  # not contiguous: stays loose
    opt = wrap(model, MODES[0])
    assert len(opt.flat.loose) == 1 and opt.flat.loose[0] is model.odd
    seen = record_groups(opt)
    for round_ in range(2):
        after, expected = gathered_step(model, opt, seen, round_)
        assert_exact(model, after, expected)
    assert not model.odd.is_contiguous()
    assert_views(model, opt)
    opt.close()


@pytest.mark.parametrize("mode", [MODES[0], MODES[3]], ids=["static", "adpsgd-sync"])
def test_model_converted_after_wrapping_keeps_being_averaged(mode):
    torch.manual_seed(0)
    model = Net()
    opt = wrap(model, mode)
    seen = record_groups(opt)
    after, expected = gathered_step(model, opt, seen, 0)
    assert_exact(model, after, expected)
    model.to(torch.float64)  # parameters get new .data, BatchNorm new buffer objects
    for round_ in range(1, 3):
        after, expected = gathered_step(model, opt, seen, round_)
        assert all(a.dtype == np.float64 for a in after)
        assert_exact(model, after, expected)
    assert [b.dtype for b in opt.flat.buffers] == [torch.float64]
    assert_views(model, opt)
    opt.close()


@pytest.mark.parametrize("make_optimizer", [
    lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9),
    lambda params: torch.optim.Adam(params, lr=0.01),
], ids=["sgd-momentum", "adam"])
def test_training_with_optimizer_state_matches_a_plain_reference(make_optimizer):
    """Each rank trains a wrapped model and a plain copy on the same batches; the copy is
    averaged here from gathered values over the groups the wrapped run used."""
    torch.manual_seed(0)
    model, reference = Net(), Net()
    reference.load_state_dict(model.state_dict())
    opt = wrap(model, MODES[0], make_optimizer(model.parameters()))
    ref_opt = make_optimizer(reference.parameters())
    seen = record_groups(opt)
    # BatchNorm in training mode makes fc1.bias's gradient rounding noise, which Adam
    # scales up to the learning rate: compare on a model whose gradients all carry signal.
    model.eval(), reference.eval()
    for step in range(4):
        gen = torch.Generator().manual_seed(100 * step + R)
        x = torch.randn(8, 5, generator=gen)
        for m, o in ((model, opt), (reference, ref_opt)):
            o.zero_grad()
            m(x).square().mean().backward()
        seen.clear()
        opt.step()
        ref_opt.step()
        local = [t.detach().numpy().copy() for _, t in averaged(reference)]
        everyone = MPI.COMM_WORLD.allgather(local)
        groups = [a for g in MPI.COMM_WORLD.allgather(list(seen)) for a in g]
        with torch.no_grad():
            for (_, t), value in zip(averaged(reference), expected_after(everyone, groups)[R]):
                t.copy_(torch.from_numpy(value))
        for (name, a), (_, b) in zip(averaged(model), averaged(reference)):
            assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), name
    assert set(opt.state) == set(model.parameters())
    assert_views(model, opt)
    opt.close()
