"""Processes as /proc shows them: running, stopped, gone, or another machine's."""
import signal
import subprocess
import sys
import time

import pytest

from ripples.core.processes import (ProcessId, Sample, condition, has_run, sample,
                                     start_ticks, this_process)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs /proc")

SPIN = "while True: pass"


def _started(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code])


def _named(child: subprocess.Popen) -> ProcessId:
    end = time.monotonic() + 10
    while start_ticks(child.pid) is None and time.monotonic() < end:
        time.sleep(0.01)
    return this_process()._replace(pid=child.pid, start=start_ticks(child.pid))


def _after_a_while(process: ProcessId, seconds: float = 0.3) -> bool:
    before = sample(process)
    time.sleep(seconds)
    return has_run(before, sample(process))


def test_a_computing_process_runs_and_a_sleeping_one_does_not():
    spinning = _started(SPIN)
    sleeping = subprocess.Popen([sys.executable, "-c", "import time; print(flush=True); "
                                 "time.sleep(60)"], stdout=subprocess.PIPE)
    try:
        spin, nap = _named(spinning), _named(sleeping)
        sleeping.stdout.readline()  # its start-up is over: it sleeps from here on
        assert _after_a_while(spin)
        assert not _after_a_while(nap)
        assert sample(nap) is not None and not sample(nap).ready  # it can run: it sleeps
    finally:
        spinning.kill(), sleeping.kill()
        spinning.wait(), sleeping.wait()


def test_a_stopped_process_cannot_run_and_a_continued_one_can():
    child = _started(SPIN)
    try:
        process = _named(child)
        child.send_signal(signal.SIGSTOP)
        end = time.monotonic() + 5
        while sample(process) is not None and time.monotonic() < end:
            time.sleep(0.01)
        assert sample(process) is None
        assert not has_run(Sample(0, True), sample(process))
        child.send_signal(signal.SIGCONT)
        assert _after_a_while(process)
    finally:
        child.kill()
        child.wait()


def test_a_gone_process_a_reused_id_and_another_host_are_not_found():
    child = _started(SPIN)
    process = _named(child)
    assert sample(process) is not None
    assert sample(process._replace(start=process.start - 1)) is None  # another process
    assert sample(process._replace(host=process.host + "-elsewhere")) is None
    assert sample(process._replace(namespace="pid:[another container]")) is None
    assert sample(process._replace(start=None)) is None
    child.kill()
    child.wait()
    assert sample(process) is None and start_ticks(child.pid) is None


def test_this_process_is_named_by_its_start():
    me = this_process()
    assert me.start == start_ticks(me.pid) and sample(me).ticks > 0 and sample(me).ready


def test_the_condition_says_what_a_process_does_in_words():
    child = _started(SPIN)
    try:
        process = _named(child)
        assert _after_a_while(process) and condition(process) in ("running", "alive, not running")
        child.send_signal(signal.SIGSTOP)
        end = time.monotonic() + 5
        while condition(process) != "stopped by SIGSTOP or a tracer" and time.monotonic() < end:
            time.sleep(0.01)
        assert condition(process) == "stopped by SIGSTOP or a tracer"
        assert condition(process._replace(host=process.host + "-elsewhere")) is None
    finally:
        child.kill()
        child.wait()
    assert condition(process) == "gone"
