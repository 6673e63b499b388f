"""launch/mpiexec.sh: the plain-mpiexec example forwards RIPPLES_* settings and exit status."""
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "launch" / "mpiexec.sh"


def run_script(np, code, extra_env=None):
    env = dict(os.environ, OMP_NUM_THREADS="1", **(extra_env or {}))
    # The script looks for mpiexec beside the first python on PATH: put ours first.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return subprocess.run(["bash", str(SCRIPT), str(np), sys.executable, "-c", code],
                          capture_output=True, text=True, timeout=60, env=env)


def test_mpiexec_script_forwards_settings():
    code = ("import os; from mpi4py import MPI; "
            "print('seed', MPI.COMM_WORLD.rank, os.environ['RIPPLES_SEED'])")
    result = run_script(3, code, {"RIPPLES_SEED": "17"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert sorted(line for line in result.stdout.splitlines() if line.startswith("seed")) == \
        ["seed 0 17", "seed 1 17", "seed 2 17"]
    assert "-x RIPPLES_SEED" in result.stderr


def test_mpiexec_script_propagates_failure():
    code = "import sys; from mpi4py import MPI; sys.exit(4 if MPI.COMM_WORLD.rank == 0 else 0)"
    assert run_script(2, code).returncode == 4


def test_mpiexec_script_usage():
    result = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=10)
    assert result.returncode == 2 and "usage" in result.stderr
