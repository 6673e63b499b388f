"""The demo end to end under mpiexec, with a timeline: table, plot and trace all produced."""
import json
import sys

from mpi_launch import run_mpi


def test_demo_runs_both_modes_and_writes_plot_and_timeline(tmp_path):
    plot = tmp_path / "demo.png"
    trace = tmp_path / "trace.json"
    result = run_mpi([sys.executable, "-m", "ripples.demo", "--seconds", "2", "--compute-ms", "5",
                      "--plot", str(plot)], 2, timeout=180,
                     env={"RIPPLES_TIMELINE": str(trace), "RIPPLES_SLOWDOWN": "1:3"})
    assert "allreduce" in result.stdout and "ripples/generator" in result.stdout
    assert "samples/s of allreduce" in result.stdout
    assert plot.exists() and plot.stat().st_size > 1000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo.png", "trace.json"]
    trace = json.loads(trace.read_text())
    for rank in range(2):
        events = [e for e in trace if e["pid"] == rank]
        names = {e["name"] for e in events}
        assert {"compute", "wait", "allreduce", "partial_allreduce"} <= names, names
        spans = [e for e in events if e.get("ph") == "X"]
        assert all(e["pid"] == rank and e["dur"] >= 0 and "ts" in e for e in spans)
        preduce = [e for e in spans if e["name"] == "partial_allreduce"]
        assert all(rank in e["args"]["group"] and e["args"]["bytes"] > 0 for e in preduce)
    assert any(e["name"] == "slowdown" and e["pid"] == 1 for e in trace)


def test_demo_rejects_a_bad_data_path(tmp_path):
    result = run_mpi([sys.executable, "-m", "ripples.demo", "--data", str(tmp_path / "none.npz"),
                      "--seconds", "1"], 2, timeout=120, check=False)
    assert result.returncode != 0
    assert result.stdout.count("no such file") >= 2  # on every rank
