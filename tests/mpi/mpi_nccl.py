"""Run under mpiexec with one GPU per rank: NCCL bootstrapped over MPI, exact results."""
import torch
from mpi4py import MPI

from ripples.comm.nccl import NcclCommunicator

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()


def _comm():
    return NcclCommunicator.from_mpi(COMM, torch.device("cuda", RANK % torch.cuda.device_count()))


def test_collectives_exact():
    with _comm() as nc:
        dev = nc.device
        x = torch.arange(10, dtype=torch.float32, device=dev) + RANK
        out = torch.empty_like(x)
        nc.allreduce(x, out, "sum")
        want_sum = [SIZE * i + SIZE * (SIZE - 1) / 2 for i in range(10)]
        avg = torch.empty_like(x)
        nc.allreduce(x, avg, "avg")
        mx = torch.empty_like(x)
        nc.allreduce(x, mx, "max")
        b = torch.full((3,), float(RANK), device=dev)
        nc.broadcast(b, root=SIZE - 1)
        g = torch.empty(2 * SIZE, device=dev)
        nc.allgather(torch.full((2,), float(RANK), device=dev), g)
        rs = torch.empty(2, device=dev)
        nc.reduce_scatter(torch.arange(2 * SIZE, dtype=torch.float32, device=dev), rs, "sum")
        torch.cuda.synchronize(dev)
        assert out.cpu().tolist() == want_sum
        assert avg.cpu().tolist() == [v / SIZE for v in want_sum]
        assert mx.cpu().tolist() == [i + SIZE - 1 for i in range(10)]
        assert b.cpu().tolist() == [float(SIZE - 1)] * 3
        assert g.cpu().tolist() == [float(r) for r in range(SIZE) for _ in range(2)]
        assert rs.cpu().tolist() == [float(SIZE * (2 * RANK + k)) for k in range(2)]
