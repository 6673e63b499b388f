"""A doorbell that lets a service thread (the Group Generator's, the shared work pool's)
sleep in the kernel between requests instead of polling MPI.

Open MPI 5 has no MPI receive that sleeps (see ``ripples/schedule/service.py``), so
requests still travel over MPI, and the doorbell only says "look now": after sending a
request, a client sends one byte in a UDP datagram to the service's socket, and the
service thread waits in ``select()`` on that socket, which takes no CPU until a datagram
arrives or its timeout (e.g. the generator's next deadline) passes.

A datagram may be lost or come before the MPI message it announces; neither can hang the
service, only delay it: after each ring the service polls MPI for a short grace period, and
it never waits in ``select()`` longer than ``MAX_WAIT_S``. One socket per process (no
connection per client), so the service's file descriptors do not grow with the world.

Set up collectively (``Doorbell.setup``, or ``setup_many`` for several services, as
AD-PSGD's passive ranks): each service's rank binds a socket and shares its host and port;
every rank opens one socket of its own to ring them from (towards the loopback address for
a service on the same node). If any rank cannot, nobody gets a doorbell and the services
poll with naps, as they do without one.
"""
from __future__ import annotations

import select
import socket
from typing import Dict, Optional, Sequence, Tuple

# The longest the service sleeps without looking at MPI, in case a datagram was lost.
MAX_WAIT_S = 0.05


class Doorbell:
    """One rank's ends of the doorbells: ``ring()`` on every rank, ``wait()`` on a service's
    rank. Build it with :meth:`setup` (one service) or :meth:`setup_many` (collective)."""

    def __init__(self, outgoing: socket.socket, incoming: Optional[socket.socket],
                 targets: Dict[int, Tuple[str, int]]):
        self._out = outgoing
        self._in = incoming
        self._targets = targets  # service rank -> its socket's address, as seen from here

    @classmethod
    def setup(cls, comm, root: int = 0) -> Optional["Doorbell"]:
        """Collective over ``comm``: a doorbell on every rank towards ``root``'s socket, or
        None on every rank when some rank could not make one."""
        return cls.setup_many(comm, [root])

    @classmethod
    def setup_many(cls, comm, services: Sequence[int]) -> Optional["Doorbell"]:
        """Collective over ``comm``: a socket on each rank of ``services`` and, on every
        rank, a way to ring each of them (``ring(service)``); or None on every rank when
        some rank could not take part."""
        from mpi4py import MPI
        node = MPI.Get_processor_name()
        incoming, address = None, None
        if comm.Get_rank() in services:
            try:
                incoming = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                incoming.bind(("0.0.0.0", 0))
                incoming.setblocking(False)
                address = (socket.gethostname(), incoming.getsockname()[1], node)
            except OSError:
                incoming = _closed(incoming)
        addresses = comm.allgather(address)
        outgoing, targets = None, {}
        if all(addresses[s] is not None for s in services):
            try:
                outgoing = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                outgoing.setblocking(False)
                for service in services:
                    host, port, service_node = addresses[service]
                    target = "127.0.0.1" if service_node == node else socket.gethostbyname(host)
                    targets[service] = (target, port)
            except OSError:
                outgoing = _closed(outgoing)
        if not all(comm.allgather(outgoing is not None)):
            _closed(outgoing)
            _closed(incoming)
            return None
        return cls(outgoing, incoming, targets)

    def ring(self, service: Optional[int] = None) -> None:
        """Tell ``service`` (the only one when None) to look for a message now (best effort,
        never blocks)."""
        target = (next(iter(self._targets.values())) if service is None
                  else self._targets[service])
        try:
            self._out.sendto(b"!", target)
        except OSError:  # a full buffer: the service has rings waiting anyway
            pass

    def wait(self, timeout_s: Optional[float]) -> bool:
        """Service side: sleep until a ring or ``timeout_s`` (at most ``MAX_WAIT_S``); drain
        every ring that came. Returns whether one did."""
        timeout = MAX_WAIT_S if timeout_s is None else max(0.0, min(timeout_s, MAX_WAIT_S))
        readable, _, _ = select.select([self._in], [], [], timeout)
        if not readable:
            return False
        while True:
            try:
                self._in.recv(64)
            except BlockingIOError:
                return True

    def close(self) -> None:
        _closed(self._out)
        _closed(self._in)


def _closed(sock: Optional[socket.socket]) -> None:
    if sock is not None:
        sock.close()
    return None
