"""Requests nobody waits for (``ripples.comm.outbox``), on 3 ranks: what they send arrives
intact although the sender let go of them, and the process does not crash."""
import gc
import time

import numpy as np
from mpi4py import MPI

from ripples.comm import outbox

LATE_S = 0.5  # how long the receiving rank lets the sender's requests wait
BIG = 100_000  # elements: too many to go eagerly, so MPI reads them once the peer comes


def _reuse_freed_memory():
    """Allocate what a freed buffer of the sizes above would be given to."""
    return [np.full(BIG, 7.0) for _ in range(20)] + [bytes([255]) * 200_000 for _ in range(20)]


def test_a_kept_send_reaches_its_receiver_intact():
    comm = MPI.COMM_WORLD.Dup()
    message = [bytes([index]) * 200_000 for index in range(4)]
    if comm.rank == 0:
        for index, part in enumerate(message):
            outbox.keep_until_complete(comm.isend(part, dest=1, tag=index))
        del part
        gc.collect()
        reused = _reuse_freed_memory()
        comm.Barrier()
        assert len(reused) == 40
    elif comm.rank == 1:
        time.sleep(LATE_S)
        received = [comm.recv(source=0, tag=index) for index in range(4)]
        comm.Barrier()
        assert received == message
    else:
        comm.Barrier()
    comm.Free()


def test_a_collective_given_up_on_completes_with_its_buffers_intact():
    """Rank 0 gives up on an all-reduce that rank 2 joins late: kept with its buffers, the
    others still get rank 0's contribution."""
    comm = MPI.COMM_WORLD.Dup()
    if comm.rank == 2:
        time.sleep(LATE_S)
    contribution, result = np.full(BIG, float(comm.rank + 1)), np.zeros(BIG)
    request = comm.Iallreduce(contribution, result, op=MPI.SUM)
    if comm.rank == 0:
        outbox.keep_until_complete(request, buffers=(contribution, result))
        del contribution, result, request
        gc.collect()
        reused = _reuse_freed_memory()
        assert len(reused) == 40
    else:
        request.Wait()
        assert np.all(result == 6.0), np.unique(result)
    comm.Barrier()
    comm.Free()


def test_a_withdrawn_receive_leaves_the_late_message_to_the_next_one():
    """Rank 0 gives up a receive before rank 1 sends: withdrawn, it takes nothing, and the
    message arrives whole at rank 0's next receive."""
    comm = MPI.COMM_WORLD.Dup()
    late = np.arange(BIG, dtype=np.float64)
    if comm.rank == 0:
        given_up = np.zeros(BIG)
        outbox.withdraw(comm.Irecv(given_up, source=1, tag=5), buffers=(given_up,))
        comm.Barrier()  # rank 1 sends only now
        received = np.zeros(BIG)
        comm.Recv(received, source=1, tag=5)
        assert np.array_equal(received, late)
        assert not given_up.any()
    elif comm.rank == 1:
        comm.Barrier()
        comm.Send(late, dest=0, tag=5)
    else:
        comm.Barrier()
    comm.Free()
