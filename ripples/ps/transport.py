"""Messages between workers and servers over a private communicator.

Requests go to servers with tag ``REQUEST``, answers come back with tag ``REPLY`` and carry
the request id. Every message is a small dict (pickled by mpi4py); tensors travel as
numpy arrays. Sends are non-blocking and tracked until complete. Waiting polls with a
back-off sleep (the machines have few cores: a spinning waiter steals a core from a peer)
and a deadline.
"""
from __future__ import annotations

import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch
from mpi4py import MPI

from ..errors import RipplesError, RipplesTimeoutError

REQUEST = 7301
REPLY = 7302
_MAX_IDLE_SLEEP_S = 0.0005


def to_wire(tensor: torch.Tensor):
    """A picklable copy-free view of a CPU tensor (numpy when the dtype allows it)."""
    tensor = tensor.detach().reshape(-1)
    try:
        return tensor.numpy()
    except TypeError:  # dtypes numpy lacks (bfloat16) travel as tensors
        return tensor.clone()


def from_wire(array) -> torch.Tensor:
    """A writable tensor holding a copy of ``array``."""
    if isinstance(array, np.ndarray):
        return torch.from_numpy(np.array(array, copy=True))
    return array.clone()


def state_to_wire(state: dict, shape: torch.Size, start: int, stop: int) -> dict:
    """Elements ``start:stop`` (of the flattened tensor) of one tensor's optimizer state.

    ``state`` belongs to a tensor of ``shape``. Entries of that shape (momentum buffers,
    Adam moments) travel as ``("slice", flat elements)``; everything else (step counts,
    scalars) as ``("whole", value)``, which every slice of the tensor shares.
    """
    out = {}
    for key, value in state.items():
        if isinstance(value, torch.Tensor) and value.shape == shape:
            wire = to_wire(value.reshape(-1)[start:stop])
            out[key] = ("slice", wire.copy() if isinstance(wire, np.ndarray) else wire)
        elif isinstance(value, torch.Tensor):
            out[key] = ("whole", value.detach().clone())
        else:
            out[key] = ("whole", value)
    return out


def state_from_wire(wire: dict) -> dict:
    """The optimizer state of one chunk, from ``state_to_wire``'s message."""
    return {key: from_wire(value) if kind == "slice" else
            (value.clone() if isinstance(value, torch.Tensor) else value)
            for key, (kind, value) in wire.items()}


def wire_nbytes(arrays) -> int:
    return sum(a.nbytes if isinstance(a, np.ndarray) else a.numel() * a.element_size()
               for a in arrays)


class Backoff:
    """Sleeps a little longer each idle round, up to half a millisecond; reset on progress."""

    def __init__(self):
        self.delay = 0.0

    def idle(self) -> None:
        if self.delay:
            time.sleep(self.delay)
        self.delay = min(_MAX_IDLE_SLEEP_S, self.delay * 2 or 0.00002)

    def reset(self) -> None:
        self.delay = 0.0


class Outbox:
    """Non-blocking sends kept alive until MPI reports them complete."""

    def __init__(self, comm):
        self.comm = comm
        self.requests: List[Any] = []

    def send(self, dest: int, message: dict, tag: int) -> None:
        self.requests.append(self.comm.isend(message, dest=dest, tag=tag))
        self.progress()

    def progress(self) -> None:
        if self.requests:
            self.requests = [r for r in self.requests if not r.Test()]

    def flush(self, deadline: float, what: str) -> None:
        backoff = Backoff()
        while self.requests:
            self.progress()
            if time.monotonic() > deadline:
                raise RipplesTimeoutError(f"{what}: {len(self.requests)} sends not completed")
            backoff.idle()


class Channel:
    """The worker's side: requests to servers and their answers, matched by id."""

    def __init__(self, comm, num_servers: int):
        self.comm = comm
        self.num_servers = num_servers
        self.outbox = Outbox(comm)
        self.inbox: Dict[Tuple[int, int], dict] = {}
        self.next_id = 0

    def send(self, server: int, message: dict) -> int:
        """Send ``message`` to ``server``; return the id its answer will carry."""
        self.next_id += 1
        message["rid"] = self.next_id
        self.outbox.send(server, message, REQUEST)
        return self.next_id

    def drain(self) -> bool:
        """Receive every answer that has arrived; True if any did."""
        got = False
        status = MPI.Status()
        while self.comm.Iprobe(source=MPI.ANY_SOURCE, tag=REPLY, status=status):
            source = status.Get_source()
            message = self.comm.recv(source=source, tag=REPLY)
            if message.get("heartbeat"):
                self.inbox[(source, -message["rid"])] = message
            else:
                self.inbox[(source, message["rid"])] = message
            got = True
        self.outbox.progress()
        return got

    def poll(self, server: int, rid: int) -> Optional[dict]:
        """The answer to request ``rid`` if it has arrived (without waiting), else None."""
        self.drain()
        return self._take(server, rid)

    def wait(self, server: int, rid: int, timeout_s: float, what: str) -> dict:
        """Wait for the answer to ``rid``; a heartbeat from the server extends the deadline.

        Raises RipplesTimeoutError naming the server when nothing arrives in ``timeout_s``,
        RipplesError when the server answers with an error.
        """
        deadline = time.monotonic() + timeout_s
        backoff = Backoff()
        while True:
            if self.drain():
                backoff.reset()
            answer = self._take(server, rid)
            if answer is not None:
                return answer
            if self.inbox.pop((server, -rid), None) is not None:
                deadline = time.monotonic() + timeout_s
            if time.monotonic() > deadline:
                raise RipplesTimeoutError(
                    f"{what}: parameter server {server} did not answer within {timeout_s:.1f} s "
                    f"(is it alive? raise timeout_s if the servers are just slow)")
            backoff.idle()

    def _take(self, server: int, rid: int) -> Optional[dict]:
        answer = self.inbox.pop((server, rid), None)
        if answer is not None and "error" in answer:
            raise RipplesError(f"parameter server {server}: {answer['error']}")
        return answer
