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

KIND, RANK, AT = os.environ["FAULT"], int(os.environ["FAULT_RANK"]), int(os.environ["FAULT_AT"])
_average_model = hvd.average_model
_calls = 0


def average_model(*args, **kwargs):
    global _calls
    _calls += 1
    if hvd.rank() == RANK and _calls == AT:
        print(f"FAULT {KIND} on rank {RANK} at {time.time():.3f}", flush=True)
        if KIND == "raise":
            raise RuntimeError("an error in the training script")
        if KIND == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
    return _average_model(*args, **kwargs)


hvd.average_model = average_model
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
