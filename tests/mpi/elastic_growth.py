"""All-reduce training inside ``hvd.elastic.run`` under ``ripplesrun --min-np/--max-np``.

Usage: ``elastic_growth.py WORK_DIR DEAD_RANK DIE_AT STEPS``. Each step every rank's
gradient is ones, so the average is ones whatever the world, and SGD with lr 1 takes the
weight down by exactly 1: after STEPS steps with none lost or applied twice it is -STEPS.
A commit every 3 steps. On the first launch only (no ``died`` file in WORK_DIR yet) rank
DEAD_RANK exits at step DIE_AT. Every rank prints ``STEP launch=L step=S size=N`` per step
and ``RESULT rank=R size=N weight=W`` at the end.
"""
import os
import sys
from pathlib import Path

import torch

import ripples.torch as hvd

work, dead_rank, die_at, steps = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), \
    int(sys.argv[4])
launch = len(list(work.glob("launch.*")))
hvd.init()
if hvd.rank() == 0:
    (work / f"launch.{launch}").touch()
model = torch.nn.Linear(4, 1, bias=False)
torch.nn.init.zeros_(model.weight)
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0),
                                     named_parameters=model.named_parameters())
state = hvd.elastic.TorchState(model, optimizer, step=0)


@hvd.elastic.run
def train(state):
    while state.step < steps:
        if state.step == die_at and hvd.rank() == dead_rank and not (work / "died").exists():
            (work / "died").touch()
            os._exit(1)
        optimizer.zero_grad()
        model.weight.grad = torch.ones_like(model.weight)
        optimizer.step()
        state.step += 1
        print(f"STEP launch={launch} step={state.step} size={hvd.size()}", flush=True)
        if state.step % 3 == 0:
            state.commit()


train(state)
print(f"RESULT rank={hvd.rank()} size={hvd.size()} weight={model.weight.detach().unique().tolist()}",
      flush=True)
hvd.join()
