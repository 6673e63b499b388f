"""The parameter-server scenarios' MPI jobs: the scenarios that need the same job shape (ranks
and servers) run one after another in one job (tests/mpi/mpi_ps_scenarios.py), since each
rank's start costs seconds of CPU (Python, torch and torch's compiler stack).

A job runs once per test run (``job``). Its tests carry its name as their xdist group,
so that one process runs them all, and take it from a module-scoped fixture
(``job_fixture``); each test checks its own scenario (``JobResult.check``): a scenario that
fails fails its own test, saying why, and the scenarios after it (which did not run) fail
theirs, naming it.
"""
from __future__ import annotations

import dataclasses
import fcntl
import functools
import json
import os
import re
import sys
from pathlib import Path
from typing import Optional

import pytest

from mpi_launch import TESTS_DIR, run_mpi


@dataclasses.dataclass(frozen=True)
class Job:
    """``nprocs`` ranks, the first ``servers`` of them parameter servers, running
    ``scenarios`` in this order within ``timeout`` seconds."""

    nprocs: int
    servers: int
    scenarios: tuple
    timeout: float

    def argv(self) -> list:
        return [sys.executable, str(TESTS_DIR / "mpi" / "mpi_ps_scenarios.py"), *self.scenarios]


# Each job's timeout is the sum of those its scenarios had as jobs of their own (a busy
# machine, e.g. a full suite beside other work, slows a job several times).
JOBS = {
    # "silent server" and "no servers" run before PS mode; the documented example shuts the
    # runtime down (only "silent worker", which needs no runtime, may follow), and "silent
    # worker" leaves its sessions broken: the last two stay last.
    "ps_3_ranks": Job(3, 1, ("silent server", "no servers", "bsp", "hyperparameters",
                             "frontend", "documented epsp example", "silent worker"),
                      timeout=630),
    "ps_4_ranks_2_servers": Job(4, 2, ("bsp", "checkpoint"), timeout=180),
    # "casp failure" replaces the workers' runtime by a strict one without PS mode: last.
    "ps_4_ranks": Job(4, 1, ("frontend policies", "epsp", "casp failure"), timeout=390),
    "ps_5_ranks": Job(5, 1, ("policies", "casp equivalence", "casp uneven", "casp epochs",
                             "casp learned"), timeout=540),
}

ERROR_LINE = re.compile(r"CHECK FAILED|^\S*(Error|Exception)\b")


@dataclasses.dataclass(frozen=True)
class JobResult:
    """What job ``name`` printed, and how it ended: ``failure`` is None when it exited 0."""

    name: str
    output: str
    failure: str | None

    def began(self, scenario: str) -> bool:
        return f"scenario {scenario}: begins" in self.output

    def passed(self, scenario: str) -> bool:
        return f"scenario {scenario}: passed" in self.output

    def check(self, scenario: str, *lines: str) -> None:
        """Fail the calling test unless ``scenario`` passed on every rank and the job printed
        ``lines``; a job that failed after all its scenarios passed fails every test."""
        scenarios = JOBS[self.name].scenarios
        assert scenario in scenarios, f"job {self.name} runs {scenarios}, not {scenario!r}"
        missing = [line for line in lines if line not in self.output]
        if self.passed(scenario) and not missing:
            if self.failure is None or not all(map(self.passed, scenarios)):
                return
            reason = f"every scenario passed, then the job failed ({self.failure})"
        elif self.passed(scenario):
            reason = f"scenario {scenario!r} passed but did not print {missing}"
        elif self.began(scenario):
            errors = [line for line in self.output.splitlines() if ERROR_LINE.search(line)]
            reason = "".join([f"scenario {scenario!r} failed ",
                              f"({self.failure or 'the job exited 0'})",
                              *(f"\n{line}" for line in errors)])
        else:
            during = [s for s in scenarios if self.began(s) and not self.passed(s)]
            reason = (f"scenario {scenario!r} did not run: the job ended "
                      f"({self.failure or 'exit code 0'}) "
                      + (f"in scenario {during[0]!r}" if during else "before it"))
        pytest.fail(f"{reason}\n--- output of job {self.name} {scenarios} ---\n{self.output}",
                    pytrace=False)


@functools.cache
def job(name: str, shared: Optional[Path] = None) -> JobResult:
    """Job ``name``'s result, the job run once per test run. With ``shared`` (a folder all
    xdist workers of this run see) the first worker to need it runs it, holding a lock, and
    the others wait for it and read its result. (Its tests' xdist group does not keep them
    in one worker with pytest 9.2 and pytest-xdist 3.6: the group suffix xdist writes into
    node ids no longer takes effect.)"""
    if shared is None:
        return run_job(name)
    shared.mkdir(exist_ok=True)
    with open(shared / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        saved = shared / f"{name}.json"
        if saved.exists():
            return JobResult(**json.loads(saved.read_text()))
        result = run_job(name)
        saved.write_text(json.dumps(dataclasses.asdict(result)))
        return result


def run_job(name: str) -> JobResult:
    """Run job ``name`` and return what it printed."""
    spec = JOBS[name]
    try:
        done = run_mpi(spec.argv(), spec.nprocs, timeout=spec.timeout, check=False,
                       env={"RIPPLES_PS_SERVERS": str(spec.servers)})
    except pytest.fail.Exception as exc:  # timed out: the message holds the output
        return JobResult(name, str(exc), f"timed out after {spec.timeout} s")
    failure = f"exit code {done.returncode}" if done.returncode else None
    return JobResult(name, done.stdout, failure)


def job_fixture(name: str):
    """A module-scoped fixture named ``name`` that gives job ``name``'s ``JobResult``; mark
    the tests that use it ``pytest.mark.xdist_group(name)``."""
    @pytest.fixture(scope="module", name=name)
    def result(tmp_path_factory) -> JobResult:
        # Under xdist each worker's base temporary folder lies in the run's own, which
        # pytest removes with its old runs: the results live there, not in /tmp for ever.
        under_xdist = os.environ.get("PYTEST_XDIST_TESTRUNUID") is not None
        shared = tmp_path_factory.getbasetemp().parent / "ps-jobs" if under_xdist else None
        return job(name, shared)
    return result


def example_accuracies(output: str) -> list:
    """The accuracies that the documented EPSP example prints, one line per worker."""
    return [float(line.split()[3]) for line in output.splitlines()
            if line.startswith("worker ") and " accuracy " in line]
