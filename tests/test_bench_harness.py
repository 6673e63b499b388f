"""The benchmarks' shared harness (``benchmarks/harness``): how a result names its command,
the summaries, interleaved timing and the mpiexec line. No processes are started."""
import json
import math
import sys

import pytest

from mpi_launch import REPO_DIR

sys.path.insert(0, str(REPO_DIR / "benchmarks"))
from harness import launch, report, stats, timing  # noqa: E402

BENCHMARKS = REPO_DIR / "benchmarks"


@pytest.fixture
def clean_env(monkeypatch):
    """No job around this process and no ripples settings in its environment."""
    import os
    for name in list(os.environ):
        if name.startswith(("RIPPLES_", "OMPI_COMM_WORLD", "PMI_")) or name == "BENCH_COMMAND":
            monkeypatch.delenv(name)
    return monkeypatch


def test_command_line_quotes_the_typed_arguments(clean_env):
    line = report.command_line(["benchmarks/step.py", "--rows", "no communication;raw MPI"])
    assert line == "python benchmarks/step.py --rows 'no communication;raw MPI'"


def test_command_line_names_settings_and_the_launcher(clean_env):
    clean_env.setenv("RIPPLES_GROUP_ALLREDUCE", "ring")
    clean_env.setenv("OMPI_COMM_WORLD_SIZE", "4")
    assert report.command_line(["benchmarks/collectives.py", "-b", "8"]) == (
        "RIPPLES_GROUP_ALLREDUCE=ring mpiexec -n 4 python benchmarks/collectives.py -b 8")


def test_a_rank_of_a_driven_job_quotes_the_driver(clean_env):
    clean_env.setenv("OMPI_COMM_WORLD_SIZE", "2")
    clean_env.setenv("BENCH_COMMAND", "python benchmarks/ps.py --transport")
    assert report.command_line() == "python benchmarks/ps.py --transport"
    assert launch.job_env()["BENCH_COMMAND"] == "python benchmarks/ps.py --transport"


def test_write_json_stamps_and_keeps_the_result(tmp_path, clean_env):
    path = tmp_path / "deeper" / "result.json"
    written = report.write_json(path, {"rows": [1], "date": "kept"}, "python x.py")
    data = json.loads(path.read_text())
    assert data == written
    assert data["command"] == "python x.py" and data["date"] == "kept" and data["rows"] == [1]
    assert data["machine"] and data["cores"] >= 1


def test_stats():
    assert stats.median([3, 1, 2]) == 2
    assert stats.ratio(3, 2) == 1.5
    assert math.isnan(stats.ratio(1, 0)) and math.isnan(stats.ratio(None, 1))
    assert stats.percentile([5, 1, 4, 2, 3], 0.99) == 5 and stats.percentile([], 0.5) is None
    assert stats.slowest_per_iteration([[1, 5], [2, 3]]) == [2, 5]
    assert stats.median_run([{"v": 3}, {"v": 1}, {"v": 2}], key=lambda r: r["v"]) == {"v": 2}


def test_interleaved_calls_each_in_turn_and_times_after_warmup():
    order = []
    times = timing.interleaved({"a": lambda i: order.append(("a", i)),
                                "b": lambda i: order.append(("b", i))}, iterations=2,
                               warmup=1, before=lambda i: order.append(("before", i)))
    assert order == [("before", 0), ("a", 0), ("before", 0), ("b", 0),
                     ("before", 1), ("a", 1), ("before", 1), ("b", 1),
                     ("before", 2), ("a", 2), ("before", 2), ("b", 2)]
    assert {k: len(v) for k, v in times.items()} == {"a": 2, "b": 2}


def test_mpiexec_command():
    assert launch.mpiexec_command(3, ["python", "x.py"])[1:] == [
        "-n", "3", "--oversubscribe", "--bind-to", "none", "python", "x.py"]
    assert launch.mpiexec_command(4, ["x"], declare_slots=True)[3:5] == ["--host", "localhost:4"]


def test_result_line_round_trip(capsys):
    launch.emit_result({"a": 1})
    done = type("Done", (), {"stdout": "noise\n" + capsys.readouterr().out, "returncode": 0,
                             "stderr": ""})()
    assert launch.result_of(done, "job") == {"a": 1}
    done.returncode = 1
    with pytest.raises(RuntimeError, match="no result from job"):
        launch.result_of(done, "job")


def test_every_benchmark_module_is_under_300_lines():
    long = {str(p.relative_to(BENCHMARKS)): n for p in BENCHMARKS.rglob("*.py")
            if (n := len(p.read_text().splitlines())) >= 300}
    assert not long
