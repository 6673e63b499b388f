"""The small model and batches that the GPU training checks share: the same training on
a CUDA device and on the host must give the same parameters, so both sides build them
here."""
import torch


def make_model(seed: int, device: torch.device) -> torch.nn.Module:
    """An 8-16-3 MLP, initialised from ``seed``, on ``device``."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    return model.to(device)


def batch(step: int, worker: int, device: torch.device):
    """Worker ``worker``'s batch of step ``step``: 32 inputs and class labels, on ``device``
    (drawn on the host, so that every device gets the same numbers)."""
    gen = torch.Generator().manual_seed(1000 * step + worker)
    x = torch.randn(32, 8, generator=gen)
    y = torch.randint(0, 3, (32,), generator=gen)
    return x.to(device), y.to(device)
