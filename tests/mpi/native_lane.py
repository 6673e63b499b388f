"""The native lane under mpiexec (2+ ranks): same results as the Python path, few Python
calls in the steady state, and the unusual cases (mismatch, join, busy members) still
handled by the Python control plane. Run with the lane on (the default)."""
import os
import resource
import sys
import time

import pytest
import torch
from mpi4py import MPI

import ripples.torch as hvd
from ripples.core.errors import MismatchError
from ripples.ops import native_lane
from ripples.runtime import current

MAX_PYTHON_CALLS = 10
WARM_UP = 4


def setup_module():
    hvd.init()


def built() -> bool:
    """Whether the lane runs here; where CI sets RIPPLES_TEST_NATIVE_LANE=1 it must."""
    ok = current().config.native_lane and native_lane.library() is not None
    if not ok and os.environ.get("RIPPLES_TEST_NATIVE_LANE") == "1":
        pytest.fail(f"RIPPLES_TEST_NATIVE_LANE=1 but the native lane: {native_lane.status()}")
    return ok


def python_calls(call) -> int:
    """Python function calls made while ``call()`` runs on this thread."""
    count = 0

    def profile(frame, event, arg):
        nonlocal count
        if event == "call":
            count += 1

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return count - 1  # the lambda itself


def expected_mean(numel, dtype):
    n = hvd.size()
    return torch.full((numel,), sum(range(1, n + 1)) / n, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_repeated_allreduce_gives_the_python_result(dtype):
    for _ in range(WARM_UP + 3):
        x = torch.full((9000,), float(hvd.rank() + 1), dtype=dtype)
        hvd.allreduce_(x)
        assert torch.equal(x, expected_mean(9000, dtype))
        y = torch.full((7,), float(hvd.rank() + 1), dtype=dtype)
        hvd.allreduce_(y, op=hvd.Sum, name="summed")
        assert torch.equal(y, torch.full((7,), float(sum(range(1, hvd.size() + 1))),
                                         dtype=dtype))


def test_steady_allreduce_makes_few_python_calls():
    if not built():
        pytest.skip(f"native lane: {native_lane.status()}")
    x = torch.ones(9000)
    for _ in range(WARM_UP):
        hvd.allreduce_(x)
    hvd.barrier()
    calls = python_calls(lambda: hvd.allreduce_(x))
    assert calls <= MAX_PYTHON_CALLS, calls
    assert torch.equal(x, torch.ones(9000))


def test_record_rounds_run_on_a_persistent_collective_where_mpi_has_one():
    """Open MPI 5 and MPI 4 libraries have MPI_Allreduce_init: a lane must use it (its
    schedule is built once instead of in every round)."""
    if not built():
        pytest.skip(f"native lane: {native_lane.status()}")
    x = torch.ones(9000)
    for _ in range(WARM_UP):
        hvd.allreduce_(x)
    lane = current().engine.lanes.get(tuple(range(hvd.size())))
    assert lane is not None and not lane.broken
    has_it = MPI.Get_version() >= (4, 0) or MPI.Get_library_version().startswith(
        ("Open MPI v5", "Open MPI v6"))
    assert native_lane.library().rl_lane_persistent(lane.handle) == int(has_it)


def test_steady_partial_allreduce_makes_few_python_calls():
    if not built():
        pytest.skip(f"native lane: {native_lane.status()}")
    group = (0, 1)
    x = torch.full((9000,), float(hvd.rank()))
    if hvd.rank() in group:
        for _ in range(WARM_UP):
            x.fill_(float(hvd.rank()))
            hvd.partial_allreduce_(x, group)
        x.fill_(float(hvd.rank()))
        calls = python_calls(lambda: hvd.partial_allreduce_(x, group))
        assert calls <= MAX_PYTHON_CALLS, calls
        assert torch.equal(x, torch.full((9000,), 0.5))
    hvd.barrier()


def test_a_shape_mismatch_on_a_planned_call_raises_as_before():
    x = torch.ones(64)
    for _ in range(WARM_UP):
        hvd.allreduce_(x, name="shaped")
    other = torch.ones(64 if hvd.rank() == 0 else 65)
    with pytest.raises(MismatchError, match="shaped"):
        hvd.allreduce_(other, name="shaped")
    hvd.allreduce_(x, name="shaped")  # the plan still serves the members afterwards
    assert torch.equal(x, torch.ones(64))


def test_a_shape_mismatch_of_equal_size_between_two_planned_shapes_raises():
    square, flat = torch.ones(8, 8), torch.ones(4, 16)
    for _ in range(WARM_UP):
        hvd.allreduce_(square, name="reshaped")
    for _ in range(WARM_UP):
        hvd.allreduce_(flat, name="reshaped")
    with pytest.raises(MismatchError, match="reshaped"):
        hvd.allreduce_(square if hvd.rank() == 0 else flat, name="reshaped")
    hvd.allreduce_(flat, name="reshaped")
    assert torch.equal(flat, torch.ones(4, 16))


def test_steady_out_of_place_allreduce_makes_few_python_calls_and_keeps_its_input():
    if not built():
        pytest.skip(f"native lane: {native_lane.status()}")
    loss = torch.full((1,), float(hvd.rank()), dtype=torch.float64)
    for _ in range(WARM_UP):
        hvd.allreduce(loss, name="loss")
    hvd.barrier()
    out = []
    calls = python_calls(lambda: out.append(hvd.allreduce(loss, name="loss")))
    assert calls <= MAX_PYTHON_CALLS, calls
    assert out[0].item() == sum(range(hvd.size())) / hvd.size()
    assert loss.item() == hvd.rank() and out[0].data_ptr() != loss.data_ptr()


def test_a_group_given_as_a_list_is_planned_too():
    if not built():
        pytest.skip(f"native lane: {native_lane.status()}")
    x = torch.full((300,), float(hvd.rank()))
    if hvd.rank() in (0, 1):
        for _ in range(WARM_UP):
            x.fill_(float(hvd.rank()))
            hvd.partial_allreduce_(x, [0, 1])
        x.fill_(float(hvd.rank()))
        calls = python_calls(lambda: hvd.partial_allreduce_(x, [0, 1]))
        assert calls <= MAX_PYTHON_CALLS, calls
        assert torch.equal(x, torch.full((300,), 0.5))
    hvd.barrier()


def test_a_name_mismatch_on_a_planned_call_raises_as_before():
    x = torch.ones(64)
    for _ in range(WARM_UP):
        hvd.allreduce_(x, name="named")
    with pytest.raises(MismatchError):
        hvd.allreduce_(x, name="named" if hvd.rank() == 0 else "renamed")
    hvd.allreduce_(x, name="named")
    assert torch.equal(x, torch.ones(64))


def test_a_member_busy_before_a_planned_call_is_waited_for():
    x = torch.ones(16)
    for _ in range(WARM_UP):
        hvd.allreduce_(x, name="late")
    if hvd.rank() == 1:
        time.sleep(0.5)  # longer than the C wait: Python waits on the same round
    x.fill_(float(hvd.rank() + 1))
    hvd.allreduce_(x, name="late")
    assert torch.equal(x, expected_mean(16, torch.float32))


def test_a_member_waiting_long_for_a_busy_peer_leaves_the_cores_to_it():
    """A member that waits seconds for a slow peer naps between polls: it must not burn a
    core (the lane's wait once yielded the core in a loop for the whole wait: 87% of one)."""
    x = torch.ones(16)
    for _ in range(WARM_UP):
        hvd.allreduce_(x, name="waiting")
    hvd.barrier()
    before, start = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
    if hvd.rank() == 0:
        time.sleep(2.0)
    hvd.allreduce_(x, name="waiting")
    after, wall = resource.getrusage(resource.RUSAGE_SELF), time.monotonic() - start
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if hvd.rank() != 0:
        assert cpu < 0.35 * wall, f"rank {hvd.rank()} used {cpu:.2f} s of CPU in {wall:.2f} s"


def test_lanes_are_bounded_and_a_group_beyond_the_bound_stays_on_the_python_path(monkeypatch):
    """Each lane keeps a communicator of its own: a schedule that keeps forming new groups
    must not arm one per group. With room for one more lane on every rank, rank 2's first
    new group gets a lane and its second does not, on both of its members alike, and both
    still sum right."""
    if not built() or hvd.size() != 3:
        pytest.skip("3 ranks with the native lane")
    lanes = current().engine.lanes
    first, second = (0, 2), (1, 2)
    assert lanes.get(first) is None and lanes.get(second) is None, "groups used before"
    monkeypatch.setattr(native_lane, "_MAX_LANES", lanes.armed() + 1)
    for group in (first, second):
        if hvd.rank() in group:
            for _ in range(WARM_UP):
                x = torch.full((50,), float(hvd.rank() + 1))
                hvd.partial_allreduce_(x, group, op=hvd.Sum)
                assert torch.equal(x, torch.full((50,), float(sum(group) + 2)))
    assert lanes.armed() <= native_lane._MAX_LANES
    if hvd.rank() in first:
        assert lanes.get(first) is not None
    if hvd.rank() in second:
        assert lanes.get(second) is None
    hvd.barrier()


def test_other_collectives_between_planned_calls():
    x = torch.ones(32)
    for step in range(WARM_UP + 2):
        hvd.allreduce_(x, name="between")
        assert hvd.broadcast_object(step, root_rank=0) == step
        y = hvd.allreduce(torch.ones(3), op=hvd.Sum)
        assert torch.equal(y, torch.full((3,), float(hvd.size())))


def test_join_with_a_planned_call():
    x = torch.ones(128)
    for _ in range(WARM_UP):
        hvd.allreduce_(x, name="joined")
    if hvd.rank() == 0:
        x.fill_(3.0)
        hvd.allreduce_(x, name="joined")  # rank(s) > 0 joined: average over rank 0 alone
        assert torch.equal(x, torch.full((128,), 3.0))
    last = hvd.join()
    assert last == 0
    hvd.allreduce_(x, name="joined")  # every rank is back
    current().engine.drain()
