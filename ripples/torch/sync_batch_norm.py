"""Batch normalization whose batch statistics cover every member of a process set.

``SyncBatchNorm`` is Horovod's ``hvd.SyncBatchNorm``, for host tensors too. torch's fused
kernels for synchronized batch norm (``torch.batch_norm_stats`` and friends) exist for CUDA
only, so the statistics here are plain torch arithmetic, the same code on every device
(CUDA inputs take it too, but have not been run on a GPU yet):

* forward: each member computes its per-channel count, mean and sum of squared deviations
  (M2); one all-gather shares them and every member combines them into the set's mean and
  variance (Chan et al.'s pairwise formula, which keeps float32 inputs with a large mean
  accurate, unlike a sum of squares);
* backward: one all-reduce (Sum) of the per-channel ``sum(dy)`` and ``sum(dy * (x - mean))``.
"""
from __future__ import annotations

import inspect
from typing import Optional

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable
from torch.nn.modules.batchnorm import _BatchNorm

from ripples import runtime as _runtime
from ripples.ops import collectives as _ops
from ripples.ops.process_sets import ProcessSet, global_process_set
from ripples.core.reduce_ops import ReduceOp


def _rank() -> str:
    return str(_runtime.current().rank) if _runtime.is_initialized() else "?"


def _channel_view(stat: torch.Tensor, dims: int) -> torch.Tensor:
    """A per-channel vector shaped to broadcast against an ``(N, C, ...)`` input."""
    return stat.view(1, -1, *([1] * (dims - 2)))


class _SyncBatchNormFunction(torch.autograd.Function):
    """Batch norm in training mode over the members of ``process_set``.

    Updates ``running_mean``/``running_var`` in place (when given) with ``factor``. The
    gradients of ``weight`` and ``bias`` are this member's own, as for any other parameter:
    the optimizer's all-reduce combines them, as in Horovod.
    """

    @staticmethod
    def forward(ctx, input, weight, bias, running_mean, running_var, eps, factor, process_set):
        compute = torch.promote_types(input.dtype, torch.float32)
        x = input.to(compute)
        channels = x.shape[1]
        reduce_dims = [0, *range(2, x.dim())]
        count = x.numel() // channels
        if count > 0:
            var, mean = torch.var_mean(x, dim=reduce_dims, correction=0)
            moments = torch.cat([mean.double(), var.double() * count]).cpu()
        else:
            moments = torch.zeros(2 * channels, dtype=torch.float64)
        # The statistics are a few numbers per channel: they travel through host memory
        # whatever the input's device.
        local = torch.cat([torch.tensor([float(count)], dtype=torch.float64), moments])
        stats = _ops.allgather(local.unsqueeze(0), process_set=process_set)

        counts, means, m2s = stats[:, :1], stats[:, 1:1 + channels], stats[:, 1 + channels:]
        total = counts.sum().item()
        if total <= 1:
            raise ValueError(
                f"SyncBatchNorm on rank {_rank()}: expected more than 1 value per channel when "
                f"training, got {int(total)} over {process_set} (input size {list(input.shape)} "
                "here)")
        mean = (counts * means).sum(dim=0) / total
        m2 = (m2s + counts * (means - mean) ** 2).sum(dim=0)
        invstd = torch.rsqrt(m2 / total + eps)

        if running_mean is not None:
            running_mean.mul_(1 - factor).add_(mean.to(running_mean) * factor)
        if running_var is not None:
            unbiased = m2 / (total - 1)
            running_var.mul_(1 - factor).add_(unbiased.to(running_var) * factor)

        mean, invstd = mean.to(x), invstd.to(x)
        ctx.save_for_backward(input, weight, mean, invstd)
        ctx.total = total
        ctx.process_set = process_set
        ctx.bias_dtype = None if bias is None else bias.dtype
        scale = invstd if weight is None else invstd * weight.to(compute)
        out = (x - _channel_view(mean, x.dim())) * _channel_view(scale, x.dim())
        if bias is not None:
            out = out + _channel_view(bias.to(compute), x.dim())
        return out.to(input.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output):
        input, weight, mean, invstd = ctx.saved_tensors
        need_input, need_weight, need_bias = ctx.needs_input_grad[:3]
        compute = mean.dtype
        dims = input.dim()
        reduce_dims = [0, *range(2, dims)]
        dy = grad_output.to(compute)
        xmu = input.to(compute) - _channel_view(mean, dims)
        sum_dy = dy.sum(dim=reduce_dims)
        sum_dy_xmu = (dy * xmu).sum(dim=reduce_dims)

        grad_weight = (sum_dy_xmu * invstd).to(weight.dtype) if need_weight else None
        grad_bias = sum_dy.to(ctx.bias_dtype) if need_bias else None
        grad_input = None
        if need_input:
            both = _ops.allreduce(torch.cat([sum_dy, sum_dy_xmu]).cpu(), op=ReduceOp.SUM,
                                  process_set=ctx.process_set).to(dy.device)
            mean_dy, mean_dy_xmu = (both / ctx.total).chunk(2)
            scale = invstd if weight is None else invstd * weight.to(compute)
            grad_input = ((dy - _channel_view(mean_dy, dims)
                           - xmu * _channel_view(invstd * invstd * mean_dy_xmu, dims))
                          * _channel_view(scale, dims)).to(input.dtype)
        return grad_input, grad_weight, grad_bias, None, None, None, None, None


# BatchNorm's `bias` argument is recent (a torch before it, e.g. 2.11, rejects the keyword).
_BATCH_NORM_TAKES_BIAS = "bias" in inspect.signature(_BatchNorm.__init__).parameters


class SyncBatchNorm(_BatchNorm):
    """Batch normalization over ``(N, C, ...)`` inputs (2-D and more: any of
    ``BatchNorm1d``/``2d``/``3d``'s) with batch statistics synchronized across the members
    of ``process_set`` (default: every rank), as Horovod's ``hvd.SyncBatchNorm``.

    Wherever batch statistics are used (training mode, or any mode with
    ``track_running_stats=False``), each member's output, its input's gradient and the
    running statistics are those of one ``BatchNorm`` applied to the concatenation of every
    member's batch, whose sizes may differ (and be 0 on some members). The loss this
    corresponds to is the sum of the members' losses. ``weight`` and ``bias`` receive this
    member's own share of their gradient, as Horovod does: summed over the members it is
    ``BatchNorm``'s gradient, and ``DistributedOptimizer`` averages it like any other.

    Contract: in those modes every member must call ``forward`` (and ``backward`` when the
    input requires grad) in the same order, as with any collective; ranks outside
    ``process_set`` get a ``ValueError`` instead. With running statistics in eval mode the
    module is plain ``BatchNorm`` and communicates nothing, so any rank may evaluate alone.
    A process set of one rank is plain ``BatchNorm``. Arguments are ``BatchNorm``'s
    (``momentum=None`` is a cumulative average) plus ``process_set`` (an ``hvd.ProcessSet``).
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: Optional[float] = 0.1,
                 affine: bool = True, track_running_stats: bool = True,
                 process_set: ProcessSet = global_process_set, device=None, dtype=None, *,
                 bias: bool = True):
        if not isinstance(process_set, ProcessSet):
            raise TypeError("SyncBatchNorm(process_set=...) must be an hvd.ProcessSet, got "
                            f"{type(process_set).__name__}")
        if _BATCH_NORM_TAKES_BIAS:
            super().__init__(num_features, eps, momentum, affine, track_running_stats, device,
                             dtype, bias=bias)
        elif not bias:
            raise TypeError(f"SyncBatchNorm(bias=False) needs a torch whose BatchNorm takes "
                            f"`bias` (torch {torch.__version__} has none): upgrade torch or "
                            "leave bias=True")
        else:
            super().__init__(num_features, eps, momentum, affine, track_running_stats, device,
                             dtype)
        self.process_set = process_set

    def _check_input_dim(self, input):
        if not isinstance(input, torch.Tensor):
            raise TypeError(f"SyncBatchNorm: input must be a torch.Tensor, got "
                            f"{type(input).__name__}")
        if input.dim() < 2:
            raise ValueError(f"SyncBatchNorm on rank {_rank()}: input must be at least 2-D "
                             f"(N, C, ...), got {input.dim()}-D input of size {list(input.shape)}")
        if input.shape[1] != self.num_features:
            raise ValueError(f"SyncBatchNorm on rank {_rank()}: input has {input.shape[1]} "
                             f"channels (dimension 1 of size {list(input.shape)}) but "
                             f"num_features={self.num_features}")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:
                factor = 1.0 / float(self.num_batches_tracked)
        use_batch_stats = self.training or (self.running_mean is None
                                            and self.running_var is None)
        # As BatchNorm: in training mode the buffers are passed (and so updated) only when
        # tracked; in eval mode they are used whenever they exist.
        tracked = not self.training or self.track_running_stats
        running_mean = self.running_mean if tracked else None
        running_var = self.running_var if tracked else None
        if use_batch_stats:
            group = self.process_set.group()
            rank = _runtime.current().rank
            if rank not in group:
                raise ValueError(
                    f"SyncBatchNorm: rank {rank} is not a member of its process_set "
                    f"{self.process_set}; only members may normalize with batch statistics")
            if len(group) > 1:
                return _SyncBatchNormFunction.apply(input, self.weight, self.bias, running_mean,
                                                    running_var, self.eps, factor,
                                                    self.process_set)
        return F.batch_norm(input, running_mean, running_var, self.weight, self.bias,
                            use_batch_stats, factor, self.eps)

    @classmethod
    def convert_sync_batchnorm(cls, module: torch.nn.Module,
                               process_set: ProcessSet = global_process_set) -> torch.nn.Module:
        """``module`` with every ``BatchNorm*d`` in it (itself included) replaced by a
        ``SyncBatchNorm`` over ``process_set`` that shares its parameters and buffers (same
        tensors, not copies) and its training mode. Returns the converted module (a new
        object when ``module`` itself is a batch norm); others are changed in place."""
        converted = module
        if isinstance(module, _BatchNorm) and not isinstance(module, cls):
            converted = cls(module.num_features, module.eps, module.momentum, module.affine,
                            module.track_running_stats, process_set)
            if module.affine:
                converted.weight = module.weight
                converted.bias = module.bias
            converted.running_mean = module.running_mean
            converted.running_var = module.running_var
            converted.num_batches_tracked = module.num_batches_tracked
            converted.train(module.training)
            if hasattr(module, "qconfig"):
                converted.qconfig = module.qconfig
        for name, child in module.named_children():
            converted.add_module(name, cls.convert_sync_batchnorm(child, process_set))
        return converted
