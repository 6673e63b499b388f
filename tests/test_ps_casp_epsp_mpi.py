"""CASP communities and EPSP/FlexRR-lite tasks under mpiexec (1 server; scripts in
``tests/mpi`` check themselves on every worker and abort the job on failure)."""
import sys

import pytest
from mpi_launch import TESTS_DIR, run_mpi

# Its module-scoped fixture runs once per test process: keep its tests in one.
pytestmark = pytest.mark.xdist_group("ps_casp_epsp")


def script(name, *args):
    return [sys.executable, str(TESTS_DIR / "mpi" / name), *map(str, args)]


@pytest.fixture(scope="module")
def five_rank_casp():
    """The two 5-rank CASP scenarios, one after the other in one job (a rank's start costs
    seconds of CPU)."""
    return run_mpi(script("mpi_ps_casp.py", "equivalence", "uneven"), 5, timeout=240).stdout


def test_casp_one_community_is_bsp_one_each_is_asp_and_regrouping_keeps_every_update(
        five_rank_casp):
    assert "casp equivalence OK" in five_rank_casp


def test_casp_workers_may_stop_after_different_numbers_of_steps(five_rank_casp):
    assert "casp uneven OK" in five_rank_casp


def test_casp_stalled_member_fails_its_community_and_the_other_continues():
    out = run_mpi(script("mpi_ps_casp.py", "failure"), 4, timeout=90).stdout
    assert "casp failure OK" in out


def test_epsp_and_flexrr_apply_every_task_exactly_once_with_transfers():
    out = run_mpi(script("mpi_ps_epsp.py"), 4, timeout=150).stdout
    assert "epsp patterns s=0 OK" in out and "epsp patterns s=2 OK" in out
    assert "epsp OK" in out


def test_casp_and_epsp_arguments_through_the_frontend():
    result = run_mpi(script("mpi_ps_frontend_policies.py"), 4, timeout=150,
                     env={"RIPPLES_PS_SERVERS": "1"})
    for worker in range(3):
        assert f"worker {worker} ok" in result.stdout


def test_documented_epsp_example_runs_as_documented(tmp_path):
    readme = (TESTS_DIR.parent / "docs" / "parameter-server.md").read_text()
    block = readme.split("<!-- epsp-example -->")[1].split("<!-- /epsp-example -->")[0]
    code = block.split("```python\n")[1].split("```")[0]
    path = tmp_path / "train_epsp.py"
    path.write_text(code)
    out = run_mpi([sys.executable, str(path)], 3, timeout=150,
                  env={"RIPPLES_PS_SERVERS": "1"}).stdout
    accuracies = [float(line.split()[3]) for line in out.splitlines()
                  if line.startswith("worker ") and " accuracy " in line]
    assert len(accuracies) == 2 and min(accuracies) > 0.9, out
