"""An epoch shared by speed: every rank draws the next part of one common order as it gets
to it, so fast ranks take more and all ranks end the epoch together (pure logic, no MPI).

A fixed epoch split into equal shards, as torch's ``DistributedSampler`` makes it, brings
back the slowest rank's pace whatever the synchronization: every rank must get through its
shard. Here all ranks agree on the epoch's order (the very permutation torch's sampler
builds from ``seed + epoch``: ``ripples.torch.sampler.epoch_order``), and one
:class:`EpochPool` hands out
consecutive *chunks* of it, first come first served, until its end.

Passes. Every iteration of a sampler is one *pass*, numbered 1, 2, ... on each rank; the
pool serves one pass at a time. The first draw of pass ``p`` opens it (position 0, the
drawer's epoch); a draw for an older pass is told that its pass is over; every draw of a
pass must carry the epoch it was opened with (``set_epoch`` called alike on every rank),
else :class:`EpochMismatch`. A rank that starts its next pass before the pool ran out ends
the current pass for everyone (the rest of its order is not handed out).

Exactly once. Positions ``[0, length)`` of a pass are handed out once each, in order; a
chunk handed back (:meth:`EpochPool.return_chunks`, e.g. the one a dead rank held) is
handed out again before new positions. With ``drop_last`` the order is cut to the multiple
of the world size that torch's sampler keeps (:func:`pool_length`); without it, every index
of the dataset once, with none repeated (torch pads its shards with repeats instead).

Chunk size (:class:`ChunkSizer`): a draw costs a round trip, and a rank can end the epoch up
to one chunk after the others. Chunks are therefore sized to last about
``TARGET_CHUNK_S`` of the rank's own work, from the rate at which it consumed its earlier
chunks, or to one batch when the batch size is given.
"""
from __future__ import annotations

import dataclasses
import math
import time
from typing import Callable, Dict, List, Optional, Tuple

from .base import check_int

Chunk = Tuple[int, int]  # positions [start, stop) of a pass's order

# How long one chunk should last: a draw every 25 ms costs about 0.5% of the time at a
# tenth of a millisecond a draw, and ranks end an epoch within about this of each other.
TARGET_CHUNK_S = 0.025
# At least this many chunks per rank per epoch (so that the first chunk, drawn before any
# rate is known, cannot be a large part of a small epoch).
MIN_CHUNKS_PER_RANK = 8
FIRST_CHUNK = 16


class EpochMismatch(ValueError):
    """Ranks iterate the same pass of a shared sampler at different epochs."""


def pool_length(length: int, replicas: int, drop_last: bool) -> int:
    """How many positions of the order a pass hands out: all of them, or with ``drop_last``
    the ``total_size`` torch's sampler keeps (the largest multiple of ``replicas`` that is
    at most ``length``)."""
    if drop_last and length % replicas:
        return math.ceil((length - replicas) / replicas) * replicas
    return length


@dataclasses.dataclass
class EpochPool:
    """The shared position of one sampler's current pass (kept on one rank).

    ``length``: positions per pass. ``holding`` maps each rank to the chunk it drew last:
    it is working on it, as a rank draws again only when its chunk is used up. ``dropped``:
    chunks handed back after every rank was done with their pass, so nobody took them
    (set when the next pass opens; whoever keeps the pool reports them).
    """

    length: int
    pass_no: int = 0
    epoch: Optional[int] = None
    opened_by: Optional[int] = None
    position: int = 0
    returned: List[Chunk] = dataclasses.field(default_factory=list)
    holding: Dict[int, Chunk] = dataclasses.field(default_factory=dict)
    dropped: List[Chunk] = dataclasses.field(default_factory=list)

    def draw(self, rank: int, pass_no: int, epoch: int, amount: int) -> Optional[Chunk]:
        """The next chunk of pass ``pass_no`` for ``rank`` (at most ``amount`` positions),
        or None when that pass is over. Raises :class:`EpochMismatch` when the pass was
        opened with another epoch."""
        if pass_no > self.pass_no:
            self.pass_no, self.epoch, self.opened_by = pass_no, epoch, rank
            self.dropped, self.returned = self.returned, []
            self.position, self.holding = 0, {}
        elif pass_no < self.pass_no:
            return None
        if epoch != self.epoch:
            raise EpochMismatch(
                f"rank {rank} iterates pass {pass_no} of a shared DistributedSampler at epoch "
                f"{epoch}, but rank {self.opened_by} started that pass at epoch {self.epoch}: "
                "call sampler.set_epoch(epoch) with the same epoch on every rank before "
                "each epoch")
        if self.returned:
            chunk = self.returned.pop(0)
        elif self.position < self.length:
            chunk = (self.position, min(self.length, self.position + amount))
            self.position = chunk[1]
        else:
            self.holding.pop(rank, None)
            return None
        self.holding[rank] = chunk
        return chunk

    def return_chunks(self, ranks) -> List[Chunk]:
        """Hand the chunks ``ranks`` hold back to the pool (they died before finishing
        them): the next draws take them first. Returns them."""
        back = [self.holding.pop(r) for r in sorted(ranks) if r in self.holding]
        self.returned.extend(back)
        return back


def undrawn(position: int, drawn) -> List[Chunk]:
    """The parts of positions ``[0, position)`` that no chunk of ``drawn`` covers, in order:
    what a pool rebuilt from its surviving drawers, after the rank that kept it died, hands
    out again (the dead drew them, or were handing them out)."""
    gaps, start = [], 0
    for first, stop in sorted(drawn):
        if first > start:
            gaps.append((start, min(first, position)))
        start = max(start, stop)
    if start < position:
        gaps.append((start, position))
    return [gap for gap in gaps if gap[0] < gap[1]]


class ChunkSizer:
    """How many positions the next draw asks for (state of one rank's sampler).

    With ``batch_size``: one batch per draw, so draws follow the DataLoader's batches.
    Without: ``FIRST_CHUNK`` (at most ``cap``) until the rate at which this rank consumes
    positions is measured, then the positions it consumes in ``target_s``, between 1 and
    ``cap``. The rate is that of the current pass (all positions drawn before the last
    chunk, over the time since the pass's first draw), or the last pass's early in a pass.
    """

    def __init__(self, cap: int, batch_size: Optional[int] = None,
                 target_s: float = TARGET_CHUNK_S, clock: Callable[[], float] = time.monotonic):
        check_int("cap", cap, low=1)
        if batch_size is not None:
            check_int("batch_size", batch_size, low=1)
        self.cap = cap
        self.batch_size = batch_size
        self.target_s = target_s
        self._clock = clock
        self._rate: Optional[float] = None  # positions per second
        self._pass_start: Optional[float] = None
        self._consumed = 0  # positions of the pass drawn before the last chunk
        self._last = 0  # size of the last chunk drawn

    def start_pass(self) -> None:
        self._pass_start, self._consumed, self._last = None, 0, 0

    def next_size(self) -> int:
        if self.batch_size is not None:
            return self.batch_size
        now = self._clock()
        if self._pass_start is None:
            self._pass_start = now
        else:
            self._consumed += self._last
            elapsed = now - self._pass_start
            if elapsed >= self.target_s and self._consumed:
                self._rate = self._consumed / elapsed
        if self._rate is None:
            return min(self.cap, FIRST_CHUNK)
        return max(1, min(self.cap, round(self._rate * self.target_s)))

    def drew(self, chunk: Chunk) -> None:
        """Record the chunk the pool gave (it may be shorter than asked, at the end)."""
        self._last = chunk[1] - chunk[0]


def chunk_cap(length: int, replicas: int) -> int:
    """The largest chunk: at least ``MIN_CHUNKS_PER_RANK`` chunks per rank per pass."""
    return max(1, length // (replicas * MIN_CHUNKS_PER_RANK))
