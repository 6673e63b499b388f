"""A script run without a launcher (an MPI singleton) keeps Open MPI's shared-memory segment
in a directory of its own that is gone after it exits (``ripples.core.singleton_shm``)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ripples.core.singleton_shm import LAUNCHED_BY, VARIABLE, needs_own_directory

needs_dev_shm = pytest.mark.skipif(not os.access("/dev/shm", os.W_OK),
                                   reason="needs a writable /dev/shm")

CHILD = """
import json, os
import torch
import ripples.torch as hvd
from ripples.core import singleton_shm
hvd.init()
x = torch.ones(4)
hvd.allreduce_(x)
where = singleton_shm.directory()
print(json.dumps({"directory": where, "files": sorted(os.listdir(where)) if where else [],
                  "inherited": os.environ.get(singleton_shm.VARIABLE), "sum": x.sum().item()}))
"""


@pytest.mark.parametrize("environ,own", [
    ({}, True),
    ({"OMPI_COMM_WORLD_SIZE": "2"}, False),  # a rank of an mpiexec job
    ({"PMIX_RANK": "0"}, False),
    ({VARIABLE: "/mine"}, False),  # the user's choice stays
])
def test_only_a_singleton_without_a_chosen_directory_gets_one(environ, own):
    assert needs_own_directory(environ) is own


@needs_dev_shm
def test_a_singleton_keeps_its_segment_in_its_own_directory_removed_at_exit():
    env = {k: v for k, v in os.environ.items() if k not in (VARIABLE, *LAUNCHED_BY)}
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    where = Path(seen["directory"])
    assert where.parent == Path("/dev/shm") and where.name.startswith("ripples-proc-")
    # Open MPI put its segment there while the process ran ...
    assert any(name.startswith("sm_segment.") for name in seen["files"]), seen
    assert seen["sum"] == 4.0
    # ... processes it starts would not inherit the directory, and it is gone now.
    assert seen["inherited"] is None
    assert not where.exists()
