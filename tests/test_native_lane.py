"""The native lane: its steady state under mpiexec with the lane off (on, it runs in
tests/test_conformance_mpi.py), and its build and status without processes."""
import os

import pytest
from mpi_launch import run_pytest_under_mpi

from ripples.ops import native_build, native_lane


def test_status_names_the_state(monkeypatch):
    monkeypatch.setenv(native_lane.ENV, "0")
    assert native_lane.status().startswith("off")
    monkeypatch.setenv(native_lane.ENV, "1")
    text = native_lane.status()
    assert text.startswith("on") or text.startswith("unavailable"), text


def test_builds_where_mpicc_is_found():
    if native_build.find_mpicc() is None:
        pytest.skip("no mpicc here: the Python path runs every collective")
    path = native_build.build()
    assert path.is_file() and os.path.getsize(path) > 0
    assert native_build.library() is not None


def test_eligible_wire_texts():
    good = "allreduce|allreduce:float32:Average:1.0:1.0:cpu|SUM|float32|10|40"
    assert native_lane._eligible_wire(good)
    assert native_lane._eligible_wire(good.replace("float32", "float64"))
    assert not native_lane._eligible_wire(good.replace("Average", "Max"))
    assert not native_lane._eligible_wire(good.replace(":1.0:cpu", ":2.0:cpu"))
    assert not native_lane._eligible_wire(good.replace("float32", "int32"))
    assert not native_lane._eligible_wire("broadcast|float32|10|0")


def test_lane_off_under_mpi():
    # With the lane on, tests/mpi/native_lane.py runs in tests/test_conformance_mpi.py.
    run_pytest_under_mpi("native_lane.py", 2, timeout=240, env={native_lane.ENV: "0"})


def test_without_a_compiler_the_python_path_runs(monkeypatch, tmp_path):
    monkeypatch.setattr(native_build, "find_mpicc", lambda: None)
    monkeypatch.setattr(native_build, "cache_dir", lambda: tmp_path)
    monkeypatch.setattr(native_build, "_library", None)
    monkeypatch.setattr(native_build, "_library_error", None)
    monkeypatch.setenv(native_lane.ENV, "1")
    with pytest.raises(RuntimeError, match="mpicc"):
        native_build.build()
    assert native_build.library() is None
    assert native_lane.status().startswith("unavailable")


def test_a_planned_call_shape_never_runs_a_cuda_tensor(monkeypatch):
    """Plans are keyed by group, name, dtype and shape, not device: a CUDA tensor of a shape
    planned on the host must take the Python path (the native lane reads host memory; on a
    GPU it crashed before this check)."""
    class Untouchable:
        def __getattr__(self, name):
            raise AssertionError(f"the plan was used: {name}")

    class CudaTensor:
        is_cuda = True

    monkeypatch.setitem(native_lane._plans, ("key",), Untouchable())
    assert native_lane.run_planned(("key",), CudaTensor()) is False
