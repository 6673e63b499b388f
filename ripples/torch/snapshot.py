"""A copy of some tensors, kept to put back after an averaging a dead peer cut short."""
from __future__ import annotations

from typing import List, Optional

import torch


class Snapshot:
    """A copy of some tensors, to put back after an averaging a dead peer cut short."""

    def __init__(self):
        self._saved: Optional[List[torch.Tensor]] = None

    def save(self, tensors: List[torch.Tensor]) -> None:
        if self._saved is None or [s.shape for s in self._saved] != [t.shape for t in tensors]:
            self._saved = [t.detach().clone() for t in tensors]
        else:
            for saved, tensor in zip(self._saved, tensors):
                saved.copy_(tensor)

    def restore(self, tensors: List[torch.Tensor]) -> None:
        """Copy the saved values back into ``tensors`` (nothing if none were saved)."""
        if self._saved is None:
            return
        with torch.no_grad():
            for saved, tensor in zip(self._saved, tensors):
                tensor.copy_(saved)
