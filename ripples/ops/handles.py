"""Handles of asynchronous collectives (``allreduce_async`` and friends)."""
from __future__ import annotations

from typing import Any, Optional


class Handle:
    """The promise of one asynchronous collective.

    ``synchronize(handle)`` returns its result; ``poll(handle)`` tells whether it is done.
    Queued collectives run, fused, when any handle is synchronized or polled, when the
    fusion threshold fills, or before any collective that is not queued.
    """

    __slots__ = ("result", "done", "error", "description")

    def __init__(self, description: str, result: Any = None, done: bool = False):
        self.description = description
        self.result = result
        self.done = done
        self.error: Optional[BaseException] = None

    def finish(self, error: Optional[BaseException] = None) -> None:
        self.done = True
        self.error = error

    def __repr__(self) -> str:
        state = "failed" if self.error else ("done" if self.done else "pending")
        return f"<Handle {self.description} {state}>"
