"""Parameter-server mode in real training-script patterns (LR schedulers, hyperparameters
set by hand, GradScaler, clipping, accumulation, frozen and unused parameters,
checkpoint/resume), under mpiexec (jobs shared with other scenarios of the same shape:
tests/ps_jobs.py)."""
import pytest

from ps_jobs import job_fixture

ps_3_ranks = job_fixture("ps_3_ranks")
ps_4_ranks_2_servers = job_fixture("ps_4_ranks_2_servers")


@pytest.mark.xdist_group("ps_3_ranks")
def test_schedulers_grad_scaler_clipping_and_accumulation_reach_the_servers(ps_3_ranks):
    ps_3_ranks.check("hyperparameters",
                     "schedule StepLR OK", "schedule LambdaLR OK", "schedule OneCycleLR OK",
                     "schedule ReduceLROnPlateau OK", "disagreeing hyperparameters OK",
                     "asp per-push hyperparameters OK",
                     "GradScaler clip=False OK", "GradScaler clip=True OK", "accumulation OK",
                     "frozen and unused parameters OK",
                     "worker 0: hyperparameters OK", "worker 1: hyperparameters OK")


@pytest.mark.xdist_group("ps_4_ranks_2_servers")
def test_checkpoint_holds_the_servers_state_and_resumes_bit_for_bit(ps_4_ranks_2_servers):
    ps_4_ranks_2_servers.check(
        "checkpoint", "worker 0: checkpoint OK", "worker 1: checkpoint OK",
        *(f"checkpoint {opt} {path} OK"
          for opt in ("sgd", "adam") for path in ("load_state_dict", "load before wrapping")))
