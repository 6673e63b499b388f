"""The bounded NCCL init, with stand-ins for the NCCL constructor (no GPU needed)."""
import sys
import threading
import time

import pytest

from ripples.comm.nccl_init import bounded_init
from ripples.core.errors import RipplesTimeoutError


class Comm:
    def __init__(self):
        self.destroyed = threading.Event()

    def destroy(self):
        self.destroyed.set()


def test_an_init_that_completes_in_time_returns_its_communicator_from_another_thread():
    comm, threads = Comm(), []
    made = bounded_init(lambda: threads.append(threading.current_thread()) or comm, 5.0, "w")
    assert made is comm and threads[0] is not threading.current_thread()
    assert not comm.destroyed.is_set()


def test_without_a_timeout_the_init_runs_on_the_callers_thread():
    threads = []
    bounded_init(lambda: threads.append(threading.current_thread()) or Comm(), None, "w")
    assert threads == [threading.current_thread()]


def test_an_init_error_is_raised_as_is():
    def fail():
        raise ValueError("unique id of another job")
    with pytest.raises(ValueError, match="unique id of another job"):
        bounded_init(fail, 5.0, "w")


def test_an_init_past_its_timeout_raises_naming_it_and_a_late_communicator_is_destroyed():
    release, comm = threading.Event(), Comm()

    def wait_for_a_peer():
        release.wait(10)
        return comm

    began = time.monotonic()
    with pytest.raises(RipplesTimeoutError, match=r"group \(0, 1\) \(rank 0 of 2\): "
                                                  r"ncclCommInitRank did not complete within 0\.3 s"):
        bounded_init(wait_for_a_peer, 0.3, "group (0, 1) (rank 0 of 2)")
    assert time.monotonic() - began < 2.0
    release.set()  # the peer shows up after all: nobody uses the communicator
    assert comm.destroyed.wait(5)


def test_the_communicator_bounds_its_init_with_the_watchdogs_timeout(monkeypatch):
    """from_mpi's path into the constructor, with stand-in MPI, cupy and NCCL."""
    from ripples.comm import nccl as nccl_module
    from ripples.comm.nccl_watchdog import NcclWatchdog

    release = threading.Event()

    class Device:
        def __init__(self, index):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    class FakeNccl:
        NCCL_SUM, NCCL_PROD, NCCL_MIN, NCCL_MAX = 0, 1, 3, 2
        NCCL_INT8, NCCL_UINT8, NCCL_INT32, NCCL_INT64 = 0, 1, 2, 4
        NCCL_FLOAT16, NCCL_FLOAT32, NCCL_FLOAT64 = 6, 7, 8
        class NcclError(RuntimeError):  # cupy's is its own class, as here
            pass

        @staticmethod
        def get_unique_id():
            return b"id"

        @staticmethod
        def get_version():
            return 22809

        class NcclCommunicator:
            def __init__(self, size, unique_id, rank):
                release.wait(10)  # the other member never asks

            def destroy(self):
                pass

    monkeypatch.setattr(nccl_module, "_import_nccl", lambda: FakeNccl)
    monkeypatch.setitem(sys.modules, "cupy", type("cupy", (), {
        "cuda": type("cuda", (), {"Device": Device})}))
    class MpiComm:  # rank 1 of 2; the collectives answer as rank 0's would
        def Get_rank(self):
            return 1

        def Get_size(self):
            return 2

        def allgather(self, place):
            return [("host", "GPU-0"), place]

        def bcast(self, value, root):
            return b"id"

    monkeypatch.setattr(nccl_module, "_gpu_place", lambda device: ("host", "GPU-1"))
    dog = NcclWatchdog(0.2, start_thread=False)
    began = time.monotonic()
    with pytest.raises(RipplesTimeoutError, match=r"group \(0, 3\) \(rank 1 of 2\): "
                                                  r"ncclCommInitRank did not complete"):
        nccl_module.NcclCommunicator.from_mpi(MpiComm(), device=0, watchdog=dog,
                                              label="group (0, 3)")
    assert time.monotonic() - began < 2.0
    release.set()
