"""A group's all-reduce as a ring of point-to-point messages over one long-lived communicator.

The default way a group (not the whole world) all-reduces is an MPI communicator of its
own, made with ``Comm.Create_group`` and cached (``ripples.comm.groups``). The ring needs
none: the members pass chunks around the ring of their world ranks on the runtime's
``peers`` communicator, a private duplicate of the world. So

- a new group costs nothing to set up (the random and generator schedules churn through
  more groups than a cache holds);
- every message is nonblocking and polled against a deadline, on a communicator that a
  survivor of a dead rank can revoke. Creating a group communicator cannot be interrupted
  that way: under ULFM a member stuck activating a new communicator hung the recovery
  (``Config.fault_tolerant`` therefore takes the ring by default);
- across hosts over TCP it runs at the links' rate where Open MPI's all-reduce did not
  (measured: 8 ranks on 4 hosts at 1 Gbit/s, 20 MB, 331 ms against 736 ms), so large
  runs of the whole world take it too (``Runtime.ring_carries``; the gradient buckets
  run it on their own communicator).

The schedule is the classic ring: the buffer is cut into ``k`` chunks (``k`` members, the
first ``numel % k`` chunks one element longer); ``k - 1`` reduce-scatter steps leave member
``p`` holding the reduced chunk ``p + 1``, and ``k - 1`` all-gather steps pass the reduced
chunks on. Each member sends ``2 (k - 1) / k`` of the buffer. Every chunk is reduced on one
path and then copied, so all members end with the same bits. The schedule is a pure
function (``ring_schedule``) so that another transport (NCCL send/receive) can run the same
steps.

16-bit floats are reduced in a float32 buffer by the caller (``ripples.ops.reduction``):
each partial sum crosses the wire at full precision and the result is rounded once.
"""
from __future__ import annotations

from typing import Callable, List, NamedTuple, Optional, Sequence

import torch
from mpi4py import MPI

from ripples.comm import outbox
from ripples.comm.mpi import Deadline, as_buffer, wait_all
from ripples.ops.half_allreduce import chunks

_TAG = 23

# MPI.Op objects are not hashable: a list of (operation, torch function) pairs.
_COMBINE = [(MPI.SUM, torch.add), (MPI.MAX, torch.maximum), (MPI.MIN, torch.minimum),
            (MPI.PROD, torch.mul)]


class RingStep(NamedTuple):
    """One step of a member: send chunk ``send`` to the next member, receive chunk ``recv``
    from the previous one, and combine it into this member's chunk (``reduce``) or
    overwrite it with the received, already reduced chunk."""

    send: int
    recv: int
    reduce: bool


def ring_schedule(position: int, size: int) -> List[RingStep]:
    """The steps of the member at ``position`` (0-based) of a ``size``-member ring."""
    if not 0 <= position < size:
        raise ValueError(f"position {position} is outside a ring of {size} members")
    scatter = [RingStep((position - s) % size, (position - s - 1) % size, True)
               for s in range(size - 1)]
    gather = [RingStep((position + 1 - s) % size, (position - s) % size, False)
              for s in range(size - 1)]
    return scatter + gather


class PeerRing:
    """The all-reduce of one group over point-to-point messages.

    ``comm``: a communicator spanning the world (every member's world rank is its rank
    there), used by nothing else that could match these messages. ``group``: the sorted
    world ranks of the members, containing ``rank``. ``deadline``: makes the bounded wait of
    one step, given a description and the world ranks waited for. ``world_ranks``: when
    ``comm`` is the group's own communicator instead (``group`` and ``rank`` then its
    ranks), the world rank of each of them, for the messages.
    """

    __slots__ = ("comm", "group", "rank", "deadline", "world_ranks")

    def __init__(self, comm: MPI.Comm, group: Sequence[int], rank: int,
                 deadline: Callable[[Callable[[], str], Sequence[int]], Deadline],
                 world_ranks: Optional[Sequence[int]] = None):
        self.comm, self.group, self.rank, self.deadline = comm, tuple(group), rank, deadline
        self.world_ranks = tuple(world_ranks) if world_ranks is not None else None

    def _world(self, rank: int) -> int:
        return rank if self.world_ranks is None else self.world_ranks[rank]

    def allreduce_(self, buffer: torch.Tensor, operation) -> None:
        """Replace the 1-D contiguous CPU ``buffer`` by its reduction over the group, in
        place. ``operation``: ``MPI.SUM``, ``MAX``, ``MIN`` or ``PROD`` (bool buffers: MAX
        for or, MIN for and). Every member calls it with the same length and dtype.
        Raises ``RipplesTimeoutError`` naming the group when a step does not complete in
        time, and the MPI error when a member died."""
        size = len(self.group)
        if buffer.dtype is torch.bool:
            buffer = buffer.view(torch.uint8)
        position = self.group.index(self.rank)
        following = self.group[(position + 1) % size]
        preceding = self.group[(position - 1) % size]
        steps = 2 * (size - 1)
        members = tuple(self._world(r) for r in self.group)

        def exchange(number: int, send: torch.Tensor, receive: torch.Tensor) -> None:
            requests = [self.comm.Irecv(as_buffer(receive), source=preceding, tag=_TAG),
                        self.comm.Isend(as_buffer(send), dest=following, tag=_TAG)]
            try:
                wait_all(requests, self.deadline(
                    lambda: f"group all-reduce on {members}, ring step {number + 1} of "
                            f"{steps} (rank {self._world(self.rank)})",
                    sorted({self._world(preceding), self._world(following)})))
            except BaseException:
                # The step gave up: its receive must not land later in a buffer reused by
                # then, and MPI may still read what it sends.
                outbox.withdraw(requests[0], buffers=(receive,))
                outbox.keep_until_complete(requests[1], buffers=(send,))
                raise

        combine = next(function for op, function in _COMBINE if op == operation)
        ring_allreduce_(buffer, position, size, exchange, combine)


def ring_allreduce_(buffer: torch.Tensor, position: int, size: int,
                    exchange: Callable[[int, torch.Tensor, torch.Tensor], None],
                    combine: Callable[..., torch.Tensor]) -> None:
    """Run ``ring_schedule(position, size)`` on the 1-D ``buffer``, whatever the transport.

    ``exchange(number, send, receive)``: step ``number`` sends the tensor ``send`` to the
    next member and receives the previous member's into ``receive`` (same length), and
    returns once both are done. ``combine(a, b, out=a)``: the elementwise reduction (a torch
    function such as ``torch.add``).
    """
    if size == 1 or buffer.numel() == 0:
        return
    counts, offsets = chunks(buffer.numel(), size)
    pieces = [buffer[o:o + c] for o, c in zip(offsets, counts)]
    scratch = torch.empty(counts[0], dtype=buffer.dtype, device=buffer.device)
    for number, step in enumerate(ring_schedule(position, size)):
        target = pieces[step.recv]
        into = scratch[:target.numel()] if step.reduce else target
        exchange(number, pieces[step.send], into)
        if step.reduce:
            combine(target, into, out=target)
