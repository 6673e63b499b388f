"""Statistical efficiency from real arithmetic: every simulated worker holds the parameter
vector of a logistic regression and trains it with real mini-batch SGD with momentum.

The problem is synthetic and fixed by ``seed``: features ``x ~ N(0, I_d)``, a true weight
vector ``w*`` with ``||w*|| = margin``, labels ``y ~ Bernoulli(sigmoid(x . w*))``. The loss
is the mean logistic loss on a held-out set. All workers start from the same zero vector
(as after a broadcast); momentum buffers stay local, as in ripples' decentralized modes.

Two ways to combine workers, the two kinds of synchronization the schedules use:

* :meth:`Workers.average_parameters` ``x_i <- mean_G x_j`` (P-Reduce of a group): a worker's
  own SGD step is applied when its computation ends, before any averaging;
* :meth:`Workers.average_gradients` (all-reduce of gradients): the members' gradients are
  averaged and every member applies the mean with its own momentum.

Steps are applied lazily and in batches: a worker whose computation ended holds a pending
step until its parameters are next needed, and then every pending step is applied in one
vectorized numpy call. This is exact: a worker's parameters cannot change between the end
of its computation and its next averaging, which is the next time they are read.

A gradient is taken at the parameters its computation started from. Only asynchronous
AD-PSGD changes a worker's parameters while it computes (an active worker averages with a
passive one that is computing); :meth:`Workers.average_parameters` then keeps the passive
worker's parameters from before the first such change, and its running step's gradient is
taken there and applied to the averaged parameters, as a real passive rank does.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Iterable

import numpy as np


@dataclasses.dataclass(frozen=True)
class Problem:
    """The synthetic logistic regression and its optimizer settings."""
    dim: int = 32
    margin: float = 4.0
    train_samples: int = 65536
    test_samples: int = 8192
    batch: int = 32
    lr: float = 0.05
    momentum: float = 0.9
    seed: int = 0

    def __post_init__(self):
        for name in ("dim", "train_samples", "test_samples", "batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if not self.lr > 0 or not 0 <= self.momentum < 1:
            raise ValueError(f"lr must be > 0 and momentum in [0, 1), got {self.lr}, {self.momentum}")


class Data:
    """The train and test sets of a :class:`Problem`."""

    def __init__(self, problem: Problem):
        rng = np.random.default_rng([problem.seed, 1])
        truth = rng.standard_normal(problem.dim)
        truth *= problem.margin / np.linalg.norm(truth)
        n = problem.train_samples + problem.test_samples
        x = rng.standard_normal((n, problem.dim))
        y = (rng.random(n) < 1 / (1 + np.exp(-x @ truth))).astype(np.float64)
        self.x_train, self.y_train = x[:problem.train_samples], y[:problem.train_samples]
        self.x_test, self.y_test = x[problem.train_samples:], y[problem.train_samples:]
        for array in (x, y):  # shared between runs by data_of(): never written
            array.flags.writeable = False

    def loss(self, weights: np.ndarray) -> np.ndarray:
        """Mean logistic loss on the test set of each row of ``weights`` (or of a vector)."""
        z = self.x_test @ np.atleast_2d(weights).T  # (samples, models)
        # log(1 + e^z) - y z, computed stably
        losses = np.logaddexp(0, z) - self.y_test[:, None] * z
        return losses.mean(axis=0)


@functools.lru_cache(maxsize=8)
def data_of(problem: Problem) -> Data:
    """The :class:`Data` of ``problem``, made once: a sweep builds many runs of one problem
    and drawing its sets costs more than a short run."""
    return Data(problem)


class Workers:
    """The parameter vectors and momentum buffers of ``count`` workers."""

    def __init__(self, problem: Problem, count: int, data: Data | None = None, seed: int = 0):
        self.problem = problem
        self.data = data or data_of(problem)
        self.params = np.zeros((count, problem.dim))
        self.momentum = np.zeros((count, problem.dim))
        self._rng = np.random.default_rng([problem.seed, seed, 2])
        self._pending: list = []
        self._started_at: dict = {}  # worker -> parameters its running computation started from

    def step_done(self, worker: int) -> None:
        """``worker`` finished computing a gradient at its current parameters."""
        self._pending.append(worker)

    def _gradients(self, workers: np.ndarray, batch: int | None = None) -> np.ndarray:
        p = self.problem
        batch = batch or p.batch
        index = self._rng.integers(0, p.train_samples, size=(len(workers), batch))
        x, y = self.data.x_train[index], self.data.y_train[index]  # (m, b, d), (m, b)
        params = self.params[workers]
        for i, w in enumerate(workers.tolist() if self._started_at else ()):
            started_at = self._started_at.pop(w, None)
            if started_at is not None:
                params[i] = started_at
        z = np.einsum("mbd,md->mb", x, params)
        residual = 1 / (1 + np.exp(-z)) - y
        return np.einsum("mb,mbd->md", residual, x) / batch

    def _apply(self, workers: np.ndarray, gradients: np.ndarray) -> None:
        p = self.problem
        self.momentum[workers] = p.momentum * self.momentum[workers] + gradients
        self.params[workers] -= p.lr * self.momentum[workers]

    def gradient(self, worker: int, batch: int | None = None) -> np.ndarray:
        """A mini-batch gradient at ``worker``'s current parameters, now (parameter-server
        modes, where the worker pushes it instead of applying it); ``batch`` samples
        (default the problem's batch)."""
        return self._gradients(np.array([worker]), batch)[0]

    def flush(self) -> None:
        """Apply every pending local SGD step (parameter-averaging modes)."""
        if self._pending:
            workers = np.asarray(self._pending)
            self._pending.clear()
            self._apply(workers, self._gradients(workers))

    def average_parameters(self, group: Iterable[int], computing: Iterable[int] = ()) -> None:
        """P-Reduce: the members' parameters become their mean. ``computing``: members in
        the middle of a computation, whose gradient stays at the parameters it started from."""
        self.flush()
        for w in computing:
            if w not in self._started_at:
                self._started_at[w] = self.params[w].copy()
        members = np.asarray(group)
        if len(members) > 1:
            self.params[members] = self.params[members].mean(axis=0)

    def average_gradients(self, group: Iterable[int]) -> None:
        """All-reduce of gradients: each member's pending gradient (all taken at the same
        parameters) is replaced by the members' mean and applied."""
        members = np.asarray(group)
        self._pending = [w for w in self._pending if w not in set(group)]
        grads = self._gradients(members)
        self._apply(members, np.broadcast_to(grads.mean(axis=0), grads.shape))

    def loss(self, worker: int | None = None) -> float:
        """Test loss of ``worker``'s model, or of the averaged model when None."""
        weights = self.params.mean(axis=0) if worker is None else self.params[worker]
        return float(self.data.loss(weights)[0])

    def consensus_distance(self) -> float:
        """``mean_i ||x_i - x_mean||^2``."""
        return float(((self.params - self.params.mean(axis=0)) ** 2).sum(axis=1).mean())


class Server:
    """The parameter servers' model, all shards together: the server-side SGD with momentum
    that ``sync="ps"`` runs with the user's optimizer, on one vector."""

    def __init__(self, problem: Problem):
        self.problem = problem
        self.params = np.zeros(problem.dim)
        self.momentum = np.zeros(problem.dim)
        self.version = 0  # updates applied

    def apply(self, gradient: np.ndarray, scale: float) -> None:
        """One optimizer step with the learning rate times ``scale``."""
        p = self.problem
        self.momentum = p.momentum * self.momentum + gradient
        self.params = self.params - p.lr * scale * self.momentum
        self.version += 1


def allreduce_loss_curve(problem: Problem, workers: int, steps: int, data: Data | None = None,
                         seed: int = 0) -> np.ndarray:
    """Test loss after each of ``steps`` synchronous all-reduce steps of ``workers``
    workers (entry ``s`` is the loss after ``s + 1`` steps). Used to define a target loss
    as "what all-reduce reaches after S steps"."""
    sim = Workers(problem, 1, data, seed)
    curve = np.empty(steps)
    for s in range(steps):
        grads = sim._gradients(np.zeros(workers, dtype=np.int64))
        sim._apply(np.zeros(1, dtype=np.int64), grads.mean(axis=0, keepdims=True))
        curve[s] = sim.loss(0)
    return curve
