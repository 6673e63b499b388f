"""DistributedOptimizer on real ranks: Horovod equivalence, P-Reduce mean preservation,
uneven work with join(), accuracy on a real data set, and wrap-time errors."""
import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits

import ripples.torch as hvd

hvd.init()
R, N = hvd.rank(), hvd.size()


def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.BatchNorm1d(32),
                               torch.nn.ReLU(), torch.nn.Linear(32, 10))


def digits():
    data = load_digits()
    x = torch.tensor(data.data / 16.0, dtype=torch.float32)
    y = torch.tensor(data.target, dtype=torch.int64)
    return x, y


def test_allreduce_mode_equals_single_process_on_concatenated_batches():
    x, y = digits()
    per_rank = 16
    model = make_model()
    reference = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters())
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    model.eval(), reference.eval()  # BatchNorm in eval: the loss is a mean over samples
    for step in range(5):
        start = step * per_rank * N
        xs, ys = x[start:start + per_rank * N], y[start:start + per_rank * N]
        mine = slice(R * per_rank, (R + 1) * per_rank)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xs[mine]), ys[mine]).backward()
        opt.step()
        ref_opt.zero_grad()
        torch.nn.functional.cross_entropy(reference(xs), ys).backward()
        ref_opt.step()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert torch.allclose(p, q, atol=1e-5), name


def test_skip_synchronize_and_fp16_compression():
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0),
                                   named_parameters=model.named_parameters(),
                                   compression=hvd.Compression.fp16)
    model.eval()
    x = torch.full((4, 64), float(R))
    model(x).sum().backward()
    local = [p.grad.clone() for p in model.parameters()]
    opt.synchronize()
    expected = hvd.grouped_allreduce(local)
    for p, e in zip(model.parameters(), expected):
        assert torch.allclose(p.grad, e, rtol=2e-3, atol=1e-3)
    with opt.skip_synchronize():
        opt.step()


@pytest.mark.parametrize("sync,schedule,options", [
    ("ripples", "static", {}), ("ripples", "random", {}), ("ripples", "generator", {}),
    ("ripples", "generator", {"policy": "all"}), ("adpsgd-sync", None, {})])
def test_preduce_preserves_the_sum_of_local_steps(sync, schedule, options):
    """Plain SGD: after each step, sum over ranks of parameters equals the sum of what the
    local steps alone would give (P-Reduce preserves the mean)."""
    model = make_model(seed=R)  # different replicas, to make averaging visible
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                   named_parameters=model.named_parameters(), sync=sync,
                                   schedule=schedule, group_size=2, model=model, **options)
    x, y = digits()
    for step in range(6):
        mine = slice((step * N + R) * 8, (step * N + R + 1) * 8)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x[mine]), y[mine]).backward()
        local = [(p - 0.05 * p.grad).detach() for p in model.parameters()]
        opt.step()
        sums = hvd.grouped_allreduce([p.detach() for p in model.parameters()], op=hvd.Sum)
        expected = hvd.grouped_allreduce(local, op=hvd.Sum)
        for s, e in zip(sums, expected):
            assert torch.allclose(s, e, atol=1e-5)
    assert opt.metrics.steps == 6
    opt.close()


def test_generator_mode_uneven_steps_then_join():
    model = make_model(seed=R)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters(), sync="ripples",
                                   schedule="generator", group_size=2)
    x, y = digits()
    for step in range(4 + 3 * R):  # fast ranks would do more in the same time
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x[:32]), y[:32]).backward()
        opt.step()
    hvd.join()
    opt.close()
    hvd.average_model(model)
    gathered = hvd.allgather_object([p.sum().item() for p in model.parameters()])
    assert all(np.allclose(g, gathered[0], atol=1e-5) for g in gathered)


@pytest.mark.parametrize("sync,schedule", [("allreduce", None), ("ripples", "static"),
                                           ("ripples", "generator"), ("adpsgd", None)])
def test_digits_accuracy_in_every_mode(sync, schedule):
    x, y = digits()
    gen = torch.Generator().manual_seed(0)
    order = torch.randperm(len(x), generator=gen)
    train, test = order[:1400], order[1400:]
    shard = train[R::N]
    model = make_model()
    kwargs = {} if sync == "allreduce" else {"schedule": schedule, "group_size": 2, "model": model}
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters(), sync=sync, **kwargs)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    for epoch in range(6):
        for i in range(0, len(shard) - 31, 32):
            batch = shard[i:i + 32]
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x[batch]), y[batch]).backward()
            opt.step()
    if sync != "allreduce":
        opt.close()
    hvd.average_model(model)
    model.eval()
    accuracy = (model(x[test]).argmax(1) == y[test]).float().mean().item()
    assert accuracy > 0.85, f"{sync}/{schedule}: accuracy {accuracy:.3f}"


def test_mismatched_models_fail_at_wrap_time_on_every_rank():
    if N == 1:
        pytest.skip("needs two ranks")
    width = 32 if R == 0 else 33
    model = torch.nn.Linear(64, width)
    with pytest.raises(ValueError, match="different model"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 named_parameters=model.named_parameters())


def test_bad_mode_names_list_the_valid_ones():
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="allreduce.*ripples.*adpsgd"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), sync="gossip")
    with pytest.raises(ValueError, match="static.*random.*generator"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), sync="ripples",
                                 schedule="ring")
    assert hvd.Sync("ripples") is hvd.Sync.RIPPLES


def test_broadcast_optimizer_state():
    model = make_model(seed=R)
    opt = torch.optim.SGD(model.parameters(), lr=0.1 * (R + 1), momentum=0.9)
    model(torch.ones(4, 64)).sum().backward()
    opt.step()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    assert opt.param_groups[0]["lr"] == 0.1
    sums = hvd.allgather_object(sum(p.sum().item() for p in model.parameters()))
    assert len(set(round(s, 5) for s in sums)) == 1


@pytest.mark.parametrize("sync,schedule", [
    ("allreduce", None), ("ripples", "static"), ("ripples", "random"),
    ("ripples", "generator"), ("adpsgd-sync", None), ("adpsgd", None)])
def test_training_goes_on_after_a_join_each_epoch(sync, schedule):
    """Horovod's pattern of one ``join()`` per epoch of uneven work: every mode trains on
    after each join (uneven step counts where the mode allows them). With the learning rate
    at 0 only averaging moves the replicas, set apart at the start of every epoch: where
    averaging pairs are fixed by the step (static, random, AD-PSGD), every epoch brings
    them closer, the epochs after a join too."""
    lockstep = schedule in ("static", "random") or sync == "adpsgd-sync"
    model = make_model(seed=R)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0),
                                   named_parameters=model.named_parameters(), sync=sync,
                                   schedule=schedule, group_size=2, model=model)
    x, y = digits()
    steps = 4 if lockstep else 2 + 2 * R
    distances = []
    for epoch in range(3):
        with torch.no_grad():
            for param in model.parameters():
                param.add_(0.1 * R)
        apart = hvd.consensus_distance(model)
        for _ in range(steps):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x[:32]), y[:32]).backward()
            opt.step()
        hvd.join()
        distances.append((apart, hvd.consensus_distance(model)))
    assert opt.metrics.steps == 3 * steps
    opt.close()
    if N > 1 and schedule != "generator" and sync != "allreduce":
        assert all(after < apart for apart, after in distances), distances


@pytest.mark.parametrize("schedule", ["static", "random"])
def test_a_checkpoint_loaded_on_the_root_only_resumes_every_rank_at_its_step(schedule):
    """Horovod's resume: load the checkpoint on rank 0, then broadcast_parameters and
    broadcast_optimizer_state. Every rank then goes on at rank 0's step, so the lockstep
    schedules give every rank the same groups (different steps gave ranks different
    groups: a MismatchError, or a rank left waiting)."""
    def wrapped():
        model = make_model(seed=0)
        return model, hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
            named_parameters=model.named_parameters(), sync="ripples", schedule=schedule,
            group_size=2, model=model)

    x, y = digits()

    def train(model, opt, steps):
        for _ in range(steps):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x[:32]), y[:32]).backward()
            opt.step()

    model, opt = wrapped()
    train(model, opt, 3)
    saved = opt.state_dict() if R == 0 else None
    opt.close()
    model, opt = wrapped()
    if R == 0:
        opt.load_state_dict(saved)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    extra = opt.state_dict()["ripples"]
    assert (extra["steps"], extra["syncs"]) == (3, 3), extra
    train(model, opt, 3)
    hvd.join()
    steps = hvd.allgather_object(opt.state_dict()["ripples"]["steps"])
    opt.close()
    assert steps == [6] * N
