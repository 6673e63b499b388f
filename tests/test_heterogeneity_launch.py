"""End to end: ripplesrun flags reach the ranks, which inject slowdown, write a timeline and
metrics; a 3x-slow rank's steps take about three times as long as a normal rank's."""
import glob
import json
import os
import sys
import textwrap

from mpi_launch import run_launcher

SCRIPT = textwrap.dedent("""
    from mpi4py import MPI
    from ripples.core.config import Config
    from ripples.core.heterogeneity import SlowdownInjector
    from ripples.observe.metrics import RankMetrics
    from ripples.observe.timeline import make_timeline

    config = Config.load()
    comm = MPI.COMM_WORLD
    rank = comm.rank
    injector = SlowdownInjector.from_config(config, rank, world_size=comm.size)
    timeline = make_timeline(config.timeline, rank)
    metrics = RankMetrics(rank)
    for step in range(5):
        with timeline.span("step", "compute", step=step):
            with injector.step():
                pass                      # all compute is emulated (compute_ms)
        metrics.add_step(samples=4)
    metrics.stop()
    timeline.close(comm, config.timeout_s)  # rank 0 writes both ranks' events
    metrics.write_json(config.metrics_path)
""")


def test_slowdown_timeline_and_metrics_through_ripplesrun(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    result = run_launcher(
        [sys.executable, "-m", "ripples.runner.launch", "-np", "2", "--slowdown", "1:3",
         "--compute-ms", "40", "--timeline", str(tmp_path / "trace.json"),
         "--metrics", str(tmp_path / "metrics.json"), "--timeout", "20",
         sys.executable, str(script)],
        timeout=90, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert result.returncode == 0, result.stdout + result.stderr

    metrics = [json.load(open(tmp_path / f"metrics.rank{r}.json")) for r in range(2)]
    assert [m["steps"] for m in metrics] == [5, 5]
    assert [m["samples"] for m in metrics] == [20, 20]
    # Rank 0: 5 steps padded to 40 ms = 0.2 s; rank 1 is 3x slower = 0.6 s.
    assert 0.19 <= metrics[0]["wall_s"] < 0.6
    assert 0.59 <= metrics[1]["wall_s"] < 1.5
    assert 2.0 < metrics[1]["wall_s"] / metrics[0]["wall_s"] < 3.3

    assert glob.glob(str(tmp_path / "trace*")) == [str(tmp_path / "trace.json")]
    events = json.load(open(tmp_path / "trace.json"))
    for rank in range(2):
        steps = [e for e in events if e["ph"] == "X" and e["pid"] == rank]
        assert [e["args"]["step"] for e in steps] == list(range(5))
        expected_us = 40_000 * (3 if rank == 1 else 1)
        assert all(expected_us * 0.95 <= e["dur"] < expected_us * 3 for e in steps)
