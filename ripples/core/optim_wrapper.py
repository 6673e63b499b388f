"""The common face of every optimizer wrapper: a ``torch.optim.Optimizer`` that holds the
user's optimizer and shows its state through.

Like PyTorch's ``PostLocalSGDOptimizer``, the wrapper subclasses ``torch.optim.Optimizer``
(so LR schedulers, ``ReduceLROnPlateau`` and ``GradScaler`` accept it) without running the
base constructor: ``param_groups``, ``state`` and ``defaults`` are the wrapped optimizer's own
objects, read through properties so that they stay shared even after
``load_state_dict`` replaces the wrapped optimizer's lists.
"""
from __future__ import annotations

from collections import OrderedDict

import torch


class OptimizerWrapper(torch.optim.Optimizer):
    """Composition over ``self.optimizer`` that passes ``isinstance(x, torch.optim.Optimizer)``.

    Subclasses implement ``step``; ``state_dict``/``load_state_dict`` may add their own
    entries (see ``extra_state``/``load_extra_state``), which are stored under
    ``EXTRA_KEY`` and never reach the wrapped optimizer.
    """

    EXTRA_KEY = "ripples"

    def __init__(self, optimizer: torch.optim.Optimizer):
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, got "
                            f"{type(optimizer).__name__}")
        if isinstance(optimizer, OptimizerWrapper):
            raise TypeError("optimizer is already a ripples DistributedOptimizer; wrap the "
                            "plain torch optimizer once")
        self.optimizer = optimizer
        # What Optimizer.__init__ would set and the hook registration methods use.
        self._optimizer_step_pre_hooks = OrderedDict()
        self._optimizer_step_post_hooks = OrderedDict()
        self._optimizer_state_dict_pre_hooks = OrderedDict()
        self._optimizer_state_dict_post_hooks = OrderedDict()
        self._optimizer_load_state_dict_pre_hooks = OrderedDict()
        self._optimizer_load_state_dict_post_hooks = OrderedDict()

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, groups):
        self.optimizer.param_groups = groups

    @property
    def state(self):
        return self.optimizer.state

    @state.setter
    def state(self, state):
        self.optimizer.state = state

    @property
    def defaults(self):
        return self.optimizer.defaults

    @defaults.setter
    def defaults(self, defaults):
        self.optimizer.defaults = defaults

    def __getstate__(self):
        raise TypeError(f"{type(self).__name__} cannot be pickled (it holds MPI state); save "
                        "optimizer.state_dict() instead")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.optimizer!r})"

    def extra_state(self) -> dict:
        """What the wrapper itself must save so that a resumed run equals an uninterrupted one."""
        return {}

    def load_extra_state(self, extra: dict) -> None:
        """Restore what ``extra_state`` returned."""

    def state_dict(self):
        state = self.optimizer.state_dict()
        extra = self.extra_state()
        if extra:
            state[self.EXTRA_KEY] = extra
        return state

    def load_state_dict(self, state_dict):
        state = dict(state_dict)
        extra = state.pop(self.EXTRA_KEY, None)
        self.optimizer.load_state_dict(state)
        if extra is not None:
            self.load_extra_state(extra)

    def zero_grad(self, set_to_none: bool = True):
        return self.optimizer.zero_grad(set_to_none=set_to_none)

    def add_param_group(self, param_group):
        raise NotImplementedError("add_param_group after wrapping is not supported: wrap an "
                                  "optimizer that already has all its parameter groups")

    def step(self, closure=None):
        raise NotImplementedError
