"""Parameter-server mode through the Horovod-style frontend (RIPPLES_PS_SERVERS=1, 3 ranks):
the server rank serves inside init() and never runs this script's body."""
import torch

import ripples.torch as hvd

hvd.init()
assert hvd.size() == 2 and hvd.rank() in (0, 1), (hvd.rank(), hvd.size())  # workers only
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                               named_parameters=model.named_parameters(), sync="ps",
                               policy="bsp")
scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
for step in range(3 + hvd.rank()):  # uneven step counts end with join()
    opt.zero_grad()
    model(torch.full((2, 4), float(hvd.rank() + 1))).sum().backward()
    opt.step()
    scheduler.step()
hvd.join()
saved = opt.state_dict()  # the servers' momentum, one buffer per parameter
assert sorted(saved["state"]) == [0, 1], saved["state"].keys()
assert saved["state"][0]["momentum_buffer"].shape == model.weight.shape, saved["state"][0]
weights = hvd.allgather_object(model.weight.detach().tolist())
assert weights[0] == weights[1], weights  # both hold the servers' final parameters
# the collectives of the core keep working among the workers
assert hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == 2.0
print(f"worker {hvd.rank()} ok", flush=True)
hvd.shutdown()
