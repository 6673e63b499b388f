"""``benchmarks/ps.py --sweep --sweep-repeats N``: the medians of repeated runs of each row,
and each row's median time to target against the best fixed policy's in its setting.

One time-to-target sample swings by tens of percent on this machine (the same
configuration lands at 0.85x and 1.39x of itself), so the bars are judged on medians of
interleaved repeats. A run that did not reach the target counts as slower than any that
did: a median that falls on such a run is ``None`` (not reached).
"""
from __future__ import annotations

import statistics
from typing import Dict, List, Optional, Sequence, Tuple

# The policies CASP is held against (the bar: at most 1.05x the best of them).
FIXED_POLICIES = ("BSP", "SSP", "ASP", "EPSP")
SETTING = ("ratio", "slow_workers", "hidden")


def is_fixed_policy(row: str) -> bool:
    """Whether ``row`` (``SSP(s=2)``, ``ASP``...) is one of ``FIXED_POLICIES``."""
    return row.split("(")[0] in FIXED_POLICIES


def ranked(times: Sequence[Optional[float]]) -> List[Optional[float]]:
    """Times to target from fastest to slowest, the misses (None) last."""
    return sorted(times, key=lambda t: (t is None, t or 0.0))


def median_time(times: Sequence[Optional[float]]) -> Optional[float]:
    """The median of times to target, a miss (None) ranking after every time."""
    ranked_times = ranked(times)
    middle = ranked_times[(len(ranked_times) - 1) // 2: len(ranked_times) // 2 + 1]
    if any(t is None for t in middle):
        return None
    return sum(middle) / len(middle)


def _median_or_none(values: List[Optional[float]]) -> Optional[float]:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def summarize_runs(runs: Sequence[dict]) -> List[dict]:
    """One row per (setting, row) of ``runs`` (``budget.summarize`` records), in first-seen
    order: its medians, every time to target, and ``vs_best_fixed``, its median time over
    the smallest median time of the fixed policies in the setting (None where either did
    not reach the target)."""
    groups: Dict[Tuple, List[dict]] = {}
    for run in runs:
        groups.setdefault(tuple(run[k] for k in SETTING) + (run["row"],), []).append(run)
    rows = []
    for key, mine in groups.items():
        times = [r["time_to_target_s"] for r in mine]
        rows.append({
            **dict(zip(SETTING, key)), "row": key[-1], "runs": len(mine),
            "steps_per_s": statistics.median(r["steps_per_s"] for r in mine),
            "time_to_target_s": median_time(times),
            "times_to_target_s": ranked(times),
            "final_accuracy": statistics.median(r["final_accuracy"] for r in mine),
            "push_bytes_per_sample": statistics.median(r["push_bytes_per_sample"]
                                                       for r in mine),
            "stale_push_share": _median_or_none([r.get("stale_push_share") for r in mine])})
    for row in rows:
        setting = [r for r in rows if all(r[k] == row[k] for k in SETTING)]
        fixed = [r["time_to_target_s"] for r in setting
                 if is_fixed_policy(r["row"]) and r["time_to_target_s"] is not None]
        best = min(fixed) if fixed else None
        row["best_fixed_s"] = best
        row["vs_best_fixed"] = (row["time_to_target_s"] / best
                                if best and row["time_to_target_s"] is not None else None)
    return rows
