"""One case of the failure fuzzer (run by tests/test_failure_fuzz_mpi.py): an epoch loop in
one mode in which one rank fails in one way at one point.

Usage: failure_case.py MODE FAILURE VICTIM AT_STEP.
MODE: ``allreduce``, ``ripples`` (generator schedule), ``adpsgd`` (asynchronous) or ``ps``
(rank 0 a parameter server, launched with RIPPLES_PS_SERVERS=1; VICTIM is a world rank).
FAILURE, done by world rank VICTIM when it reaches AT_STEP of its 3 epochs of 8 steps:
``raise`` (an uncaught exception), ``kill`` (SIGKILL), ``freeze`` (SIGSTOP), ``block`` (a
barrier of the script's own that no other rank reaches: alive, not moving), ``none``.
The parameter server (VICTIM 0 in ``ps`` mode) fails ``kill`` or ``freeze`` 0.2 * AT_STEP s
into serving, from a thread (its main thread serves), if it still serves then (else it
prints ``NOT FAILING``: once every worker has left, nobody is left to notice a server frozen
in its exit, and only the launcher could end such a job).
Each rank prints ``DONE rank R`` when it finishes.
"""
import atexit
import faulthandler
import os
import signal
import sys
import time

import torch
from mpi4py import MPI

mode, failure, victim, at_step = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
# A hang shows where each rank waits, before the outer test's limit (and fails its bound).
faulthandler.dump_traceback_later(45, exit=True)
world = MPI.COMM_WORLD.Dup()  # the script's own communicator, for the "block" failure
world_rank = MPI.COMM_WORLD.Get_rank()


def fail_now():
    print(f"FAILING {failure} rank {world_rank} at {time.time():.3f}", flush=True)
    if failure == "raise":
        raise RuntimeError(f"an error in the training script on rank {world_rank}")
    if failure == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if failure == "freeze":
        os.kill(os.getpid(), signal.SIGSTOP)
    if failure == "block":
        world.Barrier()


if mode == "ps" and world_rank == victim == 0 and failure != "none":
    # The server: fail a moment into serving, from a thread (its main thread serves inside
    # init()); its failing before init() is the init() arrival bound's case (a minute).
    import threading

    from ripples.comm.stack_watch import main_thread_stack

    def serving():
        return any(place.function == "serve" for place in main_thread_stack())

    decided, deciding = [], threading.Lock()

    def decide(fail: bool):
        """Fail, or say that it will not, once: from the thread, or at exit (the server
        exits when every worker has left, killing the thread in its sleep)."""
        with deciding:
            if decided:
                return
            decided.append(fail)
            if fail:
                fail_now()
            else:  # the workers had finished: a server frozen in its exit is out of reach
                print(f"NOT FAILING rank {world_rank}: it had stopped serving", flush=True)

    def fail_while_serving():
        while not serving():
            time.sleep(0.01)
        time.sleep(0.2 * at_step)
        decide(serving())

    threading.Thread(target=fail_while_serving, daemon=True).start()
    atexit.register(decide, False)

import ripples.torch as hvd  # noqa: E402  (after the server's timer: init() serves)

hvd.init()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
kwargs = {"allreduce": {}, "ps": {},
          "ripples": {"schedule": "generator", "group_size": 2},
          "adpsgd": {}}[mode]
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                               named_parameters=model.named_parameters(),
                               sync=mode, **kwargs)
if mode != "ps":
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
inputs = torch.randn(64, 8, generator=torch.Generator().manual_seed(1))
targets = inputs.sum(1, keepdim=True)
step = 0
for epoch in range(3):
    for _ in range(8):
        if world_rank == victim and step == at_step and failure != "none":
            fail_now()
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(inputs), targets).backward()
        time.sleep(0.01)
        opt.step()
        step += 1
    hvd.allreduce(torch.tensor([float(step)]), name="epoch metric")
hvd.join()
print(f"DONE rank {world_rank}", flush=True)
