"""Writing a mode's result: stamped by the harness (command, date, machine) with the
arguments it ran with."""
from __future__ import annotations

from harness import report


def save(args, result: dict) -> dict:
    """Write ``result`` and ``args`` to ``args.json``; returns what was written."""
    return report.write_json(args.json, {**result, "args": vars(args)})
