"""Messages between workers and servers over a private communicator.

Requests go to servers with tag ``REQUEST``, answers come back with tag ``REPLY`` and carry
the request id. Every message is a small header dict (pickled by mpi4py). Tensor bytes of
pushes and pulls do not go through pickle: a header with ``"payload": n`` is followed, on
tag ``DATA`` from the same sender, by ``n`` raw bytes sent with ``Isend`` from the sender's
buffer and received with ``Irecv`` straight into a buffer from a ``BufferPool``. MPI keeps
the order of messages between one pair of ranks on one tag, so the receiver takes the
payloads of one sender in the order of its headers. A payload over ``MAX_PIECE_BYTES`` is
sent as several pieces (``pieces``): MPI counts are C ints, so one message must stay under
2 GiB. Headers carry ``PROTOCOL`` as ``"v"``; the servers answer a header of another
version with an error. Rare messages (session setup, checkpoints, optimizer state on
migration) still carry numpy arrays inside the pickled header.

Sends are non-blocking and tracked until complete. Waiting polls with a back-off sleep (the
machines have few cores: a spinning waiter steals a core from a peer) and a deadline.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from mpi4py import MPI

from ..comm import failures, outbox
from ..comm.mpi import Deadline, wait_all
from ..core.errors import RipplesError, RipplesTimeoutError

REQUEST = 7301
REPLY = 7302
DATA = 7303
PROTOCOL = 2
MAX_PIECE_BYTES = 1 << 30
ALIGN = 64  # every tensor in a payload starts at a multiple of this (any dtype can view it)
_MAX_IDLE_SLEEP_S = 0.0005


def pieces(nbytes: int, limit: int = MAX_PIECE_BYTES) -> List[Tuple[int, int]]:
    """``(offset, length)`` of the messages that carry a payload of ``nbytes`` bytes: as few
    as possible, each at most ``limit`` bytes, in order, covering every byte once."""
    if nbytes < 0 or limit < 1:
        raise ValueError(f"pieces: nbytes must be >= 0 and limit >= 1, got {nbytes}, {limit}")
    return [(offset, min(limit, nbytes - offset)) for offset in range(0, nbytes, limit)]


def layout(sizes: Sequence[int]) -> Tuple[List[int], int]:
    """Offsets of tensors of ``sizes`` bytes packed one after another in a payload, each
    aligned to ``ALIGN`` bytes, and the payload's total size."""
    offsets, position = [], 0
    for size in sizes:
        offsets.append(position)
        position += -(-size // ALIGN) * ALIGN
    return offsets, position


def as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """The bytes of a contiguous CPU tensor as a flat uint8 tensor (no copy)."""
    return tensor.detach().reshape(-1).view(torch.uint8)


def pack(pool: "BufferPool", tensors: Sequence[torch.Tensor]) -> np.ndarray:
    """One payload holding the bytes of ``tensors`` (CPU or CUDA, any dtype) at the offsets
    ``layout`` gives: a buffer from ``pool`` with one copy per tensor."""
    offsets, total = layout([t.numel() * t.element_size() for t in tensors])
    buffer = pool.take(total)
    flat = torch.from_numpy(buffer)
    for tensor, offset in zip(tensors, offsets):
        size = tensor.numel() * tensor.element_size()
        flat[offset:offset + size].view(tensor.dtype).copy_(tensor.detach().reshape(-1))
    return buffer


def unpack(payload: np.ndarray, specs: Sequence[Tuple[int, torch.dtype]]) -> List[torch.Tensor]:
    """Views into ``payload`` (no copy) of tensors of ``(numel, dtype)`` packed by ``pack``.

    Raises ValueError when the payload's size does not match ``specs``."""
    sizes = [numel * torch.empty(0, dtype=dtype).element_size() for numel, dtype in specs]
    offsets, total = layout(sizes)
    if payload is None and total == 0:
        return []
    if payload is None or payload.nbytes != total:
        got = 0 if payload is None else payload.nbytes
        raise ValueError(f"payload of {got} bytes does not match its header ({total} bytes "
                         f"for {len(specs)} tensors)")
    flat = torch.from_numpy(payload)
    return [flat[offset:offset + size].view(dtype)
            for (numel, dtype), offset, size in zip(specs, offsets, sizes)]


class BufferPool:
    """Reusable uint8 buffers by size, so that a steady stream of equal payloads does not
    allocate (and page-fault) a fresh buffer per message. Keeps at most ``keep`` spares per
    size; a buffer given back must no longer be in use."""

    def __init__(self, keep: int = 4):
        self.keep = keep
        self.spare: Dict[int, List[np.ndarray]] = {}

    def take(self, nbytes: int) -> np.ndarray:
        stack = self.spare.get(nbytes)
        return stack.pop() if stack else np.empty(nbytes, dtype=np.uint8)

    def give(self, buffer: np.ndarray) -> None:
        stack = self.spare.setdefault(buffer.nbytes, [])
        if len(stack) < self.keep:
            stack.append(buffer)


def receive(comm, source: int, tag: int, pool: BufferPool, timeout_s: float,
            what: str) -> Tuple[Any, Optional[np.ndarray]]:
    """Receive the header waiting from ``source`` on ``tag`` and its payload, if it has one.

    Returns ``(header, payload or None)``. The payload's pieces are received with ``Irecv``
    into one buffer from ``pool``; waiting for them is bounded by ``timeout_s``
    (RipplesTimeoutError naming ``what`` and the sender).
    """
    header = comm.recv(source=source, tag=tag)
    nbytes = header.get("payload", 0) if isinstance(header, dict) else 0
    if not isinstance(nbytes, int) or nbytes <= 0:
        return header, None
    buffer = pool.take(nbytes)
    requests = [comm.Irecv([buffer[offset:offset + length], MPI.BYTE], source=source, tag=DATA)
                for offset, length in pieces(nbytes)]
    deadline = Deadline(timeout_s, timeout_s,
                        lambda: f"{what}: the {nbytes}-byte payload from rank {source}",
                        missing=lambda: [source])
    try:
        wait_all(requests, deadline)  # a dead sender raises its own error class
    except RipplesTimeoutError:
        outbox.withdraw(*requests, buffers=(buffer,))
        raise
    return header, buffer


def to_wire(tensor: torch.Tensor, copy: bool = False):
    """A picklable flat view of ``tensor``'s values in host memory: a numpy array where the
    dtype allows it, else a tensor (bfloat16). A CPU tensor is not copied unless ``copy``
    (the result then shares nothing with it); a CUDA tensor is always copied to the host."""
    tensor = tensor.detach().reshape(-1)
    if not tensor.is_cpu:
        tensor, copy = tensor.cpu(), False  # the move is the copy
    try:
        array = tensor.numpy()
    except TypeError:  # dtypes numpy lacks (bfloat16) travel as tensors; a clone pickles
        return tensor.clone()  # its own elements only, not all of its base's storage
    return array.copy() if copy else array


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
            out[key] = ("slice", to_wire(value.reshape(-1)[start:stop], copy=True))
        elif isinstance(value, torch.Tensor):
            out[key] = ("whole", value.detach().cpu().clone())
        else:
            out[key] = ("whole", value)
    return out


def state_from_wire(wire: dict) -> dict:
    """The optimizer state of one chunk, from ``state_to_wire``'s message."""
    return {key: from_wire(value) if kind == "slice" else
            (value.clone() if isinstance(value, torch.Tensor) else value)
            for key, (kind, value) in wire.items()}


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
    """Non-blocking sends kept alive (with their buffers) until MPI reports them complete."""

    def __init__(self, comm):
        self.comm = comm
        self.requests: List[Any] = []
        self.done: List[Tuple[List[Any], Callable[[], None]]] = []

    def send(self, dest: int, message: dict, tag: int, payload: Optional[np.ndarray] = None,
             on_sent: Optional[Callable[[], None]] = None) -> None:
        """Send ``message`` (a header) and then ``payload``'s bytes, if given, on ``DATA``.

        ``payload`` must stay unchanged until ``on_sent`` is called (once every piece has
        been sent; e.g. to give the buffer back to its pool)."""
        if payload is not None:
            message["payload"] = payload.nbytes
        try:
            requests = [self.comm.isend(message, dest=dest, tag=tag)]
            if payload is not None:
                requests += [self.comm.Isend([payload[offset:offset + length], MPI.BYTE],
                                             dest=dest, tag=DATA)
                             for offset, length in pieces(payload.nbytes)]
        except MPI.Exception as error:
            if not failures.is_process_failure(error):
                raise
            requests = []  # fault tolerant and ``dest`` is dead: nobody is left to read it
        self.requests.extend(requests)
        if on_sent is not None:
            self.done.append((requests, on_sent))
        self.progress()

    def progress(self) -> None:
        if self.requests:
            self.requests = [r for r in self.requests if not _completed(r)]
        if self.done:
            pending = set(map(id, self.requests))
            waiting = []
            for requests, on_sent in self.done:
                if any(id(r) in pending for r in requests):
                    waiting.append((requests, on_sent))
                else:
                    on_sent()
            self.done = waiting

    def flush(self, deadline: float, what: str) -> None:
        backoff = Backoff()
        while self.requests:
            self.progress()
            if time.monotonic() > deadline:
                raise RipplesTimeoutError(f"{what}: {len(self.requests)} sends not completed")
            backoff.idle()


def _completed(request) -> bool:
    try:
        return request.Test()
    except MPI.Exception as error:
        if not failures.is_process_failure(error):
            raise
        return True  # fault tolerant and the receiver died: the send is over


class Channel:
    """The worker's side: requests to servers and their answers, matched by id.

    An answer's payload, if any, is attached to it as ``answer["_payload"]`` (a buffer of
    ``pool``; give it back once read). Errors the servers could not match to a request (a
    header without an id) are kept in ``unmatched_errors``."""

    def __init__(self, comm, num_servers: int):
        self.comm = comm
        self.num_servers = num_servers
        self.outbox = Outbox(comm)
        self.pool = BufferPool()
        self.inbox: Dict[Tuple[int, int], dict] = {}
        self.unmatched_errors: List[Tuple[int, str]] = []
        self.next_id = 0
        self.timeout_s = 60.0
        self.deaths = failures.DeathWatch(comm)

    def send(self, server: int, message: dict, payload: Optional[np.ndarray] = None,
             on_sent: Optional[Callable[[], None]] = None) -> int:
        """Send ``message`` (and ``payload``'s bytes) to ``server``; return the id its
        answer will carry."""
        self.next_id += 1
        message["rid"] = self.next_id
        message["v"] = PROTOCOL
        self.outbox.send(server, message, REQUEST, payload, on_sent)
        return self.next_id

    def drain(self) -> bool:
        """Receive every answer that has arrived; True if any did."""
        got = False
        status = MPI.Status()
        while self._probe(status):
            source = status.Get_source()
            message, payload = receive(self.comm, source, REPLY, self.pool, self.timeout_s,
                                       "answer")
            if payload is not None:
                message["_payload"] = payload
            message["_arrived"] = time.monotonic()
            if message.get("rid") is None:
                self.unmatched_errors.append((source, message.get("error", repr(message))))
            elif message.get("heartbeat"):
                self.inbox[(source, -message["rid"])] = message
            else:
                self.inbox[(source, message["rid"])] = message
            got = True
        self.outbox.progress()
        return got

    def _probe(self, status) -> bool:
        try:
            return self.comm.Iprobe(source=MPI.ANY_SOURCE, tag=REPLY, status=status)
        except MPI.Exception as error:  # fault tolerant: a rank of the job died
            servers = [r for r in self.deaths.absorb(error) if r < self.num_servers]
            if servers:
                raise RipplesError(
                    f"parameter server(s) {servers} died: the parameters they held are lost; "
                    "resume from a checkpoint (ripplesrun --max-restarts N restarts the job)"
                ) from error
            return False  # a worker died: the servers go on without it

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
