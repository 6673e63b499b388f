"""Two ranks on one GPU asked to all-reduce over NCCL: every rank gets the same clear
error (NCCL needs one GPU per rank) instead of waiting in NCCL's init."""
import pytest
import torch

import ripples.torch as hvd
from ripples.core.errors import RipplesError

hvd.init()


def test_nccl_on_a_shared_gpu_is_refused_on_every_rank_naming_the_fix():
    torch.cuda.set_device(0)
    x = torch.ones(16, device="cuda")
    with pytest.raises(RipplesError, match=r"both on GPU .*RIPPLES_GPU_PATH=host"):
        hvd.allreduce(x, op=hvd.Sum)
