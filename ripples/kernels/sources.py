"""Where the CUDA sources live and how they are handed to a compiler.

``ripples/kernels/csrc`` is a symlink to the repository's ``csrc/`` in a source checkout;
an installed package carries real copies there (``package_data`` in setup.py).
"""
from __future__ import annotations

from pathlib import Path

KERNEL_FILES = ("fusion.cu", "scale.cu")
HEADER_FILES = ("common.cuh", "launch.cuh")


def source_dir() -> Path:
    """The directory holding the ``.cu``/``.cuh`` files; RuntimeError if they are missing."""
    here = Path(__file__).resolve().parent / "csrc"
    if not (here / "common.cuh").is_file():
        raise RuntimeError(f"ripples CUDA sources not found in {here}; the package was "
                           f"installed without its csrc/ files (check package_data)")
    return here


def read_source(name: str) -> str:
    """The text of ``name`` with a ``#line`` directive so compiler messages name the real
    file and line."""
    path = source_dir() / name
    text = path.read_text(encoding="utf-8")
    return f'#line 1 "{path}"\n{text}'
