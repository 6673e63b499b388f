"""Training-script patterns in parameter-server mode, each checked under BSP against a
single-process reference that computes every worker's gradient itself, averages them and
runs the plain torch optimizer (bit for bit: 2 workers, power-of-two loss scales).

Scenarios (run by mpi_ps_scenarios.py):
  ``hyperparameters``   1 server + 2 workers
  ``checkpoint``        2 servers + 2 workers, split chunks
"""
import torch
import torch.nn.functional as F

from mpi_ps_common import check, small_model
from ripples.ps.optimizer import PSOptimizer

STEPS = 6


def batches(worker, steps=STEPS):
    gen = torch.Generator().manual_seed(100 + worker)
    return [(torch.randn(6, 8, generator=gen), torch.randint(0, 3, (6,), generator=gen))
            for _ in range(steps)]


def loss_of(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


def sgd(model):
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)


def adam(model):
    return torch.optim.Adam(model.parameters(), lr=0.01)


def same_params(model, other):
    return all(torch.equal(p, q) for p, q in zip(model.parameters(), other.parameters()))


def max_diff(model, other):
    return max((p - q).abs().max().item() for p, q in zip(model.parameters(), other.parameters()))


# -- the reference ----------------------------------------------------------------------------
class Reference:
    """Synchronous SGD over ``workers`` workers in one process."""

    def __init__(self, workers, make_opt, make_sched=None, model=None):
        self.workers = workers
        self.model = model or small_model(seed=0)
        self.opt = make_opt(self.model)
        self.sched = make_sched(self.opt) if make_sched else None
        self.data = [batches(w) for w in range(workers)]

    def worker_grads(self, w, step, grad_fn=None):
        self.model.zero_grad()
        if grad_fn is None:
            loss_of(self.model, self.data[w][step]).backward()
        else:
            grad_fn(self.model, self.data[w][step], w)
        return [None if p.grad is None else p.grad.clone() for p in self.model.parameters()]

    def step(self, step, grad_fn=None, skip=False, metric=None):
        """Average the workers' gradients (a missing one counts as zero) and step."""
        grads = [self.worker_grads(w, step, grad_fn) for w in range(self.workers)]
        for p, *per_worker in zip(self.model.parameters(), *grads):
            present = [g for g in per_worker if g is not None]
            total = present[0] if present else None
            for g in present[1:]:
                total = total + g
            p.grad = None if total is None else total / self.workers
        if not skip:
            self.opt.step()
        if self.sched is not None:
            self.sched.step(*([] if metric is None else [metric]))


def plateau(opt):
    return torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=0)


SCHEDULES = {
    "StepLR": lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.3),
    "LambdaLR": lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s)),
    "OneCycleLR": lambda opt: torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.5,
                                                                   total_steps=STEPS),
    "ReduceLROnPlateau": plateau,
}


# -- hyperparameters, GradScaler, clipping, accumulation (1 server, 2 workers) -----------------
def hyperparameters(context):
    worker, workers = context.worker, context.num_workers
    check(context.num_servers == 1 and workers == 2, "run with 1 server + 2 workers")
    for name, make_sched in SCHEDULES.items():
        metric = 1.0 if name == "ReduceLROnPlateau" else None  # never improves: lr halves
        model = ps_schedule_run(context, make_sched, metric)
        reference = Reference(workers, sgd, make_sched)
        constant = Reference(workers, sgd)
        for step in range(STEPS):
            reference.step(step, metric=metric)
            constant.step(step)
        check(same_params(model, reference.model),
              f"{name}: servers must follow the schedule; "
              f"max diff {max_diff(model, reference.model)}")
        check(not same_params(model, constant.model), f"{name}: schedule had no effect")
        if worker == 0:
            print(f"schedule {name} OK", flush=True)
    disagreeing_workers_use_worker_0s_values(context)
    asp_uses_each_pushers_values(context)
    grad_scaler(context, clip=False)
    grad_scaler(context, clip=True)
    accumulation(context)
    frozen_and_unused(context)
    print(f"worker {worker}: hyperparameters OK", flush=True)


def ps_schedule_run(context, make_sched, metric, tamper=None):
    model = small_model(seed=context.worker)  # the servers start from worker 0's
    ps = PSOptimizer(sgd(model), model.named_parameters(), context, policy="bsp", timeout_s=20)
    sched = make_sched(ps)
    data = batches(context.worker)
    for step in range(STEPS):
        ps.zero_grad()
        loss_of(model, data[step]).backward()
        if tamper is not None:
            tamper(ps)
        ps.step()
        sched.step(*([] if metric is None else [metric]))
    ps.join()
    return model


def disagreeing_workers_use_worker_0s_values(context):
    def tamper(ps):  # worker 1 keeps overriding what the scheduler set
        if context.worker == 1:
            for group in ps.param_groups:
                group["lr"], group["momentum"] = 100.0, 0.0
    make_sched = SCHEDULES["StepLR"]
    model = ps_schedule_run(context, make_sched, None, tamper)
    reference = Reference(context.num_workers, sgd, make_sched)
    for step in range(STEPS):
        reference.step(step)
    check(same_params(model, reference.model),
          f"BSP rounds use worker 0's hyperparameters; max diff {max_diff(model, reference.model)}")
    if context.worker == 0:
        print("disagreeing hyperparameters OK", flush=True)


def asp_uses_each_pushers_values(context):
    """Updates applied on arrival use the learning rate of the worker that pushed them."""
    worker, workers = context.worker, context.num_workers
    param = torch.nn.Parameter(torch.zeros(4, dtype=torch.float64))
    ps = PSOptimizer(torch.optim.SGD([param], lr=1.0), [("v", param)], context, policy="asp",
                     timeout_s=20)
    for step in range(STEPS):
        ps.param_groups[0]["lr"] = float(worker + 1 + step)
        param.grad = torch.ones(4, dtype=torch.float64)
        ps.step()
    ps.join()
    expected = -sum(w + 1 + step for w in range(workers) for step in range(STEPS))
    check(torch.equal(param.detach(), torch.full((4,), float(expected), dtype=torch.float64)),
          f"asp: {param.tolist()} expected {expected}")
    if worker == 0:
        print("asp per-push hyperparameters OK", flush=True)


def grad_scaler(context, clip):
    """GradScaler on every worker; worker 1's gradient overflows at step 2, so that round is
    skipped by the servers for everyone (worker 0 found nothing and still steps)."""
    worker, workers = context.worker, context.num_workers
    bad_step, max_norm = 2, 0.5
    model = small_model(seed=0)
    ps = PSOptimizer(sgd(model), model.named_parameters(), context, policy="bsp", timeout_s=20)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 12, growth_interval=2)
    data = batches(worker)
    for step in range(STEPS):
        ps.zero_grad()
        scaler.scale(loss_of(model, data[step])).backward()
        if worker == 1 and step == bad_step:
            model[0].weight.grad[0, 0] = float("inf")
        if clip:
            scaler.unscale_(ps)
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        scaler.step(ps)
        scaler.update()
    metrics = ps.metrics()
    ps.join()

    def clipped(m, batch, w):
        loss_of(m, batch).backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(m.parameters(), max_norm)
    reference = Reference(workers, sgd)
    for step in range(STEPS):
        reference.step(step, grad_fn=clipped, skip=step == bad_step)
    check(metrics["server_load"][0]["skipped"] == 1, f"one round skipped: {metrics['server_load']}")
    check(metrics["server_load"][0]["updates"] == STEPS - 1, "the other rounds applied")
    check(same_params(model, reference.model),
          f"GradScaler clip={clip}: max diff {max_diff(model, reference.model)}")
    # Each scaler follows its own gradients: doubled every 2 clean steps, halved on overflow.
    expected_scale = 2.0 ** 15 if worker == 0 else 2.0 ** 13
    check(scaler.get_scale() == expected_scale, f"worker {worker} scale {scaler.get_scale()}")
    if worker == 0:
        print(f"GradScaler clip={clip} OK", flush=True)


def accumulation(context):
    """Two backward passes (half batches) per step() push their sum."""
    model = small_model(seed=0)
    ps = PSOptimizer(sgd(model), model.named_parameters(), context, policy="bsp", timeout_s=20)
    data = batches(context.worker)
    for step in range(STEPS):
        ps.zero_grad()
        x, y = data[step]
        for half in (slice(0, 3), slice(3, 6)):
            loss_of(model, (x[half], y[half])).backward()
        ps.step()
    ps.join()

    def two_passes(m, batch, w):
        x, y = batch
        for half in (slice(0, 3), slice(3, 6)):
            loss_of(m, (x[half], y[half])).backward()
    reference = Reference(context.num_workers, sgd)
    for step in range(STEPS):
        reference.step(step, grad_fn=two_passes)
    check(same_params(model, reference.model),
          f"accumulation: max diff {max_diff(model, reference.model)}")
    if context.worker == 0:
        print("accumulation OK", flush=True)


def frozen_and_unused(context):
    """A frozen bias stays put despite weight decay and momentum; a weight that only worker
    0 uses this step is averaged with worker 1's zero."""
    def frozen_model():
        model = small_model(seed=0)
        model[0].bias.requires_grad_(False)
        return model

    def backward(m, batch, w):
        loss_of(m, batch).backward()
        if w == 1:
            m[2].weight.grad = None
    model = frozen_model()
    ps = PSOptimizer(sgd(model), model.named_parameters(), context, policy="bsp", timeout_s=20)
    data = batches(context.worker)
    for step in range(STEPS):
        ps.zero_grad()
        backward(model, data[step], context.worker)
        ps.step()
    ps.join()
    reference = Reference(context.num_workers, sgd, model=frozen_model())
    for step in range(STEPS):
        reference.step(step, grad_fn=backward)
    check(torch.equal(model[0].bias, small_model(seed=0)[0].bias), "frozen bias must not move")
    check(same_params(model, reference.model),
          f"frozen and unused: max diff {max_diff(model, reference.model)}")
    if context.worker == 0:
        print("frozen and unused parameters OK", flush=True)


# -- checkpoint and resume (2 servers, 2 workers) ---------------------------------------------
def checkpoint(context):
    check(context.num_servers == 2 and context.num_workers == 2,
          "run with 2 servers + 2 workers")
    for make_opt in (sgd, adam):
        checkpoint_resume(context, make_opt)
    print(f"worker {context.worker}: checkpoint OK", flush=True)


def train(context, model, ps, steps):
    data = batches(context.worker)
    for step in steps:
        ps.zero_grad()
        loss_of(model, data[step]).backward()
        ps.step()


def checkpoint_resume(context, make_opt):
    """Run 6 steps, saving after 3 (with a halved learning rate from then on); resume a
    fresh model and optimizer from the save, by ``load_state_dict`` and by loading the
    plain optimizer before wrapping it: the last 3 steps must match bit for bit."""
    name = make_opt.__name__
    options = dict(policy="bsp", timeout_s=20, chunk_bytes=96)  # parameters span both servers
    model = small_model(seed=0)
    ps = PSOptimizer(make_opt(model), model.named_parameters(), context, **options)
    train(context, model, ps, range(3))
    for group in ps.param_groups:
        group["lr"] *= 0.5
    saved = ps.state_dict()
    saved_model = {k: v.clone() for k, v in model.state_dict().items()}
    train(context, model, ps, range(3, STEPS))
    ps.join()

    reference = Reference(context.num_workers, make_opt)
    for step in range(3):
        reference.step(step)
    for group in reference.opt.param_groups:
        group["lr"] *= 0.5
    expected = reference.opt.state_dict()
    check(set(saved["state"]) == set(expected["state"]), f"{name}: state of every parameter")
    for index, ref_state in expected["state"].items():
        for key, value in ref_state.items():
            got = saved["state"][index].get(key)
            check(isinstance(got, torch.Tensor) and got.shape == value.shape
                  and torch.equal(got, value), f"{name}: state[{index}][{key!r}] {got} != {value}")
    check(saved["param_groups"] == expected["param_groups"], f"{name}: hyperparameters saved")
    check(saved["ripples"]["clock"] == 3 and saved["ripples"]["policy"] == "bsp",
          f"{name}: session counters {saved['ripples']}")
    check(len(ps.state) == 0, "the servers hold the optimizer state, not the worker")
    for step in range(3, STEPS):
        reference.step(step)
    check(same_params(model, reference.model),
          f"{name}: uninterrupted run vs reference, max diff {max_diff(model, reference.model)}")

    for resume_path in ("load_state_dict", "load before wrapping"):
        resumed = small_model(seed=7 + context.worker)
        resumed.load_state_dict(saved_model)
        opt = make_opt(resumed)
        if resume_path == "load before wrapping":  # a plain torch optimizer reads it
            opt.load_state_dict(saved)
            ps = PSOptimizer(opt, resumed.named_parameters(), context, **options)
        else:
            ps = PSOptimizer(opt, resumed.named_parameters(), context, **options)
            ps.load_state_dict(saved)
        check(len(ps.state) == 0, "after loading, the state lives on the servers")
        train(context, resumed, ps, range(3, STEPS))
        ps.join()
        check(same_params(resumed, model),
              f"{name} {resume_path}: resumed run must equal the uninterrupted one, "
              f"max diff {max_diff(resumed, model)}")
        if context.worker == 0:
            print(f"checkpoint {name} {resume_path} OK", flush=True)


SCENARIOS = {"hyperparameters": hyperparameters, "checkpoint": checkpoint}
