"""CASP communities and EPSP/FlexRR-lite tasks under mpiexec (1 server; the scenarios in
``tests/mpi`` check themselves on every worker and abort the job on failure; they share
their jobs with other scenarios of the same shape: tests/ps_jobs.py)."""
import pytest

from ps_jobs import example_accuracies, job_fixture

ps_3_ranks = job_fixture("ps_3_ranks")
ps_4_ranks = job_fixture("ps_4_ranks")
ps_5_ranks = job_fixture("ps_5_ranks")


@pytest.mark.xdist_group("ps_5_ranks")
def test_casp_one_community_is_bsp_one_each_is_asp_and_regrouping_keeps_every_update(
        ps_5_ranks):
    ps_5_ranks.check("casp equivalence", "casp equivalence OK")


@pytest.mark.xdist_group("ps_5_ranks")
def test_casp_workers_may_stop_after_different_numbers_of_steps(ps_5_ranks):
    ps_5_ranks.check("casp uneven", "casp uneven OK")


@pytest.mark.xdist_group("ps_5_ranks")
def test_casp_re_formed_communities_and_a_metric_all_reduce_after_each_epoch(ps_5_ranks):
    ps_5_ranks.check("casp epochs", "casp epochs OK")


@pytest.mark.xdist_group("ps_4_ranks")
def test_casp_stalled_member_fails_its_community_and_the_other_continues(ps_4_ranks):
    ps_4_ranks.check("casp failure", "casp failure OK")


@pytest.mark.xdist_group("ps_4_ranks")
def test_epsp_and_flexrr_apply_every_task_exactly_once_with_transfers(ps_4_ranks):
    ps_4_ranks.check("epsp", "epsp patterns s=0 OK", "epsp patterns s=2 OK", "epsp OK")


@pytest.mark.xdist_group("ps_4_ranks")
def test_casp_and_epsp_arguments_through_the_frontend(ps_4_ranks):
    ps_4_ranks.check("frontend policies", *(f"worker {worker} ok" for worker in range(3)))


@pytest.mark.xdist_group("ps_3_ranks")
def test_documented_epsp_example_runs_as_documented(ps_3_ranks):
    ps_3_ranks.check("documented epsp example")
    accuracies = example_accuracies(ps_3_ranks.output)
    assert len(accuracies) == 2 and min(accuracies) > 0.9, ps_3_ranks.output
