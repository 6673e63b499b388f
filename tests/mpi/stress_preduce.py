"""P-Reduce stress on real MPI ranks: random groups, random delays, no deadlock, and the
mean invariant at the end.

usage: stress_preduce.py ROUNDS SEED

Every rank draws the same partition of the world into groups of 1 to 4 ranks for each
round from ``SEED`` (as the random schedule does), then sleeps a random 0-3 ms of its own
(so members arrive in any order and consecutive rounds' groups overlap in time), and
averages its vectors with its group: a float64 and a float32 vector in two asynchronous
P-Reduces waited for in a random order, every tenth round a blocking one as well. Run with
a small communicator cache (``RIPPLES_CACHE_CAPACITY``) the groups keep being evicted and
rebuilt; with ``RIPPLES_GROUP_ALLREDUCE=ring`` they go around the ring.

Averaging within groups keeps the sum over all ranks: at the end an all-reduce checks it
against the starting sum (float64 to 1e-9, float32 to 1e-4 relative). Rank 0 prints
``STRESS rounds=.. groups=.. seconds=..``. A deadlock shows as a ``RipplesTimeoutError``.
"""
import random
import sys
import time

import torch

import ripples.torch as hvd

rounds, seed = int(sys.argv[1]), int(sys.argv[2])
hvd.init()
R, N = hvd.rank(), hvd.size()
shared = random.Random(seed)          # the same on every rank: the groups
own = random.Random(seed * 1000 + R)  # this rank's delays and waiting order
wide = torch.arange(1000, dtype=torch.float64) * (R + 1)
narrow = torch.linspace(-1, 1, 257, dtype=torch.float32) * (R - N / 2)
start_wide = hvd.allreduce(wide, op=hvd.Sum)
start_narrow = hvd.allreduce(narrow, op=hvd.Sum)
groups_run = 0
began = time.perf_counter()
for number in range(rounds):
    ranks = list(range(N))
    shared.shuffle(ranks)
    groups, i = [], 0
    while i < N:
        size = shared.randint(1, 4)
        groups.append(ranks[i:i + size])
        i += size
    mine = next(g for g in groups if R in g)
    time.sleep(own.uniform(0, 0.003))
    handles = [hvd.partial_allreduce_async_(wide, mine, name=f"w{number}"),
               hvd.partial_allreduce_async_(narrow, mine, name=f"n{number}")]
    own.shuffle(handles)
    for handle in handles:
        hvd.synchronize(handle)
    if number % 10 == 0:
        hvd.partial_allreduce_(wide, mine)
    groups_run += len(mine) > 1
end_wide = hvd.allreduce(wide, op=hvd.Sum)
end_narrow = hvd.allreduce(narrow, op=hvd.Sum)
assert torch.allclose(end_wide, start_wide, rtol=1e-9, atol=1e-9), \
    f"rank {R}: the float64 sum drifted by {(end_wide - start_wide).abs().max().item()}"
assert torch.allclose(end_narrow, start_narrow, rtol=1e-4, atol=1e-4), \
    f"rank {R}: the float32 sum drifted by {(end_narrow - start_narrow).abs().max().item()}"
total_groups = hvd.allreduce(torch.tensor(groups_run), op=hvd.Sum).item()
if R == 0:
    print(f"STRESS rounds={rounds} group_memberships={total_groups} "
          f"seconds={time.perf_counter() - began:.1f}", flush=True)
