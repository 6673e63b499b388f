"""Horovod and ripples in one job, where Horovod is installed (it does not build against
torch >= 2.1 from PyPI without patching its CMake files, so usually it is not)."""
import importlib.util
import sys

import pytest

from mpi_launch import TESTS_DIR, run_mpi


@pytest.mark.skipif(importlib.util.find_spec("horovod") is None,
                    reason="Horovod is not installed (see README: Horovod interoperability)")
def test_horovod_and_ripples_side_by_side():
    result = run_mpi([sys.executable, str(TESTS_DIR / "mpi" / "horovod_side_by_side.py")], 2)
    assert result.stdout.count("side by side ok") == 2
