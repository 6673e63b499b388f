"""Parameter-server mode in real training-script patterns (LR schedulers, hyperparameters
set by hand, GradScaler, clipping, accumulation, frozen and unused parameters,
checkpoint/resume), under mpiexec."""
import sys

from mpi_launch import TESTS_DIR, run_mpi

SCRIPT = str(TESTS_DIR / "mpi" / "mpi_ps_training_patterns.py")


def test_schedulers_grad_scaler_clipping_and_accumulation_reach_the_servers():
    out = run_mpi([sys.executable, SCRIPT, "hyperparameters"], 3, timeout=90).stdout
    for line in ("schedule StepLR OK", "schedule LambdaLR OK", "schedule OneCycleLR OK",
                 "schedule ReduceLROnPlateau OK", "disagreeing hyperparameters OK",
                 "asp per-push hyperparameters OK",
                 "GradScaler clip=False OK", "GradScaler clip=True OK", "accumulation OK",
                 "frozen and unused parameters OK",
                 "worker 0: hyperparameters OK", "worker 1: hyperparameters OK"):
        assert line in out, line


def test_checkpoint_holds_the_servers_state_and_resumes_bit_for_bit():
    out = run_mpi([sys.executable, SCRIPT, "checkpoint"], 4, timeout=90).stdout
    for opt in ("sgd", "adam"):
        for path in ("load_state_dict", "load before wrapping"):
            assert f"checkpoint {opt} {path} OK" in out
    assert "worker 0: checkpoint OK" in out and "worker 1: checkpoint OK" in out
