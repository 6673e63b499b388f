"""Optimizers that scripts build and drop without closing them: a new one per training
phase, or two at once (a GAN), then join() with uneven steps and a clean shutdown."""
import re
import sys

import pytest

from mpi_launch import TESTS_DIR, run_mpi

SCRIPT = str(TESTS_DIR / "mpi" / "optimizer_lifecycle.py")


@pytest.mark.parametrize("pattern", ["rebuilt", "two"])
@pytest.mark.parametrize("sync", ["allreduce", "ripples"])
def test_optimizers_built_again_or_side_by_side_train_join_and_shut_down(pattern, sync):
    result = run_mpi([sys.executable, SCRIPT, pattern, sync], 3, timeout=120,
                     env={"RIPPLES_TIMEOUT_S": "10"})
    spreads = re.findall(r"rank \d SPREAD (\S+)", result.stdout)
    assert len(spreads) == 3 and all(float(s) == 0.0 for s in spreads), result.stdout
    assert sorted(re.findall(r"rank (\d) DONE", result.stdout)) == ["0", "1", "2"]
    if pattern == "rebuilt":  # each new optimizer closed the one before it
        live = re.findall(r"rank (\d) LIVE services (\d+) reducers (\d+)", result.stdout)
        # all-reduce: one bucket reducer per rank; ripples: one generator service, on rank 0
        expected = ([(str(r), "0", "1") for r in range(3)] if sync == "allreduce" else
                    [("0", "1", "0"), ("1", "0", "0"), ("2", "0", "0")])
        assert sorted(live) == expected, result.stdout
