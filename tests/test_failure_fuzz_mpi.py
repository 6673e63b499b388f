"""The failure fuzzer: jobs in which one random rank fails in a random way at a random point
(tests/mpi/failure_case.py), in every mode. Every case must end within its bound (no hang)
and either complete (no failure) or end non-zero with the failure named: the failing rank,
or the cause.

Bounds: ``RIPPLES_TIMEOUT_S=2`` and ``RIPPLES_STALL_SHUTDOWN_S=4``; a frozen or blocked rank
is found by the liveness checks, a raising one by the fail-fast abort, a killed one by the
launcher. The default suite runs 4 fixed cases, ``RIPPLES_LONG_TESTS=1`` 7 (``RIPPLES_FAILURE_CASES=N``
runs N random cases; the summary line ``FAILURE-FUZZ {...}`` gives the slowest end per
kind).
"""
import json
import os
import random
import re
import sys
import time
from collections import defaultdict

import pytest

from mpi_launch import TESTS_DIR, run_mpi
from ripples.comm.arrival import MIN_ARRIVAL_S

SCRIPT = str(TESTS_DIR / "mpi" / "failure_case.py")
MODES = ("allreduce", "ripples", "adpsgd", "ps")
FAILURES = ("raise", "kill", "freeze", "block", "none")
TIMEOUT_S, STALL_SHUTDOWN_S = 2, 4
# From the failure to the job's end: the stall bound, a liveness round, the timeout, the
# launcher's teardown (on 2 shared cores).
BOUND_S = {"raise": 10, "kill": 10, "freeze": 20, "block": 30, "none": 0}
LONG = os.environ.get("RIPPLES_LONG_TESTS") == "1"
FIXED = [("allreduce", "raise", 1, 5), ("ripples", "freeze", 2, 9), ("adpsgd", "kill", 1, 12),
         ("ps", "freeze", 0, 3)]
if LONG:  # blocking outside ripples is also tested by tests/test_liveness.py's stuck peer
    FIXED += [("ps", "block", 2, 4), ("ripples", "block", 0, 3), ("allreduce", "none", 0, 0)]


def draw_cases(count, seed):
    rng = random.Random(seed)
    cases = []
    for _ in range(count):
        mode, failure = rng.choice(MODES), rng.choice(FAILURES)
        if mode == "ps" and failure in ("raise", "block"):
            victim = rng.randrange(1, 4)  # a worker (the server fails only kill/freeze)
        else:
            victim = rng.randrange(4)
        cases.append((mode, failure, victim, rng.randrange(24)))
    return cases


def run_case(mode, failure, victim, at_step):
    env = {"RIPPLES_TIMEOUT_S": str(TIMEOUT_S), "RIPPLES_STALL_SHUTDOWN_S": str(STALL_SHUTDOWN_S)}
    if mode == "ps":
        env["RIPPLES_PS_SERVERS"] = "1"
    limit = 60 + BOUND_S[failure]
    started = time.time()
    result = run_mpi([sys.executable, SCRIPT, mode, failure, str(victim), str(at_step)], 4,
                     timeout=limit, check=False, env=env)
    ended = time.time()
    case = f"{mode} {failure} rank {victim} at {at_step}"
    if failure == "none" or "NOT FAILING" in result.stdout:
        assert result.returncode == 0 and result.stdout.count("DONE") == 4 - (mode == "ps"), \
            f"{case}\n{result.stdout}"
        return ended - started if failure == "none" else 0.0
    failed = re.search(r"FAILING \w+ rank \d at ([\d.]+)", result.stdout)
    if failed is None:  # the job ended before the victim reached its step: a wrong end
        pytest.fail(f"{case}: the victim never failed\n{result.stdout}")
    took = ended - float(failed.group(1))
    assert result.returncode != 0, f"{case}\n{result.stdout}"
    assert took <= BOUND_S[failure], f"{case}: ended {took:.1f} s after the failure\n" \
                                     f"{result.stdout}"
    assert named(result.stdout, victim), f"{case}: the failure is not named\n{result.stdout}"
    return took


def named(output, victim):
    """Whether the output names the failing rank (ripples' messages or the launcher's)."""
    return any(pattern in output for pattern in (
        f"rank {victim} ", f"[{victim}]", f"rank(s) [{victim}", f"rank {victim}:",
        f"process rank {victim} "))


@pytest.mark.parametrize("case", FIXED, ids=[" ".join(map(str, c)) for c in FIXED])
def test_each_failure_kind_ends_the_job_in_its_bound_naming_the_rank(case):
    run_case(*case)


@pytest.mark.skipif(not os.environ.get("RIPPLES_FAILURE_CASES"),
                    reason="RIPPLES_FAILURE_CASES=N: N random failure cases (minutes)")
def test_random_failure_cases():
    cases = draw_cases(int(os.environ["RIPPLES_FAILURE_CASES"]),
                       int(os.environ.get("RIPPLES_SEED", "0")))
    slowest = defaultdict(float)
    for case in cases:
        slowest[case[1]] = max(slowest[case[1]], run_case(*case))
    print("FAILURE-FUZZ " + json.dumps({"cases": len(cases), "hangs": 0,
                                        "slowest_end_s": dict(slowest)}))


@pytest.mark.skipif(not os.environ.get("RIPPLES_LONG_TESTS"),
                    reason="RIPPLES_LONG_TESTS=1: a minute (init()'s arrival bound)")
def test_a_server_frozen_before_init_ends_the_job_after_the_arrival_bound():
    started = time.time()
    # A stall bound below the arrival bound's floor: the floor applies.
    result = run_mpi([sys.executable, "-c", FROZEN_BEFORE_INIT], 3, timeout=150, check=False,
                     env={"RIPPLES_STALL_SHUTDOWN_S": "1"})
    assert result.returncode != 0 and "in init() for the other ranks" in result.stdout, \
        result.stdout
    assert time.time() - started < MIN_ARRIVAL_S + 30, result.stdout


FROZEN_BEFORE_INIT = """
import os, signal
from mpi4py import MPI
if MPI.COMM_WORLD.Get_rank() == 1:
    os.kill(os.getpid(), signal.SIGSTOP)
import ripples.torch as hvd
hvd.init()
"""
