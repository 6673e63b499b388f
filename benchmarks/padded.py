"""A model made bandwidth-bound while its compute stays emulated: the demo's MLP with one
large parameter added (``train.py --model-mb``, ``padded_step.py``)."""
from __future__ import annotations


def pad_models(megabytes: float) -> None:
    """Make ``ripples.demo.make_model`` (used by ``train_mode`` and the DDP row) add one
    float32 parameter of ``megabytes`` to the model. Its only use is a zero term in the
    output, so the loss and accuracy are the MLP's while every gradient all-reduce and
    every model average carries the extra bytes."""
    import torch
    import ripples.demo as demo

    small = demo.make_model

    class Padded(torch.nn.Module):
        def __init__(self, *args):
            super().__init__()
            self.net = small(*args)
            self.pad = torch.nn.Parameter(torch.zeros(int(megabytes * 1e6) // 4))

        def forward(self, x):
            return self.net(x) + 0.0 * self.pad[0]

    demo.make_model = Padded
