"""Slow is not dead across hosts (run by tests/test_hosts_netcluster.py): rank 1 holds the
interpreter lock in one native call for longer than the check delay and three answer bounds
together, while every other rank, most of them on other hosts, waits for it in an
all-reduce. Its responder cannot answer; a rank of its host sees its process run and says
so. Each rank prints ``DONE r sum=``."""
import os
import sys

import torch

import ripples.torch as hvd
from ripples.comm.liveness import answer_wait_s
from ripples.runtime import current

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lock_hold import hold_the_interpreter_lock  # noqa: E402

hvd.init()
hvd.allreduce(torch.ones(1), name="before")
if hvd.rank() == 1:
    liveness = current().liveness
    held = hold_the_interpreter_lock(liveness.check_after_s()
                                     + 3 * answer_wait_s(liveness.timeout_s))
    print(f"HELD rank 1 for {held:.1f} s", flush=True)
total = hvd.allreduce(torch.ones(1), name="after", op=hvd.Sum).item()
print(f"DONE {hvd.rank()} sum={total:g}", flush=True)
