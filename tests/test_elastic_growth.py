"""Growing back by restart: ``ripplesrun --min-np/--max-np`` starts a job that stopped for a
restart (or failed) again on ``--max-np`` ranks, which resume from the last commit
(``tests/mpi/elastic_growth.py``)."""
import re
import sys

import pytest

from mpi_launch import TESTS_DIR, mpi_env, run_launcher
from ripples.runner import elastic_restart
from ripples.runner.launch import parse_args, run_elastic

SCRIPT = str(TESTS_DIR / "mpi" / "elastic_growth.py")
STEPS = 15


def launch(tmp_path, *flags, dead_rank=2, die_at=7):
    work = tmp_path / "work"
    work.mkdir()
    result = run_launcher(
        [sys.executable, "-m", "ripples.runner.launch", "-np", "3",
         "--elastic-dir", str(tmp_path / "dir"),
         "--timeout", "20", *flags, sys.executable, SCRIPT, str(work), str(dead_rank),
         str(die_at), str(STEPS)],
        timeout=240, env=mpi_env(), cwd=str(tmp_path))
    steps = [tuple(map(int, m)) for m in
             re.findall(r"STEP launch=(\d+) step=(\d+) size=(\d+)", result.stdout)]
    results = re.findall(r"RESULT rank=(\d+) size=(\d+) weight=\[(\S+)\]", result.stdout)
    return result, steps, results


def check_final(result, results):
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    # every rank of the last launch, on 3 ranks, with every step applied exactly once
    assert sorted(r[0] for r in results) == ["0", "1", "2"], output
    assert all(size == "3" and float(weight) == -STEPS for _, size, weight in results), output


def test_a_shrunk_world_trains_on_then_grows_back_at_its_next_commit(tmp_path):
    """Rank 2 of 3 dies after step 7: the survivors roll back to the commit of step 6,
    train on 2 ranks to the commit of step 9, and stop there; the second launch resumes
    from step 9 on 3 ranks."""
    result, steps, results = launch(tmp_path, "--fault-tolerant", "--min-np", "2",
                                    "--max-np", "3")
    check_final(result, results)
    first = [(s, n) for launch_, s, n in steps if launch_ == 0]
    second = [(s, n) for launch_, s, n in steps if launch_ == 1]
    output = result.stdout + result.stderr  # the survivors' recovery is told on stderr
    assert {s for s, n in first if n == 2} == {7, 8, 9}, output  # after the rollback
    assert {s for s, n in second} == set(range(10, STEPS + 1)), output
    assert all(n == 3 for _, n in second), output
    assert "restart 1 of 3 on 3 ranks" in result.stderr, output


def test_a_world_below_min_np_restarts_at_once_from_the_last_commit(tmp_path):
    result, steps, results = launch(tmp_path, "--fault-tolerant", "--min-np", "3")
    check_final(result, results)
    # never trained on 2 ranks
    assert not [s for _, s, n in steps if n == 2], result.stdout + result.stderr
    assert {s for launch_, s, _ in steps if launch_ == 1} == set(range(7, STEPS + 1))
    assert "below min_np 3" in result.stderr, result.stderr


def test_without_fault_tolerance_a_death_ends_the_job_and_the_launcher_restarts_it(tmp_path):
    result, steps, results = launch(tmp_path, "--max-np", "3")
    check_final(result, results)
    # the whole first job ended with the death; the second resumes from the commit of step 6
    assert {s for launch_, s, _ in steps if launch_ == 1} == set(range(7, STEPS + 1))
    assert "the job failed" in result.stderr, result.stderr


def test_a_commit_left_by_an_earlier_job_is_not_resumed(tmp_path):
    (tmp_path / "dir").mkdir()
    elastic_restart.state_path(str(tmp_path / "dir")).write_bytes(b"an earlier job's commit")
    result, steps, results = launch(tmp_path, "--max-np", "3", dead_rank=-1)
    check_final(result, results)
    assert {s for _, s, _ in steps} == set(range(1, STEPS + 1))


def test_a_failure_before_the_first_commit_is_not_restarted(tmp_path):
    result, steps, _ = launch(tmp_path, "--max-np", "3", die_at=1)
    assert result.returncode != 0
    assert "before its first commit: no restart" in result.stderr, result.stderr
    assert {launch_ for launch_, _, _ in steps} == {0}


def test_restarts_stop_at_max_restarts_and_each_runs_on_max_np(tmp_path):
    args = parse_args(["-np", "2", "--max-np", "4", "--max-restarts", "2", "--elastic-dir",
                       str(tmp_path), "python", "t.py"])
    launched = []

    def always_asks_again(launch_args):
        launched.append(launch_args.np)
        elastic_restart.request_restart(str(tmp_path), "grow")
        return elastic_restart.EXIT_RESTART

    assert run_elastic(args, always_asks_again) == elastic_restart.EXIT_RESTART
    assert launched == [2, 4, 4]


@pytest.mark.parametrize("flags,message", [
    (["-np", "3", "--min-np", "4"], "min-np <= np <= max-np"),
    (["-np", "3", "--max-np", "2"], "min-np <= np <= max-np"),
    (["-np", "3", "--min-np", "0"], "min-np <= np <= max-np"),
    (["-np", "3", "--max-np", "3", "--max-restarts", "-1"], "--max-restarts"),
    (["-np", "3", "--min-np", "2", "--max-np", "3", "--ps-servers", "1"],
     "parameter-server jobs restart on as many ranks as before"),
])
def test_elastic_flags_are_checked(flags, message, capsys):
    with pytest.raises(SystemExit):
        parse_args(flags + ["python", "t.py"])
    assert message in capsys.readouterr().err


def test_a_killed_parameter_server_resumes_from_the_last_commit(tmp_path):
    """1 server + 3 workers, BSP, commits every 5 steps; worker 0 kills the server before
    step 8. The job fails, the launcher starts it again, and the servers are loaded with the
    commit of step 5 (parameters and optimizer state): steps 5-19 are redone, and the final
    model equals one process averaging the 3 workers' gradients for 20 steps."""
    script = str(TESTS_DIR / "mpi" / "ps_server_restart.py")
    result = run_launcher(
        [sys.executable, "-m", "ripples.runner.launch", "-np", "4", "--min-np", "4",
         "--max-np", "4", "--ps-servers", "1", "--max-restarts", "1", "--elastic-dir",
         str(tmp_path / "dir"), "--timeout", "20", sys.executable, script, str(tmp_path), "20",
         "8"], timeout=240, env=mpi_env(), cwd=str(tmp_path))
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "the job failed (exit 137): restart 1 of 1" in output, output
    finals = re.findall(r"FINAL rank=(\d) launch=(\d) step=(\d+) gap=(\S+)", result.stdout)
    assert sorted(rank for rank, *_ in finals) == ["0", "1", "2"], output
    assert ("0", "2") in [(rank, launch) for rank, launch, *_ in finals], output  # relaunched
    assert all(step == "20" and float(gap) < 1e-5 for *_, step, gap in finals), output

