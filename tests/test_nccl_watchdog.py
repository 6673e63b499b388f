"""The NCCL watchdog's logic, with a fake clock and fake CUDA events (no GPU needed)."""
import threading

import pytest

from ripples.comm.nccl_watchdog import NcclWatchdog
from ripples.core.errors import RipplesTimeoutError


class Event:
    def __init__(self, complete=False):
        self.complete = complete

    def query(self):
        return self.complete


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def watchdog(timeout_s=5.0):
    clock = Clock()
    return NcclWatchdog(timeout_s, clock=clock, start_thread=False), clock


def test_completed_work_is_forgotten_and_nothing_is_aborted():
    dog, clock = watchdog()
    aborted = []
    dog.track("allreduce", "comm", "group (0, 1)", Event(True), Event(True),
              lambda: aborted.append(1))
    clock.now += 60
    dog.check()
    assert dog.pending == [] and aborted == []
    dog.raise_if_failed("comm")  # nothing recorded


def test_a_gpu_busy_before_the_operation_is_slow_not_dead():
    dog, clock = watchdog(timeout_s=5.0)
    began, done, aborted = Event(), Event(), []
    dog.track("allreduce", "comm", "group (0, 1)", began, done, lambda: aborted.append(1))
    for _ in range(10):  # 50 s of compute queued ahead of it on the stream
        clock.now += 5
        dog.check()
    began.complete = True
    dog.check()  # its clock starts now
    clock.now += 4.9
    dog.check()
    assert aborted == [] and len(dog.pending) == 1
    done.complete = True
    clock.now += 1
    dog.check()
    assert aborted == [] and dog.pending == []


def test_an_operation_past_its_deadline_aborts_its_communicator_once_and_names_it():
    dog, clock = watchdog(timeout_s=5.0)
    aborted = []
    a, b = object(), object()  # two communicators
    dog.track("allreduce", a, "group (0, 2)", Event(True), Event(), lambda: aborted.append("a"))
    dog.track("broadcast", a, "group (0, 2)", Event(), Event(), lambda: aborted.append("a2"))
    other_done = Event()
    dog.track("allreduce", b, "group (1, 3)", Event(True), other_done,
              lambda: aborted.append("b"))
    dog.check()
    clock.now += 3
    dog.check()
    assert aborted == []
    clock.now += 2.5  # 5.5 s since both started
    other_done.complete = True  # the other group finished meanwhile
    dog.check()
    assert aborted == ["a"]  # one abort for the group; its later operation is dropped
    assert dog.pending == []
    with pytest.raises(RipplesTimeoutError, match=r"NCCL allreduce on group \(0, 2\).*5\.0 s"):
        dog.raise_if_failed(a)
    with pytest.raises(RipplesTimeoutError):  # stays failed: the communicator is gone
        dog.raise_if_failed(a)
    dog.raise_if_failed(b)
    # Closed, then built again for the same group: the new communicator starts clean.
    dog.forget(a)
    dog.raise_if_failed(a)
    dog.track("allreduce", object(), "group (0, 2)", Event(True), Event(True), lambda: None)
    dog.check()
    assert dog.failures == {}


def test_the_thread_aborts_on_its_own_and_closes():
    dog = NcclWatchdog(0.2, poll_s=0.01)
    aborted = threading.Event()
    dog.track("allgather", "comm", "world", Event(True), Event(), aborted.set)
    assert aborted.wait(5.0)
    with pytest.raises(RipplesTimeoutError, match="allgather on world"):
        dog.raise_if_failed("comm")
    dog.close()
    assert dog._thread is None


def test_the_timeout_must_be_positive():
    with pytest.raises(ValueError, match="timeout_s"):
        NcclWatchdog(0)


def test_a_stream_of_short_operations_does_not_wake_the_thread_for_each():
    """Operations that finish before the next pass leave nothing pending; the next one must
    not wake the thread at once (each wake takes the GIL from the caller): passes happen
    poll_s apart, not once per operation (which made 100 passes here)."""
    import time

    poll_s = 0.2
    dog = NcclWatchdog(30.0, poll_s=poll_s)
    passes = []
    check = dog.check
    dog.check = lambda: (passes.append(1), check())
    try:
        began = time.monotonic()
        for _ in range(100):  # the caller releases the GIL between operations
            dog.track("allreduce", "comm", "world", Event(True), Event(True), lambda: None)
            time.sleep(0.001)
        time.sleep(poll_s + 0.1)
        elapsed = time.monotonic() - began
        assert dog.pending == []  # the thread did look
        assert 1 <= len(passes) <= elapsed / poll_s + 2, (len(passes), elapsed)
    finally:
        dog.close()


def test_a_completed_operations_events_are_handed_out_again_and_pending_ones_are_not():
    dog, clock = watchdog()
    running, finished = (Event(True), Event()), (Event(True), Event(True))
    dog.track("allreduce", "comm", "world", *running, lambda: None)
    dog.track("allreduce", "comm", "world", *finished, lambda: None)
    assert dog.reusable_events("comm") is None  # its oldest is still running
    dog.check()  # a pass puts the finished one's events on the free list
    assert dog.reusable_events("other comm") is None  # events stay with their owner
    assert dog.reusable_events("comm") == finished
    assert dog.reusable_events("comm") is None  # the other is still running
    running[1].complete = True
    dog.check()
    dog.forget("comm")  # a closed communicator's events go with it
    assert dog.reusable_events("comm") is None


def test_at_most_max_free_events_pairs_are_kept_per_communicator():
    dog, _ = watchdog()
    for _ in range(NcclWatchdog.MAX_FREE_EVENTS + 5):
        dog.track("allreduce", "comm", "world", Event(True), Event(True), lambda: None)
    dog.check()
    kept = []
    while (pair := dog.reusable_events("comm")) is not None:
        kept.append(pair)
    assert len(kept) == NcclWatchdog.MAX_FREE_EVENTS


def test_an_aborted_operations_events_are_not_handed_out():
    dog, clock = watchdog(timeout_s=5.0)
    dog.track("allreduce", "comm", "world", Event(True), Event(), lambda: None)
    dog.check()
    clock.now += 6
    dog.check()
    assert dog.reusable_events("comm") is None


def test_a_caller_that_outruns_the_passes_takes_back_its_oldest_finished_operation():
    """A caller waiting for each result issues many operations between two passes: each
    ``track`` takes its communicator's oldest operation out of pending once it is done,
    so that the next call reuses its events."""
    dog, _ = watchdog()
    first = (Event(True), Event(True))
    dog.track("allreduce", "other comm", "world", Event(True), Event(), lambda: None)
    dog.track("allreduce", "comm", "world", *first, lambda: None)
    assert dog.reusable_events("comm") is None  # nothing taken back yet
    second = (Event(True), Event())
    dog.track("allreduce", "comm", "world", *second, lambda: None)
    assert dog.reusable_events("comm") == first
    assert [op.owner for op in dog.pending] == ["other comm", "comm"]
    dog.track("allreduce", "comm", "world", Event(True), Event(), lambda: None)
    assert dog.reusable_events("comm") is None  # its oldest (second) is still running
    assert len(dog.pending) == 3


def test_operations_taken_back_by_the_caller_do_not_wake_the_thread_for_each():
    """A caller that waits for each result takes its finished operation back before the next
    (pending is empty again each time): tracking must still not wake the thread once per
    operation (each wake takes the GIL from the caller), only from its untimed wait."""
    import time

    poll_s = 0.2
    dog = NcclWatchdog(30.0, poll_s=poll_s)
    wakes = []
    notify = dog._cond.notify
    dog._cond.notify = lambda *a: (wakes.append(1), notify(*a))
    try:
        began = time.monotonic()
        for _ in range(100):
            pair = dog.reusable_events("comm") or (Event(True), Event(True))
            dog.track("allreduce", "comm", "world", *pair, lambda: None)
            time.sleep(0.001)
        elapsed = time.monotonic() - began
        assert len(wakes) <= elapsed / poll_s + 2, (len(wakes), elapsed)
        assert len(dog.pending) == 1  # the last one, not yet taken back
    finally:
        dog.close()
