"""Gradients laid out in persistent flat buckets, each ``param.grad`` a view into its bucket.

``plan_buckets`` (pure) cuts the parameters, in reverse order (backward produces the last
layers' gradients first), into runs of one dtype of at most ``bucket_bytes``.
``GradientBuckets`` allocates one flat buffer per run and hands each bucket to a
``BucketReducer`` as soon as its last gradient is final, in plan order, so that the
all-reduce runs while backward continues. The reduced values land in the buffers, which
*are* the gradients: nothing is packed or unpacked, except into the 16-bit wire buffer
when a ``wire_dtype`` is given (``Compression.fp16``/``bf16``).

When backward ends (an autograd callback queued by the step's first final gradient), the
buckets still open are launched and every bucket is waited for, as DDP does: the code
between ``backward()`` and ``step()`` (gradient clipping, ``GradScaler.unscale_``) sees
the averaged gradients and never races with a reduction in flight. ``step()`` then has
nothing left to wait for.

A gradient that autograd created afresh (after ``zero_grad(set_to_none=True)``) is copied
into its view once, when it is final, and ``param.grad`` is pointed at the view, so later
passes accumulate in place. A parameter that got no gradient this step contributes what
its ``grad`` holds, zeros when it is None (Horovod's rule), and then holds the result too.
"""
from __future__ import annotations

import time
import weakref
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from ripples.ops.bucket_reducer import SUPPORTED_DTYPES, BucketReducer
from ripples.core.reduce_ops import ReduceOp

Named = List[Tuple[str, torch.Tensor]]


def plan_buckets(sizes: Sequence[int], dtypes: Sequence[torch.dtype],
                 bucket_bytes: int) -> List[List[int]]:
    """Indices into the parameters, grouped into buckets in launch order.

    Parameters are taken last to first; a bucket holds one dtype and closes before the
    parameter that would take it past ``bucket_bytes`` (``sizes`` are in bytes). A parameter
    larger than ``bucket_bytes`` gets a bucket of its own.
    """
    buckets: List[List[int]] = []
    current: List[int] = []
    filled = 0
    for index in reversed(range(len(sizes))):
        if current and (dtypes[index] != dtypes[current[0]]
                        or filled + sizes[index] > bucket_bytes):
            buckets.append(current)
            current, filled = [], 0
        current.append(index)
        filled += sizes[index]
    if current:
        buckets.append(current)
    return buckets


def bucketable(param: torch.Tensor) -> bool:
    """Whether ``param``'s gradient can live in a host bucket (float32/float64, reduced by
    MPI, or float16/bfloat16, summed with float32 accumulation)."""
    return (param.dtype in SUPPORTED_DTYPES and not param.is_cuda and param.is_contiguous()
            and param.layout is torch.strided)


class GradientBuckets:
    """The buckets of ``named`` (every one ``bucketable``) over ``group``.

    Construction is collective over ``group`` (see ``BucketReducer``, which also takes
    ``wire_dtype``). Per step: ``ready(p)`` when ``p``'s gradient is final, then
    ``finish()`` to reduce what is left and wait.
    """

    def __init__(self, runtime, group, named: Named, bucket_bytes: int, op: ReduceOp,
                 prescale: float, postscale: float, wire_dtype: Optional[torch.dtype] = None):
        params = [p for _, p in named]
        self.plan = plan_buckets([p.numel() * p.element_size() for p in params],
                                 [p.dtype for p in params], max(1, bucket_bytes))
        self.buffers: List[torch.Tensor] = []
        self.members: List[List[torch.Tensor]] = []
        self.views: Dict[torch.Tensor, torch.Tensor] = {}
        self.bucket_of: Dict[torch.Tensor, int] = {}
        for index, bucket in enumerate(self.plan):
            dtype = params[bucket[0]].dtype
            buffer = torch.zeros(sum(params[i].numel() for i in bucket), dtype=dtype)
            offset = 0
            for i in bucket:
                param = params[i]
                self.views[param] = buffer[offset:offset + param.numel()].view_as(param)
                self.bucket_of[param] = index
                offset += param.numel()
            self.buffers.append(buffer)
            self.members.append([params[i] for i in bucket])
        names = [[named[i][0] for i in bucket] for bucket in self.plan]
        self.reducer = BucketReducer(runtime, group, self.buffers, names, op, prescale,
                                     postscale, wire_dtype=wire_dtype)
        runtime.reducers.add(self.reducer)
        self._reducers = runtime.reducers
        reducer = weakref.ref(self.reducer)
        runtime.at_shutdown(lambda: reducer() is not None and reducer().close())
        self.waited_in_backward_s = 0.0
        self._remaining = [len(m) for m in self.members]
        self._fired: set = set()
        self._callback_queued = False
        self.reduced = False  # this step's buckets are reduced (at the end of backward)

    def __contains__(self, param) -> bool:
        return param in self.views

    def ready(self, param: torch.Tensor) -> None:
        """``param``'s gradient is final for this step: move it into its view, and launch
        every bucket, in order, whose gradients are all final."""
        if param in self._fired:
            return
        if not self._callback_queued:
            torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)
            self._callback_queued = True
        self._fired.add(param)
        grad = param.grad
        if grad is not None and not grad.is_sparse:
            self._attach(param)
        index = self.bucket_of[param]
        self._remaining[index] -= 1
        reducer = self.reducer
        while reducer.launched < len(self.plan) and self._remaining[reducer.launched] == 0:
            reducer.launch(reducer.launched)

    def _end_of_backward(self) -> None:
        self._callback_queued = False
        start = time.perf_counter()
        self._reduce_all()
        self.waited_in_backward_s += time.perf_counter() - start
        self.reduced = True

    def take_backward_wait(self) -> float:
        """Seconds spent waiting for buckets at the end of backward passes since the last
        call (communication, not compute: the slowdown injector must not scale it)."""
        waited, self.waited_in_backward_s = self.waited_in_backward_s, 0.0
        return waited

    def finish(self) -> None:
        """Make sure this step's buckets are reduced (by the end of backward, or now) and
        start the next step."""
        if not self.reduced:
            self._reduce_all()
        self.reduced = False

    def _reduce_all(self) -> None:
        """Attach the gradients that never became final (zeros for None), reduce every
        bucket not launched yet, and wait for all of them."""
        for index in range(self.reducer.launched, len(self.plan)):
            if self._remaining[index]:
                for param in self.members[index]:
                    if param not in self._fired:
                        self._attach(param)
        try:
            self.reducer.wait()
        finally:
            self._remaining = [len(m) for m in self.members]
            self._fired = set()

    def _attach(self, param: torch.Tensor) -> None:
        view = self.views[param]
        grad = param.grad
        if grad is view:
            return
        if grad is None:
            view.zero_()
        elif grad.is_sparse:
            return  # left out of the plan from the next step on (the optimizer re-plans)
        elif grad.data_ptr() != view.data_ptr():
            view.copy_(grad)
        param.grad = view

    def close(self) -> None:
        """Stop the reducer and drop it from ``join()`` at once: left to the garbage
        collector, it would leave at a different moment on each rank."""
        self.reducer.close()
        self._reducers.discard(self.reducer)
