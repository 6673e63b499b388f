"""Real training-script patterns through DistributedOptimizer, on real ranks, in every mode.

Two kinds of checks:

- Every mode: with the same initial model and the same data on every rank, averaging
  changes nothing, so a wrapped run must equal a plain torch run of the same script
  (but for the generator schedule, which may group ranks at different local steps)
  (LR schedulers, GradScaler, clipping after synchronize(), accumulation, evaluation
  pauses, frozen layers, a DataLoader with worker processes). Schedulers' learning rates
  are also checked against their closed forms.
- All-reduce mode with different data per rank: the result must equal the average of
  every rank's local gradients, computed here from an allgather of them.
"""
import contextlib
import io
import math
import os
import warnings

import pytest
import torch

import ripples.torch as hvd
from ripples.torch.optimizer import GradientsPendingError

hvd.init()
R, N = hvd.rank(), hvd.size()

MODES = {
    "allreduce": {},
    "ripples-static": {"sync": "ripples", "schedule": "static"},
    "ripples-random": {"sync": "ripples", "schedule": "random", "group_size": 2},
    "ripples-generator": {"sync": "ripples", "schedule": "generator", "group_size": 2},
    "adpsgd": {"sync": "adpsgd"},
    "adpsgd-sync": {"sync": "adpsgd-sync"},
}
# Asynchronous AD-PSGD averages an active rank's model with a passive rank's whenever the
# active one gets there, whatever step the passive one is at: replicas that run the same
# script from the same model are averaged at different steps, so neither equality with a
# plain torch run nor a bit-for-bit resume holds (the lock-step "adpsgd-sync" keeps both).
ASYNCHRONOUS = ("ripples-generator", "adpsgd")
LR = 0.1


def make_model(seed=0, frozen=False):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    if frozen:
        model[0].requires_grad_(False)
    return model


def batch(step, rank=0, size=8):
    gen = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(size, 6, generator=gen), torch.randint(0, 3, (size,), generator=gen)


def loss_of(model, x, y):
    return torch.nn.functional.cross_entropy(model(x), y)


def wrap(model, opt, mode, named=True, **kwargs):
    return hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters() if named
                                    else None, **MODES[mode], **kwargs)


def finish(opt):
    if hasattr(opt, "close"):
        opt.close()


def synchronize(opt):
    if hasattr(opt, "synchronize"):
        opt.synchronize()


def skip(opt):
    return opt.skip_synchronize() if hasattr(opt, "skip_synchronize") else contextlib.nullcontext()


# ---------------------------------------------------------------- the same script, two ways

SCHEDULERS = {
    "StepLR": lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5),
    "LambdaLR": lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda k: 1.0 / (k + 1)),
    "CosineAnnealingLR": lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=5),
    "OneCycleLR": lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.5, total_steps=8),
    "ReduceLROnPlateau": lambda o: torch.optim.lr_scheduler.ReduceLROnPlateau(
        o, factor=0.5, patience=1),
}

def one_cycle(k, start, peak, end, total=8, pct_start=0.3):
    """OneCycleLR's two cosine phases (``peak`` reached at step ``pct_start*total - 1``)."""
    turn = pct_start * total - 1
    if k <= turn:
        pct, a, b = k / turn, start, peak
    else:
        pct, a, b = (k - turn) / (total - 1 - turn), peak, end
    return b + (a - b) / 2 * (1 + math.cos(math.pi * pct))


CLOSED_FORMS = {  # learning rate after k scheduler steps
    "OneCycleLR": lambda k: one_cycle(k, 0.5 / 25, 0.5, 0.5 / 25 / 1e4),
    "StepLR": lambda k: LR * 0.5 ** (k // 2),
    "LambdaLR": lambda k: LR / (k + 1),
    "CosineAnnealingLR": lambda k: LR * (1 + math.cos(math.pi * k / 5)) / 2,
    # a constant metric never improves after the first step: halve after every 2 bad ones
    "ReduceLROnPlateau": lambda k: LR * 0.5 ** ((k - 1) // 2),
}


def batches(pattern, steps, wrapped):
    """``batch(step)`` for each step; for "dataloader" the same batches through a
    ``DataLoader`` whose worker processes are forked after MPI and ripples' threads have
    started (the plain run loads them in its own process)."""
    if pattern != "dataloader":
        return (batch(step) for step in range(steps))
    xs, ys = zip(*(batch(step) for step in range(steps)))
    data = torch.utils.data.TensorDataset(torch.cat(xs), torch.cat(ys))
    return iter(torch.utils.data.DataLoader(data, batch_size=8, num_workers=2 if wrapped else 0))


def train_script(pattern, wrapped_mode=None, steps=6):
    """Run one training-script pattern; ``wrapped_mode=None`` runs it on plain torch.

    Returns the final parameters and the learning rate after every step."""
    model = make_model(frozen=pattern == "frozen")
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    kwargs = {}
    if pattern == "accumulate" and wrapped_mode == "allreduce":
        kwargs["backward_passes_per_step"] = 2
    if wrapped_mode is not None:  # the frozen layer's optimizer also owns frozen parameters
        opt = wrap(model, opt, wrapped_mode, named=pattern != "frozen", **kwargs)
    scheduler = SCHEDULERS[pattern](opt) if pattern in SCHEDULERS else None
    scaler = torch.amp.GradScaler("cpu") if pattern.startswith("scaler") else None
    compiled = torch.compile(model) if pattern == "compiled" else None
    lrs = []
    data = batches(pattern, steps, wrapped_mode is not None)
    for step in range(steps):
        x, y = next(data)
        opt.zero_grad()
        if pattern == "accumulate":
            for half in (slice(0, 4), slice(4, 8)):
                (loss_of(model, x[half], y[half]) / 2).backward()
            opt.step()
        elif pattern == "clip":
            loss_of(model, x, y).backward()
            synchronize(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
            with skip(opt):
                opt.step()
        elif pattern == "scaler-synchronize":  # Horovod's documented AMP pattern
            scaler.scale(loss_of(model, x, y)).backward()
            synchronize(opt)
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            with skip(opt):
                scaler.step(opt)
            scaler.update()
        elif pattern == "scaler-plain":
            scaler.scale(loss_of(model, x, y)).backward()
            scaler.step(opt)
            scaler.update()
        elif pattern == "compiled":  # the forward through torch.compile, same parameters
            loss_of(compiled, x, y).backward()
            opt.step()
        else:
            loss_of(model, x, y).backward()
            opt.step()
        if pattern == "eval-pause":
            model.eval()
            with torch.no_grad():
                model(x)
            loss_of(model, x, y)  # a validation loss computed with grad, never backward
            model.train()
        if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
            scheduler.step(1.0)
        elif scheduler is not None:
            scheduler.step()
        lrs.append(opt.param_groups[0]["lr"])
    if wrapped_mode is not None:
        finish(opt)
    return [p.detach().clone() for p in model.parameters()], lrs


PATTERNS = [*SCHEDULERS, "clip", "scaler-synchronize", "scaler-plain", "accumulate",
            "eval-pause", "frozen", "dataloader"]


@pytest.mark.parametrize("mode", list(MODES))
def test_training_scripts_run_unchanged(mode):
    for pattern in PATTERNS:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # e.g. "lr_scheduler.step() before optimizer.step()"
            params, lrs = train_script(pattern, mode)
        expected, expected_lrs = train_script(pattern)
        for p, e in zip(params, expected):
            if mode in ASYNCHRONOUS:  # averages replicas at different local steps
                assert torch.isfinite(p).all(), (mode, pattern)
            else:
                assert torch.allclose(p, e, atol=1e-6), (mode, pattern)
        assert lrs == pytest.approx(expected_lrs), (mode, pattern)
        if pattern in CLOSED_FORMS:
            assert lrs == pytest.approx([CLOSED_FORMS[pattern](k + 1) for k in range(len(lrs))])


@pytest.mark.skipif(not os.environ.get("RIPPLES_LONG_TESTS"),
                    reason="RIPPLES_LONG_TESTS=1: torch.compile takes about 10 s per model")
@pytest.mark.parametrize("mode", ["allreduce", "ripples-static", "adpsgd-sync"])
def test_a_compiled_forward_trains_as_the_eager_one(mode):
    # Gradients reach .grad outside the compiled graph, where the wrapper's hooks run.
    params, _ = train_script("compiled", mode)
    expected, _ = train_script("plain")
    for p, e in zip(params, expected):
        assert torch.allclose(p, e, atol=1e-6), mode
    if mode == "allreduce":  # different data on every rank: the gradients are averaged
        model = make_model()
        opt = wrap(model, torch.optim.SGD(model.parameters(), lr=LR), mode)
        loss_of(torch.compile(model), *batch(0, R)).backward()
        opt.synchronize()
        expected = {}  # every rank's eager gradient, computed here, averaged
        for rank in range(N):
            eager = make_model()
            loss_of(eager, *batch(0, rank)).backward()
            for n, q in eager.named_parameters():
                expected[n] = expected.get(n, 0) + q.grad / N
        for n, p in model.named_parameters():
            assert torch.allclose(p.grad, expected[n], atol=1e-6), n
        finish(opt)


def test_one_cycle_cycles_momentum_through_the_wrapper():
    model = make_model()
    opt = wrap(model, torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9), "allreduce")
    scheduler = SCHEDULERS["OneCycleLR"](opt)
    momenta = []
    for step in range(4):
        opt.zero_grad()
        loss_of(model, *batch(step)).backward()
        opt.step()
        scheduler.step()
        momenta.append(opt.param_groups[0]["momentum"])
    assert momenta == pytest.approx([one_cycle(k + 1, 0.95, 0.85, 0.95) for k in range(4)])


# ---------------------------------------------------------------- all-reduce semantics

def local_grads(model):
    return {n: (p.grad.clone() if p.grad is not None else torch.zeros_like(p))
            for n, p in model.named_parameters() if p.requires_grad}


def average_over_ranks(grads):
    everyone = hvd.allgather_object(grads)
    return {n: sum(g[n] for g in everyone) / N for n in grads}


class Blocks(torch.nn.Module):
    """Three same-shaped blocks; ``skip`` chooses which one a rank leaves out this step."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(3))
        self.unused = torch.nn.Linear(4, 4)

    def forward(self, x, skip):
        for i, block in enumerate(self.blocks):
            if i != skip:
                x = torch.tanh(block(x))
        return x.sum()


def test_ranks_skipping_different_layers_reduce_by_name():
    model = Blocks()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                                   named_parameters=model.named_parameters())
    for step in range(3):
        opt.zero_grad()
        model(batch(step, R)[0][:, :4], skip=(R + step) % 3).backward()
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        expected = average_over_ranks(local_grads(model))
        opt.synchronize()
        for n, p in model.named_parameters():
            assert torch.allclose(p.grad, expected[n], atol=1e-6), n
        assert torch.equal(model.unused.weight.grad, torch.zeros(4, 4))  # unused: zeros
        with opt.skip_synchronize():
            opt.step()
        for n, p in model.named_parameters():
            assert torch.allclose(p, before[n] - LR * expected[n], atol=1e-6), n


def test_average_then_clip():
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                                   named_parameters=model.named_parameters())
    opt.zero_grad()
    loss_of(model, *batch(0, R)).backward()
    expected = average_over_ranks(local_grads(model))
    norm = torch.cat([g.flatten() for g in expected.values()]).norm()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt.synchronize()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.01)
    with opt.skip_synchronize():
        opt.step()
    for n, p in model.named_parameters():
        assert torch.allclose(p, before[n] - LR * expected[n] * 0.01 / norm, atol=1e-6), n


def test_step_after_synchronize_without_skip_warns_as_horovod():
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                                   named_parameters=model.named_parameters())
    loss_of(model, *batch(0, R)).backward()
    opt.synchronize()
    with pytest.warns(UserWarning, match="skip_synchronize"):
        opt.step()


def test_backward_passes_per_step_accumulates_then_refuses_one_more():
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                                   named_parameters=model.named_parameters(),
                                   backward_passes_per_step=2)
    opt.zero_grad()
    for k in range(2):
        loss_of(model, *batch(k, R)).backward()
    expected = average_over_ranks(local_grads(model))
    opt.synchronize()
    for n, p in model.named_parameters():
        assert torch.allclose(p.grad, expected[n], atol=1e-6), n
    with opt.skip_synchronize():
        opt.step()
    opt.zero_grad()
    for k in range(2):
        loss_of(model, *batch(k, R)).backward()
    with pytest.raises(AssertionError, match="backward_passes_per_step=2"):
        loss_of(model, *batch(2, R)).backward()


def test_zero_grad_between_backward_and_step_raises_assertion_error():
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                                   named_parameters=model.named_parameters())
    opt.zero_grad()
    loss_of(model, *batch(0, R)).backward()
    with pytest.raises(GradientsPendingError, match="zero_grad.*before.*step"):
        opt.zero_grad()
    assert issubclass(GradientsPendingError, AssertionError)
    opt.synchronize()
    opt.zero_grad()  # fine once synchronized
    loss_of(model, *batch(1, R)).backward()
    opt.step()
    opt.zero_grad()


@pytest.mark.parametrize("named", [False, True])
def test_frozen_layer(named):
    model = make_model(frozen=True)
    frozen = model[0].weight.detach().clone()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                                   named_parameters=model.named_parameters() if named else None)
    for step in range(2):
        opt.zero_grad()
        loss_of(model, *batch(step, R)).backward()
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        expected = average_over_ranks(local_grads(model))
        opt.step()
        for n, p in model.named_parameters():
            if p.requires_grad:
                assert torch.allclose(p, before[n] - LR * expected[n], atol=1e-6), n
    assert model[0].weight.grad is None and torch.equal(model[0].weight, frozen)


def test_named_parameters_may_name_more_but_not_fewer_than_the_optimizer_owns():
    model = make_model(frozen=True)
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = hvd.DistributedOptimizer(torch.optim.SGD(trainable, lr=LR),
                                   named_parameters=model.named_parameters())
    loss_of(model, *batch(0, R)).backward()
    opt.step()
    with pytest.raises(ValueError, match="named_parameters.*positions \\[1, 2, 3\\]"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                                 named_parameters=list(model.named_parameters())[:1])


def integer_model():
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    with torch.no_grad():
        for i, p in enumerate(model.parameters()):
            p.copy_(torch.arange(p.numel()).reshape(p.shape) % 3 - 1 + i)
    return model


def reduced_integer_grads(**kwargs):
    model = integer_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                                   named_parameters=model.named_parameters(), **kwargs)
    model(torch.full((2, 4), float(R + 1))).sum().backward()
    opt.synchronize()
    return [p.grad.clone() for p in model.parameters()]


def test_groups_and_reduction_arguments():
    plain = reduced_integer_grads()
    assert all(torch.equal(a, b) for a, b in zip(plain, reduced_integer_grads(groups=2)))
    summed = reduced_integer_grads(op=hvd.Sum)
    assert all(torch.equal(a * N, b) for a, b in zip(plain, summed))
    predivided = reduced_integer_grads(gradient_predivide_factor=2.0)
    assert all(torch.allclose(a, b) for a, b in zip(plain, predivided))


def test_groups_as_lists_of_parameters():
    model = integer_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                                   named_parameters=model.named_parameters(),
                                   groups=[[model[0].weight, model[1].bias]])
    model(torch.full((2, 4), float(R + 1))).sum().backward()
    opt.synchronize()
    for p, e in zip(model.parameters(), reduced_integer_grads()):
        assert torch.equal(p.grad, e)


def test_process_set_averages_over_its_members_only():
    members = list(range(max(1, N // 2)))
    process_set = hvd.add_process_set(members) if len(members) < N else hvd.global_process_set
    try:
        model = make_model()
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                                       named_parameters=model.named_parameters(),
                                       process_set=process_set)
        loss_of(model, *batch(0, R)).backward()
        everyone = hvd.allgather_object(local_grads(model))
        opt.synchronize()
        for n, p in model.named_parameters():
            expected = (sum(everyone[r][n] for r in members) / len(members) if R in members
                        else everyone[R][n])
            assert torch.allclose(p.grad, expected, atol=1e-6), n
        with opt.skip_synchronize():
            opt.step()
    finally:  # other modules of the same job register sets of these ranks
        hvd.remove_process_set(process_set)


@pytest.mark.parametrize("sparse_as_dense", [False, True])
def test_sparse_embedding_gradients(sparse_as_dense):
    torch.manual_seed(0)
    embedding = torch.nn.Embedding(10, 3, sparse=True)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(embedding.parameters(), lr=LR),
                                   named_parameters=embedding.named_parameters(),
                                   sparse_as_dense=sparse_as_dense)
    embedding(torch.tensor([R, R + 1, 7])).sum().backward()
    expected = average_over_ranks({"weight": embedding.weight.grad.to_dense()})["weight"]
    before = embedding.weight.detach().clone()
    opt.synchronize()
    assert embedding.weight.grad.is_sparse
    assert torch.allclose(embedding.weight.grad.to_dense(), expected)
    with opt.skip_synchronize():
        opt.step()
    assert torch.allclose(embedding.weight, before - LR * expected)


def test_grad_scaler_overflow_on_one_rank_skips_the_step_on_every_rank():
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                                   named_parameters=model.named_parameters())
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
    before = [p.detach().clone() for p in model.parameters()]
    # An overflow in rank 0's backward pass (its loss is infinite): the averaged gradients
    # are non-finite on every rank, so every rank skips the step and lowers its scale.
    loss = loss_of(model, *batch(0, R)) * (float("inf") if R == 0 else 1.0)
    scaler.scale(loss).backward()
    opt.synchronize()
    scaler.unscale_(opt)
    with opt.skip_synchronize():
        scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() == 2.0 ** 9
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))
    opt.zero_grad()


# ---------------------------------------------------------------- checkpoint / resume

def resumable_run(mode, steps, resume_at=None):
    """Train ``steps`` steps, optionally saving at ``resume_at`` and continuing in a fresh
    model, optimizer and scheduler built from the checkpoint."""
    def build():
        model = make_model(seed=R)  # replicas differ, so averaging shows
        opt = wrap(model, torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9), mode)
        return model, opt, torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)

    model, opt, scheduler = build()
    for step in range(steps):
        if step == resume_at:
            buffer = io.BytesIO()
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(),
                        "scheduler": scheduler.state_dict()}, buffer)
            finish(opt)
            model, opt, scheduler = build()
            buffer.seek(0)
            saved = torch.load(buffer)
            model.load_state_dict(saved["model"])
            opt.load_state_dict(saved["opt"])
            scheduler.load_state_dict(saved["scheduler"])
        opt.zero_grad()
        loss_of(model, *batch(step, R)).backward()
        opt.step()
        scheduler.step()
    state = opt.state_dict()
    finish(opt)
    return [p.detach().clone() for p in model.parameters()], state


@pytest.mark.parametrize("mode", ["allreduce", "ripples-static", "ripples-random", "adpsgd-sync"])
def test_resumed_run_equals_uninterrupted_bit_for_bit(mode):
    straight, _ = resumable_run(mode, 6)
    resumed, state = resumable_run(mode, 6, resume_at=3)
    assert all(torch.equal(a, b) for a, b in zip(straight, resumed))
    assert state["ripples"]["steps"] == 6


def test_generator_schedule_resumes_and_keeps_training():
    params, state = resumable_run("ripples-generator", 6, resume_at=3)
    assert all(torch.isfinite(p).all() for p in params)
    assert state["ripples"]["steps"] == 6 and state["ripples"]["syncs"] == 6


def test_asynchronous_adpsgd_resumes_its_counters_and_keeps_training():
    # Not bit for bit (see ASYNCHRONOUS): exchanges land on passive ranks at moments that
    # depend on timing. The counters resume: an active rank makes one exchange per step.
    params, state = resumable_run("adpsgd", 6, resume_at=3)
    assert all(torch.isfinite(p).all() for p in params)
    assert state["ripples"]["steps"] == 6
    if R % 2 == 0 and N > 1:
        assert state["ripples"]["syncs"] == 6


# ---------------------------------------------------------------- arguments

@pytest.mark.parametrize("mode", ["ripples-static", "adpsgd", "adpsgd-sync"])
def test_arguments_a_mode_ignores_warn_naming_them(mode):
    model = make_model()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt = wrap(model, torch.optim.SGD(model.parameters(), lr=LR), mode,
                   compression=hvd.Compression.fp16, backward_passes_per_step=2, op=hvd.Sum,
                   groups=2, sparse_as_dense=True)
    finish(opt)
    text = " ".join(str(w.message) for w in caught)
    for name in ("compression", "backward_passes_per_step", "op", "groups", "sparse_as_dense"):
        assert f"ignores {name}=" in text, (name, text)
    model = make_model()
    with pytest.warns(UserWarning, match="ignores gradient_predivide_factor=2.0"):
        finish(wrap(model, torch.optim.SGD(model.parameters(), lr=LR), mode,
                    gradient_predivide_factor=2.0))
    with pytest.warns(UserWarning, match="ignores schedule='static'"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR), schedule="static")
    with pytest.warns(DeprecationWarning, match="num_groups"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR), num_groups=2)


def test_rejected_arguments_raise_on_every_rank_naming_the_argument():
    model = make_model()
    other = torch.nn.Linear(2, 2)
    cases = [
        (dict(backward_passes_per_step=0), ValueError, "backward_passes_per_step"),
        (dict(backward_passes_per_step="2"), TypeError, "backward_passes_per_step"),
        (dict(gradient_predivide_factor=0.0), ValueError, "gradient_predivide_factor"),
        (dict(gradient_predivide_factor=2.0, op=hvd.Sum), ValueError, "op=Average"),
        (dict(op="Mean"), ValueError, "op="),
        (dict(compression="fp16"), TypeError, "compression"),
        (dict(groups=0), ValueError, "groups"),
        (dict(groups="all"), ValueError, "groups"),
        (dict(groups=[[1.0]]), ValueError, "groups must consist of torch.Tensor"),
        (dict(groups=[[model[0].weight], [model[0].weight]]), ValueError, "only appear once"),
        (dict(groups=[[other.weight]]), ValueError, "not one of the optimizer's parameters"),
        (dict(num_groups=-1), ValueError, "num_groups"),
        (dict(sparse_as_dense="yes"), TypeError, "sparse_as_dense"),
        (dict(process_set=[0]), TypeError, "process_set"),
        (dict(named_parameters=[("a", model[0].weight)] * 2 + list(model.named_parameters())),
         ValueError, "duplicates"),
        (dict(named_parameters=list(model.parameters())), ValueError, "named_parameters"),
        (dict(sync="ripples", sync_every=0), ValueError, "sync_every"),
        (dict(sync="ripples", group_size=1.5), TypeError, "group_size"),
        (dict(sync="ripples", process_set=hvd.ProcessSet([0])), ValueError,
         "process_set"),
        (dict(sync="adpsgd", policy="all"), TypeError, "policy"),
        (dict(sync="gossip"), ValueError, "sync="),
    ]
    for kwargs, error, match in cases:
        with pytest.raises(error, match=match):
            hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR), **kwargs)
    assert hvd.allgather_object(R) == list(range(N))  # every rank got here: nothing hung


@pytest.mark.parametrize("mode", MODES)
def test_saving_a_replica_that_may_differ_warns_once_until_averaged(mode):
    """A Horovod script saves model.state_dict() on rank 0. In decentralized modes that is
    one replica: the first such read after a step warns (naming average_model); none
    after average_model; all-reduce keeps the replicas equal and never warns."""
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                                   named_parameters=model.named_parameters(),
                                   **({"model": model} if mode != "allreduce" else {}),
                                   **MODES[mode])

    def warnings_of_reading():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model.state_dict()
        return [str(w.message) for w in caught if "average_model" in str(w.message)]

    assert warnings_of_reading() == []  # not stepped yet: the replicas are equal
    x, y = batch(0, R)
    opt.zero_grad()
    loss_of(model, x, y).backward()
    opt.step()
    hvd.average_model(model)
    assert warnings_of_reading() == []  # averaged: equal again
    opt.zero_grad()
    loss_of(model, x, y).backward()
    opt.step()
    expected = 1 if mode != "allreduce" and N > 1 else 0
    found = warnings_of_reading()
    assert len(found) == expected, found
    if expected:
        assert f"rank {R} reads the state_dict() of its own replica" in found[0]
    assert warnings_of_reading() == []  # once
    finish(opt)


@pytest.mark.parametrize("mode", MODES)
def test_an_elastic_commit_reads_the_replica_without_taking_the_users_warning(mode):
    """hvd.elastic.TorchState saves (commit) and broadcasts (sync) this rank's replica on
    purpose: that is no cause to warn, and the one warning must stay for the user's own
    state_dict() read (before, ripples' commit took it, so the checkpoint went unwarned)."""
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                                   named_parameters=model.named_parameters(),
                                   **({"model": model} if mode != "allreduce" else {}),
                                   **MODES[mode])
    x, y = batch(0, R)
    opt.zero_grad()
    loss_of(model, x, y).backward()
    opt.step()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        state = hvd.elastic.TorchState(model, opt, step=1)
        state.commit()
        state.sync()
        ripples_reads = [str(w.message) for w in caught if "average_model" in str(w.message)]
        model.state_dict()
        users_read = [str(w.message) for w in caught if "average_model" in str(w.message)]
    assert ripples_reads == []
    assert len(users_read) == (1 if mode != "allreduce" and N > 1 else 0), users_read
    finish(opt)
