"""Random collective calls at 2, 3 and 4 ranks (tests/mpi/fuzz_collectives.py): right
results or the expected error on every rank, no hang, the runtime usable after each case;
among them join() at random points and process sets. Strict mode (a member that has not
arrived within the timeout fails the wait) and liveness mode (a busy member is waited for).

The default suite runs 150 cases per world size; ``RIPPLES_LONG_TESTS=1`` runs 400 (about
90 s in all), and ``RIPPLES_FUZZ_CASES=N`` runs N (10000 for the long form: minutes; a
missing member costs two timeouts).
"""
import json
import os
import re
import sys

import pytest

from mpi_launch import TESTS_DIR, run_mpi

SCRIPT = str(TESTS_DIR / "mpi" / "fuzz_collectives.py")
LONG = os.environ.get("RIPPLES_LONG_TESTS") == "1"
CASES = int(os.environ.get("RIPPLES_FUZZ_CASES", "400" if LONG else "150"))


@pytest.mark.parametrize("nprocs,seed,group_allreduce,cases,live", [
    (2, 1, "communicator", CASES, False), (3, 11, "communicator", CASES, False),
    (4, 4, "communicator", CASES, False),
    # groups that are not the world all-reduce over the point-to-point ring
    (3, 12, "ring", CASES // 4, False),
    # liveness mode (the default): a busy member is waited for, a deadlock still raises
    (3, 22, "communicator", CASES // 3, True)])
def test_random_calls_end_right_or_in_the_expected_error_and_never_hang(
        nprocs, seed, group_allreduce, cases, live):
    result = run_mpi([sys.executable, SCRIPT, str(cases), str(seed)], nprocs,
                     timeout=120 + cases * 0.5,
                     env={"RIPPLES_TIMEOUT_S": "1", "RIPPLES_WAIT_FOR_BUSY_PEERS": str(int(live)),
                          "RIPPLES_GROUP_ALLREDUCE": group_allreduce})
    summary = json.loads(re.search(r"^FUZZ (.*)$", result.stdout, re.M).group(1))
    assert summary["cases"] == cases and sum(summary["kinds"].values()) == cases
    if live:
        assert summary["kinds"]["missing member"] >= len(range(7, cases, 25)), summary
    # every kind of case was drawn, and each error class showed up
    assert {"MismatchError", "ValueError", "TypeError"} <= set(summary["errors"]), summary
    assert {"join", "join then alltoall", "process set"} <= set(summary["kinds"]), summary
    print(json.dumps(summary))
