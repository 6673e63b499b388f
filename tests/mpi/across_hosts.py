"""Where each rank runs, then all-reduces in a loop (run by tests/test_hosts_netcluster.py
on an emulated cluster).

Usage: across_hosts.py SECONDS. Prints ``RANK r size= host= local= cross= FOO= TIMEOUT=``,
then ``READY``, all-reduces every 20 ms for SECONDS, and prints ``FINISHED``.
"""
import os
import socket
import sys
import time

import torch

import ripples.torch as hvd
from ripples import runtime

hvd.init()
print(f"RANK {hvd.rank()} size={hvd.size()} host={socket.gethostname()} "
      f"local={hvd.local_rank()}/{hvd.local_size()} cross={hvd.cross_rank()}/{hvd.cross_size()} "
      f"FOO={os.environ.get('FOO')} TIMEOUT={runtime.current().config.timeout_s:g}", flush=True)
total = hvd.allreduce(torch.ones(1), op=hvd.Sum, name="check")
print(f"READY {hvd.rank()} sum={total.item():g}", flush=True)
end = time.time() + float(sys.argv[1])
while time.time() < end:
    hvd.allreduce(torch.ones(1000), name="g")
    time.sleep(0.02)
print(f"FINISHED {hvd.rank()}", flush=True)
