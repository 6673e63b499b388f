"""The decisions of the CUDA all-reduce path that need no GPU: the NCCL op for each
ReduceOp and dtype, the path in the signature (members must agree on it), and one NCCL
communicator device per group. The data movement itself runs in the GPU tests."""
import pytest
import torch

from ripples.ops import gpu, reduction
from ripples.core.reduce_ops import ReduceOp


@pytest.mark.parametrize("op,expected", [(ReduceOp.SUM, "max"), (ReduceOp.PRODUCT, "min"),
                                         (ReduceOp.MIN, "min"), (ReduceOp.MAX, "max")])
def test_bool_reductions_are_or_and_and_as_on_the_host(op, expected):
    assert gpu.nccl_operation(op, torch.bool, active=2, members=2) == expected


def test_average_is_one_nccl_pass_only_when_every_member_contributes():
    assert gpu.nccl_operation(ReduceOp.AVERAGE, torch.float32, active=4, members=4) == "avg"
    # a joined member contributes zeros: sum, then divide by the 3 active ones
    assert gpu.nccl_operation(ReduceOp.AVERAGE, torch.float32, active=3, members=4) == "sum"
    assert gpu.nccl_operation(ReduceOp.SUM, torch.float16, active=4, members=4) == "sum"
    assert gpu.nccl_operation(ReduceOp.PRODUCT, torch.int32, active=4, members=4) == "prod"


def test_the_gpu_path_is_part_of_a_cuda_all_reduce_signature():
    texts = reduction._allreduce_texts
    by_path = {path: texts("allreduce", ReduceOp.SUM, torch.float32, (4,), path, 1.0, 1.0)
               for path in ("nccl", "mpi", "host")}
    for path, (sig, wire) in by_path.items():
        assert sig.endswith(f" on cuda/{path}") and wire.split("|")[1].endswith(f":cuda/{path}")
    assert len({sig for sig, _ in by_path.values()}) == 3
    assert len({wire for _, wire in by_path.values()}) == 3
    host = texts("allreduce", ReduceOp.SUM, torch.float32, (4,), None, 1.0, 1.0)
    assert " on " not in host[0] and host[1].split("|")[1].endswith(":cpu")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_sums_staged_through_the_host_send_what_host_tensors_send(dtype):
    """A joined rank contributes what the wire says: staged CUDA tensors are reduced as
    host tensors (16-bit on the wire), NCCL in their own dtype, CUDA-aware MPI in float32."""
    def sent(path):
        wire = reduction._allreduce_texts("allreduce", ReduceOp.SUM, dtype, (8,), path, 1.0,
                                          1.0)[1]
        return wire.split("|")[3]

    name = str(dtype)[6:]
    assert sent("host") == sent(None) == name
    assert sent("mpi") == "float32"


def test_automatic_path_without_nccl_is_the_host_and_a_setting_is_taken_as_given(monkeypatch):
    from ripples.comm import nccl
    monkeypatch.setattr(nccl, "nccl_available", lambda: False)
    gpu._automatic_gpu_path.cache_clear()
    try:
        assert gpu.gpu_path("auto") == "host"
        monkeypatch.setattr(nccl, "nccl_available", lambda: True)
        gpu._automatic_gpu_path.cache_clear()
        assert gpu.gpu_path("auto") == "nccl"
    finally:
        gpu._automatic_gpu_path.cache_clear()
    assert [gpu.gpu_path(s) for s in ("nccl", "mpi", "host")] == ["nccl", "mpi", "host"]


def test_an_unknown_gpu_path_is_refused_naming_the_choices():
    from ripples.core.config import Config
    with pytest.raises(ValueError, match=r"gpu_path.*'auto' or 'nccl' or 'mpi' or 'host'"):
        Config(gpu_path="cuda")


def test_a_group_keeps_its_nccl_communicator_on_one_device():
    class Built:
        device = torch.device("cuda", 0)

        def close(self):
            pass

    cache, mpi_comm = gpu.NcclCache(), object()
    cache._entries[(0, 1)] = (mpi_comm, Built())
    assert isinstance(cache.get((0, 1), mpi_comm, torch.device("cuda", 0)), Built)
    with pytest.raises(ValueError, match=r"group \(0, 1\) got a tensor on cuda:1.*cuda:0"):
        cache.get((0, 1), mpi_comm, torch.device("cuda", 1))


def test_an_nccl_operation_past_its_deadline_aborts_the_communicator_and_names_the_group(
        monkeypatch):
    """The wiring of NcclCommunicator to its watchdog, with fake CUDA events and stream
    (the logic itself: tests/test_nccl_watchdog.py)."""
    from ripples.comm import nccl as nccl_module
    from ripples.comm.nccl import NcclCommunicator
    from ripples.comm.nccl_watchdog import NcclWatchdog
    from ripples.core.errors import RipplesTimeoutError

    class Event:
        def __init__(self):
            self.recorded_on = None

        def record(self, stream):
            self.recorded_on = stream

        def query(self):
            return self is events[0]  # the operation began; it never finishes

    events = []
    monkeypatch.setattr(nccl_module, "CudaEvent", lambda index: events.append(Event()) or events[-1])
    monkeypatch.setattr(nccl_module, "current_stream_handle", lambda index: 7)
    calls = []

    class Comm:
        def allReduce(self, *args):
            calls.append(args)

        def abort(self):
            calls.append("abort")

    now = [0.0]
    dog = NcclWatchdog(5.0, clock=lambda: now[0], start_thread=False)
    comm = object.__new__(NcclCommunicator)  # no cupy here: set what __init__ would
    comm._comm, comm.watchdog, comm.label = Comm(), dog, "group (0, 3)"
    comm._nccl = type("Nccl", (), {"NcclError": RuntimeError})
    comm.rank, comm.size, comm.device = 0, 2, torch.device("cuda", 0)
    comm._call("allreduce", comm._comm.allReduce, 1, 2, 3)
    assert calls == [(1, 2, 3, 7)] and len(dog.pending) == 1
    dog.check()  # began: its clock starts
    now[0] = 5.5
    dog.check()
    assert calls[-1] == "abort" and comm._comm is None
    with pytest.raises(RipplesTimeoutError, match=r"NCCL allreduce on group \(0, 3\)"):
        comm._check(torch.zeros(1), "tensor")
