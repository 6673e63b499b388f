"""ripples: Partial All-Reduce and heterogeneity-aware decentralized training.

Use it through Horovod's PyTorch API: ``import ripples.torch as hvd``.
"""
__version__ = "0.1.0"
