"""A Horovod script shaped like Horovod's ImageNet example, ported to ripples: metrics
all-reduced every batch, the learning rate warmed up batch by batch, two backward passes
per step, BatchNorm, a checkpoint on rank 0 each epoch.

    ripplesrun -np 4 python examples/metrics_every_batch.py
    ripplesrun -np 4 --slowdown 3:4 --compute-ms 20 python examples/metrics_every_batch.py
    ripplesrun -np 4 --slowdown 3:4 --compute-ms 20 python examples/metrics_every_batch.py \\
        --metrics epoch

With ``sync="ripples"`` and ``hvd.DistributedSampler`` ranks take different numbers of
steps per epoch, so the rank that ends its loop first takes part in the others' last
per-batch all-reduces (``hvd.average_model`` joins first). It runs, but a per-batch
all-reduce makes every step wait for the slowest rank, and ripples warns so:
``--metrics epoch`` adds the metrics up locally and all-reduces them once per epoch.
"""
import argparse
import os
import time

import torch
import torch.nn.functional as F
import torch.utils.data as tud
from sklearn.datasets import load_digits

import ripples.torch as hvd

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--batch-size", type=int, default=8, help="per backward pass")
parser.add_argument("--passes-per-step", type=int, default=2)
parser.add_argument("--base-lr", type=float, default=0.0125)
parser.add_argument("--warmup-epochs", type=float, default=1.0)
parser.add_argument("--checkpoint", default="checkpoint.pt")
parser.add_argument("--sync", default="ripples", choices=["ripples", "adpsgd", "allreduce"])
parser.add_argument("--metrics", default="batch", choices=["batch", "epoch"],
                    help="all-reduce the training metrics every batch (as Horovod's example) "
                         "or once per epoch")
args = parser.parse_args()

hvd.init()
torch.manual_seed(0)
torch.set_num_threads(1)

digits = load_digits()
images = torch.tensor(digits.data / 16.0, dtype=torch.float32).view(-1, 1, 8, 8)
labels = torch.tensor(digits.target)
order = torch.randperm(len(images), generator=torch.Generator().manual_seed(0))
train_set = tud.TensorDataset(images[order[:1400]], labels[order[:1400]])
val_set = tud.TensorDataset(images[order[1400:]], labels[order[1400:]])
step_batch = args.batch_size * args.passes_per_step
train_sampler = hvd.DistributedSampler(train_set)
train_loader = tud.DataLoader(train_set, batch_size=step_batch, sampler=train_sampler)
val_sampler = tud.distributed.DistributedSampler(val_set, hvd.size(), hvd.rank())
val_loader = tud.DataLoader(val_set, batch_size=64, sampler=val_sampler)

model = torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.BatchNorm2d(8),
                            torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(512, 10))
peak_lr = args.base_lr * args.passes_per_step * hvd.size()
optimizer = torch.optim.SGD(model.parameters(), lr=peak_lr, momentum=0.9)

start_epoch = 0
state = torch.load(args.checkpoint) if hvd.rank() == 0 and os.path.exists(args.checkpoint) \
    else None
state = hvd.broadcast_object(state, root_rank=0, name="checkpoint")
if state is not None:
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    start_epoch = state["epoch"] + 1
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)
if args.sync == "allreduce":  # gradients all-reduced once per step, after both passes
    mode = {"backward_passes_per_step": args.passes_per_step}
else:  # each rank steps on its own gradients; BatchNorm's statistics averaged too
    mode = {"sync": args.sync, "model": model}
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                     **mode)


class Metric:
    """A running mean over the job: all-reduced at every update (``--metrics batch``) or
    added up here and all-reduced once, when read (``--metrics epoch``)."""

    def __init__(self, name):
        self.name = name
        self.total = torch.zeros(2)  # sum of values, number of values

    def update(self, value):
        value = value.detach().reshape(1)
        if args.metrics == "batch":
            value = hvd.allreduce(value, name=self.name)
        self.total += torch.cat([value, torch.ones(1)])

    @property
    def mean(self):
        total = self.total
        if args.metrics == "epoch":
            total = hvd.allreduce(total, op=hvd.Sum, name=self.name)
        return (total[0] / total[1]).item()


def warmed_up_lr(epoch, batch):
    """From ``peak_lr / size`` up to ``peak_lr`` over the warmup epochs, then tenfold lower
    each epoch after the second."""
    if epoch < args.warmup_epochs:
        progress = (epoch + (batch + 1) / len(train_loader)) / args.warmup_epochs
        return peak_lr * (1 + progress * (hvd.size() - 1)) / hvd.size()
    return peak_lr * 0.1 ** max(0, epoch - 1)


began = time.perf_counter()
for epoch in range(start_epoch, args.epochs):
    model.train()
    train_sampler.set_epoch(epoch)
    train_loss, train_accuracy = Metric("train_loss"), Metric("train_accuracy")
    steps = 0
    for batch, (data, target) in enumerate(train_loader):
        for group in optimizer.param_groups:
            group["lr"] = warmed_up_lr(epoch, batch)
        optimizer.zero_grad()
        passes = range(0, len(data), args.batch_size)
        for start in passes:
            output = model(data[start:start + args.batch_size])
            part = target[start:start + args.batch_size]
            loss = F.cross_entropy(output, part)
            train_loss.update(loss)
            train_accuracy.update((output.argmax(1) == part).float().mean())
            (loss / len(passes)).backward()
        optimizer.step()
        steps += 1

    if args.sync != "allreduce":
        hvd.average_model(model)  # one model to evaluate and save
    model.eval()
    val_accuracy = Metric("val_accuracy")
    with torch.no_grad():
        for data, target in val_loader:
            val_accuracy.update((model(data).argmax(1) == target).float().mean())
    accuracy = val_accuracy.mean
    loss, train_acc = train_loss.mean, train_accuracy.mean
    if hvd.rank() == 0:
        print(f"train_loss {loss:.4f} train_accuracy {train_acc:.4f}")
        print(f"epoch {epoch} steps {steps} val_accuracy {accuracy:.4f} "
              f"time {time.perf_counter() - began:.2f}s", flush=True)
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "epoch": epoch}, args.checkpoint)
