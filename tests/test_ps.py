"""Parameter-server mode under mpiexec: each scenario checks itself on every worker and
aborts the job on failure (servers exit inside ripples.ps.start, so the scenarios run in
plain scripts rather than pytest modules; tests/ps_jobs.py runs them)."""
import pytest

from ps_jobs import job_fixture

ps_3_ranks = job_fixture("ps_3_ranks")
ps_4_ranks_2_servers = job_fixture("ps_4_ranks_2_servers")
ps_5_ranks = job_fixture("ps_5_ranks")


@pytest.mark.xdist_group("ps_3_ranks")
def test_bsp_one_server_equals_synchronous_sgd(ps_3_ranks):
    ps_3_ranks.check("bsp", "bsp servers=1 placement=roundrobin OK")


@pytest.mark.xdist_group("ps_4_ranks_2_servers")
def test_bsp_two_servers_equals_synchronous_sgd_under_every_placement(ps_4_ranks_2_servers):
    placements = ("roundrobin", "greedy", "mxnet", "hash")
    ps_4_ranks_2_servers.check("bsp", *(f"bsp servers=2 placement={placement} OK"
                                        for placement in placements))


@pytest.mark.xdist_group("ps_5_ranks")
def test_policies_exactly_once_ssp_gate_syncopt_and_digits(ps_5_ranks):
    ps_5_ranks.check("policies", "policies OK")


@pytest.mark.xdist_group("ps_3_ranks")
def test_silent_server_makes_workers_fail_within_timeout(ps_3_ranks):
    ps_3_ranks.check("silent server", "silent server OK")


@pytest.mark.xdist_group("ps_3_ranks")
def test_silent_worker_fails_bsp_and_asp_carries_on(ps_3_ranks):
    ps_3_ranks.check("silent worker", "silent worker OK")
