"""The after-idle latency benchmark runs under mpiexec, times every row and ends cleanly
(the generator service and the AD-PSGD responder close). Behaviour only: nothing here
depends on how fast the machine is."""
import json
import sys

from mpi_launch import REPO_DIR, run_mpi

SCRIPT = str(REPO_DIR / "benchmarks" / "latency_after_idle.py")
ROWS = {"raw MPI allreduce (world)", "raw MPI allreduce (group)", "ripples allreduce",
        "ripples partial_allreduce", "generator request", "AD-PSGD exchange",
        "AD-PSGD exchange (naps)"}


def test_four_ranks_time_every_row(tmp_path):
    out = tmp_path / "latency.json"
    proc = run_mpi([sys.executable, SCRIPT, "--group-size", "2", "--iterations", "3",
                    "--warmup", "1", "--idle-ms", "1", "--json", str(out)], 4, timeout=120)
    data = json.loads(out.read_text())
    assert data["ranks"] == 4 and data["args"]["group_size"] == 2
    assert set(data["median_us"]) == ROWS
    assert all(us > 0 for us in data["median_us"].values())
    assert "AD-PSGD exchange" in proc.stdout


def test_a_group_size_that_does_not_divide_the_ranks_is_refused(tmp_path):
    proc = run_mpi([sys.executable, SCRIPT, "--group-size", "3", "--iterations", "1"], 2,
                   timeout=60, check=False)
    assert proc.returncode != 0
    assert "--group-size 3 and 2 must divide the 2 ranks" in proc.stdout
