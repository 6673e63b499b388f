"""Running the mpiexec of a job: its status as a scheduler should see it.

Ctrl-C is forwarded to mpiexec, which stops the ranks. mpiexec's error output passes
through unchanged, watched for two of Open MPI's ways of ending badly: it ends a job whose
host was lost (killed, powered off) with exit status 0, and after an ``MPI_Abort`` it may
wait for good to reach the processes of a host cut off from the network, as it does after
fault-tolerant survivors finished without ranks that stopped answering (``FINISHED_WITHOUT``).
"""
from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from ripples.comm import failures

EXIT_HOST_LOST = 1
EXIT_ABORT_STUCK = 1
# How long mpiexec may take to stop every rank after one called MPI_Abort.
ABORT_GRACE_S = 10.0


def run_job(argv: List[str], env: Dict[str, str], start_retries: int = 1) -> int:
    """Run the job; Ctrl-C is forwarded to mpiexec, which stops the ranks.

    mpiexec's error output passes through a watcher (``LostHostWatcher``): Open MPI ends a
    job whose host was lost (killed, powered off) with exit status 0, which would tell a
    scheduler the job succeeded; and after an ``MPI_Abort`` it may wait for good to reach
    the processes of a host that was cut off, so mpiexec is stopped ``ABORT_GRACE_S``
    after an abort. A launch that Open MPI's runtime failed before any rank ran (its
    listener thread or a remote daemon did not start) is made again, ``start_retries``
    times at most."""
    while True:
        code, watcher = _run_once(argv, env)
        if code == 0 or not watcher.start_failed or start_retries <= 0:
            return code
        start_retries -= 1
        print("ripplesrun: Open MPI's runtime failed to start the job before any rank ran: "
              "starting it once more", file=sys.stderr, flush=True)
        time.sleep(1.0)


def _run_once(argv: List[str], env: Dict[str, str]) -> Tuple[int, "LostHostWatcher"]:
    """One mpiexec: its status as ``run_job`` reports it, and what its watcher saw."""
    proc = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE)
    watcher = LostHostWatcher(proc.stderr, sys.stderr.buffer)
    watcher.start()
    while True:
        try:
            code = proc.wait(timeout=watcher.give_up_in())
            break
        except subprocess.TimeoutExpired:
            if not watcher.overdue():
                continue
            # mpiexec still waits for ranks it cannot reach (a host cut off, a frozen rank)
            # after a rank aborted the job, or after the survivors finished without them.
            if watcher.survivors_finished:
                print(f"ripplesrun: the survivors finished; mpiexec still waits after "
                      f"{ABORT_GRACE_S:g} s for ranks left behind (frozen or cut off): "
                      "stopping it", file=sys.stderr, flush=True)
            else:
                print(f"ripplesrun: error: mpiexec did not end within {ABORT_GRACE_S:g} s of "
                      "MPI_Abort (a host cut off?): stopping it", file=sys.stderr, flush=True)
            for pid in [*_descendants(proc.pid), proc.pid]:  # its remote shells too
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            code = proc.wait()
            watcher.join(timeout=5)
            return (0 if watcher.survivors_finished else EXIT_ABORT_STUCK), watcher
        except KeyboardInterrupt:
            proc.send_signal(signal.SIGINT)
    watcher.join(timeout=5)  # a shell left on a lost host may hold the pipe open
    if code != 0 and watcher.survivors_finished:
        # Ranks left behind stop with an error of their own; the job's result is the survivors'.
        print(f"ripplesrun: the survivors finished; mpiexec's status {code} comes from the "
              "ranks left behind: exit status 0", file=sys.stderr, flush=True)
        return 0, watcher
    if code == 0 and watcher.lost:
        print(f"ripplesrun: error: the job was terminated because host(s) "
              f"{', '.join(watcher.lost)} were lost (Open MPI lost its daemon there: killed, "
              f"down or cut off); exit status {EXIT_HOST_LOST}", file=sys.stderr, flush=True)
        return EXIT_HOST_LOST, watcher
    # A job killed by a signal reports -SIG; shells report 128 + SIG.
    return (128 - code if code < 0 else code), watcher


def _descendants(pid: int) -> List[int]:
    """The processes below ``pid`` (Linux ``/proc``; empty elsewhere)."""
    children: Dict[int, List[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        below = children.get(todo.pop(), [])
        found += below
        todo += below
    return found


class LostHostWatcher(threading.Thread):
    """Copies mpiexec's error output unchanged to ``sink`` as it comes (a progress bar's
    carriage returns included) and collects the hosts whose daemon Open MPI reports lost
    (``lost``)."""

    _LOST = re.compile(rb"lost communication with a remote daemon.*?Remote daemon:\s*\S+ "
                       rb"on node (\S+)", re.S)

    _ABORT = b"MPI_ABORT was invoked"
    # Open MPI's runtime failing before any rank ran (seen under load and on a host just
    # reconnected); a job also fails, so only a rank printing these words would be retried.
    _START_FAILED = re.compile(rb"listener thread failed to start|"
                               rb"daemon failed to report back")
    _FINISHED_WITHOUT = f"ripples: {failures.FINISHED_WITHOUT}".encode()

    def __init__(self, source, sink):
        super().__init__(name="ripplesrun-stderr", daemon=True)
        self._source, self._sink = source, sink
        self.lost: List[str] = []
        # When the job should have ended: a rank aborted it, or the survivors finished.
        self.ending_at: Optional[float] = None
        self.survivors_finished = False
        self.start_failed = False  # Open MPI's runtime failed before any rank ran

    def give_up_in(self) -> float:
        """How long to wait for mpiexec before looking at ``overdue`` again."""
        if self.ending_at is None:
            return 1.0
        return max(0.05, self.ending_at + ABORT_GRACE_S - time.monotonic())

    def overdue(self) -> bool:
        """Whether the job should have ended over ``ABORT_GRACE_S`` ago."""
        return (self.ending_at is not None
                and time.monotonic() >= self.ending_at + ABORT_GRACE_S)

    def run(self) -> None:
        recent = b""  # enough of the latest output to hold one report split across reads
        while True:
            chunk = os.read(self._source.fileno(), 65536)
            if not chunk:
                break
            self._sink.write(chunk)
            self._sink.flush()
            recent = (recent + chunk)[-8192:]
            if self.ending_at is None and self._ABORT in recent:
                self.ending_at = time.monotonic()
            if not self.start_failed and self._START_FAILED.search(recent):
                self.start_failed = True
            if self.ending_at is None and self._FINISHED_WITHOUT in recent:
                self.ending_at = time.monotonic()
                self.survivors_finished = True
            for match in self._LOST.finditer(recent):
                host = match.group(1).decode(errors="replace")
                if host not in self.lost:
                    self.lost.append(host)
