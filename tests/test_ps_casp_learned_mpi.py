"""communities="learned" in a real PS run under mpiexec (4 workers + 1 server)."""
import sys

from mpi_launch import TESTS_DIR, run_mpi


def test_learned_communities_form_and_training_completes():
    out = run_mpi([sys.executable, str(TESTS_DIR / "mpi" / "mpi_ps_casp_learned.py")], 5,
                  timeout=120, env={"RIPPLES_PS_SERVERS": "1"}).stdout
    for worker in range(4):
        assert f"worker {worker} learned communities" in out, out
