"""FlatParameters: tensors moved into one flat buffer per dtype, each ``.data`` a view."""
import copy

import pytest
import torch

from ripples.torch.flat_parameters import FlatParameters


class Mixed(torch.nn.Module):
    """float32 layers with BatchNorm buffers, plus one float64 parameter."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(5, 4)
        self.bn = torch.nn.BatchNorm1d(4)
        self.fc2 = torch.nn.Linear(4, 3)
        self.scale = torch.nn.Parameter(torch.rand(3, dtype=torch.float64))

    def forward(self, x):
        return self.fc2(torch.relu(self.bn(self.fc1(x)))).double() * self.scale


def make_model(seed=0):
    torch.manual_seed(seed)
    model = Mixed()
    with torch.no_grad():  # statistics that are not the defaults, so moving them shows
        model.bn.running_mean.uniform_()
        model.bn.running_var.uniform_(0.5, 2.0)
    return model


def averaged(model):
    return list(model.named_parameters()) + [
        (n, b) for n, b in model.named_buffers() if b.dtype.is_floating_point]


def views(tensor, buffer):
    start = buffer.data_ptr()
    end = start + buffer.numel() * buffer.element_size()
    return (tensor.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()
            and start <= tensor.data_ptr() < end)


def assert_laid_out(model, flat):
    for name, tensor in averaged(model):
        assert sum(views(tensor, b) for b in flat.buffers) == 1, name
    assert flat.stale() is None


def train(model, optimizer, steps, seed=1):
    gen = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.randn(8, 5, generator=gen)).square().mean().backward()
        optimizer.step()


def test_values_objects_and_outputs_are_unchanged():
    model = make_model()
    x = torch.randn(6, 5)
    model.eval()
    before = model(x)
    tensors = [t for _, t in averaged(model)]
    values = [t.clone() for t in tensors]
    flat = FlatParameters(averaged(model))
    assert all(a is b for (_, a), b in zip(averaged(model), tensors))  # the same objects
    assert all(torch.equal(t, v) for t, v in zip(tensors, values))
    assert torch.equal(model(x), before)
    assert_laid_out(model, flat)
    assert all(p.is_leaf and p.requires_grad for p in model.parameters())


def test_one_buffer_per_dtype_in_order_of_appearance():
    model = make_model()
    flat = FlatParameters(averaged(model))
    assert averaged(model)[0][0] == "scale"  # a module's own parameters come first
    assert [b.dtype for b in flat.buffers] == [torch.float64, torch.float32]
    float32 = sum(t.numel() for _, t in averaged(model) if t.dtype == torch.float32)
    assert [b.numel() for b in flat.buffers] == [3, float32]
    assert flat.loose == []
    # laid out one after another, in the order given
    offsets = [t.data_ptr() - flat.buffers[1].data_ptr() for _, t in averaged(model)
               if t.dtype == torch.float32]
    assert offsets == sorted(offsets)


@pytest.mark.parametrize("make_optimizer", [
    lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
    lambda params: torch.optim.Adam(params, lr=0.01),
], ids=["sgd-momentum", "adam"])
def test_optimizer_state_keyed_by_parameters_keeps_working(make_optimizer):
    model, reference = make_model(), make_model()
    optimizer, ref_optimizer = make_optimizer(model.parameters()), make_optimizer(
        reference.parameters())
    train(model, optimizer, 2), train(reference, ref_optimizer, 2)
    flat = FlatParameters(averaged(model))  # state already exists, keyed by the parameters
    train(model, optimizer, 3, seed=2), train(reference, ref_optimizer, 3, seed=2)
    assert set(optimizer.state) == set(model.parameters())
    for (name, a), b in zip(averaged(model), [t for _, t in averaged(reference)]):
        assert torch.equal(a, b), name
    assert_laid_out(model, flat)

    # a checkpoint taken, training on, then the checkpoint restored: as if never left
    saved_model = copy.deepcopy(model.state_dict())
    saved_optimizer = copy.deepcopy(optimizer.state_dict())
    train(model, optimizer, 2, seed=3)
    model.load_state_dict(saved_model)
    optimizer.load_state_dict(saved_optimizer)
    assert set(optimizer.state) == set(model.parameters())
    assert_laid_out(model, flat)
    train(model, optimizer, 2, seed=4), train(reference, ref_optimizer, 2, seed=4)
    for (name, a), b in zip(averaged(model), [t for _, t in averaged(reference)]):
        assert torch.equal(a, b), name
    assert_laid_out(model, flat)


def test_model_load_state_dict_copies_into_the_views():
    model, other = make_model(), make_model(seed=5)
    flat = FlatParameters(averaged(model))
    pointers = [b.data_ptr() for b in flat.buffers]
    model.load_state_dict(other.state_dict())
    for (name, a), (_, b) in zip(averaged(model), averaged(other)):
        assert torch.equal(a, b), name
    assert [b.data_ptr() for b in flat.buffers] == pointers
    assert_laid_out(model, flat)
    # and the flat buffers hold the loaded values
    assert torch.equal(flat.buffers[0], other.scale.detach())


def test_odd_tensors_stay_loose_and_keep_their_memory():
    torch.manual_seed(0)
    backing = torch.randn(20)
    odd = {
        "transposed": torch.nn.Parameter(torch.randn(3, 4).t()),  # not contiguous
        "sparse": torch.nn.Parameter(torch.randn(4, 3).to_sparse()),
        "slice": torch.nn.Parameter(backing[5:10]),  # shares memory with `backing`
    }
    plain = [("plain", torch.nn.Parameter(torch.randn(6)))]
    shared = torch.randn(8)
    overlapping = [("first", shared[0:5]), ("second", shared[3:8])]
    named = plain + list(odd.items()) + overlapping
    pointers = {n: t.data_ptr() if not t.is_sparse else None for n, t in named}
    values = {n: t.detach().clone() for n, t in named}
    flat = FlatParameters(named)
    assert [b.numel() for b in flat.buffers] == [6]
    assert {id(t) for t in flat.loose} == {id(t) for n, t in named if n != "plain"}
    for name, tensor in named:
        assert torch.equal(tensor.detach().to_dense(), values[name].to_dense()), name
        if name != "plain" and pointers[name] is not None:
            assert tensor.data_ptr() == pointers[name], name
    backing[5] = 42.0
    assert odd["slice"][0].item() == 42.0  # the link to its storage is kept


def test_tensors_of_an_earlier_layout_move_to_a_new_one():
    model = make_model()
    first = FlatParameters(averaged(model))
    second = FlatParameters(averaged(model))
    assert second.loose == []
    assert_laid_out(model, second)
    assert first.stale() is not None


def test_replaced_data_is_stale_and_a_new_layout_takes_the_rest_along():
    model = make_model()
    flat = FlatParameters(averaged(model))
    with torch.no_grad():
        model.fc1.bias.copy_(torch.ones(4))  # in place: still in its slice
        model.fc2.weight.add_(1.0)
    assert flat.stale() is None
    model.fc2.bias.data = model.fc2.bias.data.clone()
    assert flat.stale() == "fc2.bias"
    relaid = FlatParameters(averaged(model), previous=flat)
    assert relaid.loose == []
    assert_laid_out(model, relaid)
    assert torch.equal(model.fc1.bias, torch.ones(4))


def test_model_to_float64_is_noticed_and_laid_out_again():
    model = make_model()
    flat = FlatParameters(averaged(model))
    x = torch.randn(3, 5, dtype=torch.float64)
    model.to(torch.float64)
    assert flat.stale() == "fc1.weight"
    model.eval()
    expected = model(x)
    relaid = FlatParameters(averaged(model), previous=flat)
    assert [b.dtype for b in relaid.buffers] == [torch.float64]
    assert_laid_out(model, relaid)
    assert torch.equal(model(x), expected)


def test_empty_tensors_and_empty_input():
    named = [("empty", torch.nn.Parameter(torch.empty(0, 3))),
             ("w", torch.nn.Parameter(torch.arange(4.0)))]
    flat = FlatParameters(named)
    assert [b.tolist() for b in flat.buffers] == [[0.0, 1.0, 2.0, 3.0]]
    assert flat.stale() is None
    assert named[0][1].shape == (0, 3)
    nothing = FlatParameters([])
    assert nothing.buffers == [] and nothing.loose == [] and nothing.stale() is None
