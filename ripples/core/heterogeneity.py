"""Heterogeneity injection: make chosen ranks slow, reproducibly, in any script.

Settings (``Config`` fields, ``ripplesrun`` flags):

* ``slowdown`` / ``--slowdown "RANK:FACTOR[,RANK:FACTOR]"``: rank ``RANK`` is always
  ``FACTOR`` times slower.
* ``random_slowdown`` / ``--random-slowdown "P:FACTOR"``: at every step every rank is
  ``FACTOR`` times slower with probability ``P``. The draw is a pure function of
  ``(seed, rank, step)``, so a run repeats exactly with the same seed.
* ``compute_ms`` / ``--compute-ms T``: emulated compute; every step is padded to ``T``
  milliseconds by sleeping, so many ranks on few cores measure synchronization rather
  than CPU contention.

Per step the injector applies, in this order:

1. measure ``t``, the time the step's own work took;
2. padding: if ``compute_ms`` is ``T > 0`` and ``t < T``, sleep ``T - t``; the step time
   becomes ``s = max(t, T)``;
3. slowdown: with factor ``f`` for this step, sleep ``(f - 1) * s``; the step took
   ``f * s`` in total. ``f`` is the rank's deterministic factor, multiplied by the
   random factor on steps the random draw marks slow (1 otherwise).
"""
from __future__ import annotations

import contextlib
import hashlib
import math
import time
from typing import Callable, Dict, Iterator, Mapping, Optional, Tuple

__all__ = ["parse_slowdown", "parse_random_slowdown", "SlowdownInjector"]


def parse_slowdown(spec: str, world_size: Optional[int] = None,
                   setting: str = "slowdown") -> Dict[int, float]:
    """Parse ``"RANK:FACTOR[,RANK:FACTOR]"`` into ``{rank: factor}``.

    An empty string means no slowdown (``{}``). Ranks are integers >= 0 (and < ``world_size``
    when given), each listed once; factors are numbers >= 1. Raises ``ValueError`` naming
    ``setting`` otherwise.
    """
    if not isinstance(spec, str):
        raise TypeError(f"{setting} must be a string like '7:5,3:2', got {type(spec).__name__}")
    factors: Dict[int, float] = {}
    if not spec.strip():
        return factors
    for item in spec.split(","):
        rank_text, sep, factor_text = item.strip().partition(":")
        if not sep:
            raise ValueError(f"{setting}: {item.strip()!r} is not RANK:FACTOR (e.g. '7:5,3:2')")
        try:
            rank = int(rank_text)
        except ValueError:
            raise ValueError(f"{setting}: rank {rank_text!r} in {item.strip()!r} "
                             "is not an integer") from None
        factor = _parse_factor(factor_text, item.strip(), setting)
        if rank < 0:
            raise ValueError(f"{setting}: rank {rank} must be >= 0")
        if world_size is not None and rank >= world_size:
            raise ValueError(f"{setting}: rank {rank} does not exist in a job of "
                             f"{world_size} ranks (ranks are 0..{world_size - 1})")
        if rank in factors:
            raise ValueError(f"{setting}: rank {rank} is listed twice")
        factors[rank] = factor
    return factors


def parse_random_slowdown(spec: str, setting: str = "random_slowdown") -> Tuple[float, float]:
    """Parse ``"P:FACTOR"`` into ``(p, factor)``; ``""`` gives ``(0.0, 1.0)`` (never slow).

    ``P`` is a probability in [0, 1], ``FACTOR`` a number >= 1. Raises ``ValueError``
    naming ``setting`` otherwise.
    """
    if not isinstance(spec, str):
        raise TypeError(f"{setting} must be a string like '0.1:5', got {type(spec).__name__}")
    if not spec.strip():
        return (0.0, 1.0)
    p_text, sep, factor_text = spec.strip().partition(":")
    if not sep:
        raise ValueError(f"{setting}: {spec!r} is not P:FACTOR (e.g. '0.1:5')")
    try:
        p = float(p_text)
    except ValueError:
        raise ValueError(f"{setting}: probability {p_text!r} is not a number") from None
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"{setting}: probability {p} must be in [0, 1]")
    return (p, _parse_factor(factor_text, spec.strip(), setting))


def _parse_factor(text: str, item: str, setting: str) -> float:
    try:
        factor = float(text)
    except ValueError:
        raise ValueError(f"{setting}: factor {text!r} in {item!r} is not a number") from None
    if not (math.isfinite(factor) and factor >= 1.0):
        raise ValueError(f"{setting}: factor {factor} in {item!r} must be a finite number >= 1 "
                         "(1 = normal speed, 5 = five times slower)")
    return factor


def _uniform(seed: int, rank: int, step: int) -> float:
    """A number in [0, 1) that depends only on (seed, rank, step), the same on every platform."""
    digest = hashlib.sha256(f"ripples-slowdown:{seed}:{rank}:{step}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0 ** 64


class SlowdownInjector:
    """Pads and slows the steps of one rank; see the module docstring for the exact rule.

    Use ``with injector.step(): compute()`` around each step's own work, or call
    ``finish_step(elapsed_s)`` with a time you measured yourself. ``clock`` and ``sleep``
    are injectable for tests.

    Recorded: ``steps`` (finished steps), ``slept_s`` (total sleep), ``padded_s`` (sleep
    spent on padding), ``slowed_s`` (sleep spent on slowdown), ``slow_steps`` (steps whose
    factor was > 1), ``last_sleep_s``.
    """

    def __init__(self, rank: int, factors: Optional[Mapping[int, float]] = None,
                 random: Optional[Tuple[float, float]] = None, compute_ms: float = 0.0,
                 seed: int = 0, clock: Callable[[], float] = time.perf_counter,
                 sleep: Callable[[float], None] = time.sleep):
        if not isinstance(rank, int) or rank < 0:
            raise ValueError(f"rank must be an integer >= 0, got {rank!r}")
        factors = dict(factors or {})
        for r, f in factors.items():
            if not (isinstance(r, int) and r >= 0):
                raise ValueError(f"factors: rank {r!r} must be an integer >= 0")
            if not (math.isfinite(f) and f >= 1.0):
                raise ValueError(f"factors: factor {f!r} of rank {r} must be >= 1")
        p, random_factor = random if random is not None else (0.0, 1.0)
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"random: probability {p!r} must be in [0, 1]")
        if not (math.isfinite(random_factor) and random_factor >= 1.0):
            raise ValueError(f"random: factor {random_factor!r} must be >= 1")
        if not (math.isfinite(compute_ms) and compute_ms >= 0):
            raise ValueError(f"compute_ms must be a number >= 0, got {compute_ms!r}")
        if not isinstance(seed, int):
            raise TypeError(f"seed must be an integer, got {type(seed).__name__}")
        self.rank = rank
        self.factor = float(factors.get(rank, 1.0))
        self.random_p = float(p)
        self.random_factor = float(random_factor)
        self.compute_s = compute_ms / 1000.0
        self.seed = seed
        self._clock = clock
        self._sleep = sleep
        self.steps = 0
        self.slow_steps = 0
        self.slept_s = 0.0
        self.padded_s = 0.0
        self.slowed_s = 0.0
        self.last_sleep_s = 0.0

    @classmethod
    def from_config(cls, config, rank: int, world_size: Optional[int] = None,
                    **kwargs) -> "SlowdownInjector":
        """Build the injector from ``Config`` fields slowdown, random_slowdown, compute_ms, seed.

        ``kwargs`` (``clock``, ``sleep``) are passed through.
        """
        return cls(rank,
                   factors=parse_slowdown(config.slowdown, world_size, "RIPPLES_SLOWDOWN"),
                   random=parse_random_slowdown(config.random_slowdown, "RIPPLES_RANDOM_SLOWDOWN"),
                   compute_ms=config.compute_ms, seed=config.seed, **kwargs)

    @property
    def enabled(self) -> bool:
        """False when the injector never sleeps (no padding, no slowdown for this rank)."""
        return (self.compute_s > 0 or self.factor > 1.0
                or (self.random_p > 0 and self.random_factor > 1.0))

    def factor_at(self, step: int) -> float:
        """The slowdown factor of this rank at ``step`` (pure: depends on seed, rank, step)."""
        factor = self.factor
        if self.random_p > 0 and _uniform(self.seed, self.rank, step) < self.random_p:
            factor *= self.random_factor
        return factor

    def finish_step(self, elapsed_s: float) -> float:
        """Apply padding and slowdown to a step whose own work took ``elapsed_s``.

        Sleeps as needed, advances the step counter, and returns the seconds slept.
        """
        if elapsed_s < 0:
            raise ValueError(f"elapsed_s must be >= 0, got {elapsed_s!r}")
        pad = max(0.0, self.compute_s - elapsed_s)
        step_s = elapsed_s + pad
        factor = self.factor_at(self.steps)
        slow = (factor - 1.0) * step_s
        total = pad + slow
        if total > 0:
            self._sleep(total)
        self.steps += 1
        self.slow_steps += factor > 1.0
        self.padded_s += pad
        self.slowed_s += slow
        self.slept_s += total
        self.last_sleep_s = total
        return total

    @contextlib.contextmanager
    def step(self) -> Iterator["SlowdownInjector"]:
        """Context manager around one step's work; on exit pads and slows the step."""
        start = self._clock()
        yield self
        self.finish_step(max(0.0, self._clock() - start))
