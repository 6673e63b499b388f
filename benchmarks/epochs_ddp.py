"""``examples/epochs_horovod.py`` written for PyTorch DDP (gloo): the outside reference of
``benchmarks/epochs.py``. Launched by it under ``mpiexec`` (rank and size from Open MPI's
variables, the rendezvous port in ``RIPPLES_BENCH_PORT``, rank 0's host in
``RIPPLES_BENCH_ADDRESS``, default this one).

The same data, model, sampler, schedule, per-epoch all-reduce of the validation accuracy and
rank-0 checkpoint. Emulated compute and slowdowns follow ripples' rule
(``ripples.core.heterogeneity.SlowdownInjector``, from the same ``RIPPLES_*`` settings), applied
after the forward pass and before ``backward()``, which holds DDP's all-reduce.
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torch.utils.data as tud
from sklearn.datasets import load_digits

from ripples.core.config import Config
from ripples.core.heterogeneity import SlowdownInjector

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--epochs", type=int, default=5)
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--lr", type=float, default=0.05)
parser.add_argument("--checkpoint", default="checkpoint.pt")
args = parser.parse_args()

rank, size = int(os.environ["OMPI_COMM_WORLD_RANK"]), int(os.environ["OMPI_COMM_WORLD_SIZE"])
# rank 0's host: this one, or across hosts the one the benchmark names (it runs rank 0)
address = os.environ.get("RIPPLES_BENCH_ADDRESS", "127.0.0.1")
dist.init_process_group("gloo", init_method=f"tcp://{address}:{os.environ['RIPPLES_BENCH_PORT']}",
                        rank=rank, world_size=size)
torch.manual_seed(0)
torch.set_num_threads(1)
injector = SlowdownInjector.from_config(Config.load(), rank, size)

digits = load_digits()
x = torch.tensor(digits.data / 16.0, dtype=torch.float32)
y = torch.tensor(digits.target)
order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
train_set = tud.TensorDataset(x[order[:1400]], y[order[:1400]])
val_x, val_y = x[order[1400:]], y[order[1400:]]
train_sampler = tud.distributed.DistributedSampler(train_set, num_replicas=size, rank=rank)
train_loader = tud.DataLoader(train_set, batch_size=args.batch_size, sampler=train_sampler)

model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
ddp = torch.nn.parallel.DistributedDataParallel(model)
optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr * size, momentum=0.9)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)

began = time.perf_counter()
for epoch in range(args.epochs):
    ddp.train()
    train_sampler.set_epoch(epoch)
    steps = 0
    for data, target in train_loader:
        step_began = time.perf_counter()
        optimizer.zero_grad()
        loss = F.cross_entropy(ddp(data), target)
        injector.finish_step(time.perf_counter() - step_began)
        loss.backward()
        optimizer.step()
        steps += 1
    scheduler.step()
    ddp.eval()
    with torch.no_grad():
        accuracy = (model(val_x).argmax(1) == val_y).float().mean()
    dist.all_reduce(accuracy)
    accuracy /= size
    if rank == 0:
        print(f"epoch {epoch} steps {steps} val_accuracy {accuracy.item():.4f} "
              f"time {time.perf_counter() - began:.2f}s", flush=True)
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "epoch": epoch}, args.checkpoint)
dist.destroy_process_group()
