"""Gradient buckets of DistributedOptimizer (sync="allreduce") under mpiexec.

Run by tests/test_buckets_mpi.py at 2 and 3 ranks with RIPPLES_BUCKET_BYTES=65536 (so the
small models below span several buckets) and RIPPLES_TIMEOUT_S=3.
"""
import json
import time

import pytest
import torch

import ripples.torch as hvd
from ripples.core.errors import RipplesTimeoutError
from ripples.runtime import current

hvd.init()
R, N = hvd.rank(), hvd.size()
LR = 0.1


class SlowBackward(torch.autograd.Function):
    """Identity whose backward sleeps: the input end of the model is slow to differentiate."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        time.sleep(0.3)
        return grad


def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 128), torch.nn.ReLU(),
                               torch.nn.Linear(128, 128), torch.nn.ReLU(),
                               torch.nn.Linear(128, 4))


def batch(rank, step=0):
    generator = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(8, 16, generator=generator), torch.randint(0, 4, (8,), generator=generator)


def loss_of(model, x, y):
    return torch.nn.functional.cross_entropy(model(x), y)


def local_grads(model, rank, step=0):
    model.zero_grad()
    loss_of(model, *batch(rank, step)).backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    return grads


def storage(tensor):
    return tensor.untyped_storage().data_ptr()


def test_gradients_are_views_of_buckets_and_hold_the_average():
    model = make_model()
    reference = make_model()
    expected = [sum(g) / N for g in zip(*(local_grads(reference, r) for r in range(N)))]
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                                   named_parameters=model.named_parameters())
    loss_of(model, *batch(R)).backward()
    # Averaged by the time backward returns: nothing to unpack, nothing left for step().
    for p, e in zip(model.parameters(), expected):
        assert torch.allclose(p.grad, e, atol=1e-6)
    buckets = {storage(p.grad) for p in model.parameters()}
    assert 1 < len(buckets) < len(list(model.parameters()))  # 64 KiB buckets: several, fused
    before = [p.detach().clone() for p in model.parameters()]
    opt.step()
    for p, b, e in zip(model.parameters(), before, expected):
        assert torch.allclose(p, b - LR * e, atol=1e-6)
    opt.zero_grad()
    loss_of(model, *batch(R, 1)).backward()  # a fresh gradient goes into the same buckets
    assert {storage(p.grad) for p in model.parameters()} == buckets
    opt.step()
    opt.close()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_16_bit_models_gradients_are_bucket_views_equal_to_the_by_name_average(dtype):
    """A model trained in bfloat16/float16 on the host: its gradients live in buckets too
    (summed with float32 accumulation, rounded once), bit for bit what the by-name path
    (``hvd.allreduce`` of each local gradient) gives."""
    model = make_model().to(dtype)
    reference = make_model().to(dtype)
    x, y = batch(R)
    loss_of(reference, x.to(dtype), y).backward()
    expected = [hvd.allreduce(p.grad, name=f"by_name.{dtype}.{i}")
                for i, p in enumerate(reference.parameters())]
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                                   named_parameters=model.named_parameters())
    loss_of(model, x.to(dtype), y).backward()
    for p, e in zip(model.parameters(), expected):
        assert p.grad.dtype == dtype and torch.equal(p.grad, e)
    buckets = {storage(p.grad) for p in model.parameters()}
    assert len(buckets) < len(list(model.parameters()))  # views of shared buckets
    opt.step()
    opt.zero_grad()
    x, y = batch(R, 1)
    loss_of(model, x.to(dtype), y).backward()  # a fresh gradient goes into the same buckets
    assert {storage(p.grad) for p in model.parameters()} == buckets
    opt.step()
    opt.close()


def test_a_bucket_is_reduced_while_backward_is_still_running(tmp_path):
    """Overlap, from timeline events: the first bucket's all-reduce starts before the
    backward pass ends (the input end of the model is slow to differentiate)."""
    path = str(tmp_path / "overlap.json") if R == 0 else ""
    path = hvd.broadcast_object(path, 0)
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                                   named_parameters=model.named_parameters())
    hvd.start_timeline(path)
    x, y = batch(R)
    loss = torch.nn.functional.cross_entropy(model(SlowBackward.apply(x.requires_grad_())), y)
    timeline = current().timeline
    loss.backward()
    end = timeline.now()
    timeline.complete("backward", "compute", end, 0.0)
    opt.step()
    opt.close()
    hvd.stop_timeline()
    if R == 0:
        events = json.loads(open(path).read())
        events = events["traceEvents"] if isinstance(events, dict) else events
        mine = [e for e in events if e.get("pid") == 0 and e.get("ph") == "X"]
        backward_end = next(e["ts"] for e in mine if e["name"] == "backward")
        buckets = sorted((e for e in mine if "bucket" in e.get("args", {})),
                         key=lambda e: e["ts"])
        assert len(buckets) >= 2
        assert buckets[0]["args"]["bucket"] == 0
        assert "4.weight" in buckets[0]["args"]["names"]  # the last layer's come first
        assert buckets[0]["ts"] < backward_end - 100_000  # in the 0.3 s the input end takes


def test_unfreezing_a_layer_re_agrees_the_plan():
    model = make_model(seed=1)
    model[0].requires_grad_(False)
    reference = make_model(seed=1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                                   named_parameters=model.named_parameters())
    loss_of(model, *batch(R)).backward()
    opt.step()
    assert model[0].weight.grad is None
    with torch.no_grad():
        for p, q in zip(reference.parameters(), model.parameters()):
            p.copy_(q)
    model[0].requires_grad_(True)  # every rank unfreezes at the same step
    expected = [sum(g) / N for g in zip(*(local_grads(reference, r, 1) for r in range(N)))]
    opt.zero_grad()
    loss_of(model, *batch(R, 1)).backward()
    opt.step()  # the newcomers are averaged by name this step, then the plan is re-agreed
    for p, e in zip(model.parameters(), expected):
        assert torch.allclose(p.grad, e, atol=1e-6)
    opt.zero_grad()
    loss_of(model, *batch(R, 2)).backward()
    # In a bucket now: the two gradients are views of one buffer (by name they are not).
    assert storage(model[0].weight.grad) == storage(model[0].bias.grad)
    opt.step()
    opt.close()


def test_ranks_that_joined_contribute_nothing_to_the_average():
    """Horovod's join(): the last rank joins at once, the others train two more steps on
    gradients averaged over the ranks still training."""
    model = make_model()
    reference = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                                   named_parameters=model.named_parameters())
    if R == N - 1:
        assert hvd.join() in range(N - 1)
    else:
        active = N - 1
        for step in range(2):
            expected = [sum(g) / active for g in zip(*(local_grads(reference, r, step)
                                                       for r in range(active)))]
            opt.zero_grad()
            loss_of(model, *batch(R, step)).backward()
            for p, e in zip(model.parameters(), expected):
                assert torch.allclose(p.grad, e, atol=1e-6)
            opt.step()
            with torch.no_grad():
                for p, q in zip(reference.parameters(), model.parameters()):
                    p.copy_(q)
        assert hvd.join() in range(N - 1)
    # Every rank is in step again: one more step on the full group.
    opt.zero_grad()
    loss_of(model, *batch(R, 5)).backward()
    opt.step()
    opt.close()


def test_a_rank_that_stops_mid_training_fails_every_waiting_rank():
    """The last rank stops stepping: every other rank raises RipplesTimeoutError naming the
    collective and the group, within the timeout, instead of hanging."""
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                                   named_parameters=model.named_parameters())
    timeout = current().config.timeout_s
    if R != N - 1:
        start = time.monotonic()
        with pytest.raises(RipplesTimeoutError) as info:
            loss_of(model, *batch(R)).backward()
            opt.step()
        assert time.monotonic() - start < 2 * timeout + 2
        message = str(info.value)
        assert "allreduce" in message and str(tuple(range(N))) in message
        with pytest.raises(RipplesTimeoutError):  # the optimizer stays failed, not hung
            opt.step()
    else:
        time.sleep(timeout + 1.0)
    hvd.barrier()
