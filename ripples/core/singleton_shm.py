"""A process started without a launcher (``python train.py``: an MPI singleton) keeps Open
MPI's shared-memory segment in a directory of its own, removed when it exits.

Open MPI 5 leaves a singleton's segment file (``/dev/shm/sm_segment.<host>.<uid>.<job>.0``)
behind even after a clean ``MPI_Finalize``; raw mpi4py does the same. Every such run
leaves one more file, and a later singleton whose job id is the same opens the old one,
stale contents and all. ``ripplesrun`` gives jobs a directory of their own for the same
reason (``ripples.runner.launch.job_shm_dir``); this does it for singletons.

``start_mpi()`` must run before anything imports ``mpi4py.MPI`` (which starts MPI). It sets
``OMPI_MCA_btl_sm_backing_directory`` only while MPI starts, so that processes this one
launches later (an ``mpiexec``, possibly across hosts) do not inherit it.
"""
from __future__ import annotations

import atexit
import importlib
import os
import shutil
import sys
import tempfile
from typing import Mapping, Optional

SHM_DIR_PARAM = "btl_sm_backing_directory"  # Open MPI's: where its segment files go
VARIABLE = f"OMPI_MCA_{SHM_DIR_PARAM}"
# Set by a launcher in its ranks' environment (Open MPI, PMIx, PMI-based MPIs).
LAUNCHED_BY = ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE")

_directory: Optional[str] = None  # this process's, while it lives


def needs_own_directory(environ: Mapping[str, str]) -> bool:
    """Whether MPI, started now, would start as a singleton with Open MPI's default segment
    directory: no launcher's variables and no directory chosen by the user."""
    return VARIABLE not in environ and not any(name in environ for name in LAUNCHED_BY)


def start_mpi() -> None:
    """Start MPI (import ``mpi4py.MPI``); a singleton keeps its segment in a new directory
    under ``/dev/shm``, removed at exit. Nothing changes where MPI has started already,
    under a launcher, where the user chose a directory, or without a writable ``/dev/shm``."""
    global _directory
    if "mpi4py.MPI" in sys.modules or not needs_own_directory(os.environ):
        return
    _directory = new_shm_dir("ripples-proc-")
    if _directory is None:
        return
    # Python's exit handlers run before mpi4py finalizes MPI; removing the directory with
    # the segment still mapped is harmless (the memory goes when the process does).
    atexit.register(shutil.rmtree, _directory, True)
    os.environ[VARIABLE] = _directory
    try:
        importlib.import_module("mpi4py.MPI")  # starts MPI, which reads the variable
    finally:
        del os.environ[VARIABLE]


def new_shm_dir(prefix: str) -> Optional[str]:
    """A new directory ``/dev/shm/<prefix>*``, or None where there is none (not Linux) or it
    is not writable (Open MPI then keeps its default)."""
    try:
        return tempfile.mkdtemp(prefix=prefix, dir="/dev/shm")
    except OSError:
        return None


def directory() -> Optional[str]:
    """The directory this process's singleton MPI keeps its segment in, or None."""
    return _directory
