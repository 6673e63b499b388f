"""A rank dies while it holds a chunk of a shared epoch (run by test_fault_tolerance.py).

usage: ft_shared_sampler.py DEAD_RANK

Four ranks draw an epoch of 120 samples through ``hvd.DistributedSampler(share=True,
batch_size=4)`` and a DataLoader of batches of 2 (a chunk is two batches). Rank DEAD_RANK
prints the chunks it finished and the one it holds, then dies in the first batch of its
third chunk. The survivors print the indices they trained on in each epoch; after each
epoch they all-reduce a metric, where a death not noticed before is noticed.
"""
import faulthandler
import os
import sys
import time

import torch
import torch.utils.data as tud

import ripples.torch as hvd

dead_rank = int(sys.argv[1])
faulthandler.dump_traceback_later(120, exit=True)
hvd.init()
old_rank = hvd.rank()
data = tud.TensorDataset(torch.arange(120))
sampler = hvd.DistributedSampler(data, seed=2, share=True, batch_size=4)
loader = tud.DataLoader(data, batch_size=2, sampler=sampler)
for epoch in range(2):
    sampler.set_epoch(epoch)
    trained = []
    for batch, (index,) in enumerate(loader):
        if old_rank == dead_rank and epoch == 0 and len(sampler.draws) == 3:
            finished = sampler.indices(sampler.draws[:2])
            print(f"DEAD finished={finished} held={list(sampler.draws[2])}", flush=True)
            os._exit(1)
        trained.extend(index.tolist())
        time.sleep(0.01)
    while True:
        try:
            hvd.allreduce(torch.ones(1), name=f"metric.{epoch}")
            break
        except hvd.HorovodInternalError as error:  # the survivors go on without the dead
            print(f"RESET rank={hvd.rank()} old_rank={old_rank} size={hvd.size()}", flush=True)
    print(f"TRAINED old_rank={old_rank} epoch={epoch} indices={trained}", flush=True)
hvd.shutdown()
