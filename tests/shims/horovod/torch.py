"""``import horovod.torch as hvd`` gives ``ripples.torch`` (see the package docstring)."""
import sys

import ripples.torch

sys.modules[__name__] = ripples.torch
