"""Where each rank runs, then all-reduces in a loop (run by tests/test_hosts_netcluster.py
on an emulated cluster).

Usage: across_hosts.py SECONDS [CHECKPOINT]. Prints ``RANK r size= host= local= cross= FOO=
TIMEOUT= ring_world= ring_local= node_by_node=`` (whether a 256 KiB all-reduce of the world, and
of ranks 0 and 1, goes around the ring; whether the hosts hold equally many ranks numbered host
by host), then ``READY r sum= big= pid=`` (``big``: a 256 KiB all-reduce's
sum), all-reduces every 20 ms, SECONDS / 0.02 times, and prints
``FINISHED r size= stall=`` (the longest all-reduce, in seconds). With CHECKPOINT, the
loop goes on through ``RanksFailedError`` (fault tolerant), and every 0.5 s the current
world's rank 0 writes CHECKPOINT and appends ``host size`` to CHECKPOINT.log.
"""
import faulthandler
import os
import signal
import socket
import sys
import time

import torch

import ripples.torch as hvd
from ripples import runtime

hvd.init()
host = socket.gethostname()
# Where each rank is, on demand (SIGUSR1), into a file beside the job's log
# (ACROSS_HOSTS_STACKS): the launcher's output forwarding may be what is stuck.
_stacks = os.environ.get("ACROSS_HOSTS_STACKS")
_stack_file = open(f"{_stacks}.{hvd.rank()}", "w") if _stacks else sys.stderr
faulthandler.register(signal.SIGUSR1, file=_stack_file, all_threads=True)
print(f"RANK {hvd.rank()} size={hvd.size()} host={host} "
      f"local={hvd.local_rank()}/{hvd.local_size()} cross={hvd.cross_rank()}/{hvd.cross_size()} "
      f"FOO={os.environ.get('FOO')} TIMEOUT={runtime.current().config.timeout_s:g} "
      f"ring_world={runtime.current().ring_carries(range(hvd.size()), 256 << 10)} "
      f"ring_local={runtime.current().ring_carries((0, 1), 256 << 10)} "
      f"node_by_node={runtime.current().hosts_node_by_node}", flush=True)
total = hvd.allreduce(torch.ones(1), op=hvd.Sum, name="check")
big = hvd.allreduce(torch.ones(64 << 10), op=hvd.Sum, name="big")
print(f"READY {hvd.rank()} sum={total.item():g} big={big.unique().tolist()} pid={os.getpid()}",
      flush=True)
checkpoint = sys.argv[2] if len(sys.argv) > 2 else None
stall, last_write = 0.0, time.time()
for _ in range(int(float(sys.argv[1]) / 0.02)):  # as many on every rank: no unmatched call
    began = time.time()
    try:
        hvd.allreduce(torch.ones(1000), name="g")
    except hvd.HorovodInternalError:
        if checkpoint is None:
            raise
        print(f"RECOVERED {hvd.rank()} size={hvd.size()} after={time.time() - began:.1f}",
              flush=True)
    stall = max(stall, time.time() - began)
    if checkpoint and hvd.rank() == 0 and time.time() - last_write > 0.5:
        last_write = time.time()
        with open(checkpoint, "w") as out:
            out.write(f"{host} {hvd.size()}\n")
        with open(checkpoint + ".log", "a") as log:
            log.write(f"{host} {hvd.size()}\n")
    time.sleep(0.02)
print(f"FINISHED {hvd.rank()} size={hvd.size()} stall={stall:.1f}", flush=True)
