"""CASP's measuring controller (``communities="auto"``): the number of communities chosen
from measured training progress, as pure functions over a small state.

The analytic projection of ``casp_scoring`` ranks partitions by round times and staleness;
it cannot see what staleness actually costs the model being trained, nor what a
community's collectives cost on the machines at hand, and on real runs it chose
communities that trained worse than plain ASP. This controller measures instead:

- *Arms*: a few community counts: ``n`` (one community per worker: ASP), the count the
  projection prefers (``choose()``; 2 when it prefers an end) and ``1`` (BSP). Each count is
  formed by sort-and-cut on the measured speeds.
- *Measure*: every community push carries its number of training members (batches) and
  their training losses (the loss of the batch each member just computed, as the workers
  report it). An arm's window is the rounds the plan runs under (every community
  ``regroup_every`` rounds, the boundary the controller already waits for), cut short once
  it spans ``regroup_every`` times the slowest worker's compute time (after every community
  pushed once under the plan, so no plan is skipped). Two rates per window: batches per
  second, and loss decrease per second (minus the least-squares slope of loss against the
  server's clock).
- *Throughput first*: an arm whose batches per second fall more than ``margin`` below the
  first ASP window's loses at once, its window cut after ``TRIAL_ROUNDS`` of the slowest
  worker's compute time. Throughput is measured well in a short window, the loss slope
  only noisily in a long one; and an arm behind in batches needs that much more progress
  per batch, while with pushes weighed by community size the staleness it saves is small
  (ASP's gradient is about ``(n - 1) / n`` of one step old). Judging such an arm by its
  slope alone cost whole windows of slower training.
- *Pruning*: a count whose projected batches per second (from the measured compute
  times) are below 0.6x ASP's is not tried (BSP with a 3x-slow half, for instance).
- *Starved ASP*: when the first (ASP) window measures fewer than 0.3x the batches per
  second its workers' compute times allow, the servers cannot take a push per batch; the
  controller then commits to the projection's count at once, without more windows.
- *Starved before every first push*: the first window needs every worker's compute time,
  so it lasts until every worker has pushed once: ``n`` pushes of the whole model, seconds
  for a large model and many workers when the servers take one push at a time. Once the
  pushes so far, over ``TRIAL_ROUNDS`` of the slowest compute time measured yet, come at
  under ``STARVED`` of what the measured compute times allow, the controller leaves for
  one community (which needs no compute times to form, and whose first round brings all of
  them) and then commits to the projection's count as above.
- *Drift*: loss falls faster early in training, so windows later in time look worse. When
  an arm kept up in throughput and its loss rate is to be judged, ASP runs once more after
  it (``n, c, 1, n``) and each arm is compared with ASP's rate interpolated linearly to the
  middle of its window, which cancels a linear trend.
- *Commit*: the arm with the best gain over ASP wins: its loss rate over ASP's
  interpolated one where both were measured, else (no losses reported) its batch rate
  over ASP's; the gain must exceed ``1 + margin`` (ASP is the default: the end that never
  waits). The count then stays and sort-and-cut re-forms its communities from the speeds at
  every boundary, as for a fixed count.

Starting from ASP means the first plan needs no measurement; exploration costs the windows
spent in the other arms.
"""
from __future__ import annotations

import dataclasses
import math
from typing import List, NamedTuple, Optional, Sequence, Tuple

from .casp_scoring import choose, sort_and_cut

DEFAULT_MARGIN = 0.1
MIN_THROUGHPUT = 0.6
STARVED = 0.3  # below this fraction of the compute-bound batch rate, ASP is server-bound
TRIAL_ROUNDS = 3  # slowest compute times an arm runs before it can lose on throughput


class Window(NamedTuple):
    """One finished window: the ``count`` it ran, the server time of its ``middle``, its
    loss decrease and batches per second (None: too few samples) and how many seconds
    it spanned."""
    count: int
    middle: float
    loss_rate: Optional[float]
    batch_rate: Optional[float]
    span_s: float = 0.0


@dataclasses.dataclass
class Progress:
    """Where the exploration stands. ``schedule``: the counts to try in order (filled at
    the first boundary, from the speeds); ``losses``: ``(server seconds, loss)`` and
    ``pushes``: ``(server seconds, members, batches)`` of the arm running now; ``results``: the
    finished windows; ``committed``: the chosen count, None while exploring."""

    num_workers: int
    margin: float = DEFAULT_MARGIN
    schedule: List[int] = dataclasses.field(default_factory=list)
    losses: List[Tuple[float, float]] = dataclasses.field(default_factory=list)
    pushes: List[Tuple[float, tuple, int]] = dataclasses.field(default_factory=list)
    results: List[Window] = dataclasses.field(default_factory=list)
    committed: Optional[int] = None
    starved_early: bool = False  # left ASP for one community before every worker pushed

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
    ASP's is not tried."""
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


def record(state: Progress, now: float, members: Sequence[int], batches: int,
           losses: Sequence[float] = ()) -> None:
    """Add a push of community ``members`` carrying ``batches`` (its training members), at
    server time ``now``, with the losses they reported, to the running window."""
    if state.committed is None:
        state.pushes.append((now, tuple(members), batches))
        state.losses.extend((now, float(v)) for v in losses if math.isfinite(v))


def batch_rate(pushes: Sequence[Tuple[float, tuple, int]]) -> Optional[float]:
    """Batches per second over ``pushes``: each community's own rate (the batches of its
    pushes after its first, over the time since that one; one push counts over the whole
    window), summed. Per community, because communities push periodically and often at
    the same moments: a window-wide count would depend on which bunch opened it. None
    with fewer than 2 pushes or no time between them."""
    if len(pushes) < 2 or pushes[-1][0] <= pushes[0][0]:
        return None
    span = pushes[-1][0] - pushes[0][0]
    by_community: dict = {}
    for now, members, batches in pushes:
        by_community.setdefault(members, []).append((now, batches))
    total = 0.0
    for own in by_community.values():
        if len(own) > 1 and own[-1][0] > own[0][0]:
            total += sum(b for _, b in own[1:]) / (own[-1][0] - own[0][0])
        else:
            total += sum(b for _, b in own) / span
    return total


def window_due(state: Progress, times: Sequence[float], regroup_every: int) -> bool:
    """While exploring, a window also ends once it spans ``regroup_every`` steps of the
    slowest worker's compute time (every arm is measured over about the same seconds),
    or, for an arm other than ASP, once it spans ``TRIAL_ROUNDS`` of them and its batches
    per second are already below ASP's by more than the margin."""
    if state.committed is not None or len(state.pushes) < 2:
        return False
    if state.starved_early and not state.schedule:
        return True  # one round of the one community gave every compute time
    span = state.pushes[-1][0] - state.pushes[0][0]
    if span >= regroup_every * max(times):
        return True
    return (state.current != state.num_workers and span >= TRIAL_ROUNDS * max(times)
            and _slower(batch_rate(state.pushes), state.results, state.margin))


def _slower(rate: Optional[float], results: Sequence[Window], margin: float) -> bool:
    """Whether ``rate`` is below the first ASP window's batch rate by more than ``margin``."""
    reference = results[0].batch_rate if results else None
    return rate is not None and reference is not None and rate < (1 - margin) * reference


def starved(pushes: Sequence[Tuple[float, tuple, int]], times: Sequence[float],
            min_throughput: float = STARVED) -> bool:
    """True when ASP's measured batches per second fall below ``min_throughput`` times
    what its workers' compute times allow (well below: a round trip per step on a quick
    model already costs a large fraction): the servers or their links cannot take one
    push per batch, so a second ASP window would only cost time, and fewer communities
    push less."""
    measured = batch_rate(pushes)
    return measured is not None and measured < min_throughput * sum(1 / t for t in times)


def starved_before_every_push(state: Progress, times: Sequence[float]) -> bool:
    """In the first (ASP) window, before every worker has pushed once: True when the pushes
    so far, over ``TRIAL_ROUNDS`` of the slowest compute time measured yet, come at under
    ``STARVED`` times what those compute times allow all ``num_workers`` (``times``: the
    workers measured so far). The servers then take one push of the whole model at a time,
    and waiting for every worker's first push costs ``num_workers`` of them (seconds for a
    large model and many workers); one community needs no compute times to form."""
    if state.committed is not None or state.schedule or state.starved_early or not times \
            or len(state.pushes) < 2:
        return False
    if state.pushes[-1][0] - state.pushes[0][0] < TRIAL_ROUNDS * max(times):
        return False
    measured = batch_rate(state.pushes)
    allowed = state.num_workers * len(times) / sum(times)
    return measured is not None and measured < STARVED * allowed


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
        state.schedule = arms(times)
        if len(state.schedule) == 1:
            state.committed = state.schedule[0]
            return state.committed
        if state.starved_early or starved(state.pushes, times):
            state.committed = state.schedule[1]
            return state.committed
    began, ended = (state.pushes[0][0], state.pushes[-1][0]) if state.pushes else (0.0, 0.0)
    state.results.append(Window(state.current, (began + ended) / 2, slope_rate(state.losses),
                                batch_rate(state.pushes), ended - began))
    state.losses, state.pushes = [], []
    following = len(state.results)
    if following < len(state.schedule) and (state.schedule[following] != state.num_workers
                                            or _closing_window_needed(state)):
        return state.schedule[following]
    state.committed = decide(state.results, state.num_workers, state.margin)
    return state.committed


def _closing_window_needed(state: Progress) -> bool:
    """ASP's closing window serves only to interpolate its loss rate: it is needed when an
    arm kept up in throughput and is to be judged by its loss rate."""
    return any(r.count != state.num_workers and r.loss_rate is not None
               and not _slower(r.batch_rate, state.results, state.margin)
               for r in state.results)


def decide(results: Sequence[Window], num_workers: int, margin: float = DEFAULT_MARGIN) -> int:
    """The count with the largest gain over ASP (see the module docstring), if above
    ``1 + margin``; ASP (``num_workers``) otherwise."""
    asp = [r for r in results if r.count == num_workers]
    if not asp or asp[0].batch_rate is None:
        return num_workers
    losses = [(r.middle, r.loss_rate) for r in asp if r.loss_rate is not None]
    best, best_gain = num_workers, 1.0 + margin
    for arm in results:
        if arm.count == num_workers or arm.batch_rate is None \
                or _slower(arm.batch_rate, results, margin):
            continue
        if arm.loss_rate is not None and losses:
            gain = _ratio(arm.loss_rate, _reference(losses, arm.middle))
        else:
            gain = arm.batch_rate / asp[0].batch_rate
        if gain > best_gain:
            best, best_gain = arm.count, gain
    return best


def _reference(losses: Sequence[Tuple[float, float]], at: float) -> float:
    """ASP's loss rate interpolated (linearly, between its first and last window) to ``at``."""
    (t0, r0), (t1, r1) = losses[0], losses[-1]
    return r0 + (r1 - r0) * (at - t0) / (t1 - t0) if t1 > t0 else (r0 + r1) / 2


def _ratio(rate: float, reference: float) -> float:
    if reference <= 0:  # ASP's loss is not falling: any falling arm is better
        return math.inf if rate > 0 else 0.0
    return rate / reference
