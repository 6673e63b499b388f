"""Shared switch for GPU tests: skip without a usable GPU, fail instead when the
environment says one must be there (``RIPPLES_TEST_GPU=1``)."""
import os

import pytest


def gpu_required() -> bool:
    """True when ``RIPPLES_TEST_GPU=1``: a missing GPU or cupy is then a failure."""
    return os.environ.get("RIPPLES_TEST_GPU", "") == "1"


def require_gpu(need_cupy: bool = True) -> None:
    """Skip (or fail under ``RIPPLES_TEST_GPU=1``) unless torch sees a CUDA device and,
    with ``need_cupy``, cupy imports."""
    import torch

    reason = None
    if not torch.cuda.is_available():
        reason = "no CUDA GPU visible to torch"
    elif need_cupy:
        try:
            import cupy  # noqa: F401
        except ImportError as exc:
            reason = f"cupy not importable ({exc})"
    if reason is None:
        return
    if gpu_required():
        pytest.fail(f"RIPPLES_TEST_GPU=1 but {reason}")
    pytest.skip(reason)


@pytest.fixture
def gpu():
    """Fixture form of :func:`require_gpu`; yields the CUDA device to use."""
    import torch

    require_gpu()
    yield torch.device("cuda", torch.cuda.current_device())
