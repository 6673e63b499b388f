"""CUDA tensors through the collectives (NCCL path, and the data-movement collectives
through host memory): GPU machines only."""
import pytest

from gpu_support import require_gpu
from mpi_launch import run_pytest_under_mpi


@pytest.mark.gpu
def test_cuda_collectives_two_ranks():
    require_gpu()
    import torch
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs (NCCL puts one rank per GPU)")
    run_pytest_under_mpi("mpi_gpu_collectives.py", 2)


@pytest.mark.gpu
def test_cuda_data_movement_through_host_memory_two_ranks_on_one_gpu():
    require_gpu(need_cupy=False)
    run_pytest_under_mpi("mpi_gpu_staged.py", 2)
