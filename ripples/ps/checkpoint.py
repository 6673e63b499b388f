"""Checkpoints of a PSOptimizer: the servers' optimizer state gathered into the wrapped
optimizer's ``state_dict`` format, and a checkpoint loaded back onto the servers."""
from __future__ import annotations

from typing import List

import torch

from ..core.errors import RipplesError
from .hyperparams import snapshot
from .transport import from_wire, state_from_wire


class Checkpoints:
    """``state_dict``/``load_state_dict`` of one PSOptimizer (see those methods there).

    ``link``: the worker's ``worker_link.ServerLink``; ``mover``: its
    ``chunk_moves.ChunkMover``; ``optimizer``: the wrapped torch optimizer; ``names``:
    the parameters' names; ``worker_comm``: the workers' communicator.
    """

    def __init__(self, link, mover, optimizer, names: List[str], worker_comm):
        self.link = link
        self.mover = mover
        self.optimizer = optimizer
        self.names = names
        self.worker_comm = worker_comm
        self.saved_map = None  # a loaded checkpoint's chunk map, until it is restored

    def state_dict(self, base_state_dict) -> dict:
        """``base_state_dict()`` (the wrapped optimizer's) with the servers' state in
        ``"state"``."""
        link = self.link
        answers = link.ask_all("state", "state_dict")
        chunk_state = {cid: wire for answer in answers.values()
                       for cid, wire in answer["state"].items()}
        moving = [c.cid for c in link.map.chunks if c.cid not in chunk_state]
        if moving:
            raise RipplesError(f"state_dict on worker {link.worker}: chunks {moving} are moving "
                               f"between servers; call it on worker 0 after step(), where no "
                               f"chunk is in transit")
        state = base_state_dict()
        index_of = {id(p): i for i, p in enumerate(
            p for group in self.optimizer.param_groups for p in group["params"])}
        state["state"] = {}
        for param_index, param in enumerate(link.params):
            chunks = sorted((c for c in link.map.chunks if c.param == param_index),
                            key=lambda c: c.start)
            assembled = _assemble(param, [chunk_state[c.cid] for c in chunks])
            if assembled:
                state["state"][index_of[id(param)]] = assembled
        state["state"] = dict(sorted(state["state"].items()))
        return state

    def extra_state(self) -> dict:
        """See ``PSOptimizer.extra_state``."""
        link = self.link
        versions = {name: [link.versions[c.cid] for c in link.map.chunks if c.param == i]
                    for i, name in enumerate(self.names)}
        chunk_map = {"version": link.map.version, "owners": list(link.map.owners),
                     "active": list(link.map.members),
                     "chunks": [(c.param, c.start, c.stop) for c in link.map.chunks]}
        return {"policy": link.spec.name, "clock": link.clock, "steps": link.stats["steps"],
                "versions": versions, "chunk_map": chunk_map}

    def load(self, state_dict, load_locally) -> None:
        """See ``PSOptimizer.load_state_dict``; ``load_locally(state_dict)`` loads into the
        wrapped optimizer (and calls ``PSOptimizer.load_extra_state``)."""
        link = self.link
        link.settle("eager pull before load")
        # A worker that cannot load must not leave the others waiting for worker 0.
        problem = None
        try:
            load_locally(state_dict)
        except (KeyError, TypeError, ValueError) as exc:
            problem = exc
        everyone = self.worker_comm.allgather(repr(problem) if problem else None)
        if problem is not None:
            raise problem
        for worker, theirs in enumerate(everyone):
            if theirs:
                raise RipplesError(f"load_state_dict failed on worker {worker}: {theirs}")
        if link.worker == 0:
            try:
                rids = {s: link.channel.send(s, self._load_message(s)) for s in link.servers}
                link.wait_all(rids, "load_state_dict", count_blocked=False)
            except RipplesError as exc:
                problem = str(exc)
        problem = self.worker_comm.bcast(problem, root=0)
        if problem is not None:
            raise RipplesError(f"load_state_dict failed on the servers: {problem}")
        self.optimizer.state.clear()
        link.sent_groups.forget()
        link.install_all(link.wait_all(link.request_pull(), "pull after load_state_dict",
                                       count_blocked=False))
        saved, self.saved_map = self.saved_map, None
        self.mover.restore(saved)

    def _load_message(self, server: int) -> dict:
        wires = self.link.chunk_wires(server, self.optimizer)
        return {"kind": "load", "sid": self.link.sid, "w": self.link.worker,
                "params": {c.cid: array for c, array, _ in wires},
                "state": {c.cid: state for c, _, state in wires},
                "groups": snapshot(self.optimizer.param_groups), "map": self.link.map.version}


def _assemble(param: torch.Tensor, chunk_wires: List[dict]) -> dict:
    """One parameter's optimizer state from its chunks' ``state_to_wire`` messages (in
    element order): slices are joined to the parameter's shape, whole values come from the
    first chunk. Keys missing from any chunk are left out."""
    out = {}
    for key, (kind, value) in (chunk_wires[0].items() if chunk_wires else ()):
        if not all(key in wire for wire in chunk_wires):
            continue
        if kind == "slice":
            joined = torch.cat([from_wire(wire[key][1]) for wire in chunk_wires])
            out[key] = joined.reshape(param.shape)
        else:
            out[key] = state_from_wire({key: (kind, value)})[key]
    return out
