"""P-Reduce stress at 8 ranks (tests/mpi/stress_preduce.py): random groups, random delays,
a communicator cache of 4 groups (constant eviction) or the ring; no deadlock, and the sum
over ranks kept.

CI runs 300 rounds with group communicators (about 5 s); ``RIPPLES_LONG_TESTS=1`` runs 1,000
and adds the ring, and ``RIPPLES_STRESS_ROUNDS=N`` sets the rounds (e.g. 100000 for a long
run).
"""
import os
import re
import sys

import pytest

from mpi_launch import TESTS_DIR, run_mpi

SCRIPT = str(TESTS_DIR / "mpi" / "stress_preduce.py")
LONG = os.environ.get("RIPPLES_LONG_TESTS") == "1"
ROUNDS = int(os.environ.get("RIPPLES_STRESS_ROUNDS", "1000" if LONG else "300"))


@pytest.mark.parametrize("group_allreduce,seed", [
    ("communicator", 8),
    pytest.param("ring", 9, marks=pytest.mark.skipif(not LONG, reason="RIPPLES_LONG_TESTS=1"))])
def test_random_groups_and_delays_never_deadlock_and_keep_the_sum(group_allreduce, seed):
    result = run_mpi([sys.executable, SCRIPT, str(ROUNDS), str(seed)], 8,
                     timeout=120 + ROUNDS * 0.05,
                     env={"RIPPLES_CACHE_CAPACITY": "4",
                          "RIPPLES_GROUP_ALLREDUCE": group_allreduce})
    found = re.search(r"^STRESS rounds=(\d+) group_memberships=(\d+)", result.stdout, re.M)
    assert found and int(found.group(1)) == ROUNDS, result.stdout
    # groups of 2 to 4 formed in most rounds (1 to 4 ranks drawn per group)
    assert int(found.group(2)) > ROUNDS * 4, result.stdout
