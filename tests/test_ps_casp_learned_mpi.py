"""communities="learned" in a real PS run under mpiexec (4 workers + 1 server; the job is
shared with other scenarios of that shape: tests/ps_jobs.py)."""
import pytest

from ps_jobs import job_fixture

ps_5_ranks = job_fixture("ps_5_ranks")


@pytest.mark.xdist_group("ps_5_ranks")
def test_learned_communities_form_and_training_completes(ps_5_ranks):
    ps_5_ranks.check("casp learned",
                     *(f"worker {worker} learned communities" for worker in range(4)))
