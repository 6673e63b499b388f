"""What one server holds for one session: its chunks, their versions and the optimizer that
steps them (``ChunkStore``).

Every chunk carries a version, the number of updates applied to it; the version travels
with the chunk when it moves to another server (``migration``).

Hyperparameters: ``init`` carries worker 0's parameter groups; a push carries a worker's
groups whenever they changed since its previous push (``hyper_of`` keeps each worker's
latest). A round (BSP, Sync-opt) is applied with the values of the lowest-numbered worker
whose push is in it; an update applied on arrival uses the values of the worker that pushed
it. ``load`` (worker 0, from ``load_state_dict``) replaces chunks, their optimizer state and
the hyperparameters.
"""
from __future__ import annotations

from typing import Dict, List

import torch

from .transport import from_wire, state_from_wire, state_to_wire


class ChunkStore:
    """The chunks of one session on one server and the local copy of the workers' optimizer.

    ``chunks``/``versions``/``group_of``: by chunk id, the tensor, its update count and the
    worker's parameter group it belongs to. ``adopted_state``: optimizer state of chunks
    handed over by another server, taken by the next ``rebuild_optimizer``.
    """

    def __init__(self, init: dict):
        self.chunks: Dict[int, torch.Tensor] = {}
        self.versions: Dict[int, int] = {}
        self.group_of: Dict[int, int] = {}
        for cid, group, array in init["chunks"]:
            self.chunks[cid] = from_wire(array)
            self.versions[cid] = 0
            self.group_of[cid] = group
        self.opt_class, self.defaults = init["opt_class"], init["defaults"]
        self.optimizer = None
        self.group_ids: List[int] = []  # the worker's group index of each local group
        self.default_hyper = self.current_hyper = init["groups"]
        self.hyper_of: Dict[int, list] = {}  # the groups each worker sent last
        self.adopted_state: Dict[int, dict] = {}
        self.updates = 0
        self.rebuild_optimizer()
        if self.optimizer is not None:
            self.set_state(init.get("state", {}))

    def hyper_for(self, worker: int) -> list:
        """The groups ``worker`` sent last (worker 0's at ``init`` or ``load`` until then)."""
        return self.hyper_of.get(worker, self.default_hyper)

    def rebuild_optimizer(self) -> None:
        """A fresh local optimizer over the chunks held now (after chunks came or went),
        keeping every remaining chunk's state and taking the state of adopted ones."""
        state = dict(self.optimizer.state) if self.optimizer is not None else {}
        for cid, wire in self.adopted_state.items():
            if wire:
                state[self.chunks[cid]] = state_from_wire(wire)
        self.adopted_state = {}
        groups: Dict[int, list] = {}
        for cid in sorted(self.chunks):
            groups.setdefault(self.group_of[cid], []).append(self.chunks[cid])
        self.group_ids = sorted(groups)
        self.optimizer = None
        if groups:
            self.optimizer = self.opt_class(
                [dict(self.current_hyper[g], params=groups[g]) for g in self.group_ids],
                **self.defaults)
            for tensor in self.chunks.values():
                if tensor in state:
                    self.optimizer.state[tensor] = state[tensor]

    def use_hyper(self, groups: list) -> None:
        """Give the local optimizer's groups the values of the workers' ``groups``."""
        self.current_hyper = groups
        if self.optimizer is not None:
            for local, gid in zip(self.optimizer.param_groups, self.group_ids):
                local.update(groups[gid])

    def get_state(self) -> Dict[int, dict]:
        """Every chunk's optimizer state, as ``state_to_wire`` messages."""
        state = self.optimizer.state if self.optimizer is not None else {}
        return {cid: state_to_wire(state.get(t, {}), t.shape, 0, t.numel())
                for cid, t in self.chunks.items()}

    def set_state(self, wire: Dict[int, dict]) -> None:
        for cid, chunk_state in wire.items():
            tensor = self.chunks[cid]
            self.optimizer.state.pop(tensor, None)
            if chunk_state:
                self.optimizer.state[tensor] = state_from_wire(chunk_state)

    def load(self, message: dict) -> None:
        """Replace parameters, optimizer state and hyperparameters (``load_state_dict``)."""
        with torch.no_grad():
            for cid, array in message["params"].items():
                self.chunks[cid].copy_(from_wire(array))
        self.default_hyper = message["groups"]
        self.hyper_of = {}
        if self.optimizer is not None:
            self.set_state(message["state"])
            self.use_hyper(self.default_hyper)

    def staleness(self, message: dict) -> int:
        """How many updates the chunks a push names received after it was computed."""
        seen = message["computed_on"]
        return max((self.versions[cid] - seen[cid] for cid in seen), default=0)

    def apply(self, grads: Dict[int, torch.Tensor], factor: float) -> None:
        """One optimizer step on these chunks with the learning rate times ``factor``."""
        if self.optimizer is not None:
            for cid, tensor in self.chunks.items():
                tensor.grad = grads[cid].to(tensor.dtype) if cid in grads else None
            saved = [group.get("lr") for group in self.optimizer.param_groups]
            if factor != 1.0:
                for group, lr in zip(self.optimizer.param_groups, saved):
                    if lr is not None:
                        group["lr"] = lr * factor
            self.optimizer.step()
            for tensor in self.chunks.values():
                tensor.grad = None  # may be a view into a payload that goes back to the pool
            for group, lr in zip(self.optimizer.param_groups, saved):
                if lr is not None:
                    group["lr"] = lr
        for cid in self.chunks:
            self.versions[cid] += 1
        self.updates += 1
