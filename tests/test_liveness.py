"""The liveness verdict (a pure function) and the slow-is-not-dead behaviour under mpiexec.

``RIPPLES_LONG_LIVENESS=1`` adds the full-size runs: ``timeout_s=30``, a rank 10x slower
finishing 3 minutes after the others, and a killed rank named within 30 s.
"""
import os
import re
import sys

import pytest
import torch
from mpi_launch import TESTS_DIR, run_mpi, run_pytest_under_mpi

from ripples.comm.liveness import NEVER, OUTSIDE, PeerState, assess, grace_s
from ripples.core.processes import ProcessId

T = 10.0
LIMIT = T + grace_s(T)


def test_a_peer_that_does_not_answer_is_dead():
    verdict = assess({1: PeerState(OUTSIDE, NEVER), 3: None}, T)
    assert not verdict.wait and verdict.dead == [3]


def test_a_busy_peer_keeps_the_wait_going_and_justifies_it():
    verdict = assess({1: PeerState(OUTSIDE, NEVER), 2: PeerState(500.0, NEVER)}, T)
    assert verdict.wait and verdict.justified and verdict.busy == [1]


def test_a_peer_waiting_on_a_busy_one_justifies_a_chain():
    verdict = assess({2: PeerState(500.0, 0.5 * T)}, T)
    assert verdict.wait and verdict.justified


def test_a_young_unjustified_wait_is_given_time_but_justifies_nothing():
    verdict = assess({2: PeerState(T + 0.5, NEVER)}, T)
    assert verdict.wait and not verdict.justified


def test_old_unjustified_waits_are_hung():
    verdict = assess({2: PeerState(LIMIT + 1, NEVER), 4: PeerState(LIMIT + 5, LIMIT + 1)}, T)
    assert not verdict.wait and verdict.hung == [2, 4] and not verdict.dead


def test_a_stale_justification_does_not_count():
    assert not assess({2: PeerState(5 * T, LIMIT + 0.1)}, T).wait


def test_a_busy_peer_still_for_the_stall_bound_is_stuck_and_fails_the_wait():
    states = {1: PeerState(OUTSIDE, NEVER, 299.0, "a.py:3"),
              2: PeerState(OUTSIDE, NEVER, 301.0, "b.py:9")}
    verdict = assess(states, T, stall_shutdown_s=300.0)
    assert not verdict.wait and verdict.stuck == [2] and verdict.busy == [1, 2]
    assert assess(states, T, stall_shutdown_s=0.0).wait  # 0: never stuck
    assert assess(states, T, stall_shutdown_s=400.0).wait


def test_the_watch_sees_a_computing_thread_move_and_a_blocked_one_stay_still():
    import threading
    import time

    from ripples.comm.stack_watch import MainThreadWatch

    watch = MainThreadWatch()
    release = threading.Event()
    samples = []

    def sample_from_another_thread(samples_to_take=20):
        for _ in range(samples_to_take):
            watch.sample()
            time.sleep(0.01)
        samples.append((watch.still_s(), watch.where()))
        release.set()

    sampler = threading.Thread(target=sample_from_another_thread)
    sampler.start()
    release.wait()  # the main thread blocked in one call: still, and named where it waits
    still_s, where = samples[0]
    assert still_s >= 0.1 and "test_liveness.py" in where and "release.wait()" in where, \
        samples
    sampler.join()
    release.clear()
    # A training step spends about two thirds of its samples in backward's native call, at
    # the same position; in a few seconds some sample always lands elsewhere.
    sampler = threading.Thread(target=sample_from_another_thread, args=(300,))
    sampler.start()
    model, batch = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU()), torch.ones(8, 64)
    while not release.is_set():  # computing: the stack moves between samples
        model(batch).sum().backward()
    sampler.join()
    assert samples[1][0] < 1.0, samples


@pytest.mark.parametrize("loop", ["for", "generator"])
def test_the_watch_sees_a_tight_loop_that_calls_no_python_function_move(loop):
    # Such a loop hands over the interpreter lock at one instruction, its back edge or the
    # generator's resumption, so every sample shows the same stack: before, a pure-Python
    # loop longer than stall_shutdown_s was called stuck.
    import threading
    import time

    from ripples.comm.stack_watch import MainThreadWatch

    watch, done, longest = MainThreadWatch(), threading.Event(), []

    def sample_for_two_seconds():
        end = time.monotonic() + 2.0
        while time.monotonic() < end:
            watch.sample()
            longest.append(watch.still_s())
            time.sleep(0.01)
        done.set()

    sampler = threading.Thread(target=sample_for_two_seconds)
    sampler.start()
    total = 0.0
    while not done.is_set():
        if loop == "for":
            for i in range(100_000):
                total += i
        else:
            total += sum(i * 0.5 for i in range(100_000))
    sampler.join()
    assert max(longest) < 0.5, (max(longest), len(longest))


def test_a_frame_of_the_import_machinery_without_an_offset_counts_as_not_moving():
    """``f_lasti`` is None for such frames (seen while a rank imported torch._dynamo): the
    responder used to fail on it and drop the question, so a busy rank looked dead."""
    from types import SimpleNamespace

    from ripples.comm.stack_watch import running_bytecode

    frame = SimpleNamespace(f_code=test_old_unjustified_waits_are_hung.__code__, f_lasti=None)
    assert running_bytecode(frame) is False


def test_a_rank_that_gave_up_is_hung_only_to_waits_that_began_before(monkeypatch):
    from mpi4py import MPI

    from ripples.comm import liveness as module
    from ripples.core.errors import RipplesTimeoutError

    rank = module.Liveness(MPI.COMM_SELF.Dup(), T, T, enabled=False)
    clock = [1000.0]
    monkeypatch.setattr(module.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(rank, "probe", lambda peers: {p: PeerState(LIMIT + 1, NEVER)
                                                      for p in peers})
    rank.enabled, rank._thread = True, object()  # as if its responder ran
    with pytest.raises(RipplesTimeoutError, match="waiting on each other"):
        rank.keep_waiting([5], RipplesTimeoutError("allreduce: rank 5 missing", missing=[5]))
    clock[0] += 0.5  # it left that wait, and computes
    assert rank.state(asker_waited_s=LIMIT).inside_s == float("inf")  # the same cycle asks
    assert rank.state(asker_waited_s=0.2)[:2] == (OUTSIDE, NEVER)  # a new wait asks
    clock[0] += LIMIT
    assert rank.state(asker_waited_s=LIMIT * 2)[:2] == (OUTSIDE, NEVER)
    rank._thread = None
    rank.close()


def test_the_stall_warning_for_a_busy_peer_says_the_wait_goes_on(monkeypatch, caplog):
    """The wait goes on, so its warning must not repeat the timeout's "gave up"."""
    from mpi4py import MPI

    from ripples.comm import liveness as module
    from ripples.core.errors import RipplesTimeoutError

    rank = module.Liveness(MPI.COMM_SELF.Dup(), T, T, enabled=False)
    monkeypatch.setattr(rank, "probe", lambda peers: {p: PeerState(OUTSIDE, NEVER)
                                                      for p in peers})
    rank.enabled, rank._thread = True, object()  # as if its responder ran
    with caplog.at_level("WARNING", logger=module.log.name):
        rank.keep_waiting([5], RipplesTimeoutError(
            "allreduce 'loss': rank 5 missing: gave up after 3.5 s (Config.timeout_s / "
            "RIPPLES_TIMEOUT_S)", missing=[5]))
    warning = caplog.records[-1].getMessage()
    assert "allreduce 'loss': rank 5 missing: not done after 3.5 s;" in warning, warning
    assert "gave up" not in warning and "keeps waiting" in warning
    rank._thread = None
    rank.close()


def test_a_silent_peer_is_named_as_silent_so_fault_tolerance_can_go_on_without_it(monkeypatch):
    from mpi4py import MPI

    from ripples.comm import liveness as module
    from ripples.core.errors import PeersSilentError, RipplesTimeoutError

    rank = module.Liveness(MPI.COMM_SELF.Dup(), T, T, enabled=False)
    monkeypatch.setattr(rank, "probe", lambda peers: {4: PeerState(OUTSIDE, NEVER), 5: None})
    rank.enabled, rank._thread = True, object()  # as if its responder ran
    rank.processes = [ProcessId("h1", 100 + r, None) for r in range(5)] + [
        ProcessId("h2", 105, None)]
    with pytest.raises(PeersSilentError, match=r"rank\(s\) \[5\] \(on h2\)") as raised:
        rank.keep_waiting([4, 5], RipplesTimeoutError("allreduce: missing", missing=[4, 5]))
    assert raised.value.silent == (5,) and raised.value.missing == (4, 5)
    rank._thread = None
    rank.close()


def test_a_data_phase_with_a_silent_member_revokes_under_fault_tolerance_else_aborts():
    from ripples.comm.data_watch import DataPhaseWatch

    events = []
    answers = {1: PeerState(OUTSIDE, NEVER), 2: None}
    for fault_tolerant in (True, False):
        watch = DataPhaseWatch(0, T, T, probe=lambda peers: {p: answers[p] for p in peers},
                               fault_tolerant=fault_tolerant,
                               abort=lambda message: events.append(("abort", message)),
                               revoke=lambda: events.append(("revoke", "")))
        watch.check([0, 1, 2], "allreduce 'x'", waited_s=T + 1)
    assert [kind for kind, _ in events] == ["revoke", "abort"]
    assert "rank(s) [2]" in events[1][1] and "allreduce 'x'" in events[1][1]
    events.clear()
    answers[2] = PeerState(OUTSIDE, NEVER)  # everyone answers: a slow phase is waited for
    DataPhaseWatch(0, T, T, probe=lambda peers: {p: answers[p] for p in peers},
                   fault_tolerant=True, revoke=lambda: events.append("revoke"),
                   abort=lambda message: events.append("abort")).check([1, 2], "x", T + 1)
    assert events == []


def test_slow_is_not_dead_under_mpiexec():
    run_pytest_under_mpi("mpi_liveness.py", 3, timeout=150, env={"RIPPLES_TIMEOUT_S": "2"})


def test_requests_nobody_waits_for_complete_intact_under_mpiexec():
    run_pytest_under_mpi("mpi_outbox.py", 3, timeout=60)


def _slow_rank_run(sync, steps, fast_step_s, timeout_s, limit_s):
    result = run_mpi([sys.executable, str(TESTS_DIR / "mpi" / "slow_rank_training.py"), sync,
                      str(steps), str(fast_step_s)], 3, timeout=limit_s,
                     env={"RIPPLES_TIMEOUT_S": str(timeout_s)})
    done = dict(re.findall(r"DONE rank (\d) after ([\d.]+) s", result.stdout))
    assert sorted(done) == ["0", "1", "2"], result.stdout
    return float(done["2"])


@pytest.mark.parametrize("sync", ["allreduce", "ripples"])
def test_a_rank_ten_times_slower_finishing_many_timeouts_later_fails_nobody(sync):
    # The slow rank's 30 steps take 12 s; the others finish theirs in 1.2 s and wait over 5
    # timeouts.
    assert _slow_rank_run(sync, 30, 0.04, 2, 150) >= 10.8


LONG = os.environ.get("RIPPLES_LONG_LIVENESS") == "1"


def _stuck_peer_run(mode, seconds, timeout_s, stall_shutdown_s, limit_s):
    return run_mpi([sys.executable, str(TESTS_DIR / "mpi" / "stuck_peer.py"), mode,
                    str(seconds)], 4, timeout=limit_s, check=False,
                   env={"RIPPLES_TIMEOUT_S": str(timeout_s),
                        "RIPPLES_STALL_SHUTDOWN_S": str(stall_shutdown_s)})


def _check_stuck_peer_named(result, within_s):
    failed = re.search(r"rank 2 FAILED after ([\d.]+) s: (.*)", result.stdout)
    assert failed, result.stdout
    assert float(failed.group(1)) <= within_s, result.stdout
    assert "rank 3 at stuck_peer.py:" in failed.group(2), failed.group(2)
    assert "comm.Barrier()" in failed.group(2) and "stuck, not slow" in failed.group(2)
    assert result.returncode != 0 and "DONE" not in result.stdout  # the job was ended


def test_a_peer_blocked_outside_ripples_is_named_with_where_it_is_after_the_stall_bound():
    # The member waits in a barrier its partner never reaches: not moving, so stuck.
    _check_stuck_peer_named(_stuck_peer_run("barrier", 0, 2, 4, 120), within_s=12)


def test_a_peer_computing_longer_than_the_stall_bound_is_waited_for():
    result = _stuck_peer_run("computing", 12, 2, 3, 120)
    assert "rank 2 P-Reduced [3.0, 3.0, 3.0, 3.0]" in result.stdout, result.stdout
    assert result.returncode == 0 and result.stdout.count("DONE") == 4, result.stdout
    # the stall warning says where: in torch's backward, called from the script's line
    assert re.search(r"rank 3 at .*stuck_peer\.py:\d+ in <module>", result.stdout), result.stdout


@pytest.mark.skipif(not LONG, reason="full-size run: RIPPLES_LONG_LIVENESS=1")
def test_full_size_stuck_peer_named_within_30_s_and_a_60_s_computation_never_fails():
    _check_stuck_peer_named(_stuck_peer_run("barrier", 0, 5, 15, 120), within_s=30)
    for mode in ("computing", "looping"):
        result = _stuck_peer_run(mode, 60, 5, 15, 200)
        assert result.returncode == 0 and result.stdout.count("DONE") == 4, result.stdout


@pytest.mark.skipif(not LONG, reason="full-size run (about 4 minutes): RIPPLES_LONG_LIVENESS=1")
@pytest.mark.parametrize("sync", ["allreduce", "ripples"])
def test_full_size_slow_rank_three_minutes_behind_with_a_30_s_timeout(sync):
    assert _slow_rank_run(sync, 200, 0.1, 30, 400) >= 180


@pytest.mark.skipif(not LONG, reason="full-size run: RIPPLES_LONG_LIVENESS=1")
def test_full_size_killed_rank_is_named_within_30_s():
    result = run_mpi([sys.executable, str(TESTS_DIR / "mpi" / "rank_dies.py"), "allreduce", "-"],
                     3, timeout=200, env={"RIPPLES_TIMEOUT_S": "30"}, check=False,
                     mpiexec_args=["--enable-recovery"])
    errors = re.findall(r"rank (\d) SURVIVOR-ERROR after ([\d.]+)s: (.*)", result.stdout)
    assert sorted(r for r, _, _ in errors) == ["0", "2"], result.stdout
    for _, seconds, message in errors:
        assert float(seconds) <= 30 and "[1]" in message and "likely died" in message, message


def test_the_stack_is_read_from_the_dump_of_the_main_thread_only():
    from ripples.comm.stack_watch import Place, _parse_thread

    dump = ('Thread 0x00007f0000000002 (most recent call first):\n'
            '  File "/x/worker.py", line 7 in loop\n'
            '\n'
            'Current thread 0x00007f0000000001 (most recent call first):\n'
            '  File "/x/train.py", line 12 in step\n'
            '  File "<frozen importlib._bootstrap>", line ??? in _load\n'
            '  File "/x/train.py", line 30 in <module>\n'
            '\n'
            'Thread 0x00007f0000000003 (most recent call first):\n'
            '  File "/x/other.py", line 1 in run\n')
    assert _parse_thread(dump, 0x7f0000000001) == (
        Place("/x/train.py", 12, "step"), Place("<frozen importlib._bootstrap>", 0, "_load"),
        Place("/x/train.py", 30, "<module>"))
    assert _parse_thread(dump, 0x7f0000000002) == (Place("/x/worker.py", 7, "loop"),)
    assert _parse_thread(dump, 0x1234) == ()


def test_another_thread_reads_the_main_threads_stack_by_name():
    import threading

    from ripples.comm.stack_watch import main_thread_stack

    release, seen = threading.Event(), []

    def look():
        seen.append(main_thread_stack())
        release.set()

    def waiting_in_a_named_function():
        threading.Thread(target=look).start()
        release.wait()

    waiting_in_a_named_function()
    functions = [place.function for place in seen[0]]
    assert "waiting_in_a_named_function" in functions, seen
    assert functions.index("wait") < functions.index("waiting_in_a_named_function")
    assert all(place.filename and place.line > 0 for place in seen[0][:3]), seen
