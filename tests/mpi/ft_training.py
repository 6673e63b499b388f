"""Training through a rank's death under ``Config.fault_tolerant`` (run by test_fault_tolerance).

usage: ft_training.py MODE SCHEDULE DEAD_RANK DIE_AT_STEP STEPS

MODE ``decentralized``: ``DistributedOptimizer(sync="ripples", schedule=SCHEDULE)``; the
survivors keep their models and go on. MODE ``elastic``: all-reduce training inside
``hvd.elastic.run`` with a ``TorchState`` committed every 5 steps and a per-step metric
all-reduce; the survivors roll back to the last commit. MODE ``sampler``: one epoch through an ``ElasticSampler`` inside
``hvd.elastic.run``; the survivors share the samples not processed at the last commit. MODE
``ps``: parameter-server training (``RIPPLES_PS_SERVERS`` set by the caller) with policy
SCHEDULE; the servers drop the dead worker and go on with the rest. Rank DEAD_RANK calls ``os._exit(1)`` at step DIE_AT_STEP
(STEPS in MODE ``decentralized``: after ``join()``, as the others start ``average_model``;
or, with FT_TRAINING_RAISE=1, raises an uncaught RuntimeError there; with
FT_TRAINING_FREEZE=1, stops itself with SIGSTOP there: frozen, as if cut off; thawed, it
goes on training).

Each survivor prints ``SURVIVOR rank=R old_rank=O size=S resets=N steps=K loss0=.. loss=..
checksum=..`` after ``join()`` (and ``active=..``, its AD-PSGD role, under ``adpsgd``).
"""
import faulthandler
import os
import signal
import sys

import torch

import ripples.torch as hvd

mode, schedule, dead_rank, die_at, steps = (sys.argv[1], sys.argv[2], int(sys.argv[3]),
                                            int(sys.argv[4]), int(sys.argv[5]))
# A hung job shows where each rank waits, well before the outer test's timeout.
faulthandler.dump_traceback_later(120, exit=True)
hvd.init()
old_rank, old_size = hvd.rank(), hvd.size()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
resets = []
hvd.on_reset(lambda: resets.append(hvd.size()))

# A fixed regression problem; each rank draws its own batches from it.
data_gen = torch.Generator().manual_seed(1)
inputs = torch.randn(512, 8, generator=data_gen)
targets = inputs @ torch.randn(8, 1, generator=data_gen)


def batch(step):
    rows = torch.Generator().manual_seed(1000 * old_rank + step)
    index = torch.randint(0, len(inputs), (32,), generator=rows)
    return inputs[index], targets[index]


def loss_of(m):
    with torch.no_grad():
        return torch.nn.functional.mse_loss(m(inputs), targets).item()


def maybe_die(step):
    if old_rank == dead_rank and step == die_at:
        sys.stdout.flush()
        if os.environ.get("FT_TRAINING_RAISE") == "1":  # an uncaught error ends the rank
            raise RuntimeError(f"an error in the training script on rank {old_rank}")
        if os.environ.get("FT_TRAINING_FREEZE") == "1":  # alive to MPI, silent to all
            os.kill(os.getpid(), signal.SIGSTOP)
            print(f"WOKE old_rank={old_rank}", flush=True)
            return  # thawed: it goes on as if nothing happened
        os._exit(1)


def twin_gap(members_at):
    """The largest difference between ``model`` and the same training in one process, whose
    step ``s`` applies the average gradient of the ranks ``members_at(s)``."""
    global old_rank
    torch.manual_seed(0)
    twin = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    twin_sgd = torch.optim.SGD(twin.parameters(), lr=0.05)
    for step in range(steps):
        ranks = members_at(step)
        grads = []
        for r in ranks:
            old_rank_here, old_rank = old_rank, r
            x, y = batch(step)
            old_rank = old_rank_here
            twin.zero_grad()
            torch.nn.functional.mse_loss(twin(x), y).backward()
            grads.append([p.grad.clone() for p in twin.parameters()])
        for i, p in enumerate(twin.parameters()):
            p.grad = sum(g[i] for g in grads) / len(ranks)
        twin_sgd.step()
    return max((a - b).abs().max().item() for a, b in zip(model.parameters(), twin.parameters()))


def train_steps(optimizer):
    """``steps`` plain steps of this rank's batches (dying where told); returns the count."""
    for step in range(steps):
        maybe_die(step)
        x, y = batch(step)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    return steps


loss0 = loss_of(model)
if mode == "decentralized":
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    # SCHEDULE "adpsgd": asynchronous AD-PSGD (sync="adpsgd") instead of a P-Reduce schedule
    mode_args = ({"sync": "adpsgd"} if schedule == "adpsgd" else
                 {"sync": "ripples", "schedule": schedule, "group_size": 2})
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                         named_parameters=model.named_parameters(),
                                         **mode_args)
    done = train_steps(optimizer)
    hvd.join()
    maybe_die(steps)  # DIE_AT_STEP = STEPS: while the others average the models
    averaged = hvd.average_model(model)
    final_loss = loss_of(averaged)
elif mode == "ps":
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                         named_parameters=model.named_parameters(),
                                         sync="ps", policy=schedule)
    done = train_steps(optimizer)
    optimizer.join()  # the final parameters, pulled from the servers
    dead = optimizer.metrics()["server_load"][0]["dead"]
    print(f"PS_SERVER rank={hvd.rank()} dead={','.join(map(str, dead))}", flush=True)
    final_loss = loss_of(model)
    # BSP: every worker's gradient before the death, the survivors' after it
    gap = twin_gap(lambda step: [r for r in range(old_size) if step < die_at or r != dead_rank])
    print(f"TWIN rank={hvd.rank()} max_difference={gap!r}", flush=True)
elif mode == "sampler":
    # One epoch of 96 samples in batches of 2 through an ElasticSampler, committed every 2
    # batches; DIE_AT_STEP is the dead rank's batch. Each rank keeps the samples it trained
    # on up to its last commit (what ran after it is rolled back and redone).
    dataset = torch.utils.data.TensorDataset(inputs[:96], torch.arange(96))
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=False)
    loader = torch.utils.data.DataLoader(dataset, batch_size=2, sampler=sampler)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                         named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler)
    committed, pending = [], []
    state.register_reset_callbacks([pending.clear])

    def commit():
        committed.extend(pending)
        pending.clear()
        state.commit()

    @hvd.elastic.run
    def train(state):
        for batch_idx, (x, index) in enumerate(loader):
            if hvd.size() == old_size:
                maybe_die(batch_idx)
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), targets[index]).backward()
            optimizer.step()
            pending.extend(index.tolist())
            sampler.record_batch(batch_idx, 2)
            if batch_idx % 2 == 1:
                commit()
        commit()

    train(state)
    done = len(committed)
    everyone = hvd.allgather_object(committed)
    print(f"SAMPLES rank={hvd.rank()} trained={sorted(i for part in everyone for i in part)}",
          flush=True)
    hvd.join()
    final_loss = loss_of(model)
else:
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                         named_parameters=model.named_parameters())
    pair = hvd.add_process_set([0, 1])  # of the first world: refused after the death
    state = hvd.elastic.TorchState(model, optimizer, step=0, done=0)
    state.register_reset_callbacks([lambda: resets.append(-1)])

    @hvd.elastic.run
    def train(state):
        while state.step < steps:
            maybe_die(state.step)
            # a per-step metric, as training scripts log: planned on the native lane after
            # two steps, so the survivors learn of the death in it
            hvd.allreduce(torch.tensor(float(state.step)), name="step")
            x, y = batch(state.step)
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
            state.step += 1
            state.done += 1
            if state.step % 5 == 0:
                state.commit()

    train(state)
    done = state.done
    try:
        hvd.allreduce(torch.ones(1), process_set=pair)
        outcome = "used"
    except ValueError as error:
        outcome = "refused" if f"rank(s) [{dead_rank}] died" in str(error) else repr(error)
    hvd.remove_process_set(pair)
    pair = hvd.add_process_set([0, 1])  # of the survivors' world
    if hvd.rank() in (0, 1):
        total = hvd.allreduce(torch.ones(1), op=hvd.Sum, process_set=pair).item()
        outcome += f",sum={total:g}"
    print(f"PROCESS_SET rank={hvd.rank()} outcome={outcome}", flush=True)
    hvd.join()
    final_loss = loss_of(model)
    # The same training in one process: every rank of the first world averages its
    # gradients up to the last commit before the death, the survivors from there on.
    last_commit = die_at - die_at % 5
    gap = twin_gap(lambda step: [r for r in range(old_size)
                                 if step < last_commit or r != dead_rank])
    print(f"TWIN rank={hvd.rank()} max_difference={gap!r}", flush=True)

checksum = float(sum(p.detach().double().sum() for p in model.parameters()))
role = f" active={optimizer.active}" if mode == "decentralized" and schedule == "adpsgd" else ""
print(f"SURVIVOR rank={hvd.rank()} old_rank={old_rank} size={hvd.size()} "
      f"resets={','.join(map(str, resets))} steps={done} loss0={loss0:.6f} loss={final_loss:.6f} "
      f"checksum={checksum!r}{role}", flush=True)
hvd.shutdown()
