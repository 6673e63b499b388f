"""init(ps_servers=...) and DistributedOptimizer(sync="ps") end to end under mpiexec."""
import sys

from mpi_launch import TESTS_DIR, run_mpi


def test_ps_mode_through_the_frontend():
    result = run_mpi([sys.executable, str(TESTS_DIR / "mpi" / "ps_frontend.py")], 3,
                     timeout=120, env={"RIPPLES_PS_SERVERS": "1"})
    assert "worker 0 ok" in result.stdout and "worker 1 ok" in result.stdout


def test_sync_ps_without_servers_is_a_clear_error():
    code = ("import torch, ripples.torch as hvd\n"
            "hvd.init()\n"
            "m = torch.nn.Linear(2, 1)\n"
            "try:\n"
            "    hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), sync='ps')\n"
            "except ValueError as e:\n"
            "    print('error:', e, flush=True)\n")
    result = run_mpi([sys.executable, "-c", code], 2, timeout=60)
    assert result.stdout.count("ps_servers") >= 2
