"""Checkpoint and resume of decentralized training, for each schedule named in argv[1:].

Two runs from the same start: one trains N steps without stopping; the other trains K
steps, saves every rank's own ``model.state_dict()`` and ``opt.state_dict()`` (through
``torch.save``, as to a file), builds a fresh model and optimizer as a restarted script
would, loads both and trains the remaining N - K steps. Every rank's data depends only on
(rank, step), so both runs see the same batches. Each rank prints:

Lines start with the schedule's name, then

* ``rank R SAME <0|1>``: whether its final parameters equal the uninterrupted run's bit for bit;
* ``rank R STEPS s SYNCS y``: the counters of the resumed optimizer at the end;
* ``rank R AVGDIFF d MOVED m``: how far the rank-averaged final model is from the
  uninterrupted one, and how far training moved it from its start;
* ``rank R WRONG <error>``: what loading another rank's optimizer state raised;
* ``rank R UNTOUCHED <0|1>``: whether the optimizer was left as built after that;
* ``rank R OTHER <error>``: what loading a state saved under another schedule raised;
* ``rank R GROUP <error>``: the same under another group size (not for ``"static"``,
  which has no group size).
"""
import io
import sys

import torch

import ripples.torch as hvd

hvd.init()
R, P = hvd.rank(), hvd.size()
N, K, GROUP = 12, 5, 2


def model_of(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8), torch.nn.Tanh(),
                               torch.nn.Linear(8, 2))


def optimizer_of(model, schedule, group_size=GROUP):
    sgd = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return hvd.DistributedOptimizer(sgd, named_parameters=model.named_parameters(),
                                    sync="ripples", schedule=schedule, group_size=group_size,
                                    model=model)


def train(model, opt, first, last):
    for step in range(first, last):
        data = torch.Generator().manual_seed(1000 * R + step)
        x = torch.randn(16, 6, generator=data)
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()


def flat(model):
    return torch.cat([t.detach().reshape(-1).clone()
                      for t in list(model.parameters()) + list(model.buffers())
                      if t.dtype.is_floating_point])


def through_file(state):
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer)  # weights_only (the default): the state must be plain data


def error_of(opt, state):
    try:
        opt.load_state_dict(state)
    except ValueError as exc:
        return str(exc).replace("\n", " ")
    return "none"


def check(schedule):
    def say(text):
        print(f"{schedule} rank {R} {text}", flush=True)

    initial = flat(model_of(R))
    model = model_of(R)
    opt = optimizer_of(model, schedule)
    train(model, opt, 0, N)
    uninterrupted = flat(model)
    opt.close()

    model = model_of(R)
    opt = optimizer_of(model, schedule)
    train(model, opt, 0, K)
    saved_model, saved_opt = through_file(model.state_dict()), through_file(opt.state_dict())
    opt.close()

    model = model_of(100 + R)  # a restarted script builds its model afresh
    opt = optimizer_of(model, schedule)
    others = hvd.allgather_object(saved_opt)
    say(f"WRONG {error_of(opt, others[(R + 1) % P])}")
    say(f"UNTOUCHED {int(opt.state_dict()['ripples']['steps'] == 0 and not opt.state)}")
    model.load_state_dict(saved_model)
    opt.load_state_dict(saved_opt)
    train(model, opt, K, N)
    resumed = flat(model)
    state = opt.state_dict()["ripples"]
    opt.close()

    say(f"SAME {int(torch.equal(resumed, uninterrupted))}")
    say(f"STEPS {state['steps']} SYNCS {state['syncs']}")
    average = hvd.allreduce(resumed, op=hvd.Average)
    expected = hvd.allreduce(uninterrupted, op=hvd.Average)
    moved = hvd.allreduce(initial, op=hvd.Average)
    say(f"AVGDIFF {float((average - expected).abs().max()):.6g} "
        f"MOVED {float((expected - moved).abs().max()):.6g}")

    probes = [("OTHER", "static" if schedule != "static" else "random", GROUP)]
    if schedule != "static":
        probes.append(("GROUP", schedule, P))
    for label, kind, group_size in probes:
        probe = optimizer_of(model_of(R), kind, group_size)
        say(f"{label} {error_of(probe, saved_opt)}")
        probe.close()


for name in sys.argv[1:]:
    check(name)
hvd.shutdown()
