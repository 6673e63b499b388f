"""``epochs_horovod.py`` ported to decentralized training with ripples: the lines that
changed end in ``# ripples: ...``.

    ripplesrun -np 4 python examples/epochs_ripples.py
    ripplesrun -np 4 --slowdown 3:4 --compute-ms 20 python examples/epochs_ripples.py

Fast ranks no longer wait for slow ones: ``sync="ripples"`` averages models within groups of
ranks that are ready, and ``hvd.DistributedSampler`` lets every rank take the next batches of
the epoch as it gets to them, so all ranks finish each epoch together. Before evaluating
and saving, ``hvd.average_model`` makes every rank's replica the average.
"""
import argparse
import os
import time

import torch
import torch.nn.functional as F
import torch.utils.data as tud
from sklearn.datasets import load_digits

import ripples.torch as hvd  # ripples: instead of horovod.torch

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--epochs", type=int, default=5)
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--lr", type=float, default=0.05, help="per rank; scaled by the ranks")
parser.add_argument("--checkpoint", default="checkpoint.pt")
parser.add_argument("--loader-workers", type=int, default=0,
                    help="DataLoader worker processes (forked after init)")
parser.add_argument("--sync", default="ripples",  # ripples: the mode, for comparisons
                    choices=["ripples", "adpsgd", "allreduce"])
args = parser.parse_args()

hvd.init()
torch.manual_seed(0)
torch.set_num_threads(1)

digits = load_digits()
x = torch.tensor(digits.data / 16.0, dtype=torch.float32)
y = torch.tensor(digits.target)
order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
train_set = tud.TensorDataset(x[order[:1400]], y[order[:1400]])
val_x, val_y = x[order[1400:]], y[order[1400:]]

train_sampler = hvd.DistributedSampler(  # ripples: each rank draws the next batches
    train_set, num_replicas=hvd.size(), rank=hvd.rank())
train_loader = tud.DataLoader(train_set, batch_size=args.batch_size, sampler=train_sampler,
                              num_workers=args.loader_workers)

model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)

start_epoch = 0
# Resume: rank 0 saved the checkpoint, so rank 0 reads it and every rank gets it from rank 0
# (no shared file system needed across hosts).
state = torch.load(args.checkpoint) if hvd.rank() == 0 and os.path.exists(args.checkpoint) \
    else None
state = hvd.broadcast_object(state, root_rank=0, name="checkpoint")
if state is not None:
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    start_epoch = state["epoch"] + 1

hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                     sync=args.sync, model=model)  # ripples

began = time.perf_counter()
for epoch in range(start_epoch, args.epochs):
    model.train()
    train_sampler.set_epoch(epoch)
    steps = 0
    for data, target in train_loader:
        optimizer.zero_grad()
        F.cross_entropy(model(data), target).backward()
        optimizer.step()
        steps += 1
    scheduler.step()

    hvd.average_model(model)  # ripples: one model to evaluate and save
    model.eval()
    with torch.no_grad():
        accuracy = (model(val_x).argmax(1) == val_y).float().mean()
    accuracy = hvd.allreduce(accuracy, name="val_accuracy")
    if hvd.rank() == 0:
        print(f"epoch {epoch} steps {steps} val_accuracy {accuracy.item():.4f} "
              f"time {time.perf_counter() - began:.2f}s", flush=True)
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(), "epoch": epoch}, args.checkpoint)
