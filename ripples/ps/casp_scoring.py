"""CASP's shared vocabulary: a plan of communities, sort-and-cut and the projected score.

Pure functions of the workers' times per step (no MPI, no tensors, no clock), imported by
the community controller (``casp``), its timing model (``casp_timing``), the learned
controller (``learned_controller``) and the workers' rounds (``community``).

Choices where the published description is silent, and why:

- *Speed* is a worker's own compute time per step (from the end of its previous step to
  the start of its next one), smoothed by an EMA (``EMA_ALPHA``). Time spent waiting for
  the community is excluded, or every member of a community would look as slow as its
  slowest member and the communities could never be told apart again.
- *Cut*: after sorting by time, the ``C`` contiguous runs are the ones that minimize the
  compute time the members wait for their slowest (``sum(max - t)`` over each run), found
  by dynamic programming; among equal costs the most even sizes win. For two speed classes
  and ``C = 2`` this cut has zero idle time, so it recovers the classes exactly.
- *Projected progress per second* of a partition: community ``k`` with ``n_k`` members and
  round time ``T_k`` (its slowest member) contributes ``n_k / T_k`` batches per second,
  discounted by ``1 / sqrt(1 + d_k)`` where ``d_k = T_k * sum_{j != k} 1 / T_j`` is the
  number of other communities' updates that land during one of its rounds (its expected
  staleness). The square root is the usual learning-rate correction for stale gradients;
  the projection only needs to rank partitions, not to predict loss.
- *Traffic penalty*: a partition pushes ``sum_k 1 / T_k`` model copies per second for
  ``sum_k n_k / T_k`` batches; that ratio (1 for ASP, ``1 / n`` for BSP) times
  ``traffic_penalty`` is subtracted as a fraction of the progress.
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence, Tuple

EMA_ALPHA = 0.3
DEFAULT_TRAFFIC_PENALTY = 0.1
LEARNED = "learned"
PROGRESS = "progress"  # the measuring controller, ``communities="auto"`` (casp_progress)
AUTO = "auto"
PROJECTED = "projected"  # the count that maximizes projected_score (choose)

Communities = Tuple[Tuple[int, ...], ...]


def ema(previous: Optional[float], sample: float, alpha: float = EMA_ALPHA) -> float:
    """Exponential moving average; the first sample is taken as is."""
    return sample if previous is None else (1 - alpha) * previous + alpha * sample


def normalize(communities: Sequence[Sequence[int]]) -> Communities:
    """Members sorted inside each community, communities ordered by their first member."""
    return tuple(sorted(tuple(sorted(c)) for c in communities if c))


def controller_count(communities):
    """The community controller's ``count`` for a ``communities`` option: ``"auto"`` (and
    its older name ``"progress"``) is the measuring controller, ``"projected"`` is None
    (``choose()`` picks the count), ``"learned"`` and fixed counts stay as they are."""
    return {AUTO: PROGRESS, PROJECTED: None}.get(communities, communities)


def weighs_by_size(communities) -> bool:
    """Whether a community's push is its members' gradient sum over the number of workers
    (it weighs as its size: one learning rate for every count, BSP's), rather than their
    mean: so under the measuring controller, whose count changes as it explores."""
    return controller_count(communities) == PROGRESS


def contiguous(num_workers: int, count: int) -> Communities:
    """``count`` runs of consecutive worker ids of near-equal size (the plan before any
    speed is measured); ``"learned"`` starts from one run, ``"progress"`` from one run per
    worker (ASP)."""
    count = {LEARNED: 1, PROGRESS: num_workers}.get(count, count)
    bounds = [num_workers * k // count for k in range(count + 1)]
    return normalize(range(a, b) for a, b in zip(bounds, bounds[1:]))


def sort_and_cut(times: Sequence[float], count: int) -> Communities:
    """Sort workers by time per step and cut them into ``count`` contiguous runs that
    minimize the summed waiting for each run's slowest member (ties: most even sizes)."""
    n = len(times)
    if not 1 <= count <= n:
        raise ValueError(f"communities must be in [1, {n}] for {n} workers, got {count}")
    return _cuts(times, count, count)[count]


def _cuts(times: Sequence[float], low: int, high: int) -> Dict[int, Communities]:
    """:func:`sort_and_cut` for every count in ``[low, high]``, from one dynamic program:
    O(high * n^2) steps for ``n`` workers, instead of that for each count."""
    n = len(times)
    order = sorted(range(n), key=lambda w: (times[w], w))
    t = [times[w] for w in order]
    prefix = [0.0]
    for value in t:
        prefix.append(prefix[-1] + value)
    scale = max(prefix[-1], 1e-12)

    def idle(i: int, j: int) -> float:  # run t[i:j], its slowest is t[j - 1]
        return (j - i) * t[j - 1] - (prefix[j] - prefix[i])

    # best[k][j]: (idle, sum of squared sizes, cut points) for t[:j] in k runs. Row k
    # needs only the j that leave a worker for each of the low - k runs still to come;
    # an entry depends only on the row above at smaller j, so best[count][n] is the same
    # whichever other counts are computed alongside.
    best: List[Dict[int, tuple]] = [{0: (0.0, 0, ())}]
    plans: Dict[int, Communities] = {}
    for k in range(1, high + 1):
        row = {}
        for j in range(k, n - max(low - k, 0) + 1):
            options = []
            for i in range(k - 1, j):
                if i not in best[k - 1]:
                    continue
                cost, squares, cuts = best[k - 1][i]
                total = cost + idle(i, j)
                options.append((round(total / scale, 9), squares + (j - i) ** 2, cuts + (j,),
                                total))
            choice = min(options)
            row[j] = (choice[3], choice[1], choice[2])
        best.append(row)
        if k >= low:
            cuts = (0,) + row[n][2]
            plans[k] = normalize(order[a:b] for a, b in zip(cuts, cuts[1:]))
    return plans


def projected_score(times: Sequence[float], communities: Communities,
                    traffic_penalty: float = DEFAULT_TRAFFIC_PENALTY) -> float:
    """Projected progress per second of ``communities`` minus the traffic penalty (see the
    module docstring); higher is better."""
    rounds = [max(times[w] for w in c) for c in communities]
    updates_per_s = sum(1 / r for r in rounds)
    progress = batches = 0.0
    for members, round_s in zip(communities, rounds):
        staleness = round_s * (updates_per_s - 1 / round_s)
        progress += len(members) / round_s / math.sqrt(1 + staleness)
        batches += len(members) / round_s
    return progress * (1 - traffic_penalty * updates_per_s / batches)


def choose(times: Sequence[float], traffic_penalty: float = DEFAULT_TRAFFIC_PENALTY
           ) -> Communities:
    """Sort-and-cut with the number of communities that scores best (ties: fewer).

    O(n^3) for ``n`` workers (one dynamic program for every count): milliseconds for 64
    workers, seconds for 256; pass a fixed count beyond a few hundred workers."""
    best = None
    for count, plan in sorted(_cuts(times, 1, len(times)).items()):
        score = projected_score(times, plan, traffic_penalty)
        if best is None or score > best[0] * (1 + 1e-9):
            best = (score, plan)
    return best[1]


def labels(communities: Communities, num_workers: int) -> List[int]:
    """The index of each worker's community (the wire form of a plan)."""
    out = [-1] * num_workers
    for index, members in enumerate(communities):
        for w in members:
            out[w] = index
    return out


def from_labels(values: Sequence[int]) -> Communities:
    groups: Dict[int, List[int]] = {}
    for w, label in enumerate(values):
        groups.setdefault(int(label), []).append(w)
    return normalize(groups.values())
