"""The common face of every optimizer wrapper: the user's optimizer shows through."""
from __future__ import annotations


class OptimizerWrapper:
    """Composition over a ``torch.optim.Optimizer`` stored as ``self.optimizer``: its
    ``param_groups``, ``state``, ``defaults``, ``state_dict``, ``load_state_dict`` and
    ``zero_grad`` pass through, so schedulers and checkpoints work unchanged."""

    optimizer = None

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @property
    def state(self):
        return self.optimizer.state

    @property
    def defaults(self):
        return self.optimizer.defaults

    def state_dict(self):
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict):
        return self.optimizer.load_state_dict(state_dict)

    def zero_grad(self, set_to_none: bool = True):
        return self.optimizer.zero_grad(set_to_none=set_to_none)

    def add_param_group(self, param_group):
        raise NotImplementedError("add_param_group after wrapping is not supported: wrap an "
                                  "optimizer that already has all its parameter groups")
