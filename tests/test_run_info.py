"""The ``ripples info`` command: it runs without mpiexec and names the MPI library in use."""
import os
import subprocess
import sys

import pytest

from ripples.runner.info import _origin, _wheel_files, format_info
from ripples.runner.launch import find_mpiexec


def run_info(*args, module="ripples.runner.info"):
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1"))


def library_line():
    # Open MPI ends its version string with a NUL byte; the report must not carry it. MPI
    # starts through singleton_shm, else this singleton leaves its segment in /dev/shm.
    code = ("from ripples.core.singleton_shm import start_mpi; start_mpi(); "
            "from mpi4py import MPI; "
            "print(MPI.Get_library_version().replace(chr(0), '').strip().splitlines()[0])")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True).stdout.strip()


def report(stdout):
    return {line.split(":", 1)[0]: line.split(":", 1)[1].strip()
            for line in stdout.splitlines() if ":" in line}


def test_info_prints_versions_and_mpi_library():
    for args in ((), ("info",)):
        result = run_info(*args)
        assert result.returncode == 0, result.stdout + result.stderr
        lines = report(result.stdout)
        assert lines["MPI library"] == library_line()
        assert lines["ripples"] == "0.1.0"
        assert lines["MPI thread level"] in {"single", "funneled", "serialized", "multiple"}
        assert lines["mpiexec"].startswith(find_mpiexec())
        for key in ("torch", "mpi4py", "libmpi", "cupy", "NCCL", "nvcc"):
            assert lines[key], key


def test_python_m_ripples_is_the_ripples_command():
    result = run_info(module="ripples")
    assert result.returncode == 0, result.stdout + result.stderr
    assert report(result.stdout)["MPI library"] == library_line()
    result = run_info("--version", module="ripples")
    assert result.returncode == 0 and result.stdout == "ripples 0.1.0 (ripples-mpi)\n"


def test_help_of_each_subcommand():
    top = run_info("--help", module="ripples")
    assert top.returncode == 0 and top.stdout.startswith("usage: ripples [-h]")
    listed = [line.split()[0] for line in top.stdout.split("commands:")[1].splitlines()[2:]
              if line.startswith("    ")]
    assert listed == ["info", "sim"]
    for command in listed:
        result = run_info(command, "--help", module="ripples")
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith(f"usage: ripples {command} [-h]"), result.stdout
    assert "MPI thread level" not in run_info("info", "--help").stdout  # help, no report


def test_unknown_subcommand_is_a_usage_error():
    result = run_info("bogus")
    assert result.returncode == 2 and "invalid choice" in result.stderr


def test_origin_tells_wheel_from_system():
    files = _wheel_files("pytest")              # any installed distribution with files works
    some_file = sorted(files)[0]
    assert _origin(some_file, files).startswith("from the")
    assert _origin("/bin/sh", files) == "system"
    assert _wheel_files("no-such-distribution-here") == set()


def test_format_info_aligns_values():
    assert format_info({"a": "1", "long label": "2"}).splitlines() == \
        ["a:          1", "long label: 2"]


def test_info_says_how_cuda_tensors_are_reduced():
    """Without cupy (this machine) the automatic choice is the host; a setting is shown as
    given; a bad one is reported on its line, naming the choices."""
    if subprocess.run([sys.executable, "-c", "import cupy"], capture_output=True).returncode == 0:
        pytest.skip("cupy is installed: the automatic choice may be NCCL")
    lines = report(run_info().stdout)
    assert lines["CUDA tensors"] == "reduced by host (RIPPLES_GPU_PATH=auto)"
    env = dict(os.environ, RIPPLES_GPU_PATH="mpi")
    out = subprocess.run([sys.executable, "-m", "ripples.runner.info"], capture_output=True,
                         text=True, timeout=120, env=env).stdout
    assert report(out)["CUDA tensors"] == "reduced by mpi (RIPPLES_GPU_PATH=mpi)"
    env["RIPPLES_GPU_PATH"] = "gpu"
    out = subprocess.run([sys.executable, "-m", "ripples.runner.info"], capture_output=True,
                         text=True, timeout=120, env=env).stdout
    assert "'auto' or 'nccl' or 'mpi' or 'host'" in report(out)["CUDA tensors"]
