"""Planned all-reduces of persistent flat buffers: the steady state of gradient averaging.

A ``BucketReducer`` is made once, collectively, for a fixed plan: flat buffers ("buckets")
in launch order, one op and scaling, one group. It owns a communicator of the group and a
communication thread. Every step:

1. the caller ``launch``es buckets in plan order as they become ready (the optimizer does it
   from gradient hooks, so communication starts while backward still runs);
2. on a step's first bucket the thread runs the fixed-size step record
   (``comm.step_record``): one 48-byte ``Iallreduce``, polled with napping waits under the
   deadline, that proves every member reached the same step of the same plan and counts
   the members contributing data (joined members contribute zeros);
3. then it all-reduces each launched bucket in place with MPI's blocking ``Allreduce``
   (faster here than ``Iallreduce``), or around a ring of point-to-point messages where
   ``Runtime.ring_carries`` says (large buckets, sooner across hosts), and scales it;
   nothing is packed or unpacked. A
   float16/bfloat16 bucket (a 16-bit model's gradients) is summed in place by
   ``half_allreduce.allreduce_16bit_`` (float32 accumulation, rounded once). With a
   16-bit ``wire_dtype`` (``Compression.fp16``/``bf16``) the bucket is cast into a
   preallocated 16-bit buffer, summed by ``allreduce_16bit_`` (2 bytes per element on the
   wire) and cast back, scaled, into the bucket;
4. ``wait()`` returns when every bucket is done, or raises after the deadline.

No names are negotiated per step: the plan was agreed when the reducer was made, and the
record catches a member on another plan or step. The thread sleeps on a condition while
idle (no busy polling that would take the compute core).

Failure: a member that never arrives makes the record time out on every member that did
(``RipplesTimeoutError`` naming the collective and group). A member that stops between
buckets leaves the others inside a blocking ``Allreduce`` that cannot be cancelled: their
``wait()`` raises after the deadline, and the reducer refuses further use with that error.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from typing import List, Optional, Sequence

import numpy as np
import torch
from mpi4py import MPI

from ripples import kernels
from ripples.comm import outbox, step_record
from ripples.comm.mpi import Deadline, as_buffer, mpi_op, poll_until
from ripples.core.errors import MismatchError, RipplesTimeoutError
from ripples.ops.fusion import host_buffer
from ripples.ops.half_allreduce import HALF_DTYPES, allreduce_16bit_
from ripples.ops.ring_allreduce import PeerRing
from ripples.core.reduce_ops import ReduceOp

SUPPORTED_OPS = (ReduceOp.SUM, ReduceOp.AVERAGE)
_TAG_ABSENT = 77
_LISTEN_S = 1.0  # members that time out on the same step do so within this of each other
SUPPORTED_DTYPES = (torch.float32, torch.float64, *HALF_DTYPES)


class BucketReducer:
    """All-reduce ``buffers`` (1-D host tensors of float32, float64, float16 or bfloat16)
    over ``group`` every step.

    Construction is collective over ``group`` (it creates the communicator and checks that
    every member has the same plan: raises ``ValueError`` naming a differing rank).
    ``names[i]`` lists what bucket ``i`` holds, for errors and the timeline. ``op`` is Sum or
    Average (Average divides by the members contributing); ``prescale``/``postscale``
    multiply before and after the sum. ``wire_dtype`` (None, float16 or bfloat16): the
    dtype the buckets travel in; a 16-bit one halves the bytes (and the precision) of the
    sum, which is accumulated in float32 and rounded once to ``wire_dtype``. It is part of
    the plan, so members with different ones raise the ``ValueError`` too.
    """

    def __init__(self, runtime, group: Sequence[int], buffers: Sequence[torch.Tensor],
                 names: Sequence[Sequence[str]], op: ReduceOp = ReduceOp.AVERAGE,
                 prescale: float = 1.0, postscale: float = 1.0, what: str = "allreduce",
                 wire_dtype: Optional[torch.dtype] = None):
        if op not in SUPPORTED_OPS:
            raise ValueError(f"BucketReducer supports {[str(o) for o in SUPPORTED_OPS]}, "
                             f"got {op}")
        if wire_dtype is not None and wire_dtype not in HALF_DTYPES:
            raise ValueError(f"wire_dtype must be None, torch.float16 or torch.bfloat16, got "
                             f"{wire_dtype}")
        self._rt = runtime
        self.generation = runtime.generation
        self.group = tuple(group)
        self.buffers = list(buffers)
        self.names = [list(n) for n in names]
        self.what = what
        self._op, self._prescale, self._postscale = op, prescale, postscale
        self._mpi_ops = [mpi_op(op, b.dtype) for b in self.buffers]
        self.wire_dtype = wire_dtype
        # One buffer serves every bucket: the thread reduces them one at a time.
        self._wire = (None if wire_dtype is None else
                      host_buffer(wire_dtype, max([b.numel() for b in self.buffers], default=0)))
        self.plan = step_record.plan_hash(
            [(b.numel(), str(b.dtype)) for b in self.buffers]
            + [str(op), prescale, postscale, str(wire_dtype)])
        with runtime.data_watch.phase(self.group, f"{what}: making its communicator"):
            self.comm = _group_comm(runtime, self.group)
            plans = self.comm.allgather(self.plan)
        # Per bucket, fixed by its size and the group: around the ring (Runtime.ring_carries)?
        self._over_ring = [b.dtype not in HALF_DTYPES
                           and runtime.ring_carries(self.group, b.numel() * b.element_size())
                           for b in self.buffers]
        self._ring = self._make_ring() if any(self._over_ring) else None
        differing = [self.group[i] for i, p in enumerate(plans) if p != plans[0]]
        if differing:
            raise ValueError(f"{what}: rank(s) {differing} planned different buckets than rank "
                             f"{self.group[0]} (sizes, dtypes, op, scaling or compression "
                             "differ); every member must wrap the same model with the same "
                             "arguments")
        self.epoch = 0
        self._cond = threading.Condition()
        self._queue: deque = deque()
        self._launched = 0
        self._finished = 0
        self._active = len(self.group)
        self._error: Optional[BaseException] = None
        self.broken: Optional[BaseException] = None
        self._closing = False
        self._thread: Optional[threading.Thread] = None
        self._join_request = None
        self._join_settled = False  # the all-joined record completed: post no more
        self._join_out = np.zeros(step_record.RECORD_FIELDS, dtype=np.int64)
        # Sent by the join's all-reduce: MPI reads it until that completes (outlives it).
        self._joined_record = step_record.encode(False, 0, 0)
        self._agreeing = False  # the thread waits in a step record (bounded on its own)
        self._progress_at = 0.0  # when the thread last left a step record

    # ------------------------------------------------------------------ one step

    @property
    def launched(self) -> int:
        """Buckets launched in the current step (they are launched in order)."""
        return self._launched

    def launch(self, index: int) -> None:
        """Start bucket ``index``'s all-reduce; buckets must be launched in plan order."""
        if self.broken is not None:
            raise self.broken
        if index != self._launched:
            raise RuntimeError(f"bucket {index} launched out of order (next is "
                               f"{self._launched})")
        with self._cond:
            self._queue.append(index)
            self._launched += 1
            self._cond.notify()
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, daemon=True,
                                                name="ripples-buckets")
                self._thread.start()

    def wait(self) -> None:
        """Launch what is left, wait for every bucket of this step, and end the step."""
        if self.broken is not None:
            raise self._rt.raised(self.broken, self.generation) from self.broken
        while self._launched < len(self.buffers):
            self.launch(self._launched)
        config = self._rt.config
        # The thread's record round gives up on its own (after timeout_s, or later while
        # the members it waits for are alive and busy) and names the step; this bound only
        # fires when the thread is stuck inside a data all-reduce.
        limit = config.timeout_s * 1.5 + 1.0
        liveness = self._rt.liveness
        liveness.enter()
        try:
            with self._cond:
                while True:
                    done = self._cond.wait_for(lambda: self._error is not None
                                               or self._finished == len(self.buffers), limit)
                    if done or not (self._agreeing
                                    or time.monotonic() - self._progress_at < limit):
                        break
                error = self._error
        finally:
            liveness.leave()
        if not done:
            error = RipplesTimeoutError(
                f"{self.what} of bucket {self._finished} ({self._describe(self._finished)}) "
                f"on group {self.group}: a member stopped in the middle of step {self.epoch}; "
                f"gave up after {limit:g} s (rank {self._rt.rank}; Config.timeout_s / "
                "RIPPLES_TIMEOUT_S)")
        if error is not None:
            self.broken = error
            raise self._rt.raised(error, self.generation) from error
        self._launched = self._finished = 0
        self.epoch += 1

    # ------------------------------------------------------------------ the thread

    def _serve(self) -> None:
        torch.set_num_threads(1)  # scaling a bucket must not compete with the compute
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._queue or self._closing)
                if not self._queue:
                    return
                index = self._queue.popleft()
                skip = self._error is not None
            if skip:
                continue
            try:
                if index == 0:
                    self._agreeing = True
                    try:
                        self._agree()
                    finally:
                        self._agreeing = False
                        self._progress_at = time.monotonic()
                self._reduce(index)
            except BaseException as exc:  # kept for wait(), which raises it on the caller
                with self._cond:
                    self._error = exc
                    self._cond.notify_all()
                continue
            with self._cond:
                self._finished += 1
                self._cond.notify_all()

    def _agree(self) -> None:
        config = self._rt.config
        summed = np.zeros(step_record.RECORD_FIELDS, dtype=np.int64)
        record = step_record.encode(True, self.plan, self.epoch)
        request = self.comm.Iallreduce(record, summed, op=MPI.SUM)
        others = [member for member in self.group if member != self._rt.rank]
        deadline = Deadline(self._rt.liveness.check_after_s(), config.stall_warning_s, lambda: (
            f"{self.what} of {self._describe(0)} (step {self.epoch}) on group {self.group}: "
            f"not every member has started this step (rank {self._rt.rank} is waiting)"),
            lambda: others, self._rt.liveness)
        try:
            poll_until(request.Test, deadline)
        except BaseException as exc:
            # MPI still uses both arrays: the members that come late complete it.
            outbox.keep_until_complete(request, buffers=(record, summed))
            if not isinstance(exc, RipplesTimeoutError):
                raise
            missing = self._absent_members()
            raise RipplesTimeoutError(
                f"{self.what} of {self._describe(0)} (step {self.epoch}) on group "
                f"{self.group}: rank(s) {missing} have not called it (rank {self._rt.rank} "
                f"is waiting; gave up after {config.timeout_s:g} s, Config.timeout_s / "
                f"RIPPLES_TIMEOUT_S){'; ' + exc.finding if exc.finding else ''}",
                missing=missing) from exc
        agreement = step_record.decode(summed)
        if not (agreement.same_plan and agreement.same_epoch):
            raise MismatchError(
                f"{self.what} on group {self.group}: members are at different steps or plans "
                f"(rank {self._rt.rank} is at step {self.epoch}); every member must call "
                "step()/synchronize() the same number of times on the same model")
        # Horovod's join: the joined members count in an Average (as zeros).
        self._active = len(self.group) if self._rt.config.horovod_join else agreement.active

    def _absent_members(self) -> List[int]:
        """On the slow path only: the members that did not reach this step. Every member
        that gave up tells every other one so, and listens for a moment for the same."""
        me = self.comm.Get_rank()
        others = [i for i in range(len(self.group)) if i != me]
        sends = [self.comm.isend(self.epoch, dest=i, tag=_TAG_ABSENT) for i in others]
        heard = set()
        end = time.monotonic() + _LISTEN_S
        while time.monotonic() < end and len(heard) < len(others):
            for i in others:
                if i not in heard and self.comm.iprobe(source=i, tag=_TAG_ABSENT):
                    if self.comm.recv(source=i, tag=_TAG_ABSENT) == self.epoch:
                        heard.add(i)
            time.sleep(0.005)
        for send in sends:
            if not send.Test():
                send.Cancel()
        outbox.keep_until_complete(*sends)  # a cancel must complete too (buffers in use)
        return [self.group[i] for i in others if i not in heard]

    def _reduce(self, index: int) -> None:
        buffer = self.buffers[index]
        timeline = self._rt.timeline
        start = timeline.now() if timeline.enabled else 0.0
        post = self._postscale
        if self._op is ReduceOp.AVERAGE:
            post /= self._active
        # A member that freezes or is cut off now leaves this thread in a blocking call:
        # the data watch names it (and, fault tolerant, revokes the world so it fails).
        watched = self._rt.data_watch.phase(self.group, f"{self.what} of {self._describe(index)}")
        if self._wire is None:
            sent = buffer
            kernels.scale_(buffer, self._prescale)
            if len(self.group) > 1:
                with watched:
                    self._allreduce(index, buffer)
            kernels.scale_(buffer, post)
        else:
            sent = self._wire[:buffer.numel()]
            kernels.pack([buffer], sent, scale=self._prescale)
            if len(self.group) > 1:
                with watched:
                    allreduce_16bit_(self.comm, sent)
            kernels.unpack(sent, [buffer], scale=post)
        if timeline.enabled:
            timeline.complete(self.what, "communication", start, timeline.now() - start,
                              {"group": list(self.group), "names": self.names[index],
                               "bytes": sent.numel() * sent.element_size(),
                               "wire_dtype": str(sent.dtype)[6:], "bucket": index})

    def _allreduce(self, index: int, buffer: torch.Tensor) -> None:
        """Sum ``buffer`` (bucket ``index``, or zeros of its size) over the group in place:
        by MPI for float32/float64, around a ring on the group's communicator where the
        runtime says so (large buckets, sooner across hosts: ``Runtime.ring_carries``), by
        ``allreduce_16bit_`` (float32 accumulation, 2 bytes per element on the wire, MPI
        has no 16-bit float sum) for float16/bfloat16."""
        if buffer.dtype in HALF_DTYPES:
            allreduce_16bit_(self.comm, buffer)
        elif self._over_ring[index]:
            self._ring.allreduce_(buffer, self._mpi_ops[index])
        else:
            self.comm.Allreduce(MPI.IN_PLACE, as_buffer(buffer), op=self._mpi_ops[index])

    def _make_ring(self) -> PeerRing:
        """The ring over this reducer's communicator (its ranks are positions in the group);
        each step bounded as the group rings' are."""
        config, liveness = self._rt.config, self._rt.liveness
        return PeerRing(self.comm, range(len(self.group)), self.comm.Get_rank(),
                        lambda describe, missing: Deadline(
                            config.timeout_s, config.stall_warning_s, describe,
                            lambda: missing, liveness),
                        world_ranks=self.group)

    def _describe(self, index: int) -> str:
        if index >= len(self.names):
            return "its buckets"
        names = self.names[index]
        return f"bucket {index} of {len(self.buffers)}: {names[:3]}{'...' if len(names) > 3 else ''}"

    # ------------------------------------------------------------------ join

    def join_poll(self) -> bool:
        """A joined member's side: keep a 'joined' record posted; when the active members
        run a step, contribute zeros to each bucket. Returns whether such a step ran."""
        if self._join_settled:
            return False
        if self._join_request is None:
            self._join_request = self.comm.Iallreduce(self._joined_record,
                                                      self._join_out, op=MPI.SUM)
            return False
        if not self._join_request.Test():
            return False
        self._join_request = None
        agreement = step_record.decode(self._join_out)
        if agreement.active == 0:  # every member has joined: the reducers are in step again
            self._join_settled = True
            return False
        for index, buffer in enumerate(self.buffers):
            if self._wire is None:
                self._allreduce(index,
                                self._rt.buffers.get(buffer.dtype, buffer.numel()).zero_())
            else:
                allreduce_16bit_(self.comm, self._wire[:buffer.numel()].zero_())
        self.epoch = agreement.epoch + 1
        return True

    def join_finish(self) -> None:
        """After every member joined: complete the last 'joined' record, the one with no
        active member (bounded). A member that contributed zeros to the last step and has
        not posted its next record yet posts it now: its peers' records wait for it."""
        settled, self._join_settled = self._join_settled, False
        if settled:
            return
        if self._join_request is None:
            self._join_request = self.comm.Iallreduce(self._joined_record,
                                                      self._join_out, op=MPI.SUM)
        config = self._rt.config
        deadline = Deadline(config.timeout_s, config.stall_warning_s, lambda: (
            f"{self.what} on group {self.group}: finishing join()"))
        poll_until(lambda: self._join_request is None or self._join_request.Test(), deadline)
        self._join_request = None

    # ------------------------------------------------------------------ shutdown

    def abandon(self, error: BaseException) -> None:
        """Fail the step with ``error`` and stop the thread, without talking to the other
        members or freeing the communicator (a member died: it is revoked)."""
        with self._cond:
            self.broken = self._error = self._error or error
            self._closing = True
            self._cond.notify_all()

    def close(self) -> None:
        """Stop the thread and free the communicator (kept if a member left it mid-call)."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        thread = self._thread
        if thread is not None:
            thread.join(timeout=1.0)
            if thread.is_alive():
                return
        if self.broken is None and self._join_request is None and self.comm != MPI.COMM_NULL:
            self.comm.Free()
        if self._join_request is not None:  # a member left mid-join: MPI may still use these
            outbox.keep_until_complete(self._join_request,
                                       buffers=(self._joined_record, self._join_out))
            self._join_request = None
        self.comm = MPI.COMM_NULL


def _group_comm(runtime, group) -> MPI.Comm:
    """A private communicator of ``group`` (collective over its members)."""
    if group == tuple(range(runtime.size)):
        return runtime.world.Dup()
    mpi_group = runtime.world.Get_group().Incl(list(group))
    try:
        return runtime.world.Create_group(mpi_group)
    finally:
        mpi_group.Free()
