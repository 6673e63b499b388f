"""The timeline as users open it: one Chrome trace at the path asked for, every rank a process
row; per-rank files on request or when a rank is missing at the end, with shutdown bounded."""
import json
import re
import sys

import pytest

from mpi_launch import TESTS_DIR, run_mpi

SCRIPT = str(TESTS_DIR / "mpi" / "mpi_timeline.py")


def run(scenario, nprocs, tmp_path, env=None, **kwargs):
    return run_mpi([sys.executable, SCRIPT, scenario, str(tmp_path)], nprocs, timeout=120,
                   env=env, **kwargs)


def load(path):
    with open(path) as handle:
        events = json.load(handle)
    assert isinstance(events, list)
    return events


def rows(events):
    """{pid: row label} from the process_name metadata events."""
    names = [e for e in events if e["name"] == "process_name" and e["ph"] == "M"]
    labels = {e["pid"]: e["args"]["name"] for e in names}
    assert len(labels) == len(names), "one process_name event per rank"
    return labels


def allreduce_sizes(events, rank):
    """The byte sizes of the all-reduces ``rank`` recorded, in order."""
    return [e["args"]["bytes"] for e in events
            if e["ph"] == "X" and e["name"] == "allreduce" and e["pid"] == rank]


def shutdown_seconds(stdout):
    return {int(r): float(s) for r, s in re.findall(r"rank (\d+) shutdown ([\d.]+)", stdout)}


def test_one_trace_at_the_path_with_a_row_per_rank(tmp_path):
    nprocs = 2  # 4 ranks: test_start_and_stop_at_run_time
    trace = tmp_path / "trace.json"
    run("shutdown", nprocs, tmp_path, env={"RIPPLES_TIMELINE": str(trace)})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.json"]
    events = load(trace)
    assert rows(events) == {r: f"rank {r}" for r in range(nprocs)}
    for rank in range(nprocs):
        assert allreduce_sizes(events, rank) == [4]
        assert any(e["name"] == "wait" and e["pid"] == rank for e in events)


def test_per_rank_files_on_request(tmp_path):
    trace = tmp_path / "trace.json"
    run("shutdown", 2, tmp_path, env={"RIPPLES_TIMELINE": str(trace),
                                      "RIPPLES_TIMELINE_PER_RANK": "1"})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.rank0.json", "trace.rank1.json"]
    for rank in range(2):
        events = load(tmp_path / f"trace.rank{rank}.json")
        assert rows(events) == {rank: f"rank {rank}"}
        assert allreduce_sizes(events, rank) == [4]


def test_start_and_stop_at_run_time(tmp_path):
    result = run("start-stop", 4, tmp_path)
    assert re.search(r"a\.json events: \d+", result.stdout), result.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "b.json", "c.json"]
    # Each timeline holds exactly the all-reduces made while it recorded (sizes 2, 3, 4 floats).
    expected = {"a.json": [8], "b.json": [12], "c.json": [16, 16]}
    for name, sizes in expected.items():
        events = load(tmp_path / name)
        assert rows(events) == {r: f"rank {r}" for r in range(4)}, name
        for rank in range(4):
            assert allreduce_sizes(events, rank) == sizes, (name, rank)


def test_a_late_rank_leaves_per_rank_files_and_shutdown_is_bounded(tmp_path):
    trace = tmp_path / "trace.json"
    result = run("late", 2, tmp_path, env={"RIPPLES_TIMELINE": str(trace),
                                           "RIPPLES_TIMEOUT_S": "2"})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.rank0.json", "trace.rank1.json"]
    for rank in range(2):  # the late rank's too: rank 0 told it the merge failed
        assert allreduce_sizes(load(tmp_path / f"trace.rank{rank}.json"), rank) == [4]
    assert re.search(r"ranks \[1\] did not send their events within 2 s", result.stdout), \
        result.stdout
    seconds = shutdown_seconds(result.stdout)
    assert sorted(seconds) == [0, 1]
    assert seconds[0] < 2 + 1.5 and seconds[1] < 1, seconds  # the timeout, not more


def test_a_dead_rank_leaves_the_survivors_file(tmp_path):
    trace = tmp_path / "trace.json"
    # --enable-recovery keeps Open MPI from ending the survivor (by default it ends the whole
    # job at once, and nothing shuts down).
    result = run("dies", 2, tmp_path, env={"RIPPLES_TIMELINE": str(trace),
                                           "RIPPLES_TIMEOUT_S": "2"},
                 check=False, mpiexec_args=["--enable-recovery"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.rank0.json"], result.stdout
    assert allreduce_sizes(load(tmp_path / "trace.rank0.json"), 0) == [4]
    assert "ranks [1] did not send their events" in result.stdout, result.stdout
    seconds = shutdown_seconds(result.stdout)
    assert sorted(seconds) == [0] and seconds[0] < 2 + 1.5, result.stdout
