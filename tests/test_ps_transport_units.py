"""The buffer transport's pure pieces: splitting payloads into MPI-sized messages, packing
tensors of mixed dtypes into one payload and viewing them back (no processes)."""
import pytest
import torch

from ripples.ps import transport as tr

GiB = 1 << 30


def test_payload_over_2_gib_is_split_into_messages_under_the_int_limit():
    size = 3 * GiB + 12345  # never allocated: the split is arithmetic
    parts = tr.pieces(size)
    assert all(length <= tr.MAX_PIECE_BYTES < 2 ** 31 - 1 for _, length in parts)
    assert parts[0][0] == 0
    assert all(a[0] + a[1] == b[0] for a, b in zip(parts, parts[1:]))  # no gap, no overlap
    assert parts[-1][0] + parts[-1][1] == size
    assert len(parts) == 4


@pytest.mark.parametrize("size,limit,expected", [
    (0, 10, []), (10, 10, [(0, 10)]), (11, 10, [(0, 10), (10, 1)]), (5, 2, [(0, 2), (2, 2), (4, 1)])])
def test_pieces_small_cases(size, limit, expected):
    assert tr.pieces(size, limit) == expected


def test_pieces_rejects_bad_sizes():
    with pytest.raises(ValueError, match="nbytes"):
        tr.pieces(-1)


def test_layout_aligns_every_tensor():
    offsets, total = tr.layout([3, 64, 1, 0, 200])
    assert offsets == [0, 64, 128, 192, 192]
    assert total == 192 + 256


def test_pack_and_unpack_round_trip_mixed_dtypes():
    tensors = [torch.arange(5, dtype=torch.float32), torch.tensor([1.5, -2.0], dtype=torch.bfloat16),
               torch.arange(3, dtype=torch.int64), torch.zeros(0), torch.randn(7).double()]
    pool = tr.BufferPool()
    payload = tr.pack(pool, tensors)
    views = tr.unpack(payload, [(t.numel(), t.dtype) for t in tensors])
    for t, v in zip(tensors, views):
        assert v.dtype == t.dtype and torch.equal(v, t)
    views[0][0] = 42.0  # views, not copies: the payload buffer is what the receiver reads
    assert tr.unpack(payload, [(5, torch.float32)] + [(t.numel(), t.dtype) for t in tensors[1:]])[0][0] == 42


def test_unpack_rejects_a_payload_that_does_not_match_its_header():
    payload = tr.pack(tr.BufferPool(), [torch.ones(4)])
    with pytest.raises(ValueError, match="does not match"):
        tr.unpack(payload, [(20, torch.float32)])
    with pytest.raises(ValueError, match="does not match"):
        tr.unpack(None, [(1, torch.float32)])


def test_pool_reuses_buffers_of_the_same_size():
    pool = tr.BufferPool(keep=1)
    a = pool.take(100)
    pool.give(a)
    assert pool.take(100) is a
    assert pool.take(100) is not a


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_to_wire_with_copy_shares_nothing_and_without_shares_a_float_tensor(dtype):
    """Worker 0 sends each server its chunks' values with ``copy=True``: a bfloat16 model
    (no numpy dtype) used to fail there, calling numpy's ``copy`` on a tensor."""
    base = torch.arange(8, dtype=torch.float32).to(dtype)
    copied = tr.to_wire(base[2:5], copy=True)
    base.zero_()
    assert torch.equal(tr.from_wire(copied), torch.tensor([2.0, 3.0, 4.0]).to(dtype))
    view = tr.to_wire(base[2:5])
    base.fill_(7)
    expected = 7.0 if dtype is torch.float32 else 0.0  # numpy views share; tensors are clones
    assert torch.equal(tr.from_wire(view), torch.full((3,), expected).to(dtype))


def test_optimizer_state_of_a_bfloat16_tensor_goes_on_the_wire():
    state = {"momentum_buffer": torch.ones(6, dtype=torch.bfloat16), "step": torch.tensor(3.0)}
    wire = tr.state_to_wire(state, torch.Size([6]), 1, 4)
    back = tr.state_from_wire(wire)
    assert torch.equal(back["momentum_buffer"], torch.ones(3, dtype=torch.bfloat16))
    assert back["step"].item() == 3.0
