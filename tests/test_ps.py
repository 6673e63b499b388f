"""Parameter-server mode under mpiexec: each script checks itself on every worker and
aborts the job on failure (servers exit inside ripples.ps.start, so these are plain
scripts rather than pytest modules)."""
import sys

from mpi_launch import TESTS_DIR, run_mpi


def script(name, *args):
    return [sys.executable, str(TESTS_DIR / "mpi" / name), *map(str, args)]


def test_bsp_one_server_equals_synchronous_sgd():
    out = run_mpi(script("mpi_ps_bsp.py", 1, "roundrobin"), 3, timeout=90).stdout
    assert "bsp servers=1 placement=roundrobin OK" in out


def test_bsp_two_servers_equals_synchronous_sgd_under_every_placement():
    placements = ("roundrobin", "greedy", "mxnet", "hash")
    out = run_mpi(script("mpi_ps_bsp.py", 2, ",".join(placements)), 4, timeout=90).stdout
    for placement in placements:
        assert f"bsp servers=2 placement={placement} OK" in out


def test_policies_exactly_once_ssp_gate_syncopt_and_digits():
    out = run_mpi(script("mpi_ps_policies.py"), 5, timeout=120).stdout
    assert "policies OK" in out


def test_silent_server_makes_workers_fail_within_timeout():
    out = run_mpi(script("mpi_ps_failures.py", "server"), 3, timeout=60).stdout
    assert "silent server OK" in out


def test_silent_worker_fails_bsp_and_asp_carries_on():
    out = run_mpi(script("mpi_ps_failures.py", "worker"), 3, timeout=60).stdout
    assert "silent worker OK" in out
