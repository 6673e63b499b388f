"""Cutting parameters into chunks and assigning every chunk to exactly one server.

All functions here are pure: the same inputs give the same map on every rank, so workers
and servers agree on the map without talking. A map carries a version so that a later
load balancer can replace it at an iteration boundary and messages can say which map
they were built against.

Placements (the defaults that systems ship with):

- ``"roundrobin"`` (TensorFlow): tensors cut into ``chunk_bytes`` pieces, piece ``i`` goes
  to server ``i % S``.
- ``"mxnet"``: a tensor with key ``k`` goes whole to server ``(k * 9973) % S``; a tensor
  larger than ``chunk_bytes`` is split into ``S`` near-equal slices, slice ``j`` on server
  ``j`` (MXNet's big-array rule).
- ``"hash"`` (BytePS): ``chunk_bytes`` partitions, each hashed (CRC-32 of
  ``"name:index"``, stable across processes) to a server.
- ``"greedy"``: ``chunk_bytes`` pieces, largest first, each to the server holding the
  fewest bytes so far (longest-processing-time rule; balances bytes within 4/3 of optimal).
"""
from __future__ import annotations

import dataclasses
import zlib
from typing import Callable, Dict, List, Sequence, Tuple


@dataclasses.dataclass(frozen=True)
class ParamInfo:
    """What placement needs to know about one parameter tensor."""

    name: str
    numel: int
    itemsize: int


@dataclasses.dataclass(frozen=True)
class Chunk:
    """Elements ``[start, stop)`` of the flattened parameter number ``param``."""

    cid: int
    param: int
    start: int
    stop: int
    itemsize: int

    @property
    def nbytes(self) -> int:
        return (self.stop - self.start) * self.itemsize


@dataclasses.dataclass(frozen=True)
class ChunkMap:
    """A versioned assignment chunk -> server. ``owners[i]`` owns ``chunks[i]``.

    ``active`` lists the servers workers talk to (every owner is one; a server may be
    active without chunks under a static placement); empty means all ``num_servers``.
    The others are spares, idle until a new map gives them chunks."""

    version: int
    num_servers: int
    chunks: Tuple[Chunk, ...]
    owners: Tuple[int, ...]
    active: Tuple[int, ...] = ()

    @property
    def members(self) -> Tuple[int, ...]:
        return self.active or tuple(range(self.num_servers))

    def chunks_of(self, server: int) -> List[Chunk]:
        """The chunks owned by ``server``, in chunk-id order."""
        return [c for c, s in zip(self.chunks, self.owners) if s == server]

    def bytes_per_server(self) -> List[int]:
        load = [0] * self.num_servers
        for c, s in zip(self.chunks, self.owners):
            load[s] += c.nbytes
        return load


def split_into_pieces(params: Sequence[ParamInfo], chunk_bytes: int) -> List[Chunk]:
    """Cut every parameter into consecutive pieces of at most ``chunk_bytes`` bytes."""
    chunks: List[Chunk] = []
    for index, p in enumerate(params):
        per = max(1, chunk_bytes // p.itemsize)
        for start in range(0, max(p.numel, 1), per):
            chunks.append(Chunk(len(chunks), index, start, min(start + per, p.numel), p.itemsize))
    return chunks


def roundrobin(params: Sequence[ParamInfo], num_servers: int, chunk_bytes: int):
    chunks = split_into_pieces(params, chunk_bytes)
    return chunks, [c.cid % num_servers for c in chunks]


def mxnet(params: Sequence[ParamInfo], num_servers: int, chunk_bytes: int):
    chunks: List[Chunk] = []
    owners: List[int] = []
    for key, p in enumerate(params):
        if p.numel * p.itemsize > chunk_bytes and num_servers > 1:
            bounds = [p.numel * j // num_servers for j in range(num_servers + 1)]
            for j in range(num_servers):
                if bounds[j + 1] > bounds[j]:
                    chunks.append(Chunk(len(chunks), key, bounds[j], bounds[j + 1], p.itemsize))
                    owners.append(j)
        else:
            chunks.append(Chunk(len(chunks), key, 0, p.numel, p.itemsize))
            owners.append((key * 9973) % num_servers)
    return chunks, owners


def hashed(params: Sequence[ParamInfo], num_servers: int, chunk_bytes: int):
    chunks = split_into_pieces(params, chunk_bytes)
    owners = []
    for c in chunks:
        part = c.start // max(1, chunk_bytes // c.itemsize)
        key = f"{params[c.param].name}:{part}".encode()
        owners.append(zlib.crc32(key) % num_servers)
    return chunks, owners


def greedy(params: Sequence[ParamInfo], num_servers: int, chunk_bytes: int):
    chunks = split_into_pieces(params, chunk_bytes)
    load = [0] * num_servers
    owners = [0] * len(chunks)
    for c in sorted(chunks, key=lambda c: (-c.nbytes, c.cid)):
        target = min(range(num_servers), key=lambda s: (load[s], s))
        owners[c.cid] = target
        load[target] += c.nbytes
    return chunks, owners


PLACEMENTS: Dict[str, Callable] = {
    "roundrobin": roundrobin,
    "mxnet": mxnet,
    "hash": hashed,
    "greedy": greedy,
}


def plan(params: Sequence[ParamInfo], num_servers: int, placement="roundrobin",
         chunk_bytes: int = 4 << 20, version: int = 0) -> ChunkMap:
    """Cut ``params`` into chunks and place them on ``num_servers`` servers.

    ``placement`` is a name from ``PLACEMENTS`` or a callable with the same signature
    ``(params, num_servers, chunk_bytes) -> (chunks, owners)``. Raises ValueError for an
    unknown name, non-positive sizes, or a callable that returns an invalid assignment.
    """
    if not isinstance(num_servers, int) or num_servers < 1:
        raise ValueError(f"num_servers must be an integer >= 1, got {num_servers!r}")
    if not isinstance(chunk_bytes, int) or chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be a positive integer, got {chunk_bytes!r}")
    if callable(placement):
        fn = placement
    elif placement in PLACEMENTS:
        fn = PLACEMENTS[placement]
    else:
        raise ValueError(f"placement must be one of {sorted(PLACEMENTS)} or a callable, "
                         f"got {placement!r}")
    chunks, owners = fn(list(params), num_servers, chunk_bytes)
    check_map(params, chunks, owners, num_servers)
    return ChunkMap(version, num_servers, tuple(chunks), tuple(owners))


def check_map(params: Sequence[ParamInfo], chunks: Sequence[Chunk], owners: Sequence[int],
              num_servers: int) -> None:
    """Raise ValueError unless the chunks tile every parameter exactly once and every
    chunk has one valid owner."""
    if len(chunks) != len(owners):
        raise ValueError(f"placement returned {len(chunks)} chunks but {len(owners)} owners")
    covered: Dict[int, List[Tuple[int, int]]] = {}
    for i, (c, s) in enumerate(zip(chunks, owners)):
        if c.cid != i:
            raise ValueError(f"chunk ids must be 0..n-1 in order, chunk {i} has id {c.cid}")
        if not 0 <= s < num_servers:
            raise ValueError(f"chunk {i} assigned to server {s}, valid servers 0..{num_servers - 1}")
        covered.setdefault(c.param, []).append((c.start, c.stop))
    for index, p in enumerate(params):
        spans = sorted(covered.get(index, []))
        position = 0
        for start, stop in spans:
            if start != position or stop < start:
                raise ValueError(f"parameter {p.name!r}: chunks overlap or leave a gap at "
                                 f"element {position}")
            position = stop
        if position != p.numel:
            raise ValueError(f"parameter {p.name!r}: chunks cover {position} of {p.numel} elements")
