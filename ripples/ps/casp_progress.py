"""CASP's progress controller (``communities="progress"``): the number of communities
chosen from measured training progress, as pure functions over a small state.

The analytic projection of ``casp_scoring`` ranks partitions by round times and staleness;
it cannot see what staleness actually costs the model being trained, and on real runs it
chose communities that trained worse than plain ASP. This controller measures instead:

- *Arms*: a few community counts: ``n`` (one community per worker: ASP), the count the
  projection prefers (``choose()``; 2 when it prefers an end) and ``1`` (BSP). Each count is
  formed by sort-and-cut on the measured speeds.
- *Measure*: every community push carries its members' training losses (the loss of the
  batch each member just computed, as the workers report it). An arm's window is the
  rounds the plan runs under (every community ``regroup_every`` rounds, the boundary the
  controller already waits for), cut short once it spans ``regroup_every`` times the
  slowest worker's compute time (after every community pushed once under the plan, so
  no plan is skipped); its rate is the least-squares slope of loss against the
  server's clock over the window, negated: loss decrease per second.
- *Pruning*: a count whose projected batches per second (from the measured compute
  times) are below 0.6x ASP's is not tried (BSP with a 3x-slow half, for instance).
- *Starved ASP*: when the first (ASP) window measures fewer than 0.3x the batches per
  second its workers' compute times allow, the servers cannot take a push per batch; the
  controller then commits to the projection's count at once, without more windows.
- *Drift*: loss falls faster early in training, so windows later in time look worse. The
  ASP arm runs first and last (``n, c, 1, n``); each other arm is compared with ASP's rate
  interpolated linearly to the middle of its window, which cancels a linear trend.
- *Commit*: the arm with the best ratio to that ASP reference wins; an arm must beat ASP by
  ``margin`` (ASP is the default: the end that never waits). The count then stays and
  sort-and-cut re-forms its communities from the speeds at every boundary, as for a fixed
  count. Without reported losses every window is empty and the controller stays at ASP.

Starting from ASP means the first plan needs no measurement; exploration costs the windows
spent in the other arms (two windows with three arms).
"""
from __future__ import annotations

import dataclasses
import math
from typing import List, Optional, Sequence, Tuple

from .casp_scoring import choose, sort_and_cut

DEFAULT_MARGIN = 0.1
MIN_THROUGHPUT = 0.6
STARVED = 0.3  # below this fraction of the compute-bound batch rate, ASP is server-bound


@dataclasses.dataclass
class Progress:
    """Where the exploration stands. ``schedule``: the counts to try in order (filled at
    the first boundary, from the speeds); ``window``: ``(server seconds, loss)`` samples
    of the arm running now; ``results``: ``(count, middle of its window, rate)`` per
    finished window; ``committed``: the chosen count, None while exploring."""

    num_workers: int
    margin: float = DEFAULT_MARGIN
    schedule: List[int] = dataclasses.field(default_factory=list)
    window: List[Tuple[float, float]] = dataclasses.field(default_factory=list)
    results: List[Tuple[int, float, Optional[float]]] = dataclasses.field(default_factory=list)
    committed: Optional[int] = None

    @property
    def current(self) -> int:
        """The count the running window measures (ASP before the first boundary)."""
        if self.committed is not None:
            return self.committed
        return self.schedule[len(self.results)] if self.schedule else self.num_workers


def arms(times: Sequence[float], min_throughput: float = MIN_THROUGHPUT) -> List[int]:
    """The exploration order for these speeds: ASP, the projection's count, BSP, ASP
    (duplicates dropped for 1 or 2 workers). A count whose projected batches per second
    (each community at its slowest member's pace) fall below ``min_throughput`` times
    ASP's is not tried: it would need more progress per batch than the staleness it saves
    can give (ASP's staleness is at most ``n - 1`` updates)."""
    n = len(times)
    if n == 1:
        return [1]
    middle = len(choose(times))
    if middle in (1, n):
        middle = 2
    asp = sum(1 / t for t in times)
    tried = [c for c in dict.fromkeys((middle, 1)) if c != n
             and _batches_per_s(times, c) >= min_throughput * asp]
    return [n] + tried + [n] if tried else [n]


def _batches_per_s(times: Sequence[float], count: int) -> float:
    return sum(len(c) / max(times[w] for w in c) for c in sort_and_cut(times, count))


def record(state: Progress, now: float, losses: Sequence[float]) -> None:
    """Add the losses a push reported at server time ``now`` to the running window."""
    if state.committed is None:
        state.window.extend((now, float(v)) for v in losses if math.isfinite(v))


def window_due(state: Progress, times: Sequence[float], regroup_every: int) -> bool:
    """While exploring, a window also ends once it spans ``regroup_every`` steps of the
    slowest worker's compute time: every arm is measured over about the same seconds,
    and an arm slowed by waiting (BSP, or ASP on a busy server) costs no more than that."""
    if state.committed is not None or len(state.window) < 2:
        return False
    return state.window[-1][0] - state.window[0][0] >= regroup_every * max(times)


def starved(window: Sequence[Tuple[float, float]], times: Sequence[float],
            min_throughput: float = STARVED) -> bool:
    """True when ASP's measured batches per second (one loss per batch) fall below
    ``min_throughput`` times what its workers' compute times allow (well below: a round
    trip per step on a quick model already costs a large fraction): the servers or their
    links cannot take one push per batch, so a second ASP window would only cost time,
    and fewer communities push less."""
    if len(window) < 2 or window[-1][0] <= window[0][0]:
        return False
    measured = (len(window) - 1) / (window[-1][0] - window[0][0])
    return measured < min_throughput * sum(1 / t for t in times)


def slope_rate(samples: Sequence[Tuple[float, float]]) -> Optional[float]:
    """Loss decrease per second over ``samples`` (minus the least-squares slope); None
    with fewer than 4 samples or no time between them."""
    if len(samples) < 4:
        return None
    mt = sum(t for t, _ in samples) / len(samples)
    ml = sum(v for _, v in samples) / len(samples)
    var = sum((t - mt) ** 2 for t, _ in samples)
    if var <= 0:
        return None
    return -sum((t - mt) * (v - ml) for t, v in samples) / var


def boundary(state: Progress, times: Sequence[float]) -> int:
    """Close the running window at a plan boundary; returns the count to run next."""
    if state.committed is not None:
        return state.committed
    if not state.schedule:
        # No losses reported (the loop does not call report_loss): nothing to judge by.
        state.schedule = arms(times) if state.window else [state.num_workers]
        if len(state.schedule) == 1:
            state.committed = state.schedule[0]
            return state.committed
        if starved(state.window, times):
            state.committed = state.schedule[1]
            return state.committed
    middle = (state.window[0][0] + state.window[-1][0]) / 2 if state.window else 0.0
    state.results.append((state.current, middle, slope_rate(state.window)))
    state.window = []
    if len(state.results) < len(state.schedule):
        return state.schedule[len(state.results)]
    state.committed = decide(state.results, state.num_workers, state.margin)
    return state.committed


def decide(results: Sequence[Tuple[int, float, Optional[float]]], num_workers: int,
           margin: float = DEFAULT_MARGIN) -> int:
    """The count whose rate beats ASP's interpolated reference by the largest factor
    (and by more than ``margin``); ASP (``num_workers``) otherwise."""
    asp = [(t, r) for c, t, r in results if c == num_workers and r is not None]
    if len(asp) < 2:
        return num_workers
    (t0, r0), (t1, r1) = asp[0], asp[-1]
    best, best_gain = num_workers, 1.0 + margin
    for count, t, rate in results:
        if count == num_workers or rate is None:
            continue
        reference = r0 + (r1 - r0) * (t - t0) / (t1 - t0) if t1 > t0 else (r0 + r1) / 2
        if reference <= 0:  # ASP's loss is not falling: any falling arm is better
            gain = math.inf if rate > 0 else 0.0
        else:
            gain = rate / reference
        if gain > best_gain:
            best, best_gain = count, gain
    return best
