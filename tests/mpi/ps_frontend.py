"""Parameter-server mode through the Horovod-style frontend (RIPPLES_PS_SERVERS=1, 3 ranks):
the server rank serves inside init() and never runs this script's body."""
import torch

import ripples.torch as hvd

hvd.init()
assert hvd.size() == 2 and hvd.rank() in (0, 1), (hvd.rank(), hvd.size())  # workers only
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                               named_parameters=model.named_parameters(), sync="ps",
                               policy="bsp")
for step in range(3 + hvd.rank()):  # uneven step counts end with join()
    opt.zero_grad()
    model(torch.full((2, 4), float(hvd.rank() + 1))).sum().backward()
    opt.step()
hvd.join()
weights = hvd.allgather_object(model.weight.detach().tolist())
assert weights[0] == weights[1], weights  # both hold the servers' final parameters
# the collectives of the core keep working among the workers
assert hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == 2.0
print(f"worker {hvd.rank()} ok", flush=True)
hvd.shutdown()
