"""The unit of work of the communication engine: one named collective on one group."""
from __future__ import annotations

import time
from typing import Callable, List, Optional, Sequence, Tuple

import torch

from ripples.ops.handles import Handle

Pair = Tuple[torch.Tensor, torch.Tensor]


class Request:
    """One named collective on one group.

    An all-reduce carries ``pair`` and a ``wire`` text starting with ``"allreduce|"`` and is
    fused with its neighbours of equal ``fuse_key``; anything else carries ``run(comm,
    active)``, which does the data movement once the members agreed.
    """

    __slots__ = ("name", "group", "what", "signature", "wire", "handle", "pair", "reduce",
                 "run", "fuse_key", "nbytes", "submitted", "missing")

    def __init__(self, name: str, group, what: str, signature: str, handle: Handle,
                 wire: str = "", pair: Optional[Pair] = None, reduce=None,
                 run: Optional[Callable] = None):
        self.name, self.group, self.what = name, tuple(group), what
        self.signature, self.wire, self.handle = signature, wire, handle
        self.pair, self.reduce, self.run = pair, reduce, run
        self.fuse_key = wire.split("|", 2)[1] if pair is not None else None
        self.nbytes = pair[0].numel() * pair[0].element_size() if pair is not None else 0
        self.submitted = time.monotonic()
        self.missing: Optional[List[int]] = None


def ring_can_carry(request: Request) -> bool:
    """Whether a group's ring can move ``request`` at all: a host all-reduce (anything
    else, and device tensors, run on the group's communicator)."""
    return request.pair is not None and not request.pair[0].is_cuda


def fusion_chunks(sizes: Sequence[int], threshold: int) -> List[List[int]]:
    """Indices of consecutive items split into runs of at most ``threshold`` bytes (a bigger
    item runs alone). Every rank, joined or not, computes the same runs from the sizes."""
    chunks: List[List[int]] = []
    current: List[int] = []
    total = 0
    for index, size in enumerate(sizes):
        if current and total + size > threshold:
            chunks.append(current)
            current, total = [], 0
        current.append(index)
        total += size
    if current:
        chunks.append(current)
    return chunks
