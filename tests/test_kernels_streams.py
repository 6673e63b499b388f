"""The raw current-stream handle (torch's private fast path where it exists, else the
public one; stood in for without a GPU) and CUDA events on raw handles (on a GPU)."""
import pytest
import torch

from gpu_support import gpu  # noqa: F401 (a fixture)
from ripples.kernels import streams


def test_the_raw_handle_comes_from_torchs_fast_path_where_it_exists(monkeypatch):
    monkeypatch.setattr(streams, "_raw_current_stream", lambda index: 1000 + index)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda index: 1 / 0)  # not called
    assert streams.current_stream_handle(3) == 1003


def test_without_the_fast_path_the_public_stream_object_gives_the_handle(monkeypatch):
    monkeypatch.setattr(streams, "_raw_current_stream", None)
    monkeypatch.setattr(torch.cuda, "current_stream",
                        lambda index: type("Stream", (), {"cuda_stream": 50 + index})())
    assert streams.current_stream_handle(2) == 52


@pytest.mark.gpu
def test_on_a_gpu_the_raw_handle_is_torchs_stream_and_an_event_follows_its_work(gpu):
    from ripples.kernels.streams import CudaEvent

    side = torch.cuda.Stream(gpu)
    with torch.cuda.stream(side):  # a non-default stream, so the handles differ from 0
        handle = streams.current_stream_handle(gpu.index)
        assert handle == side.cuda_stream != 0
    assert streams.current_stream_handle(gpu.index) == torch.cuda.current_stream(gpu).cuda_stream
    event = CudaEvent(gpu.index)
    torch.cuda._sleep(200_000_000)  # about 0.1 s of GPU time queued ahead of the record
    event.record(streams.current_stream_handle(gpu.index))
    assert event.query() is False
    torch.cuda.synchronize(gpu)
    assert event.query() is True
    event.record(streams.current_stream_handle(gpu.index))  # recorded again: reusable
    torch.cuda.synchronize(gpu)
    assert event.query() is True
