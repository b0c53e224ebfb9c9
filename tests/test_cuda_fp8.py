"""The SM90 FP8 GEMM kernels of ``cutlass_nn.ops.fp8_scaled_mm`` against a float64 reference on
the same quantized operands: every compiled configuration (forced), e4m3 and e5m2 ``a``,
bfloat16 and float32 outputs, tensorwise / rowwise / mixed scales, with and without bias, odd and
aligned shapes, operand layouts read in place or copied, fast accumulation, the ATen path for what
no kernel takes (its result equal to the CPU backend's), empty problems, CUDA graphs and
torch.compile.

The error bound: the products of two float8 values are exact in float32, so the kernels differ
from the float64 reference by the accumulation (the tensor cores' FP8 sums keep fewer bits than
fp32 between promotions) and by the final rounding. Bounds are relative to the largest reference
value: one bfloat16 half-ulp plus 1e-3 with promotion, 2e-2 with fast accumulation over K=4096;
a wrong scale, layout or tile gives errors of order 1.
"""

from __future__ import annotations

import pytest
import torch

import cutlass_nn
from cuda_helpers import CUDA_MARKS
from cutlass_nn import fp8_reference as R
from cutlass_nn import ops

pytestmark = CUDA_MARKS

FORMATS = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def is_sm90() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def quantized(rows, cols, fmt, scale_dim, seed, device="cuda"):
    """(data, scale) of a random [rows, cols] matrix with rows of different magnitudes, quantized
    by the reference (scale_dim None: tensorwise; 1: one scale per row; 0: per column)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=gen, dtype=torch.float64)
    x = x * torch.exp2(torch.randint(-3, 4, (rows, 1), generator=gen).double())
    data, scale = R.quantize(x.float(), fmt, dim=scale_dim)
    return data.to(device), scale.to(device)


def reference64(a, a_scale, b, b_scale, bias=None):
    out = (a.double() * a_scale.double()) @ (b.double() * b_scale.double())
    if bias is not None:
        out = out + bias.double()
    return out


def check(out, ref, tol, what):
    assert out.shape == ref.shape, what
    err = (out.double() - ref).abs().max().item()
    scale = ref.abs().max().item() or 1.0
    assert err <= tol * scale, f"{what}: max error {err:.3e} > {tol:.1e} * {scale:.3e}"


def tolerance(out_dtype, fast_accum=False):
    rounding = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 0.0}[out_dtype]
    return rounding + (2e-2 if fast_accum else 1e-3)


def operands(m, n, k, fmt_a="e4m3", scaling="tensorwise", seed=0, bias_dtype=None):
    """a [m, k], b [k, n] column-major (the transposed view of an [n, k] weight), scales for the
    recipe ("tensorwise", "rowwise" or "mixed": a per row, b one value), optional bias."""
    a_dim = None if scaling == "tensorwise" else 1
    b_dim = 1 if scaling == "rowwise" else None
    a, sa = quantized(m, k, fmt_a, a_dim, seed)
    w, sw = quantized(n, k, "e4m3", b_dim, seed + 1)
    b = w.t()
    sb = sw.t() if sw.dim() == 2 else sw  # per output channel = per column of b: [1, n]
    bias = None
    if bias_dtype is not None:
        gen = torch.Generator().manual_seed(seed + 2)
        bias = torch.randn(n, generator=gen).to(bias_dtype).cuda()
    return a, sa, b, sb, bias


needs_sm90 = pytest.mark.skipif(not is_sm90(), reason="the FP8 kernels are compiled for SM90")

SHAPES = [(256, 512, 384), (1, 64, 16), (77, 200, 48), (130, 264, 1040), (1024, 1024, 4096)]


@needs_sm90
@pytest.mark.parametrize("config", [0, 1, 3, 4, 5, 6, 7])
@pytest.mark.parametrize("fmt_a", ["e4m3", "e5m2"])
@pytest.mark.parametrize("scaling", ["tensorwise", "rowwise", "mixed"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_kernels_bf16(config, fmt_a, scaling, shape):
    m, n, k = shape
    a, sa, b, sb, bias = operands(m, n, k, fmt_a, scaling, seed=m + n + k, bias_dtype=torch.bfloat16)
    for with_bias in (False, True):
        with ops.force_fp8_config(config):
            out = ops.fp8_scaled_mm(a, b, sa, sb, bias if with_bias else None, torch.bfloat16)
        name = cutlass_nn.ops._ops._last_kernel_name.default()
        assert name.startswith(f"sm90_fp8_{fmt_a}_e4m3_bf16"), name
        assert name.endswith(ops.fp8_configs()[config]), name
        ref = reference64(a, sa, b, sb, bias if with_bias else None)
        check(out, ref, tolerance(torch.bfloat16), f"{name} {shape} {scaling} bias={with_bias}")


@needs_sm90
@pytest.mark.parametrize("config", [0, 3, 4, 5, 7])
@pytest.mark.parametrize("swizzle", [2, 4, 8])
@pytest.mark.parametrize("shape", [(1024, 1536, 512), (77, 200, 48), (640, 3072, 1024)],
                         ids=lambda s: "x".join(map(str, s)))
def test_kernels_swizzled(config, swizzle, shape):
    """The tile scheduler's rasterization swizzle moves tiles between CTAs, never values: every
    tile still written once, the result against float64 as unswizzled."""
    m, n, k = shape
    a, sa, b, sb, bias = operands(m, n, k, "e4m3", "rowwise", seed=5 * m + n, bias_dtype=torch.bfloat16)
    with ops.force_fp8_config(config, swizzle):
        out = ops.fp8_scaled_mm(a, b, sa, sb, bias, torch.bfloat16)
    name = cutlass_nn.ops._ops._last_kernel_name.default()
    assert name.endswith(ops.fp8_configs()[config]), name
    check(out, reference64(a, sa, b, sb, bias), tolerance(torch.bfloat16), f"{name} swizzle {swizzle}")


@needs_sm90
@pytest.mark.parametrize("fmt_a", ["e4m3", "e5m2"])
@pytest.mark.parametrize("scaling", ["tensorwise", "rowwise"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_kernels_float32_out(fmt_a, scaling, shape):
    m, n, k = shape
    a, sa, b, sb, bias = operands(m, n, k, fmt_a, scaling, seed=3 * m + k, bias_dtype=torch.float32)
    out = ops.fp8_scaled_mm(a, b, sa, sb, bias, torch.float32)
    name = cutlass_nn.ops._ops._last_kernel_name.default()
    assert name.startswith(f"sm90_fp8_{fmt_a}_e4m3_f32"), name
    check(out, reference64(a, sa, b, sb, bias), tolerance(torch.float32), f"{name} {shape}")


@needs_sm90
@pytest.mark.parametrize("shape", [(256, 512, 384), (512, 1024, 4096), (77, 200, 48)])
def test_fast_accumulation(shape):
    m, n, k = shape
    a, sa, b, sb, bias = operands(m, n, k, "e4m3", "rowwise", seed=11, bias_dtype=torch.bfloat16)
    out = ops.fp8_scaled_mm(a, b, sa, sb, bias, torch.bfloat16, use_fast_accum=True)
    name = cutlass_nn.ops._ops._last_kernel_name.default()
    assert name.endswith("_fastaccum"), name
    check(out, reference64(a, sa, b, sb, bias), tolerance(torch.bfloat16, True), name)
    # e5m2 a has no fast-accumulation kernel: the promoted one runs.
    a2, sa2, *_ = operands(m, n, k, "e5m2", "rowwise", seed=12)
    ops.fp8_scaled_mm(a2, b, sa2, sb, None, torch.bfloat16, use_fast_accum=True)
    assert not cutlass_nn.ops._ops._last_kernel_name.default().endswith("_fastaccum")


# The configurations on the mainloop with overlapped promotion (5, 6, 7) and their twins on
# CUTLASS's promoted mainloop (0, 1, 3): the same tiles and the same arithmetic.
OVERLAPPED_TWINS = {5: 0, 6: 1, 7: 3}


@needs_sm90
@pytest.mark.parametrize("config", sorted(OVERLAPPED_TWINS))
@pytest.mark.parametrize("fmt_a", ["e4m3", "e5m2"])
@pytest.mark.parametrize(
    "shape",
    # 1, 2, 3, 9 and 32 k-tiles of 128 (the mainloop's head, tail and two-tile loop, odd and
    # even counts), a partial k-tile, a few-tile long K (stream-K splits it), odd sizes
    [(256, 512, 128), (200, 136, 256), (77, 264, 384), (130, 264, 1040), (512, 1024, 4096),
     (96, 128, 48), (256, 384, 8192)],
    ids=lambda s: "x".join(map(str, s)),
)
def test_overlapped_promotion_bitwise_equal_to_cutlass_mainloop(config, fmt_a, shape):
    """The overlapped mainloop sums each 128-deep k-tile on the tensor cores from zero and adds
    it into a zeroed fp32 accumulator in k order, as CUTLASS's promoted mainloop does: the
    outputs are bitwise equal, with tensorwise and rowwise scales and with bias."""
    _check_twins(config, shape, fmt_a, ("tensorwise", "rowwise"))


@needs_sm90
@pytest.mark.parametrize("config", sorted(OVERLAPPED_TWINS))
def test_overlapped_promotion_bitwise_equal_over_many_tiles(config):
    """Shapes sized from the SM count, so that the persistent kernels run several tiles per CTA
    (and both ping-pong warpgroups, the pipeline state carried from tile to tile after an odd
    k-tile count), and stream-K splits K unevenly across work units that cross tile boundaries
    (1.26 waves of tiles over 33 k-tiles)."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    waves_5_4 = 2 * ((sms * 5 // 4 + 1) // 2)
    shapes = {5: (256 * sms, 128, 1152), 6: (256 * sms, 128, 1152), 7: (128 * waves_5_4, 128, 4224)}
    _check_twins(config, shapes[config], "e4m3", ("tensorwise", "mixed"))


def _check_twins(config, shape, fmt_a, scalings):
    m, n, k = shape
    for scaling in scalings:
        a, sa, b, sb, bias = operands(m, n, k, fmt_a, scaling, seed=7 * m + k,
                                      bias_dtype=torch.bfloat16)
        outs = {}
        for c in (config, OVERLAPPED_TWINS[config]):
            with ops.force_fp8_config(c):
                outs[c] = ops.fp8_scaled_mm(a, b, sa, sb, bias, torch.bfloat16)
            assert cutlass_nn.ops._ops._last_kernel_name.default().endswith(ops.fp8_configs()[c])
        assert torch.equal(outs[config].view(torch.int16),
                           outs[OVERLAPPED_TWINS[config]].view(torch.int16)), (config, scaling)
        check(outs[config], reference64(a, sa, b, sb, bias), tolerance(torch.bfloat16),
              f"config {config} {shape} {scaling}")


@needs_sm90
def test_rule_picks_by_tile_count():
    """The per-shape rule (fp8_gemm_dispatch.cu, NOTES v0.20) by 128x128 tiles per SM (waves)."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    last = cutlass_nn.ops._ops._last_kernel_name.default
    cases = [  # (m, n, k, expected name ending)
        (256, 256, 128, "64x128x128_1x1x1_pingpong_overlap"),  # under half a wave
        (256, 256, 8192, "64x128x128_1x1x1_pingpong_overlap"),  # ... over any K
        (128 * (sms * 3 // 4), 128, 128, "128x128x128_2x1x1_coop_overlap"),  # half to one wave
        (128 * sms, 128, 4096, "128x128x128_2x1x1_coop_overlap_streamk"),  # 1-1.5 waves, long K
        (128 * sms, 128, 1024, "64x128x128_1x1x1_pingpong_overlap"),  # 1-1.5 waves, short K
        (256 * sms, 128, 1024, "128x128x128_2x1x1_coop_overlap"),  # from 1.5 waves
        (256 * sms, 128, 512, "64x128x128_1x1x1_pingpong_overlap"),  # ... over K <= 512
    ]
    for m, n, k, expected in cases:
        a, sa, b, sb, _ = operands(m, n, k)
        ops.fp8_scaled_mm(a, b, sa, sb)
        assert last().endswith(expected), (m, n, k, last())
    # float32 outputs: configuration 0
    ops.fp8_scaled_mm(a, b, sa, sb, None, torch.float32)
    assert last().endswith("f32_128x128x128_2x1x1_coop"), last()


@needs_sm90
def test_layouts_read_in_place_or_copied():
    m, n, k = 96, 128, 256
    a, sa, b, sb, _ = operands(m, n, k, "e4m3", "rowwise", seed=5)
    ref = reference64(a, sa, b, sb)
    # a with rows further apart than K (a column slice of a wider buffer, 16-byte multiple)
    wide = torch.zeros(m, k + 64, dtype=a.dtype, device="cuda")
    wide[:, :k] = a
    # b row-major [K, N] (copied to column-major), and a as a transposed view (copied)
    cases = {
        "a slice": (wide[:, :k], b),
        "b row-major": (a, b.contiguous()),
        "a transposed view": (a.t().contiguous().t(), b),
    }
    for what, (aa, bb) in cases.items():
        before = (aa.clone(), bb.clone())
        out = ops.fp8_scaled_mm(aa, bb, sa, sb)
        assert cutlass_nn.ops._ops._last_kernel_name.default().startswith("sm90_fp8"), what
        check(out, ref, tolerance(torch.bfloat16), what)
        assert torch.equal(aa.view(torch.uint8), before[0].view(torch.uint8)), what
        assert torch.equal(bb.view(torch.uint8), before[1].view(torch.uint8)), what


@pytest.mark.parametrize(
    "m, n, k, fmt_a, fmt_b, out_dtype",
    [
        (33, 40, 40, "e4m3", "e4m3", torch.bfloat16),  # K not a multiple of 16
        (33, 12, 32, "e4m3", "e4m3", torch.bfloat16),  # N not a multiple of 8
        (16, 64, 64, "e4m3", "e5m2", torch.bfloat16),  # e5m2 b: no kernel
        (16, 64, 64, "e4m3", "e4m3", torch.float16),  # float16 out: no kernel
        (0, 64, 64, "e4m3", "e4m3", torch.bfloat16),
        (16, 64, 0, "e4m3", "e4m3", torch.bfloat16),
    ],
)
def test_aten_path_matches_cpu(m, n, k, fmt_a, fmt_b, out_dtype):
    a, sa = quantized(m, k, fmt_a, 1, 1)
    w, sw = quantized(n, k, fmt_b, 1, 2)
    bias = torch.randn(n).to(out_dtype).cuda()
    out = ops.fp8_scaled_mm(a, w.t(), sa, sw.t(), bias, out_dtype)
    assert cutlass_nn.ops._ops._last_kernel_name.default() == "aten_fp8_dequantize_matmul"
    cpu = ops.fp8_scaled_mm(a.cpu(), w.t().cpu(), sa.cpu(), sw.t().cpu(), bias.cpu(), out_dtype)
    ref = reference64(a, sa, w.t(), sw.t(), bias)
    if m and n:
        check(out, ref, tolerance(out_dtype), "aten path")
        check(cpu.cuda(), ref, tolerance(out_dtype), "cpu")
    assert out.shape == cpu.shape == (m, n) and out.dtype == out_dtype


@needs_sm90
def test_cuda_graph_and_compile():
    a, sa, b, sb, bias = operands(128, 256, 512, "e4m3", "rowwise", seed=9, bias_dtype=torch.bfloat16)
    eager = ops.fp8_scaled_mm(a, b, sa, sb, bias)
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        ops.fp8_scaled_mm(a, b, sa, sb, bias)  # first call per device outside the capture
        with torch.cuda.graph(graph, stream=stream):
            captured = ops.fp8_scaled_mm(a, b, sa, sb, bias)
    torch.cuda.current_stream().wait_stream(stream)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)

    def f(a, b, sa, sb, bias):
        return ops.fp8_scaled_mm(a, b, sa, sb, bias) * 2

    compiled = torch.compile(f, fullgraph=True)
    assert torch.equal(compiled(a, b, sa, sb, bias), eager * 2)


@needs_sm90
def test_deterministic_and_inputs_untouched():
    a, sa, b, sb, bias = operands(300, 512, 1024, "e5m2", "rowwise", seed=4, bias_dtype=torch.bfloat16)
    copies = [t.clone() for t in (sa, sb, bias)]
    first = ops.fp8_scaled_mm(a, b, sa, sb, bias)
    second = ops.fp8_scaled_mm(a, b, sa, sb, bias)
    assert torch.equal(first, second)
    for t, c in zip((sa, sb, bias), copies):
        assert torch.equal(t, c)


def test_errors_match_cpu():
    a, sa = quantized(8, 32, "e4m3", None, 0)
    w, sw = quantized(16, 32, "e4m3", None, 1)
    bad = [
        dict(a=a.to(torch.bfloat16)),
        dict(b=w),  # [16, 32]: 16 rows, not 32
        dict(a_scale=torch.ones(1, 8, device="cuda")),
        dict(b_scale=torch.ones(2, device="cuda")),
        dict(b_scale=sw.cpu()),
        dict(bias=torch.zeros(16, device="cuda")),  # float32 bias, bfloat16 out
        dict(out_dtype=torch.int32),
    ]
    base = dict(a=a, b=w.t(), a_scale=sa, b_scale=sw, bias=None, out_dtype=torch.bfloat16)
    for change in bad:
        kwargs = {**base, **change}
        with pytest.raises(RuntimeError) as cuda_err:
            ops.fp8_scaled_mm(**kwargs)
        cpu_kwargs = {
            k: (v.cpu() if isinstance(v, torch.Tensor) and not (k == "b_scale" and v.device.type == "cpu") else v)
            for k, v in kwargs.items()
        }
        assert "cutlass_nn.fp8_scaled_mm: argument" in str(cuda_err.value), change
        if "b_scale" in change and change["b_scale"].device.type == "cpu":
            continue  # the device check has no CPU counterpart
        with pytest.raises(RuntimeError) as cpu_err:
            ops.fp8_scaled_mm(**cpu_kwargs)
        assert str(cpu_err.value).split("\n")[0] == str(cuda_err.value).split("\n")[0], change


# ---------------------------------------------------------------------------------------------
# fp8_quantize: the CUDA kernels against the CPU backend (the reference's arithmetic), bitwise
# ---------------------------------------------------------------------------------------------


def _bits(t):
    return t.view(torch.uint8) if t.dtype.itemsize == 1 else t


@pytest.mark.parametrize("axis", ["tensor", "row", "column"])
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
# (256, 1024), (80, 200), (4112, 1032): the transposed 16-byte-pack kernel (rows a multiple of 16,
# full and partial 64x64 tiles); (37, 45), (4099, 96), (3, 20000): the 32x32 element kernel.
@pytest.mark.parametrize("shape", [(1, 1), (37, 45), (256, 1024), (80, 200), (4112, 1032), (4099, 96),
                                   (3, 20000), (0, 8), (8, 0)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("transpose", [False, True])
def test_quantize_bitwise_cpu(axis, fmt, dtype, shape, transpose):
    gen = torch.Generator().manual_seed(shape[0] * 31 + shape[1])
    x = torch.randn(*shape, generator=gen) * torch.exp2(torch.randint(-12, 12, shape, generator=gen).float())
    x = x.to(dtype)
    data, scale = ops.fp8_quantize(x.cuda(), fmt, axis, transpose)
    want_data, want_scale = ops.fp8_quantize(x, fmt, axis, transpose)
    assert data.shape == want_data.shape and scale.shape == want_scale.shape
    assert torch.equal(_bits(data.cpu()), _bits(want_data))
    assert torch.equal(scale.cpu(), want_scale)


@pytest.mark.parametrize("axis", ["tensor", "row", "column"])
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(1, 1), (37, 45), (256, 1024), (80, 200), (4112, 1032), (4099, 96),
                                   (0, 8), (8, 0)],
                         ids=lambda s: "x".join(map(str, s)))
def test_quantize_both_bitwise_cpu(axis, fmt, dtype, shape):
    """One cast writing both layouts: each bitwise the CPU backend's."""
    gen = torch.Generator().manual_seed(shape[0] * 17 + shape[1])
    x = torch.randn(*shape, generator=gen) * torch.exp2(torch.randint(-12, 12, shape, generator=gen).float())
    x = x.to(dtype)
    data, data_t, scale = ops.fp8_quantize_both(x.cuda(), fmt, axis)
    want, want_t, want_scale = ops.fp8_quantize_both(x, fmt, axis)
    assert data.shape == want.shape and data_t.shape == want_t.shape and data_t.is_contiguous()
    assert torch.equal(_bits(data.cpu()), _bits(want)) and torch.equal(_bits(data_t.cpu()), _bits(want_t))
    assert torch.equal(scale.cpu(), want_scale)


@pytest.mark.parametrize("axis", ["tensor", "row", "column"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(37, 45), (256, 1024), (80, 200), (4099, 96), (0, 8)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("transpose", [False, True])
def test_cast_bitwise_cpu(axis, dtype, shape, transpose):
    """The cast with given scales (no maximum pass) on every cast kernel: bitwise the CPU's."""
    gen = torch.Generator().manual_seed(shape[0] * 13 + shape[1])
    x = (torch.randn(*shape, generator=gen) * torch.exp2(torch.randint(-12, 12, shape, generator=gen).float())).to(dtype)
    _, scale = ops.fp8_quantize(x, "e4m3", axis)
    data = ops.fp8_cast(x.cuda(), scale.cuda(), "e4m3", transpose)
    want = ops.fp8_cast(x, scale, "e4m3", transpose)
    assert data.shape == want.shape and torch.equal(_bits(data.cpu()), _bits(want))


def test_quantize_strided_input_and_nonfinite():
    x = torch.randn(64, 48, device="cuda", dtype=torch.bfloat16)
    x[3, 7] = float("inf")
    x[10, 0] = float("nan")
    view = x.t()  # not contiguous: copied first
    for axis in ("tensor", "row", "column"):
        data, scale = ops.fp8_quantize(view, "e4m3", axis, True)
        want_data, want_scale = ops.fp8_quantize(view.cpu(), "e4m3", axis, True)
        assert torch.equal(torch.isnan(data.float().cpu()), torch.isnan(want_data.float()))
        finite = ~torch.isnan(want_data.float())
        assert torch.equal(data.float().cpu()[finite], want_data.float()[finite])
        assert torch.equal(scale.cpu().isfinite(), want_scale.isfinite())


def test_quantize_misaligned_storage_takes_the_element_path():
    flat = torch.randn(64 * 48 + 1, device="cuda", dtype=torch.bfloat16)
    x = flat[1:].view(64, 48)  # contiguous, 2 bytes past a 16-byte boundary
    for axis in ("tensor", "row", "column"):
        data, scale = ops.fp8_quantize(x, "e5m2", axis)
        want_data, want_scale = ops.fp8_quantize(x.cpu(), "e5m2", axis)
        assert torch.equal(_bits(data.cpu()), _bits(want_data)) and torch.equal(scale.cpu(), want_scale)


@pytest.mark.parametrize("rows", [4_200_000, 2_100_001], ids=["packs", "elements"])
def test_quantize_transposed_more_rows_than_one_grid_dimension_holds(rows):
    """More row tiles than a grid's y dimension holds (65535 of 64 / of 32): the transposed casts
    put row tiles on the grid's x dimension, so they launch; bitwise the CPU backend's, both
    entry points."""
    x = torch.randn(rows, 8, dtype=torch.bfloat16)
    want_t, want_scale = ops.fp8_quantize(x, "e4m3", "tensor", True)
    data_t, scale = ops.fp8_quantize(x.cuda(), "e4m3", "tensor", True)
    assert torch.equal(_bits(data_t.cpu()), _bits(want_t)) and torch.equal(scale.cpu(), want_scale)
    data, data_t2, _ = ops.fp8_quantize_both(x.cuda(), "e4m3", "tensor")
    assert torch.equal(_bits(data_t2.cpu()), _bits(want_t))
    assert torch.equal(_bits(data.cpu()), _bits(want_t.t()))
