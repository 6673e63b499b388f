"""Tensors laid out in persistent flat buffers, each tensor's ``.data`` a view into one.

Decentralized modes average the parameters (and floating buffers) of the model at every
sync. With the tensors laid out in one contiguous buffer per (dtype, device), a sync is one
in-place P-Reduce per buffer, which MPI reduces where it lies: no fusion buffer, nothing
packed or unpacked.

The tensor objects stay the same (optimizer state keyed by a parameter keeps working); only
the memory behind them moves. Tensors that cannot move without changing what the program
sees (sparse, non-contiguous, or sharing memory with something else) stay where they are
and are listed as ``loose``.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

Named = Sequence[Tuple[str, torch.Tensor]]


class FlatParameters:
    """The layout of ``named`` tensors: ``buffers`` (one per (dtype, device), in order of
    first appearance) and ``loose`` (the tensors left as they were).

    Construction copies every movable tensor into its buffer and points its ``.data`` at
    its slice; values are unchanged bit for bit. ``previous``: the layout being replaced,
    whose tensors that still lie in their place may move again. Tensors are movable when
    they are dense, contiguous, and their storage holds nothing but movable tensors of
    ``named`` (so moving them cuts no link to other memory).
    """

    def __init__(self, named: Named, previous: Optional["FlatParameters"] = None):
        named = list(named)
        tensors = [t for _, t in named]
        in_place = previous.in_place if previous is not None else (lambda tensor: False)
        movable = _movable(tensors, in_place)
        self.buffers: List[torch.Tensor] = []
        self.loose: List[torch.Tensor] = [t for t, m in zip(tensors, movable) if not m]
        # name, tensor, and where its data must be: (data_ptr, dtype, device, numel)
        self._places: List[Tuple[str, torch.Tensor, tuple]] = []
        self._place_of: Dict[int, tuple] = {}  # by id(tensor); _places keeps them alive
        runs: Dict[tuple, List[Tuple[str, torch.Tensor]]] = {}
        for (name, tensor), move in zip(named, movable):
            if move:
                runs.setdefault((tensor.dtype, tensor.device), []).append((name, tensor))
        for (dtype, device), members in runs.items():
            buffer = torch.empty(sum(t.numel() for _, t in members), dtype=dtype, device=device)
            offset = 0
            for name, tensor in members:
                view = buffer[offset:offset + tensor.numel()].view(tensor.shape)
                view.copy_(tensor.detach())
                tensor.data = view
                self._places.append((name, tensor, _place(view)))
                self._place_of[id(tensor)] = _place(view)
                offset += tensor.numel()
            self.buffers.append(buffer)

    def in_place(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` is one of this layout's and still views its slice."""
        place = self._place_of.get(id(tensor))
        return place is not None and _place(tensor) == place

    def stale(self) -> Optional[str]:
        """The name of the first laid-out tensor that no longer views its slice (its
        ``.data`` was replaced, e.g. by ``model.to(torch.float64)``), or None."""
        for name, tensor, place in self._places:
            if tensor.numel() and _place(tensor) != place:
                return name
        return None


def _place(tensor: torch.Tensor) -> tuple:
    return tensor.data_ptr(), tensor.dtype, tensor.device, tensor.numel()


def _movable(tensors: List[torch.Tensor], in_place: Callable[[torch.Tensor], bool]) -> List[bool]:
    movable = [t.layout is torch.strided and not t.is_quantized and t.device.type != "meta"
               and t.is_contiguous() for t in tensors]
    by_storage = defaultdict(list)
    for index, tensor in enumerate(tensors):
        if movable[index] and tensor.numel() and not in_place(tensor):
            storage = tensor.untyped_storage()
            by_storage[(tensor.device, storage.data_ptr())].append(index)
    for members in by_storage.values():
        # A storage may hold several tensors of ours (e.g. an earlier flat layout), but if
        # anything else could view it (gaps, overlaps, a larger storage), leave them.
        spans = sorted((tensors[i].storage_offset() * tensors[i].element_size(),
                        tensors[i].numel() * tensors[i].element_size()) for i in members)
        end = 0
        for start, nbytes in spans:
            if start != end:
                break
            end = start + nbytes
        else:
            if end == tensors[members[0]].untyped_storage().nbytes():
                continue
        for index in members:
            movable[index] = False
    return movable
