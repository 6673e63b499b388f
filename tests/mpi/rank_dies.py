"""A rank dies in the middle of decentralized training (run by tests/test_rank_death_mpi.py).

Usage: rank_dies.py SYNC SCHEDULE. Rank 1 exits abruptly at step 5; the survivors either
carry on (and say so) or end with RipplesTimeoutError naming the missing rank.
"""
import os
import sys
import time

import torch

import ripples.torch as hvd
from ripples.core.errors import RipplesTimeoutError

sync, schedule = sys.argv[1], (sys.argv[2] if sys.argv[2] != "-" else None)
hvd.init()
model = torch.nn.Linear(8, 2)
kwargs = {} if sync == "allreduce" else {"schedule": schedule, "group_size": 2}
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                               named_parameters=model.named_parameters(), sync=sync, **kwargs)
start = None
try:
    for step in range(300):
        if hvd.rank() == 1 and step == 5:
            os._exit(3)
        if step == 5:
            start = time.monotonic()
        opt.zero_grad()
        model(torch.ones(4, 8)).sum().backward()
        opt.step()
        if step == 100:  # printed now: a peer exiting first may end this process
            print(f"rank {hvd.rank()} carried on past step 100", flush=True)
        time.sleep(0.005)
except RipplesTimeoutError as exc:
    print(f"rank {hvd.rank()} SURVIVOR-ERROR after {time.monotonic() - start:.1f}s: {exc}", flush=True)
    # The launcher may end the job once a survivor exits: stay until the other survivor,
    # which meets the same bound (TIMEOUT_S * 2 + 2 s, asserted by the test), has spoken.
    time.sleep(max(0.0, start + 10.0 - time.monotonic()))
    os._exit(0)
os._exit(0)
