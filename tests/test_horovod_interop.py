"""Horovod and ripples together, where Horovod is installed (``bash
benchmarks/install_horovod.sh`` builds it: its last release needs a C++17 patch to build
against torch >= 2.1, so usually it is not installed)."""
import importlib.util
import sys
from pathlib import Path

import pytest

from mpi_launch import TESTS_DIR, mpi_env, run_launcher, run_mpi

HOROVODRUN = Path(sys.executable).parent / "horovodrun"
# Horovod's launcher passes Open MPI "-bind-to none", which Open MPI 5's mpiexec takes for
# the program "none": the binding must be given in its own spelling (docs/launching.md).
OPEN_MPI_5_BINDING = "--bind-to none --map-by slot"


@pytest.mark.skipif(importlib.util.find_spec("horovod") is None,
                    reason="Horovod is not installed (bash benchmarks/install_horovod.sh)")
def test_horovod_and_ripples_side_by_side():
    result = run_mpi([sys.executable, str(TESTS_DIR / "mpi" / "horovod_side_by_side.py")], 2)
    assert result.stdout.count("side by side ok") == 2


@pytest.mark.skipif(not HOROVODRUN.exists(),
                    reason="Horovod is not installed (bash benchmarks/install_horovod.sh)")
def test_horovodrun_mpi_launches_a_ripples_script(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("""import torch
import ripples.torch as hvd
hvd.init()
total = hvd.allreduce(torch.tensor([float(hvd.rank())]), op=hvd.Sum)
print(f"rank {hvd.rank()} of {hvd.size()} sum {total.item():g}", flush=True)
""")
    result = run_launcher([str(HOROVODRUN), "--mpi", "-np", "2", "--binding-args",
                           OPEN_MPI_5_BINDING, sys.executable, str(script)], timeout=120,
                          env=mpi_env(), merged=True)
    assert result.returncode == 0, result.stdout
    assert "rank 0 of 2 sum 1" in result.stdout and "rank 1 of 2 sum 1" in result.stdout
