"""A stand-in ``horovod`` package whose ``horovod.torch`` is ``ripples.torch``: it lets the
tests run a script written for Horovod, unchanged, where Horovod is not installed."""
