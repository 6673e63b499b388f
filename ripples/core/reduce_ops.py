"""Reduction operations, with Horovod's names (``hvd.Average``, ``hvd.Sum``, ...)."""
from __future__ import annotations

import enum


class ReduceOp(enum.Enum):
    AVERAGE = "Average"
    SUM = "Sum"
    MIN = "Min"
    MAX = "Max"
    PRODUCT = "Product"
    ADASUM = "Adasum"

    def __str__(self) -> str:
        return self.value


Average = ReduceOp.AVERAGE
Sum = ReduceOp.SUM
Min = ReduceOp.MIN
Max = ReduceOp.MAX
Product = ReduceOp.PRODUCT
Adasum = ReduceOp.ADASUM


def check_op(op, argument: str = "op") -> ReduceOp:
    """Return ``op`` as a ReduceOp; reject unknown values and Adasum with a clear message."""
    if isinstance(op, str):
        matches = [o for o in ReduceOp if o.value.lower() == op.lower()]
        if not matches:
            raise ValueError(f"{argument}={op!r} is not a reduction; valid: "
                             f"{', '.join(o.value for o in ReduceOp)}")
        op = matches[0]
    if not isinstance(op, ReduceOp):
        raise TypeError(f"{argument} must be one of ripples.torch.Average, Sum, Min, Max, Product; "
                        f"got {op!r}")
    if op is ReduceOp.ADASUM:
        raise NotImplementedError("op=Adasum is not supported by ripples; use op=Average (or "
                                  "sync='ripples' for decentralized averaging)")
    return op
