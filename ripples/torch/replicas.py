"""Replicas that differ: decentralized training keeps one model per rank.

Under ``sync="ripples"`` and ``"adpsgd"`` each rank's model is averaged only with its group's,
so between two global averagings the replicas differ (``hvd.consensus_distance(model)`` says
by how much). A Horovod script saves ``model.state_dict()`` on rank 0: that is rank 0's
replica, not the model the job trained. ``ReplicaCheck`` warns, once, when a model given
to ``DistributedOptimizer(model=...)`` is read by ``state_dict()`` while its replicas may
differ, and ``hvd.average_model(model)`` (one all-reduce, on every rank) makes them equal:
the right thing before evaluating or saving.
"""
from __future__ import annotations

import contextlib
import warnings
from typing import Iterator, Optional

import torch


_own_reads = 0  # > 0 while ripples itself reads a replica on purpose


@contextlib.contextmanager
def own_replica_read() -> Iterator[None]:
    """ripples reads this rank's replica on purpose (an elastic commit saves it, an elastic
    sync broadcasts rank 0's): no warning, and the one warning stays for the user's read."""
    global _own_reads
    _own_reads += 1
    try:
        yield
    finally:
        _own_reads -= 1


class ReplicaCheck:
    """Whether this rank's replica of ``model`` may differ from the others', and the one
    warning when it is read by ``state_dict()`` then. ``model`` may be None (nothing to
    watch)."""

    def __init__(self, model: Optional[torch.nn.Module], rank: int, size: int, sync: str):
        self.rank = rank
        self.sync = sync
        self.differ = False
        self.warned = False
        self._handle = None
        if model is not None and size > 1:
            self._handle = model.register_state_dict_pre_hook(self._read)

    def stepped(self) -> None:
        """A local step (and a partial averaging at most) ran: the replicas may differ."""
        self.differ = True

    def averaged(self) -> None:
        """Every rank now holds the same model (``average_model``)."""
        self.differ = False

    def close(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def _read(self, module, prefix, keep_vars) -> None:
        if self.differ and not self.warned and not prefix and not _own_reads:
            self.warned = True
            warnings.warn(
                f"rank {self.rank} reads the state_dict() of its own replica of a model "
                f"trained with sync={self.sync!r}: the replicas on the ranks differ between "
                "averagings. To save or evaluate the model the job trained, call "
                "hvd.average_model(model) on every rank first (it makes every replica the "
                "average); a checkpoint of this replica alone also resumes fine",
                UserWarning, stacklevel=3)
