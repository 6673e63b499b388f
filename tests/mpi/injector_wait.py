"""Rank 1 is slowed 6x and rank 0 3x (emulated 20 ms steps), so rank 0
waits for rank 1 at the end of every backward pass; that wait is communication, so rank 0's
injected slowdown must scale only its own 20 ms (40 ms more per step), never the wait.
Prints ``rank R slowed_ms_per_step X wait_ms_per_step Y``."""
import torch

import ripples.torch as hvd

hvd.init(compute_ms=20, slowdown="0:3,1:6")
model = torch.nn.Linear(8, 4)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                               named_parameters=model.named_parameters())
steps = 8
for _ in range(steps):
    opt.zero_grad()
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
print(f"rank {hvd.rank()} slowed_ms_per_step {opt._injector.slowed_s / steps * 1000:.1f} "
      f"wait_ms_per_step {opt.metrics.wait_s / steps * 1000:.1f}", flush=True)
