"""PSLD: elastic parameter-server load distribution, as a small state object and pure
functions (no MPI, no tensors). The worker-side driver is ``ripples.ps.balancer``.

Inputs, once per iteration: the iteration time and every active server's time ``T_k`` (as
measured by the workers: from the start of a push to that server's answer to the pull;
the median over workers). A decision uses the medians over a window of ``window``
iterations measured under one map, then starts a fresh window:

1. **Judge a running exploration.** After an exploratory move, the next window's median
   iteration time is compared with the window before the move; if it is not lower, the
   move is rolled back (the previous owners come back).
2. **Exploit.** Servers with ``T_k > (1 + delta) * median_k T_k`` straggle. Each server's
   cost per byte is ``T_k / bytes_k``; a spare (no bytes yet) is assumed to cost the median
   per byte of the active servers that do not straggle. Greedy min-max then moves, one at
   a time, a chunk of the server with the largest predicted time to the server where the
   predicted times, largest first, become lexicographically smallest, while that improves
   them (at most ``max_moves`` chunks). Moving onto a spare is scale-out.
3. **Scale in.** With no straggler, the active server with the least load is returned to
   spare when spreading its chunks greedily over the others raises the predicted maximum
   by at most ``scale_in_slack`` (that is, when the load allows).
4. **Explore.** Otherwise, with probability ``epsilon``, one random chunk moves from a
   random active server to a random other server (spares included), and step 1 judges it.

Choices where the paper leaves details open: the per-server time is the push-to-pull
answer time the workers see (under BSP it includes the server's whole service time for the
round); the cost model is linear in bytes (no fixed part), which keeps the predictor one
number per server; only explorations are rolled back (an exploiting move follows the
measurements; rolling it back on noise would oscillate); decisions are made from fresh
windows only, since times measured under the old map say nothing about the new one.
"""
from __future__ import annotations

import dataclasses
import random
import statistics
from typing import Dict, List, Mapping, Optional, Sequence, Tuple


@dataclasses.dataclass(frozen=True)
class PSLDConfig:
    """Knobs of the scheduler (see the module docstring).

    delta: straggler threshold over the median; epsilon: probability of exploring at a
    decision; window: iterations per decision (>= 1); explore: False disables exploration;
    max_moves: chunks moved by one exploiting decision; scale_in_slack: allowed rise of the
    predicted maximum when a server is returned to spare; seed: the exploration draws.
    """

    delta: float = 0.1
    epsilon: float = 0.1
    window: int = 5
    explore: bool = True
    max_moves: int = 16
    scale_in_slack: float = 0.05
    seed: int = 0

    def __post_init__(self):
        if not (isinstance(self.window, int) and self.window >= 1):
            raise ValueError(f"PSLDConfig.window must be an integer >= 1, got {self.window!r}")
        if not 0.0 <= self.epsilon <= 1.0:
            raise ValueError(f"PSLDConfig.epsilon must be in [0, 1], got {self.epsilon!r}")
        if self.delta < 0 or self.scale_in_slack < 0:
            raise ValueError("PSLDConfig.delta and scale_in_slack must be >= 0")
        if not (isinstance(self.max_moves, int) and self.max_moves >= 1):
            raise ValueError(f"PSLDConfig.max_moves must be an integer >= 1, got {self.max_moves!r}")


@dataclasses.dataclass
class PSLDState:
    """What the scheduler remembers between iterations."""

    config: PSLDConfig
    rng: random.Random
    samples: List[Tuple[float, Dict[int, float]]] = dataclasses.field(default_factory=list)
    trial: Optional[dict] = None  # the map before a running exploration, and its time
    counts: Dict[str, int] = dataclasses.field(default_factory=lambda: {
        "exploit": 0, "explore": 0, "rollback": 0, "scale_in": 0, "kept": 0})


@dataclasses.dataclass(frozen=True)
class Decision:
    """A new assignment: ``owners[cid]`` and the ``active`` servers; ``kind`` is one of
    ``exploit``, ``explore``, ``rollback``, ``scale_in``."""

    owners: Tuple[int, ...]
    active: Tuple[int, ...]
    kind: str


def new_state(config: PSLDConfig) -> PSLDState:
    return PSLDState(config, random.Random(config.seed))


def stragglers(times: Mapping[int, float], delta: float) -> List[int]:
    """Servers whose time exceeds ``(1 + delta)`` times the median time."""
    if not times:
        return []
    median = statistics.median(times.values())
    return sorted(k for k, t in times.items() if t > (1 + delta) * median)


def loads(sizes: Sequence[int], owners: Sequence[int], servers: Sequence[int]) -> Dict[int, int]:
    """Bytes each of ``servers`` owns."""
    out = {s: 0 for s in servers}
    for size, owner in zip(sizes, owners):
        out[owner] = out.get(owner, 0) + size
    return out


def rates(times: Mapping[int, float], load: Mapping[int, int], servers: Sequence[int],
          delta: float) -> Dict[int, float]:
    """Seconds per byte of every server in ``servers``: measured ones from ``times`` and
    ``load``; the others (no bytes or no time yet) at the median of the active servers
    that do not straggle."""
    measured = {k: times[k] / load[k] for k in times if load.get(k, 0) > 0}
    slow = set(stragglers(times, delta))
    typical = [r for k, r in measured.items() if k not in slow] or list(measured.values())
    fallback = statistics.median(typical) if typical else 1.0
    return {s: measured.get(s, fallback) for s in servers}


def greedy_minmax(sizes: Sequence[int], owners: Sequence[int], rate: Mapping[int, float],
                  candidates: Sequence[int], max_moves: int,
                  evict: Sequence[int] = ()) -> Tuple[int, ...]:
    """Move chunks to lower the largest predicted time ``rate[s] * bytes[s]``.

    First every chunk of a server in ``evict`` goes where it raises the maximum least; then,
    up to ``max_moves`` times, the chunk of the most loaded server whose move improves
    ``score`` most goes to its best server among ``candidates``. Pure; ties go to lower ids.
    """
    owners = list(owners)
    load = loads(sizes, owners, candidates)
    targets = [s for s in candidates if s not in evict]

    def predicted(s):
        return rate[s] * load[s]

    for cid in sorted((c for c, o in enumerate(owners) if o in evict), key=lambda c: -sizes[c]):
        dst = min(targets, key=lambda s: (rate[s] * (load[s] + sizes[cid]), s))
        load[owners[cid]] -= sizes[cid]
        load[dst] += sizes[cid]
        owners[cid] = dst
    for _ in range(max_moves):
        src = max(targets, key=lambda s: (predicted(s), -s))
        current = score(rate, load, targets)
        best = None
        for cid in (c for c, o in enumerate(owners) if o == src):
            for dst in targets:
                if dst == src:
                    continue
                load[src] -= sizes[cid]
                load[dst] += sizes[cid]
                after = score(rate, load, targets)
                load[src] += sizes[cid]
                load[dst] -= sizes[cid]
                if after < current and (best is None or after < best[0]):
                    best = (after, cid, dst)
        if best is None:
            break
        _, cid, dst = best
        load[src] -= sizes[cid]
        load[dst] += sizes[cid]
        owners[cid] = dst
    return tuple(owners)


def score(rate: Mapping[int, float], load: Mapping[int, int], servers: Sequence[int]):
    """Predicted times, largest first: a move is better when this is lexicographically
    smaller, i.e. it lowers the maximum, or keeps it and lowers the next one (so that two
    servers tied at the maximum can both be relieved, one move at a time)."""
    return tuple(sorted((rate[s] * load[s] for s in servers), reverse=True))


def _active_of(owners: Sequence[int]) -> Tuple[int, ...]:
    return tuple(sorted(set(owners)))


def observe(state: PSLDState, iteration_s: float, times: Mapping[int, float],
            sizes: Sequence[int], owners: Sequence[int], active: Sequence[int],
            num_servers: int) -> Optional[Decision]:
    """Record one iteration measured under the map ``(owners, active)``; return a new
    assignment when a window is complete and one is called for, else None.

    ``times`` holds ``T_k`` for the active servers; ``sizes[cid]`` is a chunk's bytes.
    The caller must call ``reset_window`` whenever the map changes under it.
    """
    cfg = state.config
    state.samples.append((iteration_s, dict(times)))
    if len(state.samples) < cfg.window:
        return None
    iteration = statistics.median(s for s, _ in state.samples)
    median_times = {k: statistics.median(t[k] for _, t in state.samples if k in t)
                    for k in active if any(k in t for _, t in state.samples)}
    state.samples = []
    owners = tuple(owners)
    if state.trial is not None:
        trial, state.trial = state.trial, None
        if iteration >= trial["iteration_s"]:
            state.counts["rollback"] += 1
            return Decision(trial["owners"], trial["active"], "rollback")
        state.counts["kept"] += 1
    all_servers = list(range(num_servers))
    load = loads(sizes, owners, all_servers)
    rate = rates(median_times, load, all_servers, cfg.delta)
    if stragglers(median_times, cfg.delta):
        moved = greedy_minmax(sizes, owners, rate, all_servers, cfg.max_moves)
        if moved != owners:
            state.counts["exploit"] += 1
            return Decision(moved, _active_of(moved), "exploit")
    else:
        shrunk = scale_in(sizes, owners, rate, active, cfg)
        if shrunk is not None:
            state.counts["scale_in"] += 1
            return Decision(shrunk, _active_of(shrunk), "scale_in")
    if cfg.explore and state.rng.random() < cfg.epsilon:
        moved = explore(state.rng, owners, active, num_servers)
        if moved is not None:
            state.counts["explore"] += 1
            state.trial = {"owners": owners, "active": tuple(active), "iteration_s": iteration}
            return Decision(moved, _active_of(moved), "explore")
    return None


def scale_in(sizes: Sequence[int], owners: Sequence[int], rate: Mapping[int, float],
             active: Sequence[int], cfg: PSLDConfig) -> Optional[Tuple[int, ...]]:
    """Owners without the least-loaded active server, when that raises the predicted
    maximum by at most ``cfg.scale_in_slack``; else None."""
    if len(active) < 2:
        return None
    load = loads(sizes, owners, active)
    current = max(rate[s] * load[s] for s in active)
    victim = min(active, key=lambda s: (rate[s] * load[s], -s))
    shrunk = greedy_minmax(sizes, owners, rate, list(active), 0, evict=[victim])
    after = max(rate[s] * b for s, b in loads(sizes, shrunk, active).items())
    return shrunk if after <= current * (1 + cfg.scale_in_slack) else None


def explore(rng: random.Random, owners: Sequence[int], active: Sequence[int],
            num_servers: int) -> Optional[Tuple[int, ...]]:
    """One random chunk of a random active server moved to a random other server."""
    holders = sorted({o for o in owners if o in active})
    if not holders or num_servers < 2:
        return None
    src = rng.choice(holders)
    cid = rng.choice([c for c, o in enumerate(owners) if o == src])
    dst = rng.choice([s for s in range(num_servers) if s != src])
    moved = list(owners)
    moved[cid] = dst
    return tuple(moved)


def reset_window(state: PSLDState) -> None:
    """Forget the samples of the current window (the map changed under them)."""
    state.samples = []


def load_ratio(values: Sequence[float]) -> float:
    """max / mean of per-server loads (1.0 is perfectly balanced)."""
    values = list(values)
    mean = sum(values) / len(values) if values else 0.0
    return max(values) / mean if mean > 0 else 1.0
