"""What an elastic job and ``ripplesrun --min-np/--max-np`` tell each other through the
elastic directory (``Config.elastic_dir``), so that a job can grow by restarting.

- ``state.pt``: the last ``commit()`` of ``hvd.elastic`` state, written by rank 0
  (atomically: a temporary file, then a rename), read by rank 0 of the next launch;
- ``restart``: the job asks the launcher to start it again on ``max_np`` ranks; the file
  holds the reason. The launcher removes it before every launch.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Optional

STATE_FILE = "state.pt"
RESTART_FILE = "restart"
# Exit status of ranks that stop for a restart (EX_TEMPFAIL): under a plain mpiexec the
# job does not look like a success.
EXIT_RESTART = 75


def state_path(directory: str) -> Path:
    return Path(directory) / STATE_FILE


def write_atomically(path: Path, write: Callable[[Path], None]) -> None:
    """``write(temporary)``, then rename it to ``path``: a reader sees the old file or the
    new one, never half of it."""
    temporary = path.with_suffix(".tmp")
    write(temporary)
    os.replace(temporary, path)


def request_restart(directory: str, reason: str) -> None:
    """Ask the launcher for a restart (rank 0 calls this)."""
    write_atomically(Path(directory) / RESTART_FILE,
                     lambda temporary: temporary.write_text(reason + "\n", encoding="utf-8"))


def restart_reason(directory: str) -> Optional[str]:
    """The reason of a pending restart request, or None."""
    try:
        return (Path(directory) / RESTART_FILE).read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None


def clear_restart(directory: str) -> None:
    (Path(directory) / RESTART_FILE).unlink(missing_ok=True)
