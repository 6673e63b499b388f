"""How fast a schedule mixes: the second eigenvalue of ``E[W^T W]``.

One step that averages within the groups of a partition is the matrix ``W`` with ``1/|G|``
on the block of every group ``G``. ``W`` is symmetric and idempotent, so ``W^T W = W``.
For a uniformly random partition into groups of ``k`` (``k`` dividing ``n``) two workers
share a group with probability ``(k-1)/(n-1)``, so ``E[W] = a I + b 11^T`` with
``b = (k-1)/(k(n-1))`` and ``a = 1/k - b``; on the vectors orthogonal to ``1`` (the
disagreement between workers) every eigenvalue is ``a = (n-k)/(k(n-1))``. A smaller value
means the consensus distance shrinks faster per step.
"""
from __future__ import annotations

from typing import Callable, List

import numpy as np

from .base import Group, check_group_size, check_int
from .static import random_partition


def averaging_matrix(partition: List[Group], size: int) -> np.ndarray:
    """The matrix ``W`` of averaging inside every group of ``partition``."""
    w = np.zeros((size, size))
    for group in partition:
        idx = np.asarray(group)
        w[np.ix_(idx, idx)] = 1.0 / len(group)
    return w


def second_eigenvalue(sample: Callable[[int], List[Group]], size: int, samples: int) -> float:
    """Estimate the second largest eigenvalue of ``E[W^T W]`` from ``samples`` partitions
    ``sample(i)``, ``i = 0..samples-1``."""
    check_int("samples", samples, low=1)
    total = np.zeros((size, size))
    for i in range(samples):
        w = averaging_matrix(sample(i), size)
        total += w.T @ w
    eigenvalues = np.linalg.eigvalsh(total / samples)
    return float(eigenvalues[-2])


def random_division_eigenvalue(size: int, group_size: int, samples: int = 2000,
                               seed: int = 0) -> float:
    """:func:`second_eigenvalue` of :func:`random_partition` with ``seed``."""
    check_int("size", size, low=2)
    check_group_size(group_size, size)
    return second_eigenvalue(lambda i: random_partition(seed, i, size, group_size), size, samples)


def expected_random_division_eigenvalue(size: int, group_size: int) -> float:
    """The exact value ``(n-k)/(k(n-1))`` for ``k`` dividing ``n``."""
    check_int("size", size, low=2)
    check_group_size(group_size, size)
    if size % group_size:
        raise ValueError(f"group_size must divide size ({size}) for the closed form, "
                         f"got {group_size}")
    return (size - group_size) / (group_size * (size - 1))
