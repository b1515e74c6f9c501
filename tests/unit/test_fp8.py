"""ops/fp8.py: quantization error bounds per scale layout, dequantization of each checkpoint layout,
and the reference FP8 linear against the dense product."""
import pytest
import torch

from tritongen.ops.fp8 import (E4M3, E4M3_MAX, Fp8Linear, Fp8Scales, dequantize_weight, expand_scales,
                               fp8_linear_ref, quantize_tokens, quantize_weight)

LAYOUTS = [Fp8Scales("channel"), Fp8Scales("tensor"), Fp8Scales("block", (16, 32)), Fp8Scales("block", (7, 5))]
# e4m3 keeps 3 mantissa bits: rounding to nearest is off by at most 2**-4 of the value (relative),
# and values below the smallest normal are off by at most half its subnormal step (2**-10 of one scale).
REL = 2.0 ** -4
SUBNORMAL_HALF_STEP = 2.0 ** -10


@pytest.mark.parametrize("scales", LAYOUTS, ids=lambda s: f"{s.kind}{s.block or ''}")
def test_quantize_dequantize_error_is_within_e4m3_rounding(scales):
    torch.manual_seed(0)
    w = torch.randn(45, 70) * torch.logspace(-2, 1, 45)[:, None]  # rows of very different magnitude
    q, s = quantize_weight(w, scales)
    assert q.dtype == E4M3 and q.shape == w.shape
    assert tuple(s.shape) == scales.shape(45, 70)
    per_elem = expand_scales(s, scales, 45, 70).expand(45, 70)
    err = (dequantize_weight(q, s, scales) - w).abs()
    assert torch.all(err <= REL * w.abs() + SUBNORMAL_HALF_STEP * per_elem + 1e-7)
    # the largest magnitude of each group maps to (close to) the top of the e4m3 range
    assert float(q.float().abs().max()) == pytest.approx(E4M3_MAX, rel=REL)


def test_per_channel_scales_are_per_row():
    w = torch.stack([torch.full((8,), 1e-3), torch.full((8,), 100.0)])
    q, s = quantize_weight(w, Fp8Scales("channel"))
    assert s.tolist() == pytest.approx([1e-3 / E4M3_MAX, 100.0 / E4M3_MAX])
    assert torch.equal(dequantize_weight(q, s, Fp8Scales("channel")), w)


def test_block_dequantization_uses_each_tiles_scale():
    """A checkpoint's block scales (HF 'fp8' weight_scale_inv): tile (i, j) multiplies by scale[i, j]."""
    q = torch.ones(5, 6).to(E4M3)
    scale = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    w = dequantize_weight(q, scale, Fp8Scales("block", (4, 3)))
    assert w[:4, :3].unique().tolist() == [1.0] and w[:4, 3:].unique().tolist() == [2.0]
    assert w[4:, :3].unique().tolist() == [3.0] and w[4:, 3:].unique().tolist() == [4.0]


def test_wrong_scale_shapes_and_layouts_are_refused_with_the_shape():
    q = torch.zeros(4, 8).to(E4M3)
    with pytest.raises(ValueError, match=r"channel scales of an \[4, 8\] weight have shape \[4\], got \[8\]"):
        dequantize_weight(q, torch.ones(8), Fp8Scales("channel"))
    with pytest.raises(ValueError, match="must be one of"):
        Fp8Scales("row")
    with pytest.raises(ValueError, match="block size"):
        Fp8Scales("block")
    with pytest.raises(ValueError, match="2-D"):
        quantize_weight(torch.ones(3), Fp8Scales("channel"))


def test_zero_rows_and_tokens_quantize_to_zero_without_nan():
    q, s = quantize_weight(torch.zeros(3, 4), Fp8Scales("channel"))
    assert torch.all(s > 0) and torch.equal(dequantize_weight(q, s, Fp8Scales("channel")), torch.zeros(3, 4))
    xq, xs = quantize_tokens(torch.zeros(2, 4))
    assert torch.all(xs > 0) and torch.equal(xq.float(), torch.zeros(2, 4))


@pytest.mark.parametrize("dynamic", [True, False])
@pytest.mark.parametrize("scales", LAYOUTS[:3], ids=lambda s: s.kind)
def test_fp8_linear_matches_the_dense_product_within_the_quantization_error(scales, dynamic):
    torch.manual_seed(1)
    dense = torch.nn.Linear(64, 48, bias=True)
    x = torch.randn(2, 3, 64)
    fp8 = Fp8Linear.from_linear(dense, scales)
    assert fp8.weight.dtype == E4M3 and fp8.weight_scale.dtype == torch.float32
    out = fp8_linear_ref(x, fp8.weight, fp8.weight_scale, scales, fp8.bias, dynamic)
    want = dense(x)
    assert out.shape == want.shape == (2, 3, 48)
    # each product term is off by at most REL (weight) [+ REL (activation)] of |x||w|
    bound = (2 * REL if dynamic else REL) * (x.abs() @ dense.weight.abs().t()) + 1e-5
    assert torch.all((out - want).abs() <= bound)
    assert not torch.equal(out, want)  # the quantization is really there
    # on the CPU the layer itself is the weight-only reference
    if not dynamic:
        assert torch.equal(fp8(x), out)


def test_fp8_linear_keeps_the_input_dtype():
    dense = torch.nn.Linear(16, 8, bias=False).to(torch.bfloat16)
    fp8 = Fp8Linear.from_linear(dense)
    assert fp8(torch.randn(4, 16, dtype=torch.bfloat16)).dtype == torch.bfloat16
    assert "scales=channel" in repr(fp8)


@pytest.mark.parametrize("scales", LAYOUTS[:3], ids=lambda s: s.kind)
def test_stacked_layers_compute_the_parts_side_by_side(scales):
    from tritongen.ops.fp8 import stack_fp8

    torch.manual_seed(2)
    parts = [Fp8Linear.from_linear(torch.nn.Linear(64, n, bias=True), scales) for n in (32, 16, 16)]
    stacked = stack_fp8(parts)
    x = torch.randn(5, 64)
    assert stacked.out_features == 64 and stacked.scales.kind == ("channel" if scales.kind == "tensor" else scales.kind)
    assert torch.equal(stacked(x), torch.cat([p(x) for p in parts], dim=-1))


def test_stacking_refuses_mismatched_layouts_and_ragged_blocks():
    from tritongen.ops.fp8 import stack_fp8

    a = Fp8Linear.from_linear(torch.nn.Linear(32, 16), Fp8Scales("channel"))
    b = Fp8Linear.from_linear(torch.nn.Linear(32, 16), Fp8Scales("tensor"))
    with pytest.raises(ValueError, match="different scale layouts"):
        stack_fp8([a, b])
    c = Fp8Linear.from_linear(torch.nn.Linear(32, 24), Fp8Scales("block", (16, 16)))
    with pytest.raises(ValueError, match="block scales of height 16"):
        stack_fp8([c, c])


def test_stacking_channel_layers_equals_quantizing_the_stack():
    """Why the loader may quantize before fuse_projections stacks q/k/v and gate/up."""
    from tritongen.ops.fp8 import stack_fp8

    torch.manual_seed(4)
    dense = [torch.nn.Linear(32, n, bias=False) for n in (16, 8, 8)]
    stacked = stack_fp8([Fp8Linear.from_linear(d) for d in dense])
    whole = torch.nn.Linear(32, 32, bias=False)
    with torch.no_grad():
        whole.weight.copy_(torch.cat([d.weight for d in dense]))
    direct = Fp8Linear.from_linear(whole)
    assert torch.equal(stacked.weight.float(), direct.weight.float())
    assert torch.equal(stacked.weight_scale, direct.weight_scale)


def test_e4m3_range_constant_is_torchs():
    from tritongen.ops import fp8_scales

    assert fp8_scales.E4M3_MAX == float(torch.finfo(torch.float8_e4m3fn).max)
