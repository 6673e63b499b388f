"""Chrome-trace timeline of a job (the JSON format of Horovod's timeline).

A job with a timeline (``ripplesrun --timeline PATH``, ``RIPPLES_TIMELINE=PATH``,
``init(timeline=PATH)`` or ``start_timeline(PATH)``) leaves ONE trace at exactly ``PATH``:
a JSON array of events that ``json.load``, ``chrome://tracing`` and Perfetto open directly,
in which every rank is its own process row (``pid`` = rank, labelled ``"rank N"``). Each
rank records its events in memory; when the timeline is closed (at ``shutdown()`` or
``stop_timeline()``) the ranks send them to rank 0, which writes the trace.

That gather is bounded by ``Config.timeout_s``. When it cannot complete (a rank died, or did
not reach the end of its timeline in time), every rank that got there writes its own file
instead: ``PATH`` with ``.rank<N>`` inserted before the extension (``trace.json`` ->
``trace.rank0.json``; see ``per_rank_path``), and rank 0 logs a warning naming the missing
ranks. ``Config.timeline_per_rank`` (``RIPPLES_TIMELINE_PER_RANK=1``,
``ripplesrun --timeline-per-rank``) asks for per-rank files always; ``merge_timelines``
joins per-rank files into one trace afterwards. Every file is written to a temporary name
and renamed, so whatever exists at a trace path is a complete JSON array.

Events are complete events (``"ph": "X"``) with ``ts``/``dur`` in microseconds, plus
optional cycle marks (instant events); ``tid`` is a small per-thread number. Timestamps are
wall-clock microseconds since the epoch, taken from a monotonic clock anchored once per
process, so ranks on one machine line up.

When no timeline is wanted use ``NullTimeline`` (same API, does nothing); ``make_timeline``
picks one.
"""
from __future__ import annotations

import contextlib
import glob
import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Union

__all__ = ["Timeline", "NullTimeline", "make_timeline", "per_rank_path", "rank_files",
           "merge_timelines"]

log = logging.getLogger("ripples")

PathLike = Union[str, "os.PathLike[str]"]

# Tags of the gather at close (other traffic on the same communicator uses other tags).
_TAG_EVENTS = 0x544C
_TAG_RESULT = 0x544D
# Sends whose receiver gave up stay in flight; MPI may still read their buffers, so they
# must outlive the timeline that made them.
_unfinished_sends: List[Any] = []


def per_rank_path(path: PathLike, rank: int) -> str:
    """``path`` with ``.rank<rank>`` inserted before its extension (appended if it has none)."""
    path = Path(path)
    if path.suffix:
        return str(path.with_name(f"{path.stem}.rank{rank}{path.suffix}"))
    return str(path.with_name(f"{path.name}.rank{rank}"))


def rank_files(path: PathLike) -> List[str]:
    """The per-rank files of the trace ``path`` that exist, in rank order."""
    head, tail = per_rank_path(path, 0).rsplit(".rank0", 1)
    found = []
    for candidate in glob.glob(glob.escape(head) + ".rank*" + glob.escape(tail)):
        number = candidate[len(head) + len(".rank"):len(candidate) - len(tail)]
        if number.isdigit():
            found.append((int(number), candidate))
    return [name for _, name in sorted(found)]


def _write_atomically(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    temporary = f"{path}.tmp{os.getpid()}"
    with open(temporary, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(temporary, path)


def _join_arrays(arrays: Iterable[str]) -> str:
    """One JSON array from JSON array texts, without parsing them."""
    inner = [text.strip()[1:-1].strip() for text in arrays]
    return "[" + ",".join(part for part in inner if part) + "]"


class Timeline:
    """Records trace events of one rank; ``close()`` writes the job's trace at ``path``.

    ``span``, ``complete`` and ``mark_cycle`` may be called from any thread. Events stay in
    memory until ``close()`` (or ``flush()``, which writes this rank's own file).
    ``mark_cycles``: ``mark_cycle()`` records an instant event (otherwise it does nothing).
    """

    def __init__(self, path: PathLike, rank: int, mark_cycles: bool = False):
        if not isinstance(rank, int) or rank < 0:
            raise ValueError(f"rank must be an integer >= 0, got {rank!r}")
        if not str(path):
            raise ValueError("path must name a file; use NullTimeline for no timeline")
        self.path = str(path)
        self.rank_path = per_rank_path(path, rank)
        self.rank = rank
        self.mark_cycles = bool(mark_cycles)
        self._lock = threading.Lock()
        self._tids: Dict[int, int] = {}
        self._events: List[Dict[str, Any]] = [
            {"name": "process_name", "ph": "M", "pid": rank, "tid": 0,
             "args": {"name": f"rank {rank}"}},
            {"name": "process_sort_index", "ph": "M", "pid": rank, "tid": 0,
             "args": {"sort_index": rank}},
        ]
        # Anchor the monotonic clock to the epoch once, so durations stay exact and
        # timestamps of different processes are comparable.
        self._epoch_us = time.time() * 1e6 - time.perf_counter() * 1e6
        self.closed = False

    @property
    def enabled(self) -> bool:
        return True

    @staticmethod
    def now() -> float:
        """The clock that ``complete``'s ``start_s`` uses (``time.perf_counter``)."""
        return time.perf_counter()

    def _tid(self) -> int:  # caller holds the lock
        ident = threading.get_ident()
        tid = self._tids.get(ident)
        if tid is None:
            tid = len(self._tids)
            self._tids[ident] = tid
            self._events.append({"name": "thread_name", "ph": "M", "pid": self.rank, "tid": tid,
                                 "args": {"name": threading.current_thread().name}})
        return tid

    def complete(self, name: str, cat: str, start_s: float, dur_s: float,
                 args: Optional[Dict[str, Any]] = None) -> None:
        """Record an event that started at ``start_s`` (a ``Timeline.now()`` value) and lasted
        ``dur_s`` seconds. ``args`` must be JSON-serialisable."""
        event = {"name": name, "cat": cat, "ph": "X",
                 "ts": round(self._epoch_us + start_s * 1e6, 3),
                 "dur": round(max(0.0, dur_s) * 1e6, 3),
                 "pid": self.rank, "args": dict(args or {})}
        with self._lock:
            event["tid"] = self._tid()
            self._events.append(event)

    def mark_cycle(self) -> None:
        """Mark the start of a communication cycle (only with ``mark_cycles``)."""
        if not self.mark_cycles:
            return
        event = {"name": "cycle", "cat": "cycle", "ph": "i", "s": "p",
                 "ts": round(self._epoch_us + time.perf_counter() * 1e6, 3), "pid": self.rank}
        with self._lock:
            event["tid"] = self._tid()
            self._events.append(event)

    @contextlib.contextmanager
    def span(self, name: str, category: str, **args: Any):
        """Record the enclosed block as one event; an exception is noted in its args."""
        start = time.perf_counter()
        try:
            yield
        except BaseException as err:
            args["error"] = type(err).__name__
            raise
        finally:
            self.complete(name, category, start, time.perf_counter() - start, args)

    def events(self) -> List[Dict[str, Any]]:
        """A copy of the events recorded so far (metadata first)."""
        with self._lock:
            return list(self._events)

    def flush(self) -> str:
        """Write this rank's events so far to ``rank_path`` (atomically replaced); returns it."""
        _write_atomically(self.rank_path, json.dumps(self.events()))
        return self.rank_path

    def close(self, comm=None, timeout_s: float = 60.0, per_rank: bool = False,
              generation: int = 0) -> Optional[str]:
        """Write the trace; returns the path this rank wrote, or None (merged by rank 0).

        Without ``comm`` this process is the whole job: its events go to ``path``. With an
        mpi4py communicator ``comm`` (collective over it: every member must close its
        timeline), rank 0 of ``comm`` writes all members' events at ``path``, waiting at most
        ``timeout_s`` for them; if any is missing (or rank 0 does not confirm within
        ``timeout_s``), each rank writes ``rank_path`` instead and rank 0 logs a warning
        naming the missing ranks. ``per_rank``: every rank writes ``rank_path``, with no
        communication. ``generation`` tells consecutive timelines apart on ``comm`` (the same
        number on every rank; a late message of an earlier one is discarded).
        """
        self.closed = True
        if per_rank:
            return self.flush()
        if comm is None or comm.Get_size() == 1:
            _write_atomically(self.path, json.dumps(self.events()))
            return self.path
        if self._gather(comm, timeout_s, generation):
            return self.path if comm.Get_rank() == 0 else None
        return self.flush()

    def _gather(self, comm, timeout_s: float, generation: int) -> bool:
        """Send events to rank 0 of ``comm``, which writes the merged trace; whether it did."""
        from ripples.comm.mpi import Deadline

        text = json.dumps(self.events())
        if comm.Get_rank() != 0:
            _unfinished_sends.append(comm.isend((generation, text), dest=0, tag=_TAG_EVENTS))
            results = _receive(comm, {0}, _TAG_RESULT, generation,
                               Deadline(timeout_s, timeout_s, lambda: "timeline"))
            _prune_sends()
            if 0 not in results:  # otherwise rank 0 says what went wrong
                log.warning("timeline: rank 0 did not confirm the merged trace %s within %g s; "
                            "this rank writes %s instead", self.path, timeout_s, self.rank_path)
            return results.get(0) is True
        texts = _receive(comm, set(range(1, comm.Get_size())), _TAG_EVENTS, generation,
                         Deadline(timeout_s, timeout_s, lambda: "timeline"))
        missing = sorted(set(range(1, comm.Get_size())) - set(texts))
        merged = False
        if missing:
            log.warning("timeline: ranks %s did not send their events within %g s; instead "
                        "of %s each rank writes its own file (%s, ...; join them with "
                        "ripples.observe.timeline.merge_timelines)", missing, timeout_s, self.path,
                        self.rank_path)
        else:
            try:
                _write_atomically(self.path, _join_arrays(
                    [text] + [texts[r] for r in range(1, comm.Get_size())]))
                merged = True
            except OSError as err:
                log.warning("timeline: cannot write %s (%s); every rank writes its own file "
                            "instead", self.path, err)
        for rank in range(1, comm.Get_size()):
            _unfinished_sends.append(comm.isend((generation, merged), dest=rank,
                                                tag=_TAG_RESULT))
        _prune_sends()
        return merged

    def __enter__(self) -> "Timeline":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _receive(comm, sources, tag: int, generation: int, deadline) -> Dict[int, Any]:
    """Payloads of ``(generation, payload)`` messages from ``sources`` until all arrived or
    the deadline passed; messages of other generations are dropped."""
    from ripples.core.errors import RipplesTimeoutError

    received: Dict[int, Any] = {}
    pause = 0.0
    while len(received) < len(sources):
        progressed = False
        for source in sources - set(received):
            message = comm.improbe(source=source, tag=tag)
            if message is not None:
                number, payload = message.recv()
                if number == generation:
                    received[source] = payload
                progressed = True
        if progressed:
            pause = 0.0
        else:
            try:
                deadline.check()
            except RipplesTimeoutError:
                break
            pause = min(0.01, pause * 2 or 1e-4)
            time.sleep(pause)
    return received


def _prune_sends() -> None:
    _unfinished_sends[:] = [request for request in _unfinished_sends if not request.Test()]


class NullTimeline:
    """The disabled timeline: the same API as ``Timeline``, records and writes nothing."""

    path = ""
    rank_path = ""
    closed = False
    mark_cycles = False
    _NO_SPAN = contextlib.nullcontext()

    def __init__(self, path: PathLike = "", rank: int = 0, mark_cycles: bool = False):
        self.rank = rank

    @property
    def enabled(self) -> bool:
        return False

    now = staticmethod(time.perf_counter)

    def complete(self, name, cat, start_s, dur_s, args=None) -> None:
        pass

    def mark_cycle(self) -> None:
        pass

    def span(self, name, category, **args):
        return self._NO_SPAN

    def events(self) -> List[Dict[str, Any]]:
        return []

    def flush(self) -> None:
        pass

    def close(self, comm=None, timeout_s: float = 60.0, per_rank: bool = False,
              generation: int = 0) -> None:
        pass

    def __enter__(self) -> "NullTimeline":
        return self

    def __exit__(self, *exc) -> None:
        pass


def make_timeline(path: Optional[PathLike], rank: int,
                  mark_cycles: bool = False) -> Union[Timeline, NullTimeline]:
    """A ``Timeline`` writing at ``path``, or a ``NullTimeline`` when ``path`` is empty or
    None (e.g. ``make_timeline(config.timeline, rank)``)."""
    return Timeline(path, rank, mark_cycles) if path else NullTimeline(rank=rank)


def merge_timelines(paths: Iterable[PathLike], out: PathLike) -> int:
    """Join timeline files (e.g. ``rank_files("trace.json")``, left by ``per_rank`` or by a
    merge that could not complete) into one trace at ``out``, written atomically; returns
    the event count. Ranks already differ by ``pid``, so events are kept as they are."""
    merged: List[Dict[str, Any]] = []
    for path in paths:
        with open(path, encoding="utf-8") as handle:
            events = json.load(handle)
        if not isinstance(events, list):
            raise ValueError(f"{path}: not a timeline (expected a JSON array of events)")
        merged.extend(events)
    _write_atomically(str(out), json.dumps(merged))
    return len(merged)
