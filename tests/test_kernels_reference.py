"""pack / unpack / scale_ semantics on CPU (the torch reference path), exact values."""
import pytest
import torch

from ripples.kernels import pack, scale_, unpack

FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


def _ints(shape, start=0, dtype=torch.float32):
    n = 1
    for s in shape:
        n *= s
    return (torch.arange(n, dtype=torch.int64) + start).to(dtype).reshape(shape)


def _mixed_layouts(dtype):
    """Contiguous, transposed, strided-slice and 0-d tensors with distinct integer values."""
    return [
        _ints((3, 4), 1, dtype),
        _ints((4, 5), 20, dtype).t(),
        _ints((10,), 50, dtype)[::3],
        torch.tensor(7, dtype=dtype),
        _ints((2, 3, 2), 100, dtype).permute(2, 0, 1),
        _ints((0,), 0, dtype),
    ]


def _expected_flat(tensors):
    # Row-major order is what Python iteration over nested lists gives.
    values = []
    for t in tensors:
        values.extend(float(v) for v in t.flatten().tolist())
    return values


@pytest.mark.parametrize("src", FLOATS)
@pytest.mark.parametrize("dst", FLOATS)
def test_pack_unpack_round_trip_integer_values(src, dst):
    tensors = _mixed_layouts(src)
    expected = _expected_flat(tensors)
    out = torch.full((len(expected) + 3,), -1.0, dtype=dst)
    pack(tensors, out)
    assert out[:len(expected)].tolist() == expected
    assert out[len(expected):].tolist() == [-1.0] * 3, "elements past the total must stay"

    targets = [torch.zeros_like(t) for t in _mixed_layouts(src)]
    # Non-contiguous destinations: write through a transposed view.
    targets[1] = torch.zeros(4, 5, dtype=src).t()
    unpack(out, targets)
    for got, want in zip(targets, tensors):
        assert got.shape == want.shape
        assert torch.equal(got, want)


@pytest.mark.parametrize("src", FLOATS)
@pytest.mark.parametrize("dst", FLOATS)
def test_pack_scale_and_unpack_scale(src, dst):
    tensors = _mixed_layouts(src)
    expected = _expected_flat(tensors)
    out = torch.empty(len(expected), dtype=dst)
    pack(tensors, out, scale=0.25)  # powers of two and small integers stay exact
    assert out.tolist() == [v * 0.25 for v in expected]
    targets = [torch.empty_like(t) for t in tensors]
    unpack(out, targets, scale=4.0)
    for got, want in zip(targets, tensors):
        assert torch.equal(got, want)


def test_pack_half_into_float_uses_fp32_arithmetic():
    h = torch.linspace(-3, 3, 1001).half()
    out = torch.empty(1001)
    pack([h], out, scale=0.1)
    want = h.double().mul(torch.tensor(0.1, dtype=torch.float32).double()).float()
    # fp32 product of two fp32 values, rounded once: equals the correctly rounded double.
    assert torch.equal(out, want)


def test_unpack_float_into_half_rounds_once():
    f = torch.linspace(-3, 3, 1001)
    h = torch.empty(1001, dtype=torch.float16)
    unpack(f, [h], scale=0.1)
    assert torch.equal(h, (f * 0.1).half())


@pytest.mark.parametrize("dtype", FLOATS)
def test_scale_in_place(dtype):
    t = _ints((5, 7), -10, dtype).t()  # non-contiguous
    scale_(t, 2.0)
    assert torch.equal(t, _ints((5, 7), -10, torch.float64).t().mul(2).to(dtype))
    scale_(t, 0.5)
    assert torch.equal(t, _ints((5, 7), -10, dtype).t())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_scale_low_precision_rounds_once_from_fp32(dtype):
    t = torch.linspace(-100, 100, 4099).to(dtype)
    want = (t.float() * torch.tensor(1 / 3, dtype=torch.float32)).to(dtype)
    scale_(t, 1 / 3)
    assert torch.equal(t, want)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8, torch.bool])
def test_integer_and_bool_are_copied(dtype):
    tensors = [torch.tensor([[1, 0], [1, 1]], dtype=dtype).t(), torch.tensor([0, 1], dtype=dtype)]
    out = torch.zeros(6, dtype=dtype)
    pack(tensors, out)
    assert out.tolist() == torch.tensor([1, 1, 0, 1, 0, 1], dtype=dtype).tolist()
    back = [torch.zeros(2, 2, dtype=dtype), torch.zeros(2, dtype=dtype)]
    unpack(out, back)
    assert torch.equal(back[0], tensors[0]) and torch.equal(back[1], tensors[1])
    scale_(back[1], 1.0)
    with pytest.raises(ValueError, match="scale"):
        pack(tensors, out, scale=2.0)
    with pytest.raises(ValueError, match="scale"):
        unpack(out, back, scale=0.5)
    with pytest.raises(ValueError, match="factor"):
        scale_(back[1], 3.0)


def test_integer_tensors_into_float_buffer_with_scale_rejected():
    with pytest.raises(ValueError, match="scale"):
        pack([torch.arange(3)], torch.empty(3), scale=2.0)


def test_argument_errors_name_the_argument():
    t = [torch.ones(4)]
    with pytest.raises(ValueError, match="out"):
        pack(t, torch.empty(3))
    with pytest.raises(ValueError, match="out must be 1-D"):
        pack(t, torch.empty(2, 2))
    with pytest.raises(ValueError, match="buffer"):
        unpack(torch.empty(3), t)
    with pytest.raises(TypeError, match="tensors"):
        pack(torch.ones(4), torch.empty(4))
    with pytest.raises(TypeError, match=r"tensors\[1\]"):
        pack([torch.ones(1), [1.0]], torch.empty(4))
    with pytest.raises(TypeError, match="scale"):
        pack(t, torch.empty(4), scale="2")
    with pytest.raises(ValueError, match="scale"):
        pack(t, torch.empty(4), scale=float("nan"))
    with pytest.raises(TypeError, match="tensor"):
        scale_([1.0], 2.0)


def test_empty_list_is_a_no_op():
    out = torch.full((2,), 3.0)
    pack([], out, scale=2.0)
    unpack(out, [], scale=2.0)
    assert out.tolist() == [3.0, 3.0]


def test_many_small_tensors():
    tensors = [torch.full((i % 7 + 1,), float(i)) for i in range(300)]
    total = sum(t.numel() for t in tensors)
    out = torch.empty(total)
    pack(tensors, out, scale=-2.0)
    assert out.tolist() == [-2.0 * float(i) for i in range(300) for _ in range(i % 7 + 1)]
