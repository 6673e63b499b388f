"""``ripples.torch.DistributedSampler``: torch's ``DistributedSampler``, whose epochs are
shared by speed when the job's optimizer lets ranks take different numbers of steps.

With equal shards, every rank must get through ``len(dataset) / size`` samples per epoch,
so the epoch takes as long as the slowest rank needs, whatever the synchronization. Under
``DistributedOptimizer(sync="ripples")`` with a generator schedule, or ``sync="adpsgd"``,
this sampler instead lets every rank draw the next chunk of the epoch's common order as it
gets to it (``ripples.schedule.shared_epoch``): fast ranks train on more batches, and all
ranks end the epoch at about the same time, so a per-epoch all-reduce of a metric, or a
checkpoint, waits for nobody. Every sample is used exactly once per epoch.

The chunks are handed out by a thread on rank 0 (``WorkPool``, one for every shared
sampler of the job; ``ripples.comm.request_service`` says why not MPI one-sided).
"""
from __future__ import annotations

import logging
import numbers
import warnings
import weakref
from typing import Dict, Iterator, List, Optional

import torch
import torch.utils.data.distributed as torch_distributed

from ripples import runtime as _runtime
from ripples.comm.failures import revoke
from ripples.comm.request_service import RequestService
from ripples.core.errors import RanksFailedError
from ripples.ops.collectives import allgather_object
from ripples.schedule.shared_epoch import (Chunk, ChunkSizer, EpochPool, chunk_cap,
                                           pool_length, undrawn)

__all__ = ["DistributedSampler", "epoch_order"]

log = logging.getLogger("ripples")


def epoch_order(length: int, shuffle: bool, seed: int, epoch: int) -> List[int]:
    """The order of an epoch: ``torch.randperm(length)`` from a generator seeded with
    ``seed + epoch``, as torch's ``DistributedSampler`` draws it, or ``0..length-1``."""
    if not shuffle:
        return list(range(length))
    generator = torch.Generator()
    generator.manual_seed(seed + epoch)
    return torch.randperm(length, generator=generator).tolist()


class DistributedSampler(torch_distributed.DistributedSampler):
    """A drop-in for ``torch.utils.data.distributed.DistributedSampler`` (a subclass of it)
    whose epoch is one pool that ranks draw from as they go, when training lets ranks take
    different numbers of steps.

    Arguments as torch's: ``num_replicas`` and ``rank`` default to ``hvd.size()`` and
    ``hvd.rank()`` (other values raise ``ValueError``: the pool spans the whole job),
    ``shuffle``, ``seed`` and ``drop_last`` mean what they mean there; ``set_epoch(epoch)``
    must be called with the same epoch on every rank before each epoch. Construction is
    collective: every rank builds its samplers in the same order with the same arguments
    (else ``ValueError`` naming the first differing rank). A dataset with fewer samples than
    ranks raises ``ValueError``.

    share: ``None`` (default) decides at each ``iter()``: the epoch is shared by speed when
        a live ``DistributedOptimizer`` lets ranks take different numbers of steps
        (``sync="ripples"`` with the ``"generator"`` or ``"generator-node"`` schedule,
        ``sync="adpsgd"``), else every rank gets torch's shard, exactly as torch's sampler
        gives it (all-reduce training and the lockstep schedules need equal step counts).
        ``True`` or ``False`` decides for good.
    batch_size: samples per draw. Pass the DataLoader's ``batch_size`` to draw one batch at
        a time; by default a draw is sized to last about 25 ms of this rank's work
        (``ripples.schedule.shared_epoch.ChunkSizer``).

    A shared epoch: the order is torch's (``seed + epoch``); all ranks together draw each of
    its indices exactly once, none twice (torch pads shards with repeats without
    ``drop_last``; with it, the same tail is dropped), and a rank's share follows its speed
    up to one chunk. ``len(sampler)`` stays torch's even share (``ceil(len(dataset) /
    size)`` or less with ``drop_last``), what a per-epoch scheduler or a progress bar can
    expect on average; a fast rank iterates more, a slow one fewer, so a schedule that
    counts its total steps in advance (``OneCycleLR(total_steps=...)``) must leave room.
    A DataLoader that prefetches (``num_workers > 0``) draws its prefetched batches early,
    so ranks end an epoch up to that many batches apart. ``draws`` records the chunks
    ``(start, stop)`` of the order this rank drew in its last shared epoch, in order: with
    the seed they give back exactly the indices it trained on (``indices(draws)``). A rank
    that starts its next epoch before the pool ran out (it left the loop early) ends the
    current epoch for every rank. Under ``--fault-tolerant``, the chunk that a dead rank
    held goes back to the pool; a survivor still in that epoch trains on it, or, when the
    death is noticed only after every survivor finished the epoch (at a collective of the
    script), it is skipped with a warning naming it. If rank 0, which keeps the pool, dies,
    the survivors rebuild the pool from what they drew: every position none of them drew is
    handed out again (the dead ranks drew it, or rank 0 was handing it to a survivor when
    it died), so nothing is lost, but a sample a dead rank had trained on may be trained
    again; a warning says so.
    """

    def __init__(self, dataset, num_replicas: Optional[int] = None, rank: Optional[int] = None,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False, *,
                 batch_size: Optional[int] = None, share: Optional[bool] = None):
        rt = _runtime.current()
        for argument, value, expected in (("num_replicas", num_replicas, rt.size),
                                          ("rank", rank, rt.rank)):
            if value is not None and value != expected:
                raise ValueError(
                    f"DistributedSampler({argument}={value!r}) on rank {rt.rank}: the sampler "
                    f"spans the whole job, so {argument} must be {expected} (hvd."
                    f"{'size' if argument == 'num_replicas' else 'rank'}()) or left out")
        if batch_size is not None and (isinstance(batch_size, bool)
                                       or not isinstance(batch_size, numbers.Integral)
                                       or batch_size < 1):
            raise ValueError(f"DistributedSampler(batch_size={batch_size!r}) must be an int >= "
                             "1 (the DataLoader's batch_size) or None")
        if share not in (None, True, False):
            raise ValueError(f"DistributedSampler(share={share!r}) must be None, True or False")
        length = len(dataset)
        if length < rt.size:
            raise ValueError(f"DistributedSampler: the dataset has {length} samples for "
                             f"{rt.size} ranks; every rank needs at least one (use fewer "
                             "ranks or a larger dataset)")
        super().__init__(dataset, num_replicas=rt.size, rank=rt.rank, shuffle=shuffle,
                         seed=seed, drop_last=drop_last)
        self.batch_size = batch_size
        self.share = share
        self.draws: List[Chunk] = []
        self._runtime = rt
        self._length = pool_length(length, rt.size, drop_last)
        self._sizer = ChunkSizer(chunk_cap(self._length, rt.size), batch_size)
        self._passes = 0
        self._pass_epoch: Optional[int] = None
        self._warned_epoch = False
        _check_same_sampler(rt, (length, bool(shuffle), int(seed), bool(drop_last), batch_size,
                                 share))
        self._pool = WorkPool.of(rt)
        self._pool_id = self._pool.register(self)

    @property
    def sharing(self) -> bool:
        """Whether the next ``iter()`` shares the epoch by speed (see ``share``)."""
        if self.share is not None:
            return self.share
        return bool(self._runtime.uneven_steps)

    def indices(self, draws: List[Chunk], epoch: Optional[int] = None) -> List[int]:
        """The dataset indices that ``draws`` (chunks of positions) stand for in ``epoch``'s
        order (default: the current epoch)."""
        order = epoch_order(len(self.dataset), self.shuffle, self.seed,
                            self.epoch if epoch is None else epoch)
        return [order[i] for start, stop in draws for i in range(start, stop)]

    def __iter__(self) -> Iterator[int]:
        if not self.sharing:
            return super().__iter__()
        self._passes += 1
        if self._pass_epoch == self.epoch and self.shuffle and not self._warned_epoch:
            self._warned_epoch = True
            warnings.warn("DistributedSampler: set_epoch() was not called between two epochs, "
                          "so they use the same order (as torch's sampler does); call "
                          "sampler.set_epoch(epoch) on every rank before each epoch",
                          UserWarning, stacklevel=2)
        self._pass_epoch = self.epoch
        self.draws = []
        self._sizer.start_pass()
        return self._shared_pass(self._passes, self.epoch)

    def _shared_pass(self, pass_no: int, epoch: int) -> Iterator[int]:
        order = epoch_order(len(self.dataset), self.shuffle, self.seed, epoch)
        while True:
            chunk = self._pool.draw(self._pool_id, self._length, pass_no, epoch,
                                    self._sizer.next_size())
            if chunk is None:  # the epoch is used up: this rank is done with its share
                self._runtime.left_training_step()
                return
            self._sizer.drew(chunk)
            self.draws.append(chunk)
            for position in range(*chunk):
                yield order[position]


def _check_same_sampler(rt, settings) -> None:
    everyone = allgather_object(settings, name="ripples.sampler.settings")
    names = ("len(dataset)", "shuffle", "seed", "drop_last", "batch_size", "share")
    for rank, theirs in enumerate(everyone):
        if theirs != everyone[0]:
            name, mine, first = next((n, a, b) for n, a, b in zip(names, theirs, everyone[0])
                                     if a != b)
            raise ValueError(f"rank {rank} builds a DistributedSampler with {name}={mine!r}, "
                             f"rank 0 with {name}={first!r}: every rank must build its samplers "
                             "in the same order with the same dataset and arguments")


class WorkPool:
    """Every shared sampler's position, kept by a thread on rank 0 (one per job, made by
    the first ``DistributedSampler``; collective). ``draw`` asks it for a sampler's next
    chunk. Under ``--fault-tolerant`` it moves with the survivors to a smaller world."""

    def __init__(self, rt):
        self._runtime = rt
        self._pools: Dict[int, EpochPool] = {}  # on the service's rank: pool id -> state
        self._samplers: Dict[int, weakref.ref] = {}
        self._service = self._start_service()
        rt.at_shutdown(self.close)
        rt.abandon_hooks.append(self._abandon)
        rt.rebuild_hooks.append(self._new_world)

    @classmethod
    def of(cls, rt) -> "WorkPool":
        if rt.work_pool is None:
            rt.work_pool = cls(rt)
        return rt.work_pool

    def _start_service(self) -> RequestService:
        rt = self._runtime
        self._rank, self._size = rt.rank, rt.size  # the service's world
        return RequestService(rt.service_comm.Dup(), self._handle, rt.config.timeout_s,
                              name="shared sampler pool")

    def register(self, sampler: DistributedSampler) -> int:
        """A pool id for ``sampler``: the same on every rank, as samplers are built in the
        same order everywhere."""
        pool_id = len(self._samplers)
        self._samplers[pool_id] = weakref.ref(sampler)
        return pool_id

    def draw(self, pool_id: int, length: int, pass_no: int, epoch: int,
             amount: int) -> Optional[Chunk]:
        """The next chunk of the sampler's pass, or None when the pass is over."""
        rt = self._runtime
        while True:
            generation = rt.generation
            try:
                return self._service.call((pool_id, length, pass_no, epoch, amount))
            except Exception as exc:
                error = rt.raised(exc, generation)
                if not isinstance(error, RanksFailedError):
                    raise error from exc
                # The survivors moved to a smaller world, and so did the pool: ask again.

    def _handle(self, rank: int, request) -> Optional[Chunk]:
        pool_id, length, pass_no, epoch, amount = request
        pool = self._pools.setdefault(pool_id, EpochPool(length))
        if pool.length != length:
            raise ValueError(f"rank {rank} draws from shared sampler {pool_id} with "
                             f"{length} positions per epoch, but it has {pool.length}")
        dropped_pass = pool.pass_no
        chunk = pool.draw(rank, pass_no, epoch, amount)
        if pool.dropped:
            log.warning("shared sampler %d: the chunks %s of pass %d, held by ranks that died, "
                        "came back after every rank had finished that pass: they were "
                        "skipped", pool_id, pool.dropped, dropped_pass)
            pool.dropped = []
        return chunk

    def close(self) -> None:
        """Stop the service (collective, at ``shutdown()``)."""
        rt = self._runtime
        self._service.close()
        rt.abandon_hooks.remove(self._abandon)
        rt.rebuild_hooks.remove(self._new_world)
        rt.work_pool = None

    def _abandon(self) -> None:
        """Ranks died: revoke the service's communicator, so that a rank waiting for a chunk
        learns of it, and stop the service without talking to anyone."""
        revoke([self._service.comm])
        self._service.abandon()

    def _new_world(self) -> None:
        """The survivors are on a smaller world: start the service there with every pool's
        position (collective over them, in ``Runtime.recover``). Survivors keep their order,
        so rank 0, the pools' keeper, stays rank 0 if it survived."""
        rt = self._runtime
        old_ranks = rt.world.allgather(self._rank)
        dead = sorted(set(range(self._size)) - set(old_ranks))
        if old_ranks[0] != 0:
            self._pools = self._rebuilt_without_keeper(rt, dead, old_ranks)
        for pool_id, pool in self._pools.items():
            back = pool.return_chunks(dead)
            if back:
                log.warning("shared sampler %d: the chunks %s of pass %d that dead rank(s) %s "
                            "held go back to the pool", pool_id, back, pool.pass_no, dead)
            pool.holding = {old_ranks.index(r): c for r, c in pool.holding.items()}
        self._service = self._start_service()

    def _rebuilt_without_keeper(self, rt, dead, old_ranks) -> Dict[int, EpochPool]:
        """Every pool's current pass continued from the furthest position a survivor drew,
        the positions before it that no survivor drew handed out first, each survivor
        holding its last chunk (by its old rank); kept on the new rank 0."""
        mine = {}
        for pool_id, ref in self._samplers.items():
            sampler = ref()
            if sampler is not None and sampler._passes:
                mine[pool_id] = (sampler._passes, sampler._pass_epoch, sampler._length,
                                 list(sampler.draws))
        everyone = rt.world.allgather(mine)
        pools = {}
        for pool_id in sorted({p for theirs in everyone for p in theirs}):
            views = {old_ranks[rank]: theirs[pool_id]
                     for rank, theirs in enumerate(everyone) if pool_id in theirs}
            pass_no, epoch, length, _ = max(views.values(), key=lambda v: v[0])
            draws = {rank: v[3] for rank, v in views.items() if v[0] == pass_no}
            drawn = [chunk for chunks in draws.values() for chunk in chunks]
            position = max((stop for _, stop in drawn), default=0)
            again = undrawn(position, drawn)
            if rt.rank == 0:
                log.warning("shared sampler %d: rank 0, which kept its position, died with "
                            "rank(s) %s; pass %d goes on from position %d, the furthest a "
                            "survivor drew. The positions no survivor drew are handed out "
                            "again, first those before it, %s: the dead ranks drew them (a "
                            "sample they trained on may be trained again) or rank 0 was "
                            "handing them out", pool_id, dead, pass_no, position, again)
            holding = {rank: chunks[-1] for rank, chunks in draws.items() if chunks}
            pools[pool_id] = EpochPool(length, pass_no=pass_no, epoch=epoch, position=position,
                                       returned=again, holding=holding)
        return pools if rt.rank == 0 else {}
