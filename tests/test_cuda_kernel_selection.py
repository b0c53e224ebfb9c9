"""Kernel selection on a CUDA GPU: every SM90 tile configuration (forced, as the benchmark sweep
forces them) against a float64 reference, the scheduler swizzle, the padded path that gives
misaligned (odd K / N) problems to the TMA kernels, and the 3xTF32 path of float32 "highest"."""

from __future__ import annotations


import pytest
import torch

import cutlass_nn
from cuda_helpers import (
    CUDA_MARKS,
    FLOOR_16BIT_INTO_F32,
    GEMM_OPS,
    check_close,
    clone_all,
    forced_config,
    gemm_args,
    gemm_out_shape,
    is_sm90_build,
    make_matrix,
    matmul_precision,
    needs_sm90,
    run_ours,
    run_torch,
    sm90_config_names,
    to64,
    assert_unchanged,
)

pytestmark = CUDA_MARKS

ops = cutlass_nn.ops
FLOOR_16 = 2e-3


# The configurations that run the transposed problem D^T = B^T A^T (small M).
SWAPPED_CONFIGS = (4, 5, 6, 7, 16)
# The short-K configurations, compiled for the wgrad layout only (9: 16-bit outputs only).
SHORT_K_CONFIGS = (8, 9)
# The small-wgrad configurations (64-row ping-pong tiles): the wgrad layout, 16-bit outputs only.
SMALL_WGRAD_CONFIGS = (11, 12)
# The row-major configurations compiled with a float32 output too (the wgrad of an fp32 main
# gradient); config 1 (v0.30) and 10, 13, 14, 15, 17-19 have 16-bit outputs only.
FP32_OUT_CONFIGS = (0, 2, 3)
N_CONFIGS = 20


def _transposable(op: str) -> bool:
    """Whether the op's GEMM can run transposed: its A is row-major (the forward, dgrad and mm;
    wgrad reads dY^T, column-major)."""
    return op != "linear_wgrad"


def _config_has_kernel(config: int, op: str) -> bool:
    """Whether a configuration has kernels for the op's GEMM (16-bit in, same dtype out)."""
    if config in SWAPPED_CONFIGS:
        return _transposable(op)
    if config in SHORT_K_CONFIGS or config in SMALL_WGRAD_CONFIGS:
        return op == "linear_wgrad"
    return True


def test_config_names_listed():
    names = sm90_config_names()
    assert len(names) == N_CONFIGS and len(set(names)) == N_CONFIGS, names
    assert names[0] == "128x256x64_2x1x1_coop"
    assert all(("swapab" in names[c]) == (c in SWAPPED_CONFIGS) for c in range(N_CONFIGS)), names
    assert all(("_epi" in names[c]) == (c in SHORT_K_CONFIGS) for c in range(N_CONFIGS)), names


def test_set_gemm_config_rejects_bad_values():
    with pytest.raises(RuntimeError, match=r"_set_gemm_config: argument 'config'"):
        torch.ops.cutlass_nn._set_gemm_config(99, 0)
    with pytest.raises(RuntimeError, match=r"_set_gemm_config: argument 'swizzle'"):
        torch.ops.cutlass_nn._set_gemm_config(-1, 100)
    with pytest.raises(RuntimeError, match=r"_set_gemm_config: argument 'splits'"):
        torch.ops.cutlass_nn._set_gemm_config(-1, 0, 65)
    assert list(torch.ops.cutlass_nn._set_gemm_config(-1, 0)) == [-1, 0, 0]


# (M, N, K): a multi-wave aligned problem, a decode-like small M, and one whose M and N are not
# multiples of the tile (partial tiles on both edges), K not a multiple of the 64-deep k-block.
CONFIG_SHAPES = {"aligned": (512, 768, 1024), "small_m": (16, 1024, 2048), "edges": (1000, 1032, 520)}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("shape", CONFIG_SHAPES.values(), ids=CONFIG_SHAPES.keys())
@pytest.mark.parametrize("op", GEMM_OPS)
@pytest.mark.parametrize("config", range(N_CONFIGS))
def test_each_sm90_config(config, op, shape, dtype, gen):
    needs_sm90()
    m, n, k = shape
    args = gemm_args(op, m, n, k, dtype, "contig", gen)
    before = clone_all(args)
    with forced_config(config):
        ours = run_ours(op, args)
        name = ops.last_kernel_name()
    context = f"{op} {shape} config={config} {dtype}"
    if not _config_has_kernel(config, op):
        # Forced onto a GEMM it has no kernel for: the rule's row-major SM90 kernel instead.
        assert name.startswith("sm90") and sm90_config_names()[config] not in name, (
            f"{context}: ran {name}"
        )
        assert "swapab" not in name or _transposable(op), f"{context}: ran {name}"
    else:
        assert name.endswith(sm90_config_names()[config]), f"{context}: ran {name}"
    assert ours.shape == gemm_out_shape(op, m, n, k)
    check_close(ours, run_torch(op, args), run_torch(op, to64(args)), FLOOR_16, context)
    assert_unchanged(args, before, context)


@pytest.mark.parametrize("config", (*FP32_OUT_CONFIGS, 1))
def test_each_sm90_config_fp32_accumulation(config, gen):
    """The fp32-output wgrad kernels (an fp32 main gradient, beta = 1 with C == D); a forced
    configuration without one (config 1) runs the rule's fp32-output kernel instead."""
    needs_sm90()
    m, n, k = 300, 264, 136
    dy = make_matrix(m, n, torch.bfloat16, "contig", gen)
    x = make_matrix(m, k, torch.bfloat16, "contig", gen)
    gw = make_matrix(n, k, torch.float32, "contig", gen)
    start = gw.clone()
    with forced_config(config):
        ops.linear_wgrad_accumulate_(gw, dy, x)
        name = ops.last_kernel_name()
    assert "f32" in name, name
    assert name.endswith(sm90_config_names()[config]) == (config in FP32_OUT_CONFIGS), name
    ref64 = start.double() + dy.double().t() @ x.double()
    check_close(gw, start + torch.mm(dy.t().float(), x.float()), ref64, FLOOR_16BIT_INTO_F32,
                f"config {config}")


def test_rule_v027_head_weight_gradient(gen):
    """Rule v0.27: the weight gradient of a 32000 x 1024 language-model head over 4096 tokens
    (2000 tiles of 128x128) runs config 0 with a 16-bit output, and keeps ping-pong (config 3)
    with a float32 output (the main-gradient accumulation, which was not measured in float32)."""
    needs_sm90()
    if torch.cuda.get_device_properties(0).multi_processor_count != 132:
        pytest.skip("the expected configurations are those of a 132-SM GPU")
    tokens, out, inp = 4096, 32000, 1024
    dy = make_matrix(tokens, out, torch.bfloat16, "contig", gen)
    x = make_matrix(tokens, inp, torch.bfloat16, "contig", gen)
    ref64 = dy.double().t() @ x.double()
    gw = ops.linear_wgrad(dy, x)
    name = ops.last_kernel_name()
    assert name.endswith(sm90_config_names()[0]) and "bf16_bf16_nt" in name, name
    check_close(gw, torch.mm(dy.t(), x), ref64, FLOOR_16, "head wgrad, bf16 out")
    acc = make_matrix(out, inp, torch.float32, "contig", gen)
    start = acc.clone()
    ops.linear_wgrad_accumulate_(acc, dy, x)
    name = ops.last_kernel_name()
    assert name.endswith(sm90_config_names()[3]) and "bf16_f32_nt" in name, name
    check_close(acc, start + torch.mm(dy.t().float(), x.float()), start.double() + ref64,
                FLOOR_16BIT_INTO_F32, "head wgrad, float32 accumulation")


@pytest.mark.parametrize("swizzle", [1, 2, 4, 8])
def test_scheduler_swizzle(swizzle, gen):
    needs_sm90()
    args = gemm_args("linear", 1024, 2048, 256, torch.bfloat16, "contig", gen)
    with forced_config(0, swizzle):
        ours = run_ours("linear", args)
    check_close(ours, run_torch("linear", args), run_torch("linear", to64(args)), FLOOR_16,
                f"swizzle {swizzle}")


def test_rule_gives_small_m_narrow_n_a_stream_k_kernel(gen):
    """A decode-like problem (16 rows) with too few weight rows for a 64-row tile per SM must
    not run the 128x256 persistent kernel, whose few tiles would leave most SMs idle."""
    needs_sm90()
    args = gemm_args("linear_nobias", 16, 512, 4096, torch.bfloat16, "contig", gen)
    run_ours("linear_nobias", args)
    assert "streamk" in ops.last_kernel_name(), ops.last_kernel_name()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("tokens", [16, 256])
def test_rule_gives_short_k_wgrad_its_own_kernel(tokens, dtype, gen):
    """wgrad over a few tokens (K <= 256): the write-bound short-K configurations (a wider
    epilogue tile: 128x128 up to K = 128, 128x64 beyond); an fp32 output (accumulation) keeps
    the default configuration."""
    needs_sm90()
    dy = make_matrix(tokens, 4096, dtype, "contig", gen)
    x = make_matrix(tokens, 2048, dtype, "contig", gen)
    ref64 = dy.double().t() @ x.double()
    gw = ops.linear_wgrad(dy, x)
    name = ops.last_kernel_name()
    assert name.endswith(sm90_config_names()[9 if tokens <= 128 else 8]), name
    check_close(gw, torch.mm(dy.t(), x), ref64, FLOOR_16, f"wgrad over {tokens} tokens")
    acc = make_matrix(4096, 2048, torch.float32, "contig", gen)
    start = acc.clone()
    ops.linear_wgrad_accumulate_(acc, dy, x)
    name = ops.last_kernel_name()
    assert name.endswith(sm90_config_names()[0]) and "f32" in name, name
    check_close(acc, start + torch.mm(dy.t().float(), x.float()), ref64 + start.double(),
                FLOOR_16BIT_INTO_F32, f"fp32 wgrad accumulation over {tokens} tokens")


# Small-M problems (GEMM M x N x K) that the rule runs transposed, D^T = B^T A^T: 1 to 128 rows
# (partial token tiles: 17, 100); N a multiple of the 64-row weight tile and not, wide and narrow
# (the token tile narrowed until the tiles cover the SMs); K with a partial k-block; an odd K
# large enough for the padded path (then transposed).
SMALL_M_SHAPES = {
    "m1": (1, 8192, 520),
    "m16": (16, 8264, 1000),
    "m17": (17, 8192, 264),
    "m64_n4096": (64, 4096, 520),
    "m100_n2048": (100, 2048, 1000),
    "m128": (128, 8264, 2056),
    "m128_n4096": (128, 4096, 1000),
    "m16_odd_k": (16, 8192, 4093),
}


def _expected_swapped_config(m: int, n: int) -> int:
    """The documented rule (gemm_dispatch.cu, choose_sm90_config) for M <= 128, N >= 1024: the
    narrowest token tile of 16 / 32 / 64 / 128 rows holding all m rows, narrowed while the
    ceil(n / 64) x ceil(m / rows) tiles cover less than 7/8 of the SMs."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    tiles = [(16, 4), (32, 5), (64, 6), (128, 7)]
    i = next(j for j, (rows, _) in enumerate(tiles) if rows >= m)
    while i > 0 and -(-n // 64) * -(-m // tiles[i][0]) * 8 < 7 * sms:
        i -= 1
    return tiles[i][1]


def _op_shape(op: str, m: int, n: int, k: int) -> tuple[int, int, int]:
    """gemm_args' (m, n, k) that give ``op`` the GEMM M x N x K (dgrad's GEMM N is its k)."""
    return (m, k, n) if op == "linear_dgrad" else (m, n, k)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("shape", SMALL_M_SHAPES.values(), ids=SMALL_M_SHAPES.keys())
@pytest.mark.parametrize("op", ["linear", "linear_nobias", "linear_dgrad", "mm"])
def test_rule_runs_small_m_transposed(op, shape, dtype, gen):
    needs_sm90()
    m, n, k = shape
    args = gemm_args(op, *_op_shape(op, m, n, k), dtype, "contig", gen)
    before = clone_all(args)
    ours = run_ours(op, args)
    name = ops.last_kernel_name()
    context = f"{op} {shape} {dtype}"
    expected = sm90_config_names()[_expected_swapped_config(m, n)]
    assert expected in name, f"{context}: ran {name}"
    assert ours.shape == gemm_out_shape(op, *_op_shape(op, m, n, k)) and ours.is_contiguous()
    check_close(ours, run_torch(op, args), run_torch(op, to64(args)), FLOOR_16, context)
    assert_unchanged(args, before, context)


@pytest.mark.parametrize("layout", ["offset", "colslice", "transposed"])
@pytest.mark.parametrize("op", ["linear", "linear_dgrad", "mm"])
def test_small_m_operands_the_transposed_kernels_cannot_read(op, layout, gen):
    """Unaligned, odd-strided or column-major operands of a small-M problem: whatever kernel
    takes them (the row-major rule's, padded, or SM80), the result is right."""
    needs_sm90()
    args = gemm_args(op, *_op_shape(op, 16, 8192, 520), torch.bfloat16, layout, gen)
    before = clone_all(args)
    ours = run_ours(op, args)
    context = f"{op} {layout} ran {ops.last_kernel_name()}"
    check_close(ours, run_torch(op, args), run_torch(op, to64(args)), FLOOR_16, context)
    assert_unchanged(args, before, context)


@pytest.mark.parametrize("act", ["relu", "gelu", "gelu_tanh"])
@pytest.mark.parametrize("m", [16, 128])
def test_small_m_fused_activation_runs_transposed_gemm_then_activation(act, m, gen):
    """No fused kernel at a small M: the transposed GEMM, then the activation pass (the output and
    the pre-activation as from the fused kernels, rounded once)."""
    needs_sm90()
    F = torch.nn.functional
    torch_act = {"relu": F.relu, "gelu": F.gelu,
                 "gelu_tanh": lambda z: F.gelu(z, approximate="tanh")}[act]
    x = make_matrix(m, 1000, torch.bfloat16, "contig", gen)
    w = make_matrix(8192, 1000, torch.bfloat16, "contig", gen)
    b = make_matrix(1, 8192, torch.bfloat16, "contig", gen)[0]
    out, pre = ops.linear_act_aux(x, w, b, act)
    assert "swapab" in ops.last_kernel_name(), ops.last_kernel_name()
    z64 = x.double() @ w.double().t() + b.double()
    z_torch = torch.nn.functional.linear(x, w, b)
    check_close(pre, z_torch, z64, FLOOR_16, f"{act} pre-activation")
    check_close(out, torch_act(z_torch.float()).bfloat16(), torch_act(z64), FLOOR_16,
                f"{act} output")
    alone = ops.linear_act(x, w, b, act)
    assert torch.equal(alone, out)


@pytest.mark.parametrize("act", ["relu", "gelu", "gelu_tanh"])
@pytest.mark.parametrize("shape", [(4096, 3072, 768), (2048, 4096, 1024), (2048, 4096, 2048)],
                         ids=["3072x768", "4096x1024", "4096x2048"])
def test_gelu_with_the_pre_activation_runs_the_gemm_then_the_activation(act, shape, gen):
    """Rules v0.45 - v0.47: linear_act_aux with the erf GELU (the training path of a Linear +
    GELU layer) runs the rule's GEMM with the bias, then the activation pass, since the fused
    epilogue's erff costs more than the pass, except over K >= 2048 (v0.47: the mainloop hides
    it); ReLU and GELU(tanh) (its epilogue math z * sigmoid(2u) with the fast exponential) keep
    the fused kernel, and so does the inference path (linear_act). Both results are right
    either way."""
    needs_sm90()
    m, n, k = shape
    F = torch.nn.functional
    torch_act = {"relu": F.relu, "gelu": F.gelu,
                 "gelu_tanh": lambda z: F.gelu(z, approximate="tanh")}[act]
    x = make_matrix(m, k, torch.bfloat16, "contig", gen)
    w = make_matrix(n, k, torch.bfloat16, "contig", gen)
    b = make_matrix(1, n, torch.bfloat16, "contig", gen)[0]
    out, pre = ops.linear_act_aux(x, w, b, act)
    name = ops.last_kernel_name()
    if act == "gelu" and k < 2048:
        assert not name.endswith(("gelu", "gelutanh", "_aux")), name
    else:
        suffix = {"relu": "relu", "gelu": "gelu", "gelu_tanh": "gelutanh"}[act]
        assert name.endswith(f"pingpong_{suffix}_aux"), name
    z64 = x.double() @ w.double().t() + b.double()
    z_torch = F.linear(x, w, b)
    check_close(pre, z_torch, z64, FLOOR_16, f"{act} pre-activation ({name})")
    check_close(out, torch_act(z_torch.float()).bfloat16(), torch_act(z64), FLOOR_16,
                f"{act} output ({name})")
    alone = ops.linear_act(x, w, b, act)
    suffix = {"relu": "relu", "gelu": "gelu", "gelu_tanh": "gelutanh"}[act]
    assert ops.last_kernel_name().endswith("pingpong_" + suffix), ops.last_kernel_name()
    check_close(alone, torch_act(z_torch.float()).bfloat16(), torch_act(z64), FLOOR_16,
                f"{act} inference output")


@pytest.mark.parametrize("act", ["relu", "gelu_tanh", "gelu"])
@pytest.mark.parametrize("aux", [False, True], ids=["linear_act", "linear_act_aux"])
def test_fused_walk_restreaming_a_large_operand_runs_unfused(act, aux, gen):
    """Rule v0.47: where config 3's walk over its tiles would stream an operand of more than 40
    MiB once per row of tiles (B of 16384 x 5120 x 4224: 41.25 MiB) and the rule's tile is
    another, a fused epilogue runs the rule's GEMM and then the activation pass; at 5120 x
    4096 (exactly 40 MiB) it stays on the fused kernel, the erf GELU with the pre-activation
    too (K >= 2048). Right results on both paths."""
    needs_sm90()
    F = torch.nn.functional
    torch_act = {"relu": F.relu, "gelu": F.gelu,
                 "gelu_tanh": lambda z: F.gelu(z, approximate="tanh")}[act]
    suffix = {"relu": "relu", "gelu": "gelu", "gelu_tanh": "gelutanh"}[act]
    for k, fused in ((4096, True), (4224, False)):
        m, n = 16384, 5120
        x = make_matrix(m, k, torch.bfloat16, "contig", gen)
        w = make_matrix(n, k, torch.bfloat16, "contig", gen)
        b = make_matrix(1, n, torch.bfloat16, "contig", gen)[0]
        if aux:
            out, pre = ops.linear_act_aux(x, w, b, act)
        else:
            out = ops.linear_act(x, w, b, act)
        name = ops.last_kernel_name()
        context = f"{act} {m}x{n}x{k} ({name})"
        if fused:
            assert name.endswith(f"pingpong_{suffix}_aux" if aux else f"pingpong_{suffix}"), context
        else:
            assert not name.endswith(("relu", "gelu", "gelutanh", "_aux")), context
        z64 = x.double() @ w.double().t() + b.double()
        z_torch = F.linear(x, w, b)
        if aux:
            check_close(pre, z_torch, z64, FLOOR_16, f"{context} pre-activation")
        check_close(out, torch_act(z_torch.float()).bfloat16(), torch_act(z64), FLOOR_16,
                    f"{context} output")
        del z64


# Misaligned problems large enough (m * n * k >= 2^27) for the padded TMA path.
ODD_SHAPES = {"odd_kn": (520, 1027, 1029), "odd_m": (515, 1031, 1024), "odd_all": (777, 333, 999)}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("shape", ODD_SHAPES.values(), ids=ODD_SHAPES.keys())
@pytest.mark.parametrize("op", GEMM_OPS)
def test_misaligned_problems_run_padded_on_sm90(op, shape, dtype, gen):
    needs_sm90()
    m, n, k = shape
    args = gemm_args(op, m, n, k, dtype, "contig", gen)
    before = clone_all(args)
    ours = run_ours(op, args)
    name = ops.last_kernel_name()
    context = f"{op} {shape} {dtype}"
    assert name.startswith("sm90"), f"{context}: ran {name}"
    assert ours.shape == gemm_out_shape(op, m, n, k) and ours.is_contiguous()
    check_close(ours, run_torch(op, args), run_torch(op, to64(args)), FLOOR_16, context)
    assert_unchanged(args, before, context)


def wgrad_into_padded_gradient(t, n, k, grad_dtype, gen):
    """dy [t, n] and x [t, k] in bf16, and a gradient [n, k] with random values in a NaN-filled
    buffer 3 columns wider (rows 16-byte misaligned; the NaN columns show any write past it):
    returns (dy, x, buf, grad_weight, its starting values)."""
    dy = make_matrix(t, n, torch.bfloat16, "contig", gen)
    x = make_matrix(t, k, torch.bfloat16, "contig", gen)
    buf = torch.full((n, k + 3), float("nan"), dtype=grad_dtype, device="cuda")
    gw = buf[:, :k]
    gw.copy_(make_matrix(n, k, torch.float32, "contig", gen).to(grad_dtype))
    return dy, x, buf, gw, gw.clone()


@pytest.mark.parametrize("acc_dtype", [torch.bfloat16, torch.float32], ids=["same", "f32"])
def test_misaligned_accumulation_padded(acc_dtype, gen):
    """In-place accumulation on the padded path: existing values kept, padding never written."""
    needs_sm90()
    m, n, k = 1001, 515, 517
    dy, x, buf, gw, start = wgrad_into_padded_gradient(m, n, k, acc_dtype, gen)
    ops.linear_wgrad_accumulate_(gw, dy, x)
    assert ops.last_kernel_name().startswith("sm90"), ops.last_kernel_name()
    ref64 = start.double() + dy.double().t() @ x.double()
    if acc_dtype == torch.float32:
        torch_same, floor = start + torch.mm(dy.t().float(), x.float()), FLOOR_16BIT_INTO_F32
    else:
        torch_same, floor = start + torch.mm(dy.t(), x), FLOOR_16
    check_close(gw, torch_same, ref64, floor, "padded accumulate")
    assert torch.isnan(buf[:, k:]).all(), "wrote past grad_weight"


# float32 "highest": 3xTF32. On Hopper, problems of at least 2^26 multiply-adds run as one TF32
# GEMM over operands split into TF32 parts, on the SM90 kernel that adds WGMMA's partial sums into
# fp32 registers every 128 products ("3xtf32_split+sm90_..._promoted"); smaller ones, other GPUs, and
# the forced SM80 path run the SM80 3xTF32 kernels (mma.sync); SIMT fp32 where 3xTF32 cannot read
# the operands.
F32_SHAPES = {"aligned": (256, 384, 1024), "odd_k": (300, 388, 1001), "small": (64, 96, 80)}
SPLIT_KERNEL = "3xtf32_split+sm90_tma_ws_tf32_f32_tn_128x128x32_2x1x1_coop_promoted"


@pytest.mark.parametrize("shape", F32_SHAPES.values(), ids=F32_SHAPES.keys())
@pytest.mark.parametrize("op", ["linear", "linear_nobias", "linear_dgrad", "linear_wgrad", "mm"])
def test_fp32_highest_is_3xtf32_at_fp32_accuracy(op, shape, gen):
    """As accurate as cuBLAS fp32 (within 2x of its error vs float64, plus a 1e-6 floor)."""
    m, n, k = shape
    args = gemm_args(op, m, n, k, torch.float32, "contig", gen)
    before = clone_all(args)
    with matmul_precision(False):
        ours = run_ours(op, args)
        name = ops.last_kernel_name()
        torch_fp32 = run_torch(op, args)
    assert "3xtf32" in name or "simt" in name, name
    if shape == F32_SHAPES["aligned"]:
        assert "3xtf32" in name, name
    if shape != F32_SHAPES["small"] and is_sm90_build():
        assert name == SPLIT_KERNEL, name
    ref = run_torch(op, to64(args))
    err = lambda t: float((t.double() - ref).norm() / ref.norm())  # noqa: E731
    assert err(ours) <= 2 * err(torch_fp32) + 1e-6, (name, err(ours), err(torch_fp32))
    assert_unchanged(args, before, op)


@pytest.mark.parametrize("op", ["linear", "linear_dgrad", "linear_wgrad"])
def test_fp32_highest_long_k_matches_cublas_fp32(op, gen):
    """A long K (16384 products per output) is where an inexact accumulator shows: one plain TF32
    WGMMA GEMM over the split operands measured 50x cuBLAS fp32's error at K = 4096. Ours must
    stay within 2x of cuBLAS fp32's error against float64, and every result must be finite."""
    # The contracted extent is 16384 in each: K of the forward, N (outputs) of the dgrad, M
    # (tokens) of the wgrad.
    m, n, k = {
        "linear": (1024, 768, 16384),
        "linear_dgrad": (1024, 16384, 768),
        "linear_wgrad": (16384, 1024, 768),
    }[op]
    args = gemm_args(op, m, n, k, torch.float32, "contig", gen)
    with matmul_precision(False):
        ours = run_ours(op, args)
        name = ops.last_kernel_name()
        torch_fp32 = run_torch(op, args)
    if is_sm90_build():
        assert name == SPLIT_KERNEL, name
    ref = run_torch(op, to64(args))
    err = lambda t: float((t.double() - ref).norm() / ref.norm())  # noqa: E731
    assert torch.isfinite(ours).all()
    assert err(ours) <= 2 * err(torch_fp32), (name, err(ours), err(torch_fp32))
    # and far from TF32's own error (~5e-4 in the norm)
    assert err(ours) < 5e-5, (name, err(ours))


def test_fp32_highest_split_with_transposed_and_strided_operands(gen):
    """The split reads any strides: a transposed weight and a column slice of a wider input give
    the same result as contiguous copies, at fp32 accuracy, with the inputs untouched."""
    m, n, k = 320, 256, 1024
    wide = make_matrix(m, k + 12, torch.float32, "contig", gen)
    x = wide[:, 5 : 5 + k]  # column slice: row stride k + 12, offset 5 (not 16-byte aligned)
    w_t = make_matrix(k, n, torch.float32, "contig", gen)
    w = w_t.t()  # [n, k], column-major
    bias = make_matrix(1, n, torch.float32, "contig", gen)[0]
    before = (wide.clone(), w_t.clone(), bias.clone())
    with matmul_precision(False):
        ours = ops.linear(x, w, bias)
        name = ops.last_kernel_name()
        again = ops.linear(x.contiguous(), w.contiguous(), bias)
        torch_fp32 = torch.nn.functional.linear(x, w, bias)
    if is_sm90_build():
        assert name == SPLIT_KERNEL, name
    assert torch.equal(ours, again)
    ref = torch.nn.functional.linear(x.double(), w.double(), bias.double())
    err = lambda t: float((t.double() - ref).norm() / ref.norm())  # noqa: E731
    assert err(ours) <= 2 * err(torch_fp32) + 1e-6, (err(ours), err(torch_fp32))
    assert torch.equal(wide, before[0]) and torch.equal(w_t, before[1])
    assert torch.equal(bias, before[2])


def test_fp32_highest_accumulates_and_keeps_non_finite(gen):
    """In-place fp32 accumulation at precision "highest", and an infinity in an operand gives
    non-finite results exactly where torch's do (3xTF32 may turn +-inf into NaN: the split of
    inf has a NaN remainder)."""
    dy = make_matrix(1000, 256, torch.float32, "contig", gen)
    x = make_matrix(1000, 512, torch.float32, "contig", gen)
    gw = make_matrix(256, 512, torch.float32, "contig", gen)
    start = gw.clone()
    with matmul_precision(False):
        ops.linear_wgrad_accumulate_(gw, dy, x)
        ref = start.double() + dy.double().t() @ x.double()
        assert float((gw.double() - ref).norm() / ref.norm()) < 1e-6
        xi = make_matrix(512, 1024, torch.float32, "contig", gen)
        w = make_matrix(256, 1024, torch.float32, "contig", gen)
        xi[3, 5] = float("inf")
        ours = ops.linear(xi, w, None)
        theirs = torch.nn.functional.linear(xi, w)
    assert torch.equal(torch.isfinite(ours), torch.isfinite(theirs))


def test_fp32_highest_split_accumulates_into_a_padded_output(gen):
    """An output the SM90 kernel cannot write in place (N = 515 columns, a row stride of 518):
    the split path accumulates through a padded copy, keeps the old values, and never writes past
    the output's columns."""
    m, n, k = 1000, 260, 515
    dy = make_matrix(m, n, torch.float32, "contig", gen)
    x = make_matrix(m, k, torch.float32, "contig", gen)
    buf = torch.full((n, k + 3), float("nan"), dtype=torch.float32, device="cuda")
    gw = buf[:, :k]
    gw.copy_(make_matrix(n, k, torch.float32, "contig", gen))
    start = gw.clone()
    with matmul_precision(False):
        ops.linear_wgrad_accumulate_(gw, dy, x)
        name = ops.last_kernel_name()
        torch_fp32 = start + torch.mm(dy.t(), x)
    if is_sm90_build():
        assert name == SPLIT_KERNEL, name
    ref = start.double() + dy.double().t() @ x.double()
    err = lambda t: float((t.double() - ref).norm() / ref.norm())  # noqa: E731
    assert err(gw) <= 2 * err(torch_fp32) + 1e-6, (name, err(gw), err(torch_fp32))
    assert torch.isnan(buf[:, k:]).all(), "wrote past grad_weight"


@pytest.mark.parametrize("splits", [1, 2, 4, 7])
@pytest.mark.parametrize("op", ["linear", "linear_dgrad", "linear_wgrad"])
def test_stream_k_split_factors(op, splits, gen):
    """Forced split-K factors (and data-parallel, splits = 1) of the stream-K configuration,
    including a factor that does not divide the number of k-blocks."""
    needs_sm90()
    m, n, k = 48, 1024, 2056
    args = gemm_args(op, m, n, k, torch.bfloat16, "contig", gen)
    with forced_config(2, 0, splits):
        ours = run_ours(op, args)
        first = ours.clone()
        again = run_ours(op, args)
    assert torch.equal(first, again), "split-K reduction is not deterministic"
    check_close(ours, run_torch(op, args), run_torch(op, to64(args)), FLOOR_16,
                f"{op} splits={splits}")



# The expected configuration of the GEMMs whose rule depends on the device's memory bandwidth
# (pingpong_waves_config below).
PINGPONG_WAVES = object()

# The rule at transformer layer shapes (tokens, out, in) of the v0.8 and v0.10 sweeps (132-SM H100 / H200;
# benchmarks/NOTES.md): which configuration each GEMM of a layer gets, checked against float64.
# Config 6 / 7: the transposed problem with 64- / 128-row token tiles; 2: 128x128 stream-K /
# split-K / data-parallel; 3: 128x128 ping-pong; 0: 128x256 cooperative; 10: 128x192
# cooperative; 11 / 12: 64x64 / 64x32 ping-pong (small weight gradients); 13: 64x128 ping-pong
# (v0.28; a 128x64 tile from v0.22); 14 (v0.22): 256x128 cooperative with a 1x2 cluster; 1
# (v0.30): 128x192 cooperative without a cluster; 15 (v0.37): 128x128 ping-pong without a
# cluster. Layer shapes: a wgrad (tokens T, out N, in K)
# is the GEMM N x K x T.
TRANSFORMER_RULE_CASES = [
    ("linear", (512, 1024, 1024), 6),  # few tiles: transposed, token tile narrowed to fill SMs
    ("linear", (512, 2304, 768), 7),
    ("linear", (4096, 256, 1024), 13),  # a grouped-query key/value projection: 128 tiles of 64x128
    ("linear", (2048, 256, 1024), 6),  # 64 tiles of 64x128: transposed
    # v0.41: config 6's tile with 64-deep k-blocks over 512 tokens, K >= 3072 in the forward
    # layout, K >= 8192 in the dgrad layout
    ("linear", (512, 768, 3072), 16),
    ("linear", (512, 1024, 8192), 16),
    ("linear", (512, 1024, 2816), 6),  # K < 3072
    ("linear", (4096, 128, 8192), 6),  # 4096 tokens
    ("linear", (512, 4096, 11008), 15),  # row-major over a long K; 128 tiles: v0.40 one_wave
    ("linear_dgrad", (512, 3072, 768), 6),  # dgrad GEMM 512 x 768 x 3072, transposed ("tt")
    ("linear_dgrad", (512, 8192, 1024), 16),  # dgrad GEMM 512 x 1024 x 8192
    ("linear_wgrad", (4096, 768, 768), 13),  # 72 tiles of 64x128, each over the whole K (v0.29)
    ("linear_wgrad", (4096, 256, 1024), 11),  # 64 tiles of 64x64, each over the whole K
    ("linear_wgrad", (512, 256, 1024), 12),  # 128 tiles of 64x32 over 512 tokens
    ("linear_wgrad", (4096, 1024, 1024), 13),  # 1024 rows over 4096 tokens: 128 tiles of 64x128
    ("linear", (4096, 1024, 4096), 15),  # 256 tiles of 128x128 over K = 4096: v0.40 two_waves
    # v0.36: config 3 in config 14's place for the forward and dgrad layouts with 256 < K <= 1024
    ("linear_dgrad", (4096, 1024, 2816), 3),  # dgrad GEMM 4096 x 2816 x 1024
    # v0.37: config 15 (config 3 without a cluster) for the forward layout of outputs at most
    # 1024 wide over 1.5-3 waves of 128x128 tiles with 256 < K <= 3072 (within config 14's gate:
    # N = 1024 over 3073-4096 tokens)
    ("linear", (4096, 1024, 1024), 15),
    ("linear", (4096, 1024, 2816), 15),  # in place of config 14
    ("linear", (8192, 1024, 1024), 3),  # 512 tiles: more than 3 waves
    # v0.38: config 15 for the dgrad layout of the same domain (was config 3 at K <= 1024, config
    # 14 above)
    ("linear_dgrad", (4096, 1024, 1024), 15),  # dgrad GEMM 4096 x 1024 x 1024
    ("linear_dgrad", (4096, 2816, 1024), 15),  # dgrad GEMM 4096 x 1024 x 2816
    ("linear_dgrad", (8192, 1024, 1024), 3),  # 512 tiles: more than 3 waves
    ("linear_dgrad", (4096, 1024, 4096), 3),  # dgrad GEMM 4096 x 4096 x 1024
    ("linear", (4096, 2816, 1024), 3),
    ("linear_dgrad", (4096, 256, 1024), 14),  # dgrad GEMM 4096 x 1024 x 256
    ("linear_wgrad", (4096, 3072, 1024), 19),  # v0.49: 128 tiles of 192x128 (96 of 256x128)
    # 128x192 tiles without a cluster over 2048-4096 tokens (v0.30)
    ("linear_wgrad", (4096, 1024, 2816), 1),  # 120 tiles of 128x192: 91% of a wave
    ("linear_wgrad", (4096, 2816, 1024), 1),  # 132 tiles, a taller output
    ("linear_wgrad", (8192, 2816, 1024), 2),  # over 8192 tokens: stream-K as before v0.30
    ("linear_wgrad", (4096, 3584, 768), 1),  # 112 tiles: 84.8% of a wave, from 80% (v0.31)
    ("linear_wgrad", (4096, 3328, 768), 2),  # 104 tiles: under 80%, stream-K
    ("linear", (4096, 768, 3072), 10),  # 128 tiles of 128x192 in place of the transposed problem
    ("linear", (4096, 4096, 4096), 0),
    ("linear_wgrad", (4096, 3072, 768), 18),  # v0.49: 128 tiles of 192x96 (144 of 128x128)
    ("linear", (512, 12288, 4096), 1),  # data-parallel 128x128 before v0.40: 128x192, no cluster
    ("linear", (4096, 2304, 768), 3),  # 288 tiles of 256x128, 73% of three waves: ping-pong (v0.32)
    ("linear", (4096, 8192, 1024), 3),  # short-ish K, 1024 tiles: ping-pong
    ("linear_dgrad", (4096, 4096, 11008), 0),  # dgrad GEMM 4096 x 11008 x 4096: 2752 tiles (v0.26)
    ("linear", (4096, 4096, 11008), 0),  # K = 11008: 128x256 cooperative
    ("linear_wgrad", (1024, 1280, 3328), 15),  # 260 tiles of 128x128: v0.40 two_waves
    # v0.40: config 15 for the weight gradient over 512 tokens, and where the rule would
    # transpose a weight gradient (which cannot run transposed); config 1 for the wide forward
    ("linear_wgrad", (512, 4096, 4096), 15),
    ("linear_wgrad", (512, 2816, 1024), 19),
    ("linear_dgrad", (512, 1024, 4096), 15),  # dgrad GEMM 512 x 4096 x 1024: one_wave
    ("linear", (512, 18944, 3584), 1),
    ("linear", (1024, 2816, 2816), 10),  # 128x192 tiles, not the transposed problem (v0.25)
    ("linear_dgrad", (1024, 1024, 3072), 10),  # dgrad GEMM 1024 x 3072 x 1024 (v0.25)
    # v0.42: 16 tiles over 16384 tokens, batched split-K (config 2's float32-output kernel)
    ("linear_wgrad", (16384, 256, 1024), 2),
    # v0.43: one wave of 64x128 tiles for the 128 x 8192 weight gradient over >= 4096 tokens;
    # config 1's 128x192 tiles for the 768 x 3072 / 3072 x 768 ones over 512 tokens (v0.49:
    # config 18's 192x96, one whole wave)
    ("linear_wgrad", (4096, 128, 8192), 13),
    ("linear_wgrad", (16384, 128, 8192), 13),
    ("linear_wgrad", (512, 768, 3072), 18),
    ("linear_wgrad", (512, 3072, 768), 18),
    # v0.40's pingpong_waves (7 waves of 128x128 tiles, 1x2 cluster, against 5 of 128x192): from
    # v0.44 on devices of at least 4.5 TB/s only (the H200); the H100 keeps config 10
    ("linear", (4096, 3584, 3584), PINGPONG_WAVES),
    ("linear", (4096, 3584, 8192), PINGPONG_WAVES),
    ("linear", (4096, 3584, 18944), PINGPONG_WAVES),
    ("linear_dgrad", (4096, 3584, 3584), PINGPONG_WAVES),  # dgrad GEMM 4096 x 3584 x 3584
    ("linear_dgrad", (4096, 8192, 3584), PINGPONG_WAVES),  # dgrad GEMM 4096 x 3584 x 8192
    ("linear_dgrad", (4096, 18944, 3584), PINGPONG_WAVES),  # dgrad GEMM 4096 x 3584 x 18944
]


def pingpong_waves_config() -> int:
    """The configuration v0.44 gives pingpong_waves' GEMMs on this device: config 3 from 4.5
    TB/s of peak DRAM bandwidth (or unknown, 0), else the 128x192 tile's config 10."""
    gbps = torch.ops.cutlass_nn._device_memory_gbps(0)
    return 3 if gbps == 0 or gbps >= 4500 else 10


def test_device_memory_bandwidth_is_read_and_checked():
    needs_sm90()
    gbps = torch.ops.cutlass_nn._device_memory_gbps(0)
    assert 1000 <= gbps <= 20000, gbps  # every SM90 part: 2-5 TB/s of HBM
    # The two GPUs the rule's bandwidth clause was measured on (a units slip, such as a
    # single data rate, would move them across its 4.5 TB/s threshold)
    known = {"NVIDIA H100 80GB HBM3": (3300, 3400), "NVIDIA H200": (4700, 5000)}
    low, high = known.get(torch.cuda.get_device_name(0), (1000, 20000))
    assert low <= gbps <= high, (torch.cuda.get_device_name(0), gbps)
    with pytest.raises(RuntimeError, match=r"_device_memory_gbps: argument 'device' must be a CUDA "
                                           r"device index in \[0, \d+\), got -1"):
        torch.ops.cutlass_nn._device_memory_gbps(-1)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize(
    "op,shape,config",
    TRANSFORMER_RULE_CASES,
    ids=[f"{op}-{'x'.join(map(str, s))}" for op, s, _ in TRANSFORMER_RULE_CASES],
)
def test_rule_at_transformer_shapes(op, shape, config, dtype, gen):
    needs_sm90()
    if torch.cuda.get_device_properties(0).multi_processor_count != 132:
        pytest.skip("the expected configurations are those of a 132-SM GPU")
    if config is PINGPONG_WAVES:
        config = pingpong_waves_config()
    args = gemm_args(op, *shape, dtype, "contig", gen)
    before = clone_all(args)
    ours = run_ours(op, args)
    name = ops.last_kernel_name()
    context = f"{op} {shape} {dtype}"
    assert name.endswith(sm90_config_names()[config]), f"{context}: ran {name}"
    again = run_ours(op, args)
    assert torch.equal(ours, again), f"{context}: repeated call differs ({name})"
    check_close(ours, run_torch(op, args), run_torch(op, to64(args)), FLOOR_16, context)
    assert_unchanged(args, before, context)


# Kernels without a C operand (configs 3 and 15 since v0.38, 0 and 14 since v0.39, 17-19 since
# v0.49; 16-bit in and out, every layout) for plain products: the same product as the kernel with
# C, bitwise (same mainloop; with beta = 0 the kernel with C never reads C), and never for a bias.
WITHOUT_C_CONFIGS = [3, 15, 0, 14, 17, 18, 19]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("config", WITHOUT_C_CONFIGS)
@pytest.mark.parametrize("op", ["linear_nobias", "linear_dgrad", "linear_wgrad", "mm"])
@pytest.mark.parametrize("shape", [(4096, 2816, 1024), (1000, 1032, 776)], ids=["aligned", "partial-tiles"])
def test_plain_product_runs_without_c(op, config, dtype, shape, gen):
    needs_sm90()
    args = gemm_args(op, *shape, dtype, "contig", gen)
    before = clone_all(args)
    context = f"{op} {shape} {dtype} config {config}"
    with forced_config(config):
        ours = run_ours(op, args)
        name = ops.last_kernel_name()
        previous = torch.ops.cutlass_nn._set_epilogue_without_c(False)
        try:
            with_c = run_ours(op, args)
            name_with_c = ops.last_kernel_name()
        finally:
            torch.ops.cutlass_nn._set_epilogue_without_c(previous)
    assert previous is True
    suffix = sm90_config_names()[config]
    assert "_noc_" in name and name.endswith(suffix), f"{context}: ran {name}"
    assert "_noc_" not in name_with_c and name_with_c.endswith(suffix), f"{context}: {name_with_c}"
    assert torch.equal(ours, with_c), f"{context}: {name} and {name_with_c} differ"
    check_close(ours, run_torch(op, args), run_torch(op, to64(args)), FLOOR_16, context)
    assert_unchanged(args, before, context)


@pytest.mark.parametrize("config", WITHOUT_C_CONFIGS)
def test_bias_keeps_the_kernel_with_c(config, gen):
    needs_sm90()
    args = gemm_args("linear", 4096, 2816, 1024, torch.bfloat16, "contig", gen)
    with forced_config(config):
        ours = run_ours("linear", args)
    name = ops.last_kernel_name()
    assert "_noc_" not in name and name.endswith(sm90_config_names()[config]), name
    check_close(ours, run_torch("linear", args), run_torch("linear", to64(args)), FLOOR_16,
                f"linear with bias, config {config}")


# Batched split-K (splits < 0 forced, v0.42): the K slices run as a batch of GEMMs on config 2's
# float32-output kernel, a second kernel sums them into the output.
BATCHED_SPLIT_KERNEL = "_f32_nt_128x128x64_1x1x1_coop_streamk"
# (tokens T, out N, in K) of linear_wgrad, the GEMM N x K x T: 16 tiles over 4096 tokens, and
# partial tiles on both edges with slices that are not whole 64-deep k-blocks (3000 / 8 = 375;
# N and K multiples of 8, as the operands' TMA needs).
BATCHED_SPLIT_SHAPES = {"aligned": (4096, 256, 1024), "partial": (3000, 200, 136)}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("shape", BATCHED_SPLIT_SHAPES.values(), ids=BATCHED_SPLIT_SHAPES.keys())
@pytest.mark.parametrize("slices", [2, 8])
def test_batched_split_k_against_float64(shape, slices, dtype, gen):
    needs_sm90()
    args = gemm_args("linear_wgrad", *shape, dtype, "contig", gen)
    before = clone_all(args)
    context = f"linear_wgrad {shape} {dtype} in {slices} slices"
    with forced_config(-1, 0, -slices):
        ours = run_ours("linear_wgrad", args)
        name = ops.last_kernel_name()
        again = run_ours("linear_wgrad", args)
    assert BATCHED_SPLIT_KERNEL in name, f"{context}: ran {name}"
    assert ours.dtype == dtype and ours.shape == (shape[1], shape[2])
    assert torch.equal(ours, again), f"{context}: the reduction is not deterministic"
    check_close(ours, run_torch("linear_wgrad", args), run_torch("linear_wgrad", to64(args)),
                FLOOR_16, context)
    assert_unchanged(args, before, context)


@pytest.mark.parametrize("grad_dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_batched_split_k_accumulates_into_a_strided_gradient(grad_dtype, gen):
    """grad_weight += dy^T x through the batched split-K: the reduction adds the old gradient
    (C aliasing D) into rows 1027 elements apart (no 16-byte alignment: no SM90 kernel could
    write it in place) and writes nothing past the gradient's columns."""
    needs_sm90()
    t, n, k = 4096, 256, 1024
    dy, x, buf, gw, start = wgrad_into_padded_gradient(t, n, k, grad_dtype, gen)
    with forced_config(-1, 0, -4):
        ops.linear_wgrad_accumulate_(gw, dy, x)
        name = ops.last_kernel_name()
    assert BATCHED_SPLIT_KERNEL in name, name
    ref = start.double() + dy.double().t() @ x.double()
    torch_way = (start.float() + torch.mm(dy.t(), x).float()).to(grad_dtype)
    err = lambda v: float((v.double() - ref).norm() / ref.norm())  # noqa: E731
    assert err(gw) <= 2 * err(torch_way) + 1e-6, (name, err(gw), err(torch_way))
    assert torch.isnan(buf[:, k:]).all(), "wrote past grad_weight"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
def test_rule_takes_batched_split_k_for_a_long_k_weight_gradient(dtype, gen):
    """The rule's batched split-K (v0.42): 16 tiles of 128x128 over 16384 tokens run on the
    float32-output kernel (the 16-bit output's own kernels are the plain stream-K plan)."""
    needs_sm90()
    if torch.cuda.get_device_properties(0).multi_processor_count != 132:
        pytest.skip("the expected plan is that of a 132-SM GPU")
    args = gemm_args("linear_wgrad", 16384, 256, 1024, dtype, "contig", gen)
    ours = run_ours("linear_wgrad", args)
    name = ops.last_kernel_name()
    assert BATCHED_SPLIT_KERNEL in name and ours.dtype == dtype, name
    check_close(ours, run_torch("linear_wgrad", args), run_torch("linear_wgrad", to64(args)),
                FLOOR_16, f"linear_wgrad 16384 x 256 x 1024 {dtype}")


def test_batched_split_k_that_does_not_fit_runs_the_rule(gen):
    """A forced batched split-K the problem cannot take (the forward's layout; K not a multiple
    of the slices) runs the rule's kernel, with the same result."""
    needs_sm90()
    for op, shape in (("linear_nobias", (256, 1024, 4096)), ("linear_wgrad", (4095, 256, 1024))):
        args = gemm_args(op, *shape, torch.bfloat16, "contig", gen)
        rule = run_ours(op, args)
        rule_name = ops.last_kernel_name()
        with forced_config(-1, 0, -8):
            ours = run_ours(op, args)
            name = ops.last_kernel_name()
        assert name == rule_name and BATCHED_SPLIT_KERNEL not in name, (op, name)
        assert torch.equal(ours, rule), op


def test_set_gemm_config_takes_batched_splits():
    previous = torch.ops.cutlass_nn._set_gemm_config(-1, 0, -8)
    try:
        assert list(torch.ops.cutlass_nn._set_gemm_config(-1, 0, -64)) == [-1, 0, -8]
        with pytest.raises(RuntimeError, match=r"_set_gemm_config: argument 'splits'"):
            torch.ops.cutlass_nn._set_gemm_config(-1, 0, -1)
        with pytest.raises(RuntimeError, match=r"_set_gemm_config: argument 'splits'"):
            torch.ops.cutlass_nn._set_gemm_config(-1, 0, -65)
    finally:
        torch.ops.cutlass_nn._set_gemm_config(*previous)
