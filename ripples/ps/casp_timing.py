"""A fast analytic model of parameter-server timing under CASP communities.

It is the environment the learned community controller is trained and evaluated in, so it
is made of pure functions of the workers' compute times and a partition; no MPI, no clock.

The model, and why it is this simple:

- *Round time* of a community: its slowest member's compute time plus the push and the
  pull of its one model copy (``push_s + pull_s``). Members wait for the slowest inside
  the synchronous P-Reduce, and the collective itself is cheap next to the round trip to
  the servers, so it is left out.
- *Server contention*: every push occupies the servers for ``server_s``. When the pushes
  arriving per second would keep them busy more than all of the time
  (``load = sum_k server_s / T_k > 1``), every round stretches by ``load``: the servers
  serve pushes in arrival order, so all communities slow down alike.
- *Asynchrony*: communities do not wait for each other; community ``k`` pushes ``1 / T_k``
  updates per second, and ``T_k * sum_{j != k} 1 / T_j`` other updates land during one of
  its rounds (its expected staleness).
- *Reward*: ``casp_scoring.projected_score`` on those round times, i.e. progress per second with
  the staleness discount minus the traffic penalty, the very quantity sort-and-cut's
  ``choose()`` maximizes; with zero push, pull and server costs the two coincide, so a
  learned choice and ``choose()`` are compared on the same scale.

Times are in any unit (the controller uses multiples of the fastest worker's time); the
default costs are fractions of that unit.
"""
from __future__ import annotations

from typing import List, Sequence

from .casp_scoring import Communities, DEFAULT_TRAFFIC_PENALTY, projected_score, sort_and_cut

DEFAULT_PUSH_S = 0.05
DEFAULT_PULL_S = 0.05
DEFAULT_SERVER_S = 0.02


def round_times(times: Sequence[float], communities: Communities,
                push_s: float = DEFAULT_PUSH_S, pull_s: float = DEFAULT_PULL_S,
                server_s: float = DEFAULT_SERVER_S) -> List[float]:
    """Seconds per round of each community, server contention included."""
    raw = [max(times[w] for w in members) + push_s + pull_s for members in communities]
    load = sum(server_s / r for r in raw)
    return [r * max(1.0, load) for r in raw]


def staleness(rounds: Sequence[float]) -> List[float]:
    """Expected number of other communities' updates landing during each one's round."""
    rate = sum(1 / r for r in rounds)
    return [r * (rate - 1 / r) for r in rounds]


def mean_staleness(times: Sequence[float], communities: Communities, **costs) -> float:
    """Staleness of an update averaged over workers (a community weighs by its size)."""
    values = staleness(round_times(times, communities, **costs))
    return sum(len(c) * s for c, s in zip(communities, values)) / len(times)


def reward(times: Sequence[float], communities: Communities,
           traffic_penalty: float = DEFAULT_TRAFFIC_PENALTY, **costs) -> float:
    """Progress per second minus the traffic penalty of ``communities`` (higher is better).

    ``costs``: ``push_s``, ``pull_s``, ``server_s`` of ``round_times``."""
    rounds = round_times(times, communities, **costs)
    # Each member takes its community's round time, so projected_score sees these rounds.
    effective = [0.0] * len(times)
    for members, r in zip(communities, rounds):
        for w in members:
            effective[w] = r
    return projected_score(effective, communities, traffic_penalty)


def count_reward(times: Sequence[float], count: int,
                 traffic_penalty: float = DEFAULT_TRAFFIC_PENALTY, **costs) -> float:
    """Reward of the action ``count``: sort-and-cut into that many communities."""
    return reward(times, sort_and_cut(times, count), traffic_penalty, **costs)
