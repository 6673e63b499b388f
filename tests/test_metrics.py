"""Per-rank metrics bookkeeping with a fake clock."""
import gc
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from ripples.observe.metrics import RankMetrics, record_samples


class Clock:
    def __init__(self):
        self.now = 10.0

    def __call__(self):
        return self.now


def test_counts_rates_and_waits():
    clock = Clock()
    m = RankMetrics(3, clock=clock)
    for _ in range(4):
        m.add_step(samples=32)
    m.add_wait(0.5)
    with m.waiting():
        clock.now += 1.5
    clock.now += 0.5                      # 2 s since start
    d = m.as_dict()
    assert (d["rank"], d["steps"], d["samples"]) == (3, 4, 128)
    assert d["wall_s"] == pytest.approx(2.0)
    assert d["samples_per_s"] == pytest.approx(64.0)
    assert d["steps_per_s"] == pytest.approx(2.0)
    assert d["wait_s"] == pytest.approx(2.0)
    assert d["wait_fraction"] == pytest.approx(1.0)


def test_stop_and_reset_clock():
    clock = Clock()
    m = RankMetrics(0, clock=clock)
    clock.now += 5
    m.reset_clock()
    clock.now += 2
    m.stop()
    clock.now += 100
    assert m.wall_s == pytest.approx(2.0)


def test_zero_wall_time_gives_zero_rates():
    m = RankMetrics(0, clock=Clock())
    m.add_step(8)
    d = m.as_dict()
    assert d["samples_per_s"] == 0.0 and d["steps_per_s"] == 0.0 and d["wait_fraction"] == 0.0


def test_groups_and_consensus():
    m = RankMetrics(1, clock=Clock())
    for size in (4, 4, 2, 1, 4):
        m.add_group(size)
    m.add_consensus(10, 0.25)
    m.add_consensus(20, 0.125)
    d = m.as_dict()
    assert d["groups_by_size"] == {"1": 1, "2": 1, "4": 3}
    assert d["groups"] == 5
    assert d["mean_group_size"] == pytest.approx(15 / 5)
    assert d["consensus"] == [[10, 0.25], [20, 0.125]]


def test_bad_values():
    m = RankMetrics(0)
    for call, arg in [(m.add_step, -1), (m.add_wait, -0.1), (m.add_group, 0),
                      (m.add_wait, float("nan"))]:
        with pytest.raises(ValueError):
            call(arg)
    with pytest.raises(ValueError, match="value"):
        m.add_consensus(0, -1.0)
    with pytest.raises(ValueError, match="rank"):
        RankMetrics(-2)


def test_write_json_one_file_per_rank(tmp_path):
    clock = Clock()
    paths = []
    for rank in range(2):
        m = RankMetrics(rank, clock=clock)
        m.add_step(rank + 1)
        m.add_group(2)
        paths.append(m.write_json(str(tmp_path / "out" / "metrics.json")))
    assert paths == [str(tmp_path / "out" / "metrics.rank0.json"),
                     str(tmp_path / "out" / "metrics.rank1.json")]
    loaded = [json.loads(open(p).read()) for p in paths]
    assert [d["samples"] for d in loaded] == [1, 2]
    assert loaded[1]["groups_by_size"] == {"2": 1}


def test_add_samples_counts_samples_not_steps():
    clock = Clock()
    m = RankMetrics(0, clock=clock)
    m.add_samples(32)
    m.add_samples(np.int64(16))           # numpy and 0-d torch integers count too
    m.add_step()
    clock.now += 2
    d = m.as_dict()
    assert (d["steps"], d["samples"], d["samples_per_s"]) == (1, 48, 24.0)
    for bad in (-1, 2.5, True, "8"):
        with pytest.raises(ValueError, match="samples must be an integer >= 0"):
            m.add_samples(bad)
    assert m.samples == 48


def test_record_samples_counts_on_the_latest_metrics():
    first, second = RankMetrics(0), RankMetrics(0)
    record_samples(5)
    record_samples(3)
    assert (first.samples, second.samples) == (0, 8)
    with pytest.raises(ValueError, match="samples must be"):
        record_samples(-1)


def test_record_samples_without_metrics_does_nothing():
    RankMetrics(0)                        # made and dropped at once
    gc.collect()
    record_samples(5)                     # no error, nothing to count on
    with pytest.raises(ValueError, match="samples must be"):
        record_samples(1.5)               # still checked


def test_samples_reach_the_metrics_file_of_a_training_job(tmp_path):
    code = """
import torch, ripples.torch as hvd, ripples.observe.metrics
hvd.init()
model = torch.nn.Linear(4, 1)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                               named_parameters=model.named_parameters())
for step in range(3):
    x = torch.ones(8 + hvd.rank(), 4)
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()
    ripples.observe.metrics.record_samples(len(x))
hvd.shutdown()
"""
    result = subprocess.run(
        [sys.executable, "-m", "ripples.runner.launch", "-np", "2",
         "--metrics", str(tmp_path / "m.json"),
         "--timeout", "30", sys.executable, "-c", code], capture_output=True, text=True,
        timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert result.returncode == 0, result.stdout + result.stderr
    for rank in range(2):
        d = json.loads((tmp_path / f"m.rank{rank}.json").read_text())
        assert (d["steps"], d["samples"]) == (3, 3 * (8 + rank))
        assert d["samples_per_s"] > 0
