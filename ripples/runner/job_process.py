"""Running the mpiexec of a job: its status as a scheduler should see it.

Ctrl-C is forwarded to mpiexec, which stops the ranks. mpiexec's output and error output
pass through unchanged, watched for Open MPI's ways of ending badly: it ends a job whose
host was lost (killed, powered off) with exit status 0, or with its daemon's status and a
report that the daemon "failed to report back" (on standard output, though the daemon had
run the ranks); and after an ``MPI_Abort`` it may wait for good to reach the processes of a
host cut off from the network, as it does after fault-tolerant survivors finished without
ranks that stopped answering (``FINISHED_WITHOUT``). A launch whose daemon started on a
host but cannot connect back never starts the ranks, and mpiexec waits for it for good: a
start bound stops it.
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
from ripples.core.processes import proc_stat
from ripples.runner.leftovers import PROCTABLE_ENTRY, LocalRanks

EXIT_HOST_LOST = 1
EXIT_ABORT_STUCK = 1
EXIT_NOT_STARTED = 1
EXIT_NOBODY_LEFT = 1
# Open MPI 5 prints the table of started ranks on standard error once all have started.
PROCTABLE_OPTION = "--output-proctable=+"
# How long mpiexec may take to stop every rank after one called MPI_Abort.
ABORT_GRACE_S = 10.0
# How long ranks of this host may take to exit once mpiexec has ended (freeing a large
# process's memory takes a moment) before they are killed as left behind.
LEFTOVER_GRACE_S = 2.0


def run_job(argv: List[str], env: Dict[str, str], start_retries: int = 1,
            start_timeout_s: Optional[float] = None) -> int:
    """Run the job; Ctrl-C is forwarded to mpiexec, which stops the ranks.

    mpiexec's output passes through a ``JobReport``: a job whose host was lost (killed,
    powered off) ends with status ``EXIT_HOST_LOST`` (or mpiexec's own non-zero status)
    and names the host, where Open MPI may exit 0; and after an ``MPI_Abort`` it may wait
    for good to reach the processes of a host that was cut off, so mpiexec is stopped
    ``ABORT_GRACE_S`` after an abort. A launch that Open MPI's runtime failed before any
    rank ran (its listener thread or a remote daemon did not start) is made again,
    ``start_retries`` times at most.

    With ``start_timeout_s`` (Open MPI 5's mpiexec only: ``PROCTABLE_OPTION`` is added to
    ``argv``), a job whose ranks have not all started within that many seconds is stopped
    with status ``EXIT_NOT_STARTED``: Open MPI waits for good for a daemon that started on
    a host but cannot connect back (a firewall, a cut link). It is not started again. The
    same table names the ranks of this host: any still alive once mpiexec has ended are
    killed (``ripples.runner.leftovers``)."""
    if start_timeout_s is not None:
        argv = [argv[0], PROCTABLE_OPTION, *argv[1:]]
    while True:
        code, report = _run_once(argv, env, start_timeout_s)
        left = report.local_ranks.end_leftovers(LEFTOVER_GRACE_S)
        if left:
            why = "on Ctrl-C" if report.interrupted else "(frozen or blocked for good)"
            print(f"ripplesrun: {', '.join(left)} of this host outlived mpiexec by "
                  f"{LEFTOVER_GRACE_S:g} s {why}: killed", file=sys.stderr, flush=True)
        if (code == 0 or not report.start_failed or report.lost or report.interrupted
                or start_retries <= 0):
            return code
        start_retries -= 1
        print("ripplesrun: Open MPI's runtime failed to start the job before any rank ran: "
              "starting it once more", file=sys.stderr, flush=True)
        time.sleep(1.0)


def _run_once(argv: List[str], env: Dict[str, str],
              start_timeout_s: Optional[float]) -> Tuple[int, "JobReport"]:
    """One mpiexec: its status as ``run_job`` reports it, and what its report saw."""
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    report = JobReport(start_timeout_s, launcher=proc.pid)
    copiers = [StreamCopier(proc.stdout, sys.stdout.buffer, report),
               StreamCopier(proc.stderr, sys.stderr.buffer, report, JobReport.PROCTABLE_LINE)]
    for copier in copiers:
        copier.start()
    while True:
        try:
            code = proc.wait(timeout=report.give_up_in())
            break
        except subprocess.TimeoutExpired:
            if report.start_overdue():
                print(f"ripplesrun: error: Open MPI did not start every rank within "
                      f"{start_timeout_s:g} s (--start-timeout): a host's daemon cannot "
                      "connect back to this host (a firewall, a cut link, another network "
                      "interface?) or its launch hangs: stopping the job",
                      file=sys.stderr, flush=True)
                _stop(proc, copiers)
                return EXIT_NOT_STARTED, report
            if not report.overdue():
                continue
            # mpiexec still waits for ranks it cannot reach (a host cut off, a frozen rank)
            # after a rank aborted the job, or after the survivors finished without them.
            if report.survivors_finished:
                print(f"ripplesrun: the survivors finished; mpiexec still waits after "
                      f"{ABORT_GRACE_S:g} s for ranks left behind (frozen or cut off): "
                      "stopping it", file=sys.stderr, flush=True)
            elif report.nobody_left:
                print(f"ripplesrun: error: {report.nobody_left_said()}, and mpiexec still "
                      f"waits after {ABORT_GRACE_S:g} s for them (frozen or cut off): "
                      "stopping it", file=sys.stderr, flush=True)
            else:
                print(f"ripplesrun: error: mpiexec did not end within {ABORT_GRACE_S:g} s of "
                      "MPI_Abort (a host cut off?): stopping it", file=sys.stderr, flush=True)
            _stop(proc, copiers)
            return (0 if report.survivors_finished else
                    EXIT_NOBODY_LEFT if report.nobody_left else EXIT_ABORT_STUCK), report
        except KeyboardInterrupt:
            report.interrupted = True
            proc.send_signal(signal.SIGINT)
    _join(copiers)
    if report.nobody_left:
        code = (128 - code if code < 0 else code) or EXIT_NOBODY_LEFT
        print(f"ripplesrun: error: {report.nobody_left_said()}: exit status {code}",
              file=sys.stderr, flush=True)
        return code, report
    if code != 0 and report.survivors_finished:
        # Ranks that died, raised or were left behind end with an error of their own; fault
        # tolerant, the job's result is the survivors'.
        print(f"ripplesrun: the survivors finished; mpiexec's status {code} comes from the "
              "ranks they went on without: exit status 0", file=sys.stderr, flush=True)
        return 0, report
    # A job killed by a signal reports -SIG; shells report 128 + SIG.
    code = 128 - code if code < 0 else code
    if report.lost:
        code = code or EXIT_HOST_LOST
        print(f"ripplesrun: error: the job was terminated because host(s) "
              f"{', '.join(report.lost)} were lost (Open MPI lost its daemon there: killed, "
              f"down or cut off); exit status {code}", file=sys.stderr, flush=True)
    return code, report


def _stop(proc: subprocess.Popen, copiers: List["StreamCopier"]) -> None:
    """Kill mpiexec and the processes below it (its remote shells too)."""
    for pid in [*_descendants(proc.pid), proc.pid]:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()
    _join(copiers)


def _join(copiers: List["StreamCopier"]) -> None:
    for copier in copiers:
        copier.join(timeout=5)  # a shell left on a lost host may hold a pipe open


def _descendants(pid: int) -> List[int]:
    """The processes below ``pid`` (Linux ``/proc``; empty elsewhere)."""
    children: Dict[int, List[int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        fields = proc_stat(int(entry.name))
        if fields is not None:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        below = children.get(todo.pop(), [])
        found += below
        todo += below
    return found


class JobReport:
    """What mpiexec's output said about how the job ends: the hosts whose daemon Open MPI
    lost (``lost``), whether its runtime failed before any rank ran (``start_failed``),
    whether every rank started (``started``: the table ``PROCTABLE_OPTION`` prints; only
    looked for with a ``start_timeout_s``), when the job should have ended (a rank
    aborted it, the survivors finished, or, fault tolerant, every rank either left the job
    with an uncaught error or was left behind by the survivors: ``nobody_left``), and the
    ranks of this host below the mpiexec whose process id is ``launcher``
    (``local_ranks``)."""

    PROCTABLE_LINE = re.compile(rb"^\(rank, host, exe, pid\) = \([^\n]*\)\n", re.M)

    _LOST = re.compile(rb"lost communication with a remote daemon.*?Remote daemon:\s*\S+ "
                       rb"on node (\S+)", re.S)
    # Open MPI's report on a daemon whose launch shell ended with an error. The daemon may
    # have run for long: a shell killed with its host (status 128 + SIGKILL) is a lost host.
    _DAEMON_ENDED = re.compile(rb"daemon failed to report back.*?Remote host:\s*(\S+)\s*"
                               rb"Daemon exit status:\s*(\d+)", re.S)
    _ABORT = b"MPI_ABORT was invoked"
    # Open MPI's runtime failing before any rank ran (seen under load and on a host just
    # reconnected); a job also fails, so only a rank printing these words would be retried.
    # Open MPI prints the second also for a host cut off after a rank aborted the job.
    _START_FAILED = re.compile(rb"listener thread failed to start|"
                               rb"daemon failed to report back")
    _FINISHED_WITHOUT = f"ripples: {failures.FINISHED_WITHOUT}".encode()
    _LEFT_AS_DEAD = re.compile(
        rf"{failures.LEFT_AS_DEAD} \({failures.LAUNCH_RANK} (\d+);".encode())
    _LEFT_BEHIND = re.compile(rf"{re.escape(failures.LEFT_BEHIND)} \[([\d, ]*)\]".encode())

    def __init__(self, start_timeout_s: Optional[float] = None,
                 launcher: Optional[int] = None):
        self._start_by = (None if start_timeout_s is None
                          else time.monotonic() + start_timeout_s)
        self.started = False
        self.lost: List[str] = []
        self.ending_at: Optional[float] = None
        self.survivors_finished = False
        # Fault tolerant, by ranks of the launch: those started, those that left the job
        # with an uncaught error, and those the survivors left behind (silent)
        self.launched: set = set()
        self.left_as_dead: set = set()
        self.left_behind: set = set()
        self.nobody_left = False  # every rank did one or the other: nobody can finish
        self.interrupted = False  # Ctrl-C was forwarded to mpiexec
        self._start_failure_said = False
        self.local_ranks = LocalRanks(launcher)
        self._lock = threading.Lock()

    @property
    def start_failed(self) -> bool:
        """Whether Open MPI said its runtime failed, and no rank is known to have run: none
        aborted the job and no survivors finished (a rank that ran may have trained and
        written checkpoints, so such a job is never started again)."""
        return self._start_failure_said and self.ending_at is None

    def give_up_in(self) -> float:
        """How long to wait for mpiexec before looking at ``overdue`` again."""
        if self.ending_at is None:
            return 1.0 if self._start_by is None or self.started else 0.25
        return max(0.05, self.ending_at + ABORT_GRACE_S - time.monotonic())

    def start_overdue(self) -> bool:
        """Whether the ranks should all have started by now (and no rank is known to have
        run: one that aborted the job, or survivors that finished, show it started)."""
        return (self._start_by is not None and not self.started and self.ending_at is None
                and time.monotonic() >= self._start_by)

    def overdue(self) -> bool:
        """Whether the job should have ended over ``ABORT_GRACE_S`` ago."""
        return (self.ending_at is not None
                and time.monotonic() >= self.ending_at + ABORT_GRACE_S)

    def read(self, recent: bytes) -> None:
        """Take in the latest output of one stream (enough to hold one whole report). Each
        stream's copier calls it from its own thread."""
        with self._lock:
            self._read(recent)

    def _read(self, recent: bytes) -> None:
        if self.ending_at is None and self._ABORT in recent:
            self.ending_at = time.monotonic()
        if self.ending_at is None and self._FINISHED_WITHOUT in recent:
            self.ending_at = time.monotonic()
            self.survivors_finished = True
        if self.PROCTABLE_LINE.search(recent):
            self.started = True
            self.local_ranks.read(recent)
            self.launched.update(int(m.group(1)) for m in PROCTABLE_ENTRY.finditer(recent))
        self._read_departures(recent)
        if not self._start_failure_said and self._START_FAILED.search(recent):
            self._start_failure_said = True
        hosts = [match.group(1) for match in self._LOST.finditer(recent)]
        hosts += [match.group(1) for match in self._DAEMON_ENDED.finditer(recent)
                  if int(match.group(2)) > 128]
        for host in hosts:
            name = host.decode(errors="replace")
            if name not in self.lost:
                self.lost.append(name)

    def _read_departures(self, recent: bytes) -> None:
        """Fault tolerant: the job should end once every rank either left with an error or
        was left behind by the survivors, as mpiexec waits for the silent ones for good."""
        self.left_as_dead.update(int(m.group(1)) for m in self._LEFT_AS_DEAD.finditer(recent))
        for match in self._LEFT_BEHIND.finditer(recent):
            self.left_behind.update(int(r) for r in match.group(1).split(b",") if r.strip())
        if (self.ending_at is None and self.left_as_dead and self.left_behind
                and self.launched and self.launched <= self.left_as_dead | self.left_behind):
            self.ending_at = time.monotonic()
            self.nobody_left = True

    def nobody_left_said(self) -> str:
        """What ``nobody_left`` means for this job, naming the ranks of the launch."""
        gone = sorted(self.left_as_dead - self.left_behind)
        return (f"every rank the survivors could reach left the job with an uncaught error "
                f"(launch rank(s) {gone}); rank(s) {sorted(self.left_behind)} were left "
                "behind")


class StreamCopier(threading.Thread):
    """Copies one of mpiexec's output streams unchanged to ``sink`` as it comes (a progress
    bar's carriage returns included), but for whole lines matching ``hidden`` (the launcher's
    own bookkeeping), and lets ``report`` read all of it. A sink that was closed (a pipe
    into ``head``) is no longer written, but the stream is still drained: mpiexec must not
    block on a full pipe."""

    def __init__(self, source, sink, report: JobReport,
                 hidden: Optional["re.Pattern[bytes]"] = None):
        super().__init__(name="ripplesrun-output", daemon=True)
        self._source, self._sink, self._report = source, sink, report
        self._hidden = hidden

    def run(self) -> None:
        recent = b""  # enough of the latest output to hold one report split across reads
        sink = self._sink
        while True:
            chunk = os.read(self._source.fileno(), 65536)
            if not chunk:
                break
            shown = chunk if self._hidden is None else self._hidden.sub(b"", chunk)
            if sink is not None and shown:
                try:
                    sink.write(shown)
                    sink.flush()
                except OSError:
                    sink = None
            # A report split across reads is whole in the window; a read longer than what
            # is kept is read in full (several ranks' tracebacks can come in one).
            window = recent + chunk
            self._report.read(window)
            recent = window[-8192:]
