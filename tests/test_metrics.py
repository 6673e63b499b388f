"""Per-rank metrics bookkeeping with a fake clock."""
import json

import pytest

from ripples.metrics import RankMetrics


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
