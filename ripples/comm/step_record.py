"""The fixed-size control record of a planned collective (a gradient bucket plan's step).

Once the members of a group have agreed on a plan (which tensors, in which order, with
which op), each step needs only to know that every member has arrived at the same step of
the same plan, and how many members contribute data (some may have joined). One ``SUM``
all-reduce of six int64 fields answers all of it, whatever the group size: O(log P) with
MPI's tree algorithms, 48 bytes on the wire, no leader.

Fields (each member contributes):

=====  ==================  =================================================
0      active              1 if this member contributes data, 0 if joined
1      joined              1 - active
2, 3   plan hash, squared  of an active member (0 if joined)
4, 5   epoch, squared      the step count of an active member (0 if joined)
=====  ==================  =================================================

Equality of the hash over the active members follows from the sums alone: ``n`` values
are all equal exactly when ``n * sum(x^2) == sum(x)^2`` (their variance is zero). Hashes
and epochs are taken modulo 2^20 so that the squares summed over 2^20 members fit in int64.
"""
from __future__ import annotations

import zlib
from typing import NamedTuple, Sequence

import numpy as np

RECORD_FIELDS = 6
_MODULUS = 1 << 20


def plan_hash(description: Sequence) -> int:
    """A 20-bit hash of a plan's description (its ``repr`` must be equal on every member)."""
    return zlib.crc32(repr(tuple(description)).encode()) % _MODULUS


def encode(active: bool, plan: int, epoch: int) -> np.ndarray:
    """This member's record (a fresh int64 array of ``RECORD_FIELDS``)."""
    if not active:
        return np.array([0, 1, 0, 0, 0, 0], dtype=np.int64)
    h, e = plan % _MODULUS, epoch % _MODULUS
    return np.array([1, 0, h, h * h, e, e * e], dtype=np.int64)


class Agreement(NamedTuple):
    """What the summed records say: ``active`` members contribute; ``same_plan`` and
    ``same_epoch`` over them; ``epoch`` is theirs when they agree (else -1)."""

    active: int
    joined: int
    same_plan: bool
    same_epoch: bool
    epoch: int


def decode(summed: np.ndarray) -> Agreement:
    """The agreement in the element-wise sum of every member's ``encode``."""
    active, joined, h, h2, e, e2 = (int(v) for v in summed)
    same_plan = active * h2 == h * h
    same_epoch = active * e2 == e * e
    epoch = e // active if active and same_epoch else -1
    return Agreement(active, joined, same_plan, same_epoch, epoch)
