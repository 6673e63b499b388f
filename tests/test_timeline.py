"""Chrome-trace timeline: file layout, event structure, null timeline, merging."""
import json
import threading
import time

import pytest

from ripples.timeline import NullTimeline, Timeline, make_timeline, merge_timelines, per_rank_path


def test_per_rank_path():
    assert per_rank_path("/a/trace.json", 3) == "/a/trace.rank3.json"
    assert per_rank_path("/a/trace", 0) == "/a/trace.rank0"
    assert per_rank_path("t.x.json", 12) == "t.x.rank12.json"


def test_file_loads_and_has_chrome_trace_structure(tmp_path):
    tl = Timeline(str(tmp_path / "trace.json"), rank=2)
    before_us = time.time() * 1e6
    with tl.span("allreduce", "collective", bytes=1024):
        time.sleep(0.002)
    start = tl.now()
    tl.complete("step", "compute", start, 0.5, {"step": 7})
    tl.close()

    assert tl.path == str(tmp_path / "trace.rank2.json")
    with open(tl.path) as handle:
        events = json.load(handle)
    assert isinstance(events, list)
    meta = [e for e in events if e["ph"] == "M"]
    assert {"name": "process_name", "ph": "M", "pid": 2, "tid": 0,
            "args": {"name": "rank 2"}} in meta
    spans = [e for e in events if e["ph"] == "X"]
    assert [e["name"] for e in spans] == ["allreduce", "step"]
    for e in spans:
        assert set(e) == {"name", "cat", "ph", "ts", "dur", "pid", "tid", "args"}
        assert e["pid"] == 2 and isinstance(e["tid"], int)
    allreduce, step = spans
    assert allreduce["cat"] == "collective" and allreduce["args"] == {"bytes": 1024}
    assert 2000 <= allreduce["dur"] < 2_000_000                         # microseconds
    assert before_us - 1e5 < allreduce["ts"] < time.time() * 1e6       # epoch microseconds
    assert step["dur"] == pytest.approx(500_000)
    assert step["args"] == {"step": 7}
    assert step["ts"] >= allreduce["ts"] + allreduce["dur"] - 1


def test_span_records_errors(tmp_path):
    tl = Timeline(str(tmp_path / "t.json"), rank=0)
    with pytest.raises(KeyError):
        with tl.span("lookup", "test"):
            raise KeyError("x")
    (event,) = [e for e in tl.events() if e["ph"] == "X"]
    assert event["args"] == {"error": "KeyError"}


def test_threads_get_their_own_tid(tmp_path):
    tl = Timeline(str(tmp_path / "t.json"), rank=0)
    with tl.span("main", "test"):
        pass
    worker = threading.Thread(target=lambda: tl.complete("bg", "test", tl.now(), 0.0),
                              name="comm")
    worker.start()
    worker.join()
    events = tl.events()
    tids = {e["name"]: e["tid"] for e in events if e["ph"] == "X"}
    assert tids["main"] != tids["bg"]
    names = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert names[tids["bg"]] == "comm"


def test_null_timeline_has_the_same_api_and_writes_nothing(tmp_path):
    tl = make_timeline("", rank=1)
    assert isinstance(tl, NullTimeline) and not tl.enabled
    with tl.span("x", "y", a=1):
        pass
    tl.complete("x", "y", tl.now(), 1.0, {})
    tl.flush()
    tl.close()
    assert tl.events() == []
    assert list(tmp_path.iterdir()) == []
    public = {n for n in dir(Timeline) if not n.startswith("_")}
    assert public <= {n for n in dir(NullTimeline) if not n.startswith("_")}
    assert isinstance(make_timeline(str(tmp_path / "t.json"), 0), Timeline)


def test_merge(tmp_path):
    paths = []
    for rank in range(3):
        with Timeline(str(tmp_path / "t.json"), rank) as tl:
            tl.complete("step", "compute", tl.now(), 0.001)
        paths.append(tl.path)
    count = merge_timelines(paths, str(tmp_path / "all.json"))
    merged = json.load(open(tmp_path / "all.json"))
    assert count == len(merged)
    assert sorted(e["pid"] for e in merged if e["ph"] == "X") == [0, 1, 2]


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="rank"):
        Timeline(str(tmp_path / "t.json"), -1)
    with pytest.raises(ValueError, match="path"):
        Timeline("", 0)
