"""Torch's current CUDA stream as a raw handle, and CUDA events recorded on such handles,
both cheap enough for once per collective.

``torch.cuda.current_stream(device).cuda_stream`` builds a ``torch.cuda.Stream`` object
(switching devices to do so), about 5 us a call on an H100 host, and a ``torch.cuda.Event``
records only on such an object: more than the NCCL call or kernel launch they serve. CUDA
builds of torch have the handle itself as ``torch._C._cuda_getCurrentRawStream`` (where it
is missing the public path is used), and cupy's runtime bindings record an event on a
handle.
"""
from __future__ import annotations

import torch

_raw_current_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
_CUDA_ERROR_NOT_READY = 600  # cudaErrorNotReady: what cudaEventQuery returns while pending


def current_stream_handle(device_index: int) -> int:
    """The ``cudaStream_t`` (as an int) of torch's current stream on device
    ``device_index``: the stream torch would queue this thread's next kernel on."""
    if _raw_current_stream is not None:
        return _raw_current_stream(device_index)
    return torch.cuda.current_stream(device_index).cuda_stream


class CudaEvent:
    """A CUDA event without timing on device ``device_index`` (needs cupy), recorded again
    and again on raw stream handles of that device."""

    __slots__ = ("ptr", "_runtime")

    def __init__(self, device_index: int):
        import cupy
        from cupy.cuda import runtime

        self._runtime = runtime
        with cupy.cuda.Device(device_index):
            self.ptr = runtime.eventCreateWithFlags(runtime.eventDisableTiming)

    def record(self, stream_handle: int) -> None:
        """Mark the point after everything queued so far on ``stream_handle``."""
        self._runtime.eventRecord(self.ptr, stream_handle)

    def query(self) -> bool:
        """True once the work before the last :meth:`record` has finished. A CUDA error
        also reads as finished: nothing more will run, and the next CUDA call raises it."""
        return self._runtime.eventQuery(self.ptr) != _CUDA_ERROR_NOT_READY

    def __del__(self):
        ptr = getattr(self, "ptr", 0)
        if ptr:
            try:
                self._runtime.eventDestroy(ptr)
            except Exception:  # interpreter shutdown, or a CUDA context already gone
                pass
