"""The facts every result carries, and writing it: the command that produced it, the date,
the machine. ``docs/hooks.py`` quotes each result file with these keys."""
from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import sys
from pathlib import Path
from typing import Optional, Sequence

# Set by launch.job_env for the ranks of a job. Not RIPPLES_*: ripples warns about
# RIPPLES_* names it does not know.
COMMAND_VARIABLE = "BENCH_COMMAND"
_PASSED_ON = ("RIPPLES_",)  # settings in the environment that change what is measured


def command_line(argv: Optional[Sequence[str]] = None) -> str:
    """The command as typed: ``python`` and this script's arguments (``argv``, default
    ``sys.argv``), after the ``RIPPLES_*`` settings of the environment. A rank of a job
    started by a driver returns the driver's line (``BENCH_COMMAND``); a rank of a job
    started by hand is quoted ``mpiexec -n SIZE python ...``."""
    if argv is None and os.environ.get(COMMAND_VARIABLE):
        return os.environ[COMMAND_VARIABLE]
    words = ["python", *(sys.argv if argv is None else argv)]
    ranks = os.environ.get("OMPI_COMM_WORLD_SIZE") or os.environ.get("PMI_SIZE")
    if ranks:
        words = ["mpiexec", "-n", ranks, *words]
    settings = [f"{k}={v}" for k, v in sorted(os.environ.items())
                if k.startswith(_PASSED_ON) and not k.startswith("RIPPLES_TEST")]
    return " ".join([*settings, *(shlex.quote(str(w)) for w in words)])


def machine() -> str:
    """Host name and platform, e.g. ``node1 (Linux-6.1-x86_64-with-glibc2.36)``."""
    return f"{platform.node()} ({platform.platform()})"


def stamp(command: Optional[str] = None) -> dict:
    """``command``, ``date`` (UTC, to the second), ``machine`` and ``cores``."""
    return {"command": command or command_line(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": machine(), "cores": os.cpu_count()}


def stamped(result: dict, command: Optional[str] = None) -> dict:
    """``result`` with the stamp's keys first (a key the result has already wins)."""
    return {**stamp(command), **result}


def write_json(path, result: dict, command: Optional[str] = None) -> dict:
    """Write ``result``, stamped, as indented JSON to ``path`` (folders made); returns what
    was written."""
    full = stamped(result, command)
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(full, indent=1) + "\n")
    return full
