"""Chrome-trace timeline: file layout, event structure, null timeline, merging (one process;
the gather over ranks is in test_timeline_mpi.py)."""
import json
import os
import threading
import time

import pytest

from ripples.core.config import Config
from ripples.runner.launch import build_command, parse_args
from ripples.observe.timeline import (NullTimeline, Timeline, make_timeline, merge_timelines,
                              per_rank_path, rank_files)


def test_per_rank_path():
    assert per_rank_path("/a/trace.json", 3) == "/a/trace.rank3.json"
    assert per_rank_path("/a/trace", 0) == "/a/trace.rank0"
    assert per_rank_path("t.x.json", 12) == "t.x.rank12.json"


def test_rank_files_in_rank_order(tmp_path):
    for rank in (10, 0, 2):
        Timeline(str(tmp_path / "t.json"), rank).flush()
    (tmp_path / "t.rankx.json").write_text("[]")
    (tmp_path / "other.rank1.json").write_text("[]")
    assert rank_files(str(tmp_path / "t.json")) == [
        str(tmp_path / f"t.rank{r}.json") for r in (0, 2, 10)]
    assert rank_files(str(tmp_path / "none.json")) == []


def test_alone_close_writes_exactly_the_path(tmp_path):
    tl = Timeline(str(tmp_path / "trace.json"), rank=0)
    tl.complete("step", "compute", tl.now(), 0.001)
    assert tl.close() == str(tmp_path / "trace.json")
    assert os.listdir(tmp_path) == ["trace.json"]
    assert [e["name"] for e in json.load(open(tmp_path / "trace.json"))][-1] == "step"


def test_per_rank_close_and_flush_write_the_rank_file(tmp_path):
    tl = Timeline(str(tmp_path / "trace.json"), rank=3)
    assert tl.rank_path == str(tmp_path / "trace.rank3.json")
    assert tl.close(per_rank=True) == tl.rank_path
    assert os.listdir(tmp_path) == ["trace.rank3.json"]


def test_file_loads_and_has_chrome_trace_structure(tmp_path):
    tl = Timeline(str(tmp_path / "trace.json"), rank=2)
    before_us = time.time() * 1e6
    with tl.span("allreduce", "collective", bytes=1024):
        time.sleep(0.002)
    start = tl.now()
    tl.complete("step", "compute", start, 0.5, {"step": 7})
    tl.close()

    assert tl.path == str(tmp_path / "trace.json")
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


def test_recording_from_many_threads_while_writing(tmp_path):
    tl = Timeline(str(tmp_path / "t.json"), rank=0)

    together = threading.Barrier(3)  # alive at once: a finished thread's ident is reused

    def record():
        together.wait()
        for _ in range(2000):
            tl.complete("bg", "test", tl.now(), 0.0)
        together.wait()

    workers = [threading.Thread(target=record) for _ in range(3)]
    for worker in workers:
        worker.start()
    while any(worker.is_alive() for worker in workers):
        tl.flush()  # every write is a complete array, whatever the threads do
        assert json.load(open(tl.rank_path))[0]["name"] == "process_name"
    for worker in workers:
        worker.join()
    spans = [e for e in tl.events() if e["ph"] == "X"]
    assert len(spans) == 6000 and len({e["tid"] for e in spans}) == 3


def test_cycles_are_marked_only_when_asked(tmp_path):
    quiet, marked = Timeline(str(tmp_path / "a.json"), 0), make_timeline(
        str(tmp_path / "b.json"), 1, mark_cycles=True)
    for tl in (quiet, marked):
        tl.mark_cycle()
    assert [e for e in quiet.events() if e["ph"] == "i"] == []
    (cycle,) = [e for e in marked.events() if e["ph"] == "i"]
    assert cycle["name"] == "cycle" and cycle["pid"] == 1 and cycle["s"] == "p"


def test_null_timeline_has_the_same_api_and_writes_nothing(tmp_path):
    tl = make_timeline("", rank=1)
    assert isinstance(tl, NullTimeline) and not tl.enabled
    with tl.span("x", "y", a=1):
        pass
    tl.complete("x", "y", tl.now(), 1.0, {})
    tl.mark_cycle()
    tl.flush()
    tl.close()
    assert tl.events() == []
    assert list(tmp_path.iterdir()) == []
    public = {n for n in dir(Timeline) if not n.startswith("_")}
    assert public <= {n for n in dir(NullTimeline) if not n.startswith("_")}
    assert isinstance(make_timeline(str(tmp_path / "t.json"), 0), Timeline)


def test_merge_per_rank_files(tmp_path):
    for rank in range(3):
        tl = Timeline(str(tmp_path / "t.json"), rank)
        tl.complete("step", "compute", tl.now(), 0.001)
        tl.close(per_rank=True)
    count = merge_timelines(rank_files(str(tmp_path / "t.json")), str(tmp_path / "t.json"))
    merged = json.load(open(tmp_path / "t.json"))
    assert count == len(merged)
    assert sorted(e["pid"] for e in merged if e["ph"] == "X") == [0, 1, 2]
    assert {e["args"]["name"] for e in merged if e["name"] == "process_name"} == {
        "rank 0", "rank 1", "rank 2"}
    assert not [p for p in os.listdir(tmp_path) if ".tmp" in p]


def test_per_rank_setting_from_environment_and_ripplesrun():
    assert Config.load({}).timeline_per_rank is False
    assert Config.load({"RIPPLES_TIMELINE_PER_RANK": "1"}).timeline_per_rank is True
    argv, _ = build_command(parse_args(["-np", "2", "--timeline", "t.json",
                                        "--timeline-per-rank", "python", "x.py"]), 2,
                            environ={}, is_root=False)
    assert "RIPPLES_TIMELINE_PER_RANK=1" in argv and "RIPPLES_TIMELINE=t.json" in argv
    argv, _ = build_command(parse_args(["-np", "2", "--timeline", "t.json", "python", "x.py"]),
                            2, environ={}, is_root=False)
    assert not [a for a in argv if a.startswith("RIPPLES_TIMELINE_PER_RANK")]


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="rank"):
        Timeline(str(tmp_path / "t.json"), -1)
    with pytest.raises(ValueError, match="path"):
        Timeline("", 0)
