"""How long each simulated worker's step takes: a compute model times a speed model.

A step of worker ``w`` takes ``compute.seconds * speed.factor(w, step) + compute.update_s``:
the compute model gives the time of one step on a nominal worker, the speed model the
slowdown of this worker at this step (1 = nominal, 5 = five times slower), which does not
stretch the local update. Slow workers are the highest
ranks, as in ``benchmarks/train.py`` (``--slowdown {last}:5``).
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np

SPEED_MODELS = ("homogeneous", "stragglers", "random", "lognormal")


@dataclasses.dataclass(frozen=True)
class Compute:
    """Time of one step on a nominal worker.

    Either ``step_s`` (a measured or emulated step time) or ``flops_per_step`` and
    ``device_flops`` (sustained FLOP/s of the device): ``step_s = flops / rate``.
    ``update_s``: the local update of every step (the optimizer's pass over the model),
    which a slow worker's slowdown does not scale (``benchmarks/train.py`` slows the padded
    forward and backward only); 0 by default.
    """
    step_s: Optional[float] = None
    flops_per_step: Optional[float] = None
    device_flops: Optional[float] = None
    update_s: float = 0.0

    def __post_init__(self):
        if not self.update_s >= 0:
            raise ValueError(f"update_s must be >= 0 seconds, got {self.update_s!r}")
        if self.step_s is None:
            if not (self.flops_per_step and self.device_flops):
                raise ValueError("Compute needs step_s, or flops_per_step and device_flops")
            if self.flops_per_step <= 0 or self.device_flops <= 0:
                raise ValueError("flops_per_step and device_flops must be > 0")
        elif not self.step_s > 0:
            raise ValueError(f"step_s must be > 0 seconds, got {self.step_s!r}")

    @property
    def seconds(self) -> float:
        if self.step_s is not None:
            return self.step_s
        return self.flops_per_step / self.device_flops


@dataclasses.dataclass(frozen=True)
class Speed:
    """Per-worker, per-step slowdown factors.

    kind:
        ``"homogeneous"``: every step factor 1.
        ``"stragglers"``: the last ``count`` workers are ``factor`` times slower, always.
        ``"random"``: each step of each worker is ``factor`` times slower with probability
            ``probability`` (transient slowdowns), independently.
        ``"lognormal"``: worker ``w`` has a fixed factor ``exp(sigma * z_w)``, ``z_w``
            standard normal drawn once from ``seed`` (persistent spread of speeds), floored
            at 0.1 so no worker is implausibly fast.
    jitter: every step's factor is also multiplied by ``exp(jitter * z)``, ``z`` standard
        normal drawn per step from ``seed`` (the small spread of real step times; 0: none,
        and identical workers step in exact ties).
    """
    kind: str = "homogeneous"
    count: int = 1
    factor: float = 5.0
    probability: float = 0.1
    sigma: float = 0.5
    jitter: float = 0.0

    def __post_init__(self):
        if self.kind not in SPEED_MODELS:
            raise ValueError(f"speed kind must be one of {SPEED_MODELS}, got {self.kind!r}")
        if not self.factor >= 1:
            raise ValueError(f"factor must be >= 1, got {self.factor!r}")
        if not 0 <= self.probability <= 1:
            raise ValueError(f"probability must be in [0, 1], got {self.probability!r}")
        if self.count < 0:
            raise ValueError(f"count must be >= 0, got {self.count!r}")
        if not self.sigma >= 0:
            raise ValueError(f"sigma must be >= 0, got {self.sigma!r}")
        if not self.jitter >= 0:
            raise ValueError(f"jitter must be >= 0, got {self.jitter!r}")

    def sampler(self, workers: int, seed: int) -> "SpeedSampler":
        return SpeedSampler(self, workers, seed)

    def expected_factors(self, workers: int, seed: int) -> np.ndarray:
        """Mean step-time factor of every worker (for the throughput ceiling)."""
        return self.sampler(workers, seed).expected


class SpeedSampler:
    """Draws the factors of :class:`Speed` for ``workers`` workers from ``seed``."""

    def __init__(self, speed: Speed, workers: int, seed: int):
        self.speed = speed
        self._rng = np.random.default_rng([seed, 7])
        fixed = np.ones(workers)
        if speed.kind == "stragglers":
            fixed[max(workers - speed.count, 0):] = speed.factor
        elif speed.kind == "lognormal":
            fixed = np.maximum(np.exp(speed.sigma * self._rng.standard_normal(workers)), 0.1)
        self._fixed = fixed
        if speed.kind == "random":
            self.expected = np.full(workers, 1 + speed.probability * (speed.factor - 1))
        else:
            self.expected = fixed.copy()
        self.expected *= np.exp(speed.jitter ** 2 / 2)  # the mean of the lognormal spread
        self._draws = Blocks(self._rng.random)
        self._spread = Blocks(np.random.default_rng([seed, 11]).standard_normal)

    def factor(self, worker: int) -> float:
        """The factor of ``worker``'s next step."""
        if self.speed.kind != "random":
            factor = float(self._fixed[worker])
        else:
            factor = self.speed.factor if self._draws.next() < self.speed.probability else 1.0
        if self.speed.jitter:
            factor *= float(np.exp(self.speed.jitter * self._spread.next()))
        return factor


class Blocks:
    """Numbers from ``draw(size)``, drawn 4,096 at a time (one numpy call per block)."""

    def __init__(self, draw):
        self.draw = draw
        self.block = np.empty(0)
        self.at = 0

    def next(self) -> float:
        if self.at == len(self.block):
            self.block, self.at = self.draw(4096), 0
        self.at += 1
        return self.block[self.at - 1]
