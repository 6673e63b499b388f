"""Checkpoint and resume of decentralized training, as two jobs: ``save DIR SCHEDULE...``
then ``resume DIR SCHEDULE...``.

``save`` trains K steps with each schedule and writes every rank's own
``model.state_dict()`` and ``opt.state_dict()`` to ``DIR/<schedule>-<rank>.pt``. ``resume``,
a new process as a restarted script is, first trains N steps from the same start without
stopping, then builds a fresh model and optimizer, loads its rank's file and trains the
remaining N - K steps. Every rank's data depends only on (rank, step), so both runs see
the same batches. ``resume`` prints, per schedule and rank, ``<schedule> rank R`` and:

* ``FOREIGN <error> STEPS s``: what loading the file of rank R + 1 raised (nothing: a rank
  may resume from another rank's state, as when rank 0 alone saves) and the step count it
  then has;
* ``RANK0 STEPS s SYNCS y``: the counters after every rank loaded rank 0's file (model and
  optimizer, Horovod's checkpoint pattern) and trained to N;
* ``UNTOUCHED <0|1>``: whether an optimizer was left as built after a refused load;
* ``SAME <0|1>``: whether the final parameters and buffers equal the uninterrupted run's
  bit for bit;
* ``STEPS s SYNCS y``: the counters of the resumed optimizer at the end;
* ``AVGDIFF d MOVED m``: how far the rank-averaged final model is from the uninterrupted
  one, and how far training moved that one from its start;
* ``OTHER <error>``: what loading the state into an optimizer with another schedule raised;
* ``GROUP <error>``: the same with another group size (not for ``"static"``, which has
  no group size).
"""
import os
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


def error_of(opt, state):
    try:
        opt.load_state_dict(state)
    except ValueError as exc:
        return str(exc).replace("\n", " ")
    return "none"


def save(path, schedule):
    model = model_of(R)
    opt = optimizer_of(model, schedule)
    train(model, opt, 0, K)
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, path(R))
    opt.close()


def resume(path, schedule):
    def say(text):
        print(f"{schedule} rank {R} {text}", flush=True)

    initial = flat(model_of(R))
    model = model_of(R)
    opt = optimizer_of(model, schedule)
    train(model, opt, 0, N)
    uninterrupted = flat(model)
    opt.close()

    model = model_of(100 + R)  # a restarted script builds its model afresh
    opt = optimizer_of(model, schedule)
    error = error_of(opt, torch.load(path((R + 1) % P))['opt'])
    say(f"FOREIGN {error} STEPS {opt.state_dict()['ripples']['steps']}")
    first = torch.load(path(0))
    say(f"GENERATOR_STATE {int('schedule_state' in first['opt']['ripples'])}")
    model.load_state_dict(first["model"])
    opt.load_state_dict(first["opt"])
    train(model, opt, K, N)
    state = opt.state_dict()["ripples"]
    say(f"RANK0 STEPS {state['steps']} SYNCS {state['syncs']}")
    opt.close()

    model = model_of(100 + R)
    opt = optimizer_of(model, schedule)
    saved = torch.load(path(R))  # weights_only (the default): the state is plain data
    model.load_state_dict(saved["model"])
    opt.load_state_dict(saved["opt"])
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
        say(f"{label} {error_of(probe, saved['opt'])}")
        if label == "OTHER":
            say(f"UNTOUCHED {int(probe.state_dict()['ripples']['steps'] == 0 and not probe.state)}")
        probe.close()


phase, directory = sys.argv[1], sys.argv[2]
for name in sys.argv[3:]:
    {"save": save, "resume": resume}[phase](
        lambda rank: os.path.join(directory, f"{name}-{rank}.pt"), name)
hvd.shutdown()
