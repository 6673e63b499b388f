"""Chrome-trace timeline per rank (the JSON format of Horovod's timeline).

Each rank writes its own file: the path with ``.rank<N>`` inserted before the extension
(``trace.json`` -> ``trace.rank0.json``, ``trace.rank1.json``, ...), so no rank waits for
another and a crashed rank's peers still leave their traces. Each file is a JSON array of
events that ``json.load``, ``chrome://tracing`` and Perfetto read; ``merge_timelines``
concatenates rank files into one array to view the whole job at once.

Events are complete events (``"ph": "X"``) with ``ts``/``dur`` in microseconds; ``pid`` is
the rank (labelled by a ``process_name`` metadata event) and ``tid`` a small per-thread
number. Timestamps are wall-clock microseconds since the epoch, taken from a monotonic clock
anchored once per process, so ranks on one machine line up.

When no timeline is wanted use ``NullTimeline`` (same API, does nothing); ``make_timeline``
picks one.
"""
from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Union

__all__ = ["Timeline", "NullTimeline", "make_timeline", "per_rank_path", "merge_timelines"]

PathLike = Union[str, "os.PathLike[str]"]


def per_rank_path(path: PathLike, rank: int) -> str:
    """``path`` with ``.rank<rank>`` inserted before its extension (appended if it has none)."""
    path = Path(path)
    if path.suffix:
        return str(path.with_name(f"{path.stem}.rank{rank}{path.suffix}"))
    return str(path.with_name(f"{path.name}.rank{rank}"))


class Timeline:
    """Collects trace events for one rank and writes them to ``per_rank_path(path, rank)``.

    ``span`` and ``complete`` may be called from any thread. Events stay in memory until
    ``flush()`` or ``close()``; each write replaces the file with a complete JSON array, so
    the file is always loadable.
    """

    def __init__(self, path: PathLike, rank: int):
        if not isinstance(rank, int) or rank < 0:
            raise ValueError(f"rank must be an integer >= 0, got {rank!r}")
        if not str(path):
            raise ValueError("path must name a file; use NullTimeline for no timeline")
        self.path = per_rank_path(path, rank)
        self.rank = rank
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

    def _tid(self) -> int:
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

    def flush(self) -> None:
        """Write all events so far to the file (atomically replaced)."""
        events = self.events()
        directory = os.path.dirname(self.path) or "."
        os.makedirs(directory, exist_ok=True)
        temporary = f"{self.path}.tmp"
        with open(temporary, "w", encoding="utf-8") as handle:
            json.dump(events, handle)
        os.replace(temporary, self.path)

    def close(self) -> None:
        """Write the file; later events are still recorded and written by another flush."""
        self.flush()
        self.closed = True

    def __enter__(self) -> "Timeline":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class NullTimeline:
    """The disabled timeline: the same API as ``Timeline``, records and writes nothing."""

    path = ""
    closed = False
    _NO_SPAN = contextlib.nullcontext()

    def __init__(self, path: PathLike = "", rank: int = 0):
        self.rank = rank

    @property
    def enabled(self) -> bool:
        return False

    now = staticmethod(time.perf_counter)

    def complete(self, name, cat, start_s, dur_s, args=None) -> None:
        pass

    def span(self, name, category, **args):
        return self._NO_SPAN

    def events(self) -> List[Dict[str, Any]]:
        return []

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> "NullTimeline":
        return self

    def __exit__(self, *exc) -> None:
        pass


def make_timeline(path: Optional[PathLike], rank: int) -> Union[Timeline, NullTimeline]:
    """A ``Timeline`` writing next to ``path`` (see ``per_rank_path``), or a ``NullTimeline``
    when ``path`` is empty or None (e.g. ``make_timeline(config.timeline, rank)``)."""
    return Timeline(path, rank) if path else NullTimeline(rank=rank)


def merge_timelines(paths: Iterable[PathLike], out: PathLike) -> int:
    """Concatenate per-rank timeline files into one JSON array at ``out``; returns the event
    count. Ranks already differ by ``pid``, so events are kept as they are."""
    merged: List[Dict[str, Any]] = []
    for path in paths:
        with open(path, encoding="utf-8") as handle:
            events = json.load(handle)
        if not isinstance(events, list):
            raise ValueError(f"{path}: not a timeline (expected a JSON array of events)")
        merged.extend(events)
    with open(out, "w", encoding="utf-8") as handle:
        json.dump(merged, handle)
    return len(merged)
