"""SyncBatchNorm's construction across torch versions: BatchNorm's ``bias`` keyword is
recent, and a torch without it (2.11, seen on a GPU machine) rejected every construction."""
import pytest

from ripples.torch import sync_batch_norm
from ripples.torch.sync_batch_norm import SyncBatchNorm


def test_on_a_torch_whose_batch_norm_has_no_bias_argument(monkeypatch):
    monkeypatch.setattr(sync_batch_norm, "_BATCH_NORM_TAKES_BIAS", False)
    layer = SyncBatchNorm(4)
    assert layer.weight.shape == (4,) and layer.bias.shape == (4,)
    with pytest.raises(TypeError, match=r"bias=False.*upgrade torch or leave bias=True"):
        SyncBatchNorm(4, bias=False)


def test_on_a_torch_whose_batch_norm_takes_bias():
    if not sync_batch_norm._BATCH_NORM_TAKES_BIAS:
        pytest.skip("this torch's BatchNorm has no bias argument")
    layer = SyncBatchNorm(4, bias=False)
    assert layer.bias is None and layer.weight.shape == (4,)
