"""Handles of asynchronous collectives (``allreduce_async`` and friends)."""
from __future__ import annotations

import threading
from typing import Any, Callable, Optional


class Handle:
    """The promise of one asynchronous collective (made of ``parts`` named collectives).

    ``synchronize(handle)`` waits and returns its result; ``poll(handle)`` tells, without
    waiting or communicating, whether it is done. The communication engine completes the
    parts in the background; the first failure is kept and raised by ``synchronize``.
    ``finalize`` (optional) runs once on the waiting thread after success and returns the
    result (e.g. to decompress or to unpack a sparse all-gather).
    """

    __slots__ = ("result", "error", "description", "finalize", "_left", "_event", "_lock",
                 "blocking", "generation")

    def __init__(self, description: str, result: Any = None, parts: int = 1,
                 finalize: Optional[Callable[[Any], Any]] = None):
        self.description = description
        self.result = result
        self.error: Optional[BaseException] = None
        self.finalize = finalize
        self.blocking = False  # a caller is waiting on it (tells the engine nothing else comes)
        self.generation = 0  # the runtime's world when submitted (see Runtime.raised)
        self._left = parts
        self._lock = threading.Lock()
        # Made by the first wait() that must block: a blocking collective is usually done
        # by the thread that waits for it, which then never needs one.
        self._event: Optional[threading.Event] = None

    @property
    def done(self) -> bool:
        return self._left <= 0

    def part_done(self, error: Optional[BaseException] = None) -> None:
        """One part finished (with ``error`` if it failed)."""
        with self._lock:
            if error is not None and self.error is None:
                self.error = error
            self._left -= 1
            if self._left == 0 and self._event is not None:
                self._event.set()

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Block until done or ``timeout`` seconds passed; returns whether it is done."""
        with self._lock:
            if self._left <= 0:
                return True
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        return event.wait(timeout)

    def __repr__(self) -> str:
        state = "failed" if self.error else ("done" if self.done else "pending")
        return f"<Handle {self.description} {state}>"
