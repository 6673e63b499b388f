"""init(ps_servers=...) and DistributedOptimizer(sync="ps") end to end under mpiexec (3
ranks; the job is shared with other scenarios of that shape: tests/ps_jobs.py)."""
import pytest

from ps_jobs import job_fixture

ps_3_ranks = job_fixture("ps_3_ranks")
pytestmark = pytest.mark.xdist_group("ps_3_ranks")


def test_ps_mode_through_the_frontend(ps_3_ranks):
    ps_3_ranks.check("frontend", "worker 0 ok", "worker 1 ok")


def test_sync_ps_without_servers_is_a_clear_error(ps_3_ranks):
    ps_3_ranks.check("no servers")
    errors = [line for line in ps_3_ranks.output.splitlines() if " error: " in line]
    for rank in range(3):
        assert any(line.startswith(f"rank {rank} error: ") and "ps_servers" in line
                   for line in errors), (rank, errors)
