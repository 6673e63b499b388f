"""``benchmarks/ps.py --sweep --sweep-repeats N``: the medians of repeated runs of each row,
and each row's median time to target against the best fixed policy's in its setting.

One time-to-target sample swings by tens of percent on this machine (the same
configuration lands at 0.85x and 1.39x of itself), so the bars are judged on medians of
interleaved repeats. A run that did not reach the target counts as slower than any that
did: a median that falls on such a run is ``None`` (not reached).

Policies that apply stale pushes (ASP with momentum) swing by tens of points from one
evaluation to the next, so the first evaluation at or above the target can be a swing that
falls back at once. Each run therefore also has a *held* time: the first evaluation at
which the mean of the last ``HELD_EVALUATIONS`` evaluations reaches the target.
"""
from __future__ import annotations

import statistics
from typing import Dict, List, Optional, Sequence, Tuple

# The policies CASP is held against (the bar: at most 1.05x the best of them).
FIXED_POLICIES = ("BSP", "SSP", "ASP", "EPSP")
SETTING = ("ratio", "slow_workers", "hidden")
HELD_EVALUATIONS = 3  # about 0.6 s of evaluations at 5 steps of worker 0 each


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


def held_time(curve: Sequence[Sequence[float]], target: float,
              evaluations: int = HELD_EVALUATIONS) -> Optional[float]:
    """The time of the first evaluation of ``curve`` (``(seconds, accuracy)`` pairs in
    order) at which the mean accuracy of it and the ``evaluations - 1`` before it reaches
    ``target``; None if none does."""
    for end in range(evaluations, len(curve) + 1):
        window = curve[end - evaluations:end]
        if sum(a for _, a in window) / evaluations >= target:
            return window[-1][0]
    return None


def _median_or_none(values: List[Optional[float]]) -> Optional[float]:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def summarize_runs(runs: Sequence[dict]) -> List[dict]:
    """One row per (setting, row) of ``runs`` (``budget.summarize`` records), in first-seen
    order: its medians, every time to target, and ``vs_best_fixed``, its median time over
    the smallest median time of the fixed policies in the setting (None where either did
    not reach the target); the same for the held times (``time_to_target_held_s``,
    ``vs_best_fixed_held``; None for runs recorded without one)."""
    groups: Dict[Tuple, List[dict]] = {}
    for run in runs:
        groups.setdefault(tuple(run[k] for k in SETTING) + (run["row"],), []).append(run)
    rows = []
    for key, mine in groups.items():
        times = [r["time_to_target_s"] for r in mine]
        held = [r.get("time_to_target_held_s") for r in mine]
        rows.append({
            **dict(zip(SETTING, key)), "row": key[-1], "runs": len(mine),
            "steps_per_s": statistics.median(r["steps_per_s"] for r in mine),
            "time_to_target_s": median_time(times),
            "times_to_target_s": ranked(times),
            "time_to_target_held_s": median_time(held),
            "times_to_target_held_s": ranked(held),
            "final_accuracy": statistics.median(r["final_accuracy"] for r in mine),
            "push_bytes_per_sample": statistics.median(r["push_bytes_per_sample"]
                                                       for r in mine),
            "stale_push_share": _median_or_none([r.get("stale_push_share") for r in mine])})
    for row in rows:
        setting = [r for r in rows if all(r[k] == row[k] for k in SETTING)]
        for time_key, best_key, versus_key in (
                ("time_to_target_s", "best_fixed_s", "vs_best_fixed"),
                ("time_to_target_held_s", "best_fixed_held_s", "vs_best_fixed_held")):
            fixed = [r[time_key] for r in setting
                     if is_fixed_policy(r["row"]) and r[time_key] is not None]
            best = min(fixed) if fixed else None
            row[best_key] = best
            row[versus_key] = (row[time_key] / best
                               if best and row[time_key] is not None else None)
    return rows
