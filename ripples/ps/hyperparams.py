"""The hyperparameters a worker sends the servers: its optimizer's group values.

A change to any group value (``lr``, ``momentum``, ``betas``, ``weight_decay``; by an LR
scheduler or by hand) travels with the next push (``SentGroups.changed``).
"""
from __future__ import annotations

import copy
from typing import List, Optional

import torch


def snapshot(groups) -> List[dict]:
    """A copy of every group's values except its parameters."""
    return [copy.deepcopy({k: v for k, v in g.items() if k != "params"}) for g in groups]


class SentGroups:
    """The group values a worker sent last (None before its first push)."""

    def __init__(self):
        self.sent: Optional[List[dict]] = None

    def changed(self, groups) -> Optional[List[dict]]:
        """Every group's values when any changed since the last call, else None."""
        if self.sent is not None and len(groups) == len(self.sent) and all(
                _same_groups(g, sent) for g, sent in zip(groups, self.sent)):
            return None
        self.sent = snapshot(groups)
        return self.sent

    def forget(self) -> None:
        """Send every group with the next push (after ``load_state_dict``)."""
        self.sent = None


def _same_groups(group: dict, sent: dict) -> bool:
    return len(group) == len(sent) + 1 and all(
        k in group and _same_value(group[k], v) for k, v in sent.items())


def _same_value(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
                and a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b))
    if isinstance(a, (tuple, list)) or isinstance(b, (tuple, list)):
        return (type(a) is type(b) and len(a) == len(b)
                and all(_same_value(x, y) for x, y in zip(a, b)))
    return type(a) is type(b) and a == b
