"""One real payload over 2 GiB through the PS transport (2 ranks): rank 0 sends 3 GB with
``Outbox.send``, rank 1 receives it with ``receive`` and checks bytes on both sides of
every piece boundary."""
import time

import numpy as np
from mpi4py import MPI

from mpi_ps_common import check, run
from ripples.ps import transport as tr

SIZE = 3 * 10 ** 9


def marks():
    """Positions around every piece boundary, and the ends."""
    out = {0, SIZE - 1}
    for offset, _ in tr.pieces(SIZE):
        out.update(p for p in (offset - 1, offset, offset + 1) if 0 <= p < SIZE)
    return sorted(out)


def main():
    comm = MPI.COMM_WORLD.Dup()
    check(SIZE > 2 ** 31 and len(tr.pieces(SIZE)) > 2, "the payload needs several messages")
    if comm.Get_rank() == 0:
        payload = np.zeros(SIZE, dtype=np.uint8)
        for i, position in enumerate(marks()):
            payload[position] = 1 + i % 250
        outbox = tr.Outbox(comm)
        outbox.send(1, {"kind": "big"}, tr.REQUEST, payload)
        outbox.flush(time.monotonic() + 120, "3 GB send")
    else:
        status = MPI.Status()
        deadline = time.monotonic() + 120
        while not comm.Iprobe(source=0, tag=tr.REQUEST, status=status):
            check(time.monotonic() < deadline, "no header within 120 s")
            time.sleep(0.01)
        began = time.monotonic()
        header, buffer = tr.receive(comm, 0, tr.REQUEST, tr.BufferPool(), 120, "3 GB receive")
        check(header == {"kind": "big", "payload": SIZE} and buffer.nbytes == SIZE,
              f"header {header}")
        for i, position in enumerate(marks()):
            check(buffer[position] == 1 + i % 250, f"byte {position}")
        check(int(buffer[1 << 20:2 << 20].sum()) == 0, "untouched bytes stay zero")
        print(f"3 GB payload in {len(tr.pieces(SIZE))} messages OK "
              f"({time.monotonic() - began:.1f} s)", flush=True)


run(main)
