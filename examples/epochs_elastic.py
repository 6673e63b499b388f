"""``epochs_horovod.py`` made elastic, as with Horovod's ``hvd.elastic``: all-reduce training
that survives ranks lost under ``ripplesrun --fault-tolerant`` by rolling back to the last
``commit()`` on the survivors.

    ripplesrun -np 4 --fault-tolerant python examples/epochs_elastic.py

The training function runs inside ``hvd.elastic.run``: when a rank dies, freezes or is cut
off, the collective that finds it raises ``HorovodInternalError`` on the others, which
restore the state committed last (model, optimizer, epoch, sampler position) and call the
function again on the smaller world. Rank 0 of the world saves a checkpoint after every
epoch; a rank on the losing side of a network partition stops instead of returning here.
"""
import argparse
import time

import torch
import torch.nn.functional as F
import torch.utils.data as tud
from sklearn.datasets import load_digits

import ripples.torch as hvd

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--epochs", type=int, default=5)
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--lr", type=float, default=0.05, help="per rank; scaled by the ranks")
parser.add_argument("--checkpoint", default="checkpoint.pt")
parser.add_argument("--commit-every", type=int, default=4, help="batches between commits")
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

model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
sampler = hvd.elastic.ElasticSampler(train_set, shuffle=True, seed=0)
loader = tud.DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)
state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0)
began = time.perf_counter()


@hvd.elastic.run
def train(state):
    for state.epoch in range(state.epoch, args.epochs):
        model.train()
        for batch, (data, target) in enumerate(loader):
            optimizer.zero_grad()
            F.cross_entropy(model(data), target).backward()
            optimizer.step()
            sampler.record_batch(batch, args.batch_size)
            if batch % args.commit_every == args.commit_every - 1:
                state.commit()
        model.eval()
        with torch.no_grad():
            accuracy = (model(val_x).argmax(1) == val_y).float().mean()
        accuracy = hvd.allreduce(accuracy, name="val_accuracy")
        if hvd.rank() == 0:
            print(f"epoch {state.epoch} size {hvd.size()} val_accuracy {accuracy.item():.4f} "
                  f"time {time.perf_counter() - began:.2f}s", flush=True)
            torch.save({"model": model.state_dict(), "epoch": state.epoch}, args.checkpoint)
        sampler.set_epoch(state.epoch + 1)
        state.commit()


train(state)
