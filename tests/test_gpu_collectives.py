"""CUDA tensors through the collectives and the optimizer (NCCL with one GPU per rank, the
host path where ranks share a GPU, the data-movement collectives through host memory):
GPU machines only."""
import re
import sys

import pytest

from gpu_support import require_gpu
from mpi_launch import TESTS_DIR, run_mpi, run_pytest_under_mpi

HOST_PATH = {"RIPPLES_GPU_PATH": "host"}


def _two_gpus():
    import torch
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs (NCCL puts one rank per GPU)")


@pytest.mark.gpu
def test_cuda_collectives_two_ranks():
    require_gpu()
    _two_gpus()
    run_pytest_under_mpi("mpi_gpu_collectives.py", 2)


@pytest.mark.gpu
def test_cuda_optimizer_in_every_mode_two_ranks_over_nccl():
    require_gpu()
    _two_gpus()
    run_pytest_under_mpi("mpi_gpu_optimizer.py", 2, timeout=300)


@pytest.mark.gpu
def test_cuda_collectives_two_ranks_sharing_one_gpu_through_the_host():
    require_gpu(need_cupy=False)
    run_pytest_under_mpi("mpi_gpu_collectives.py", 2, env=HOST_PATH)


@pytest.mark.gpu
def test_cuda_optimizer_in_every_mode_two_ranks_sharing_one_gpu_through_the_host():
    require_gpu(need_cupy=False)
    run_pytest_under_mpi("mpi_gpu_optimizer.py", 2, timeout=300, env=HOST_PATH)


@pytest.mark.gpu
def test_nccl_refuses_two_ranks_on_one_gpu_on_every_rank():
    require_gpu()
    run_pytest_under_mpi("mpi_gpu_shared_nccl.py", 2, timeout=120,
                         env={"RIPPLES_GPU_PATH": "nccl"})


@pytest.mark.gpu
def test_cuda_data_movement_through_host_memory_two_ranks_on_one_gpu():
    require_gpu(need_cupy=False)
    run_pytest_under_mpi("mpi_gpu_staged.py", 2)


@pytest.mark.gpu
def test_parameter_server_mode_trains_a_cuda_model_as_the_host_model():
    require_gpu(need_cupy=False)
    result = run_mpi([sys.executable, str(TESTS_DIR / "mpi" / "mpi_gpu_ps.py")], 3, timeout=180,
                     env={**HOST_PATH, "RIPPLES_PS_SERVERS": "1"})
    assert sorted(re.findall(r"GPU_PS worker=(\d) ok", result.stdout)) == ["0", "1"], \
        result.stdout
