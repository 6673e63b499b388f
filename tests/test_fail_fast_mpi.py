"""An uncaught exception on one rank ends the whole job within seconds (``ripples.comm.
fail_fast``), with its traceback shown once and a non-zero exit status; so does a member
frozen inside a blocking MPI call of its group (``ripples.comm.data_watch``): a collective's
data phase, or the making of a communicator."""
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mpi_launch import TESTS_DIR, mpi_env, run_launcher, run_mpi

from ripples.ops import native_lane

SCRIPT = str(TESTS_DIR / "mpi" / "rank_raises.py")
MESSAGE = "ValueError: an error in the training script on rank 1"


# adpsgd: the others wait in exchanges served by a responder thread, not in collectives
@pytest.mark.parametrize("sync", ["allreduce", "ripples", "adpsgd"])
def test_an_uncaught_exception_on_one_rank_ends_the_job_within_seconds(sync):
    # A long timeout: without the abort the others would wait for rank 1 for 60 s.
    result = run_mpi([sys.executable, SCRIPT, sync], 4, timeout=120, check=False,
                     env={"RIPPLES_TIMEOUT_S": "60"})
    ended = time.time()
    raised = float(re.search(r"RAISING at ([\d.]+)", result.stdout).group(1))
    assert result.returncode != 0, result.stdout
    assert ended - raised < 5, (ended - raised, result.stdout)
    assert result.stdout.count(MESSAGE) == 1, result.stdout
    assert "rank 1 raised an uncaught ValueError and aborts the job" in result.stdout
    assert "FINISHED" not in result.stdout



@pytest.mark.parametrize("place, what", [
    ("data", "'gradients'"),
    # collectives outside a data phase proper, as blocking: a host cut off just then once
    # left a job waiting for good in the native lane's arming
    ("communicator", "making the communicator of group (0, 1)"),
    ("arming", "arming the native lane of group (0, 1, 2)"),
    # mpi4py's pickled allreduce keeps the GIL while it waits, so the watch could not run
    ("join", "the end of join"),
    # on the bucket thread: a host cut off mid-step left all-reduce training waiting
    ("buckets", "allreduce of bucket 0 of 1: ['bias', 'weight']")])
def test_a_member_frozen_in_a_blocking_call_is_named_and_the_job_ends(place, what):
    if place == "arming" and not native_lane.status().startswith("on"):
        pytest.skip(f"the native lane is not available here: {native_lane.status()}")
    result = run_mpi([sys.executable, str(TESTS_DIR / "mpi" / "frozen_in_data_phase.py"),
                      place], 3, timeout=120, check=False, env={"RIPPLES_TIMEOUT_S": "2"})
    ended = time.time()
    frozen = float(re.search(r"FREEZING at ([\d.]+)", result.stdout).group(1))
    assert result.returncode != 0, result.stdout
    # rank 2 is not in the communicator's group: it goes on and finishes
    group = [0, 1] if place == "communicator" else [0, 1, 2]
    for rank in group:
        assert f"rank {rank} FINISHED" not in result.stdout, result.stdout
    assert "rank(s) [1] (on " in result.stdout and "did not answer a liveness check" in \
        result.stdout, result.stdout
    assert "rank 1's process is stopped by SIGSTOP or a tracer" in result.stdout, result.stdout
    assert f"{what}: rank(s) [1]" in result.stdout, result.stdout
    assert "in the data phase" in result.stdout, result.stdout
    # the timeout, the answer bound, the watch's period, and the launcher's teardown
    assert ended - frozen < 15, (ended - frozen, result.stdout)


def test_fault_tolerant_a_member_frozen_while_the_lane_arms_ends_the_job_within_a_bound():
    """Under --fault-tolerant the others leave the blocked arming vote (the world is
    revoked), name the frozen rank and make the world of the two survivors; the script's
    all-reduce then raises, uncaught, and the job ends within the bound."""
    if not native_lane.status().startswith("on"):
        pytest.skip(f"the native lane is not available here: {native_lane.status()}")
    ripplesrun = str(Path(sys.executable).parent / "ripplesrun")
    command = [ripplesrun, "-np", "3", "--fault-tolerant", "--timeout", "2", sys.executable,
               str(TESTS_DIR / "mpi" / "frozen_in_data_phase.py"), "arming"]
    result = run_launcher(command, timeout=120, env=mpi_env(), merged=True)
    ended = time.time()
    out = result.stdout
    frozen = float(re.search(r"FREEZING at ([\d.]+)", out).group(1))
    assert result.returncode != 0 and "FINISHED" not in out, out
    assert "arming the native lane of group (0, 1, 2): rank(s) [1]" in out, out
    assert "rank(s) [1] of the 3-rank world did not answer" in out, out
    # the timeout, the answer bound, the membership round, the bound and the teardown
    assert ended - frozen < 2 + 1 + 16 + 15, (ended - frozen, out)


BLOCKED_ABORT = """
import time
from ripples.comm import fail_fast

class World:
    def Abort(self, status):  # a launcher that never answers
        time.sleep(60)

class StandInMPI:
    COMM_WORLD = World()
    Is_initialized = staticmethod(lambda: True)
    Is_finalized = staticmethod(lambda: False)

fail_fast.MPI = StandInMPI
fail_fast.ABORT_BOUND_S = 1.0
fail_fast.end_job("rank 0 ends the job")
print("NOT REACHED", flush=True)
"""


def test_a_rank_whose_abort_never_returns_exits_on_its_own_showing_where_it_was():
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-c", BLOCKED_ABORT], capture_output=True,
                          text=True, timeout=60, cwd=str(TESTS_DIR.parent), env=mpi_env())
    took = time.monotonic() - began
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)
    assert took < 30, took  # the bound is 1 s; the interpreter's start is the rest
    assert "ripples: rank 0 ends the job" in done.stderr
    assert "in Abort" in done.stderr and "NOT REACHED" not in done.stdout, done.stderr
