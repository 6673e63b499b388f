"""Progress output that suits where it goes: a tqdm bar on a terminal, plain lines in a log.

A bar redraws itself with carriage returns and escape sequences, which a file or a pipe
keeps as noise; there ``PlainProgress`` writes one ordinary line per ``step_percent`` of
progress instead.
"""
from __future__ import annotations

import sys
from typing import Optional, TextIO

__all__ = ["PlainProgress", "progress_bar"]


class PlainProgress:
    """Progress towards ``total`` as lines ``"LABEL: N/TOTAL UNIT (P%)"``, one each time
    another ``step_percent`` of ``total`` is reached, and a last one at ``close()`` if the
    final value was not written yet. The surface ``tqdm`` offers callers: ``n``,
    ``update(delta)``, ``close()``.
    """

    def __init__(self, total: float, label: str, unit: str = "", stream: Optional[TextIO] = None,
                 step_percent: int = 10):
        if not total > 0:
            raise ValueError(f"total must be > 0, got {total!r}")
        if not 1 <= step_percent <= 100:
            raise ValueError(f"step_percent must be in [1, 100], got {step_percent!r}")
        self.total = total
        self.label = label
        self.unit = f" {unit}" if unit else ""
        self.stream = sys.stderr if stream is None else stream
        self.step_percent = step_percent
        self.n = 0.0
        self._next_percent = step_percent
        self._written: Optional[float] = None

    def update(self, delta: float) -> None:
        """Advance by ``delta``; write a line when a ``step_percent`` boundary is crossed."""
        self.n += delta
        percent = 100 * self.n / self.total
        if percent >= self._next_percent:
            self._write()
            self._next_percent = (int(percent) // self.step_percent + 1) * self.step_percent

    def close(self) -> None:
        """Write the final value unless the last line already showed it."""
        if self._written != self.n:
            self._write()

    def _write(self) -> None:
        digits = 1 if self.total < 10 else 0  # "0.5/2 s", "12/20 s"
        percent = 100 * self.n / self.total
        print(f"{self.label}: {self.n:.{digits}f}/{self.total:.{digits}f}{self.unit} "
              f"({percent:.0f}%)", file=self.stream, flush=True)
        self._written = self.n


def progress_bar(total: float, label: str, unit: str = "", stream: Optional[TextIO] = None):
    """A tqdm bar on ``stream`` (default stderr) when it is a terminal, else ``PlainProgress``.
    Either has ``n``, ``update(delta)`` and ``close()``."""
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    if isatty is None or not isatty():
        return PlainProgress(total, label, unit, stream)
    from tqdm import tqdm
    return tqdm(total=total, desc=label, unit=unit or "it", mininterval=1.0, file=stream,
                bar_format="{desc}: {bar} {n:.0f}/{total:.0f}" + (f" {unit}" if unit else ""))
