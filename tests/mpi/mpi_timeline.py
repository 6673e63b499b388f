"""Timeline scenarios under mpiexec (run by tests/test_timeline_mpi.py, which checks the files).

Usage: mpi_timeline.py SCENARIO DIR

- ``shutdown``: the timeline named by RIPPLES_TIMELINE, written when the job shuts down.
- ``start-stop``: ``start_timeline``/``stop_timeline`` at run time: ``a.json`` (stopped
  explicitly; rank 0 reads it back at once), ``b.json`` (stopped by starting ``c.json``),
  ``c.json`` (written at shutdown). The all-reduces of each timeline have their own size.
- ``late``: the last rank reaches shutdown ``RIPPLES_TIMEOUT_S + 2`` seconds after the others.
- ``dies``: the last rank exits abruptly before shutdown (run with ``--enable-recovery``).

Each rank prints ``rank R shutdown S`` with the seconds its shutdown took.
"""
import json
import os
import sys
import time

import torch

import ripples.torch as hvd

scenario, directory = sys.argv[1], sys.argv[2]
hvd.init()
rank, size = hvd.rank(), hvd.size()


def allreduce(numel):
    result = hvd.allreduce(torch.full((numel,), float(rank)), op=hvd.Sum)
    assert result.tolist() == [float(sum(range(size)))] * numel


allreduce(1)  # before start_timeline in "start-stop": recorded nowhere
if scenario == "start-stop":
    try:
        hvd.start_timeline("")
        raise AssertionError("start_timeline('') must raise ValueError")
    except ValueError as exc:
        assert "file_path" in str(exc), exc
    hvd.start_timeline(os.path.join(directory, "a.json"))
    allreduce(2)
    hvd.stop_timeline()
    if rank == 0:  # written before stop_timeline returned
        with open(os.path.join(directory, "a.json")) as handle:
            print("a.json events:", len(json.load(handle)), flush=True)
    hvd.stop_timeline()  # nothing is recording: does nothing
    allreduce(1)
    hvd.start_timeline(os.path.join(directory, "b.json"), mark_cycles=True)
    allreduce(3)
    hvd.start_timeline(os.path.join(directory, "c.json"))
    allreduce(4)
    allreduce(4)
elif scenario == "late" and rank == size - 1:
    time.sleep(float(os.environ["RIPPLES_TIMEOUT_S"]) + 2)
elif scenario == "dies" and rank == size - 1:
    time.sleep(0.5)  # let the others finish the all-reduce: MPI's own wait there is unbounded
    os._exit(0)

start = time.monotonic()
hvd.shutdown()
print(f"rank {rank} shutdown {time.monotonic() - start:.2f}", flush=True)
if scenario == "dies":  # as in rank_dies.py: MPI_Finalize beside a dead rank is MPI's
    os._exit(0)         # business (it hung once in a full-suite run here), not the timeline's
