"""NCCL backend: clear errors without cupy (runs everywhere); a world of one rank on a GPU;
two MPI-launched ranks on two GPUs."""
import pytest
import torch

from gpu_support import require_gpu
from mpi_launch import run_pytest_under_mpi
from ripples.comm import nccl as backend


def test_without_cupy_nccl_is_unavailable_and_construction_explains():
    try:
        import cupy  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("cupy is installed")
    assert backend.nccl_available() is False
    with pytest.raises(RuntimeError, match="cupy") as info:
        backend.NcclCommunicator(1, None, 0)
    assert isinstance(info.value.__cause__, ImportError)

    class NoMpi:  # from_mpi must fail on the import before touching the communicator
        def __getattr__(self, name):
            raise AssertionError(f"communicator used: {name}")

    with pytest.raises(RuntimeError, match="cupy"):
        backend.NcclCommunicator.from_mpi(NoMpi())


@pytest.fixture
def world_of_one():
    require_gpu()
    from cupy.cuda import nccl

    comm = backend.NcclCommunicator(1, nccl.get_unique_id(), 0, torch.device("cuda", 0))
    yield comm
    comm.close()


DTYPES = [torch.float16, torch.float32, torch.float64, torch.int32, torch.int64]

# Rank 0 of a two-rank communicator whose rank 1 never comes: the real NCCL init must give
# up at the bound. Its own process, so that the init left waiting cannot touch other tests.
_LONELY_INIT = """
import os, sys, time, torch
from cupy.cuda import nccl
from ripples.comm.nccl import NcclCommunicator
from ripples.core.errors import RipplesTimeoutError
began = time.monotonic()
try:
    NcclCommunicator(2, nccl.get_unique_id(), 0, torch.device("cuda", 0),
                     label="group (0, 1)", init_timeout_s=2.0)
except RipplesTimeoutError as exc:
    print(f"TIMEOUT after {time.monotonic() - began:.1f} s: {exc}", flush=True)
    os._exit(0)
print("INIT RETURNED", flush=True)
os._exit(1)
"""


@pytest.mark.gpu
def test_an_init_whose_peer_never_comes_gives_up_at_its_bound():
    import subprocess
    import sys

    require_gpu()
    result = subprocess.run([sys.executable, "-c", _LONELY_INIT], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    seconds = float(result.stdout.split("TIMEOUT after ")[1].split(" s")[0])
    assert 2.0 <= seconds < 5.0, result.stdout
    assert "group (0, 1) (rank 0 of 2): ncclCommInitRank did not complete" in result.stdout


@pytest.mark.gpu
def test_world_of_one_under_a_watchdog_completes_and_is_forgotten():
    require_gpu()
    from cupy.cuda import nccl

    from ripples.comm.nccl_watchdog import NcclWatchdog

    dog = NcclWatchdog(30.0, start_thread=False)
    comm = backend.NcclCommunicator(1, nccl.get_unique_id(), 0, torch.device("cuda", 0),
                                    watchdog=dog, label="world")
    x = torch.ones(1 << 20, device="cuda")
    comm.allreduce(x, x, "sum")
    assert len(dog.pending) == 1
    torch.cuda.synchronize()
    dog.check()
    assert dog.pending == [] and dog.failures == {}
    comm.close()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", backend.OPS)
def test_world_of_one_allreduce_is_identity(world_of_one, dtype, op):
    x = torch.arange(-5, 6, device="cuda").to(dtype)
    out = torch.empty_like(x)
    world_of_one.allreduce(x, out, op)
    torch.cuda.synchronize()
    assert torch.equal(out.cpu(), torch.arange(-5, 6).to(dtype))


@pytest.mark.gpu
def test_world_of_one_other_collectives(world_of_one):
    x = torch.arange(8, dtype=torch.float32, device="cuda")
    world_of_one.broadcast(x, root=0)
    gathered = torch.empty(8, device="cuda")
    world_of_one.allgather(x, gathered)
    scattered = torch.empty(8, device="cuda")
    world_of_one.reduce_scatter(x, scattered, "sum")
    if torch.bfloat16 in world_of_one._dtypes:
        b = torch.arange(4, device="cuda").bfloat16()
        world_of_one.allreduce(b, b, "sum")
        assert b.cpu().tolist() == [0.0, 1.0, 2.0, 3.0]
    torch.cuda.synchronize()
    assert x.cpu().tolist() == list(range(8))
    assert gathered.cpu().tolist() == list(range(8))
    assert scattered.cpu().tolist() == list(range(8))


@pytest.mark.gpu
def test_argument_errors(world_of_one):
    x = torch.ones(4, device="cuda")
    with pytest.raises(ValueError, match="op"):
        world_of_one.allreduce(x, x, "mean")
    with pytest.raises(ValueError, match="recv_tensor"):
        world_of_one.allreduce(x, torch.empty(5, device="cuda"))
    with pytest.raises(TypeError, match="recv_tensor"):
        world_of_one.allreduce(x, torch.empty(4, device="cuda", dtype=torch.float64))
    with pytest.raises(ValueError, match="contiguous"):
        world_of_one.broadcast(torch.ones(4, 4, device="cuda").t())
    with pytest.raises(ValueError, match="send_tensor"):
        world_of_one.allreduce(torch.ones(4), torch.ones(4))
    with pytest.raises(ValueError, match="root"):
        world_of_one.broadcast(x, root=1)
    world_of_one.close()
    from ripples.core.errors import RipplesError
    with pytest.raises(RipplesError, match="closed"):
        world_of_one.allreduce(x, x)


@pytest.mark.gpu
def test_two_ranks_under_mpi():
    require_gpu()
    if torch.cuda.device_count() < 2:
        pytest.skip("NCCL needs one GPU per rank: fewer than 2 GPUs")
    run_pytest_under_mpi("mpi_nccl.py", 2, timeout=120)


def test_ranks_sharing_a_gpu_are_found_by_host_and_gpu():
    assert backend.ranks_sharing_a_gpu([("a", "u0"), ("a", "u1"), ("b", "u0")]) is None
    assert backend.ranks_sharing_a_gpu([("a", "u0"), ("a", "u1"), ("a", "u1"), ("a", "u0")]) \
        == (1, 2)


def test_two_members_on_one_gpu_are_refused_before_nccl_is_asked(monkeypatch):
    """Every member gets the same places, so every member raises (no rank waits in NCCL's
    init for a peer that refused)."""
    class Comm:
        def Get_rank(self):
            return 1

        def Get_size(self):
            return 2

        def allgather(self, place):
            return [("host", "GPU-1"), place]

        def bcast(self, *args, **kwargs):
            raise AssertionError("the unique id must not be sent")

    monkeypatch.setattr(backend, "_import_nccl", lambda: None)
    monkeypatch.setattr(backend, "_as_cuda_device", lambda device: torch.device("cuda", 0))
    monkeypatch.setattr(backend, "_gpu_place", lambda device: ("host", "GPU-1"))
    from ripples.core.errors import RipplesError
    with pytest.raises(RipplesError, match=r"group \(0, 1\): ranks 0 and 1 of it are both on "
                                           r"GPU \('host', 'GPU-1'\).*RIPPLES_GPU_PATH=host"):
        backend.NcclCommunicator.from_mpi(Comm(), label="group (0, 1)")
