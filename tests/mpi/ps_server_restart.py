"""A parameter server killed mid-training, and the job resumed from its last commit by
``ripplesrun --max-restarts`` (run by tests/test_fault_tolerance.py).

usage: ps_server_restart.py MARKER_DIR STEPS KILL_AT

1 server + workers, BSP, inside ``hvd.elastic.run`` with a ``TorchState`` committed every 5
steps. In the first launch worker 0 kills the server (SIGKILL) before step KILL_AT; the job
fails, and the launcher starts it again from the last commit. Every worker prints ``FINAL
rank=R launches=L step=S weight=W twin=T``: T is the same training in one process (each
step applies the average gradient of every worker's batch), which the resumed job must
equal, since the steps after the commit are redone from it.
"""
import os
import signal
import sys
from pathlib import Path

import torch

import ripples.torch as hvd

marker_dir, steps, kill_at = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
hvd.init()
launch = len(list(marker_dir.glob("launch-*"))) + 1 if hvd.rank() == 0 else 0
torch.manual_seed(0)
model = torch.nn.Linear(4, 1, bias=False)
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                     named_parameters=model.named_parameters(),
                                     sync="ps", policy="bsp")
data = torch.Generator().manual_seed(1)
inputs = torch.randn(64, 4, generator=data)
targets = inputs @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])


def batch(worker, step):
    rows = torch.Generator().manual_seed(1000 * worker + step)
    index = torch.randint(0, len(inputs), (8,), generator=rows)
    return inputs[index], targets[index]


def server_pid():
    """The process of world rank 0 (the server) of this job, from /proc (one host)."""
    mine = os.environ["PMIX_NAMESPACE"]
    for entry in Path("/proc").iterdir():
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        if (f"PMIX_NAMESPACE={mine}".encode() in environ
                and b"OMPI_COMM_WORLD_RANK=0" in environ):
            return int(entry.name)
    raise RuntimeError("the server's process was not found")


state = hvd.elastic.TorchState(model, optimizer, step=0)


@hvd.elastic.run
def train(state):
    while state.step < steps:
        if state.step == kill_at and hvd.rank() == 0 and launch == 1:
            (marker_dir / "launch-1").touch()
            os.kill(server_pid(), signal.SIGKILL)
        x, y = batch(hvd.rank(), state.step)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        state.step += 1
        if state.step % 5 == 0:
            state.commit()


train(state)
optimizer.join()
twin = torch.nn.Linear(4, 1, bias=False)
torch.manual_seed(0)
twin = torch.nn.Linear(4, 1, bias=False)
for step in range(steps):
    twin.zero_grad()
    total = sum(torch.nn.functional.mse_loss(twin(x), y)
                for x, y in (batch(w, step) for w in range(hvd.size())))
    (total / hvd.size()).backward()
    with torch.no_grad():
        twin.weight -= 0.1 * twin.weight.grad
print(f"FINAL rank={hvd.rank()} launch={launch} step={state.step} "
      f"gap={(model.weight - twin.weight).abs().max().item():.3g}", flush=True)
