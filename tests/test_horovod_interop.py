"""Horovod and ripples together, where Horovod is installed (``bash
benchmarks/install_horovod.sh`` builds it: its last release needs a C++17 patch to build
against torch >= 2.1, so usually it is not installed)."""
import importlib.util
import os
import sys
from pathlib import Path

import pytest

from mpi_launch import REPO_DIR, TESTS_DIR, mpi_env, run_launcher, run_mpi

BIN = Path(sys.executable).parent


@pytest.mark.skipif(importlib.util.find_spec("horovod") is None,
                    reason="Horovod is not installed (bash benchmarks/install_horovod.sh)")
def test_horovod_and_ripples_side_by_side():
    result = run_mpi([sys.executable, str(TESTS_DIR / "mpi" / "horovod_side_by_side.py")], 2)
    assert result.stdout.count("side by side ok") == 2


@pytest.mark.skipif(not (BIN / "horovodrun").exists(),
                    reason="Horovod is not installed (bash benchmarks/install_horovod.sh)")
@pytest.mark.parametrize("np_", [2, 3])  # 3 ranks: more than this machine's 2 cores
def test_launch_horovodrun_sh_starts_a_ripples_script(tmp_path, np_):
    """launch/horovodrun.sh: ``horovodrun --mpi`` plus what Open MPI 5 needs (its own
    binding spelling; yielding waits with more ranks than cores)."""
    script = tmp_path / "train.py"
    script.write_text("""import torch
import ripples.torch as hvd
hvd.init()
total = hvd.allreduce(torch.tensor([float(hvd.rank())]), op=hvd.Sum)
print(f"rank {hvd.rank()} of {hvd.size()} sum {total.item():g}", flush=True)
""")
    env = mpi_env({"NP": str(np_), "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"})
    result = run_launcher([str(REPO_DIR / "launch" / "horovodrun.sh"), sys.executable,
                           str(script)], timeout=120, env=env, merged=True)
    assert result.returncode == 0, result.stdout
    total = sum(range(np_))
    for rank in range(np_):
        assert f"rank {rank} of {np_} sum {total}" in result.stdout, result.stdout
