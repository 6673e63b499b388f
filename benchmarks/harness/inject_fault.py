"""Run a training script with one rank misbehaving, as a user's rank would.

    python benchmarks/harness/inject_fault.py examples/epochs_ripples.py [ARGS...]

with ``FAULT`` (``raise``: an uncaught error; ``stop``: the process stops, SIGSTOP, as a
hung one), ``FAULT_RANK`` and ``FAULT_AT`` (the Nth ``hvd.average_model`` call of that
rank, once an epoch in the porting guide's script). The faulty rank prints ``FAULT <kind>
on rank <r> at <unix time>`` first. The script itself runs unchanged (``runpy``).
"""
import os
import runpy
import signal
import sys
import time

import ripples.torch as hvd


def faulty(average_model, kind: str, rank: int, at: int):
    """``average_model`` that misbehaves as ``kind`` on ``rank`` at its ``at``-th call."""
    calls = 0

    def wrapped(*args, **kwargs):
        nonlocal calls
        calls += 1
        if hvd.rank() == rank and calls == at:
            print(f"FAULT {kind} on rank {rank} at {time.time():.3f}", flush=True)
            if kind == "raise":
                raise RuntimeError("an error in the training script")
            if kind == "stop":
                os.kill(os.getpid(), signal.SIGSTOP)
        return average_model(*args, **kwargs)
    return wrapped


def main() -> None:
    hvd.average_model = faulty(hvd.average_model, os.environ["FAULT"],
                               int(os.environ["FAULT_RANK"]), int(os.environ["FAULT_AT"]))
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
