"""bench --what step-profile: kernel categories, the per-step summary, arguments (CPU)."""

from __future__ import annotations

import math

import pytest

from cutlass_nn.bench import cli, step_profile as sp


@pytest.mark.parametrize("name, category", [
    ("void cutlass_nn::kernels::(anonymous namespace)::amax_tensor_kernel<__nv_bfloat16, true>(...)",
     "fp8 quantize"),
    ("void cutlass_nn::kernels::(anonymous namespace)::cast_transposed_kernel<float>(...)", "fp8 quantize"),
    ("void cutlass_nn::kernels::(anonymous namespace)::cast_transposed_packs_kernel<__nv_bfloat16, false>(...)",
     "fp8 quantize"),
    ("void cutlass_nn::kernels::(anonymous namespace)::cast_kernel<__nv_bfloat16, true>(...)", "fp8 quantize"),
    ("void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<...> >(...)", "gemm (CUTLASS-named)"),
    ("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_32x4_nn_align8>(...)",
     "gemm (CUTLASS-named)"),
    ("void cutlass_nn::kernels::(anonymous namespace)::rms_norm_kernel<__nv_bfloat16>(...)",
     "cutlass_nn other"),
    ("nvjet_hsh_256x128_64x4_1x2_h_bz_coopA_NTN", "gemm (cuBLAS-named)"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64", "gemm (cuBLAS-named)"),
    ("void pytorch_flash::flash_fwd_kernel<...>", "attention"),
    ("void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<128, 64, 128, "
     "8, 2, 4, 2, false, false, cutlass::bfloat16_t, Flash_kernel_traits<128, 64, 128, 8, cutlass::bfloat16_t> "
     ">, true, false, false, false, false, true, false, false>(...)", "attention"),
    ("void fmha_cutlassB_bf16_aligned_64x64_k128_sm80(PyTorchMemEffAttention::AttentionBackwardKernel<"
     "cutlass::arch::Sm80, cutlass::bfloat16_t, true, false, false, 64, 64, 128, false>::Params)", "attention"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor>", "optimizer"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16> >",
     "other"),
])
def test_categories(name, category):
    assert sp.categorize(name) == category


def test_summary_is_per_step_and_ranked():
    kernels = [("nvjet_a", 100.0), ("nvjet_a", 300.0), ("amax_rows_kernel<float, true>", 50.0),
               ("elementwise", 10.0)]
    s = sp.summarize_kernels(kernels, steps=2, top=2)
    assert math.isclose(s["gpu_ms_per_step"], 0.23)
    assert math.isclose(s["categories_ms_per_step"]["gemm (cuBLAS-named)"], 0.2)
    assert math.isclose(s["categories_ms_per_step"]["fp8 quantize"], 0.025)
    assert [k["name"] for k in s["top_kernels"]] == ["nvjet_a", "amax_rows_kernel<float, true>"]
    assert s["top_kernels"][0]["calls_per_step"] == 1.0


def test_arguments_and_delegation():
    args = sp.parse_args(["--what", "step-profile", "--fp8", "tensorwise", "--fuse-mlp"])
    assert args.fp8 == "tensorwise" and args.fuse_mlp and args.family == "llama"
    for bad in (["--steps", "0"], ["--family", "t5"]):
        with pytest.raises(SystemExit):
            sp.parse_args(bad)
    assert cli._delegated_what(["--what", "step-profile"]) == "step-profile"


def test_mode_argument():
    assert sp.parse_args([]).mode == "eager"
    assert sp.parse_args(["--mode", "compile"]).mode == "compile"
    assert sp.parse_args(["--mode", "reduce-overhead", "--warmup", "3"]).warmup == 3
    for bad in (["--mode", "max-autotune"], ["--mode", "compile", "--warmup", "1"]):
        with pytest.raises(SystemExit):
            sp.parse_args(bad)


def test_inductor_kernels_have_their_own_category():
    assert sp.categorize("triton_poi_fused_gelu_add_0") == "inductor (Triton)"
    assert sp.categorize("triton_red_fused_sum_3") == "inductor (Triton)"
    # a generated kernel of the optimizer stays the optimizer's
    assert sp.categorize("triton_for_fused__fused_adam_4") == "optimizer"
    assert sp.categorize("my_triton_kernel") == "other"


def test_user_annotations_are_not_kernels():
    import types

    import torch

    cuda = torch.autograd.DeviceType.CUDA
    kernel = types.SimpleNamespace(name="nvjet_x", device_type=cuda, device_time=5.0, is_user_annotation=False)
    annotation = types.SimpleNamespace(name="my_range", device_type=cuda, device_time=9.0, is_user_annotation=True)
    optimizer = types.SimpleNamespace(name="Optimizer.step#AdamW.step", device_type=cuda, device_time=9.0)
    host = types.SimpleNamespace(name="aten::mm", device_type=torch.autograd.DeviceType.CPU, device_time=0.0)
    assert [sp.is_kernel(e) for e in (kernel, annotation, optimizer, host)] == [True, False, False, False]


@pytest.mark.parametrize("what", ["models", "host", "fused", "fp8", "step-profile"])
def test_every_delegated_benchmark_says_it_needs_a_gpu(what, monkeypatch, capsys):
    """Without a CUDA GPU each benchmark stops with exit code 2 and the same message
    (cli.gpu_run_meta, the start they share)."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli.main(["--what", what]) == 2
    assert cli.NO_CUDA_MESSAGE in capsys.readouterr().err


def test_gemm_ops_are_summarized_per_operator_and_shapes():
    ops = [
        ("cutlass_nn::linear_wgrad", "[[4096, 1024], [4096, 1024]]", [("k13", 20.0)]),
        ("cutlass_nn::linear_wgrad", "[[4096, 1024], [4096, 1024]]", [("k13", 22.0)]),
        ("aten::mm", "[[1024, 4096], [4096, 1024]]", [("nvjet_x", 15.0), ("Memset", 1.0)]),
        ("cutlass_nn::linear", "[[4096, 1024], [32000, 1024], []]", [("k3", 400.0)]),
        ("aten::add", "[[4096, 1024], [4096, 1024]]", [("add", 5.0)]),  # not a GEMM
        ("aten::mm", "[[8, 8], [8, 8]]", []),  # launched nothing itself
    ]
    s = sp.summarize_gemm_ops(ops, steps=2, top=2)
    assert [(g["op"], g["shapes"]) for g in s] == [
        ("cutlass_nn::linear", "[[4096, 1024], [32000, 1024], []]"),
        ("cutlass_nn::linear_wgrad", "[[4096, 1024], [4096, 1024]]")]
    assert s[1]["calls_per_step"] == 1.0 and math.isclose(s[1]["us_per_call"], 21.0)
    assert math.isclose(s[1]["ms_per_step"], 0.021) and s[1]["kernels"] == ["k13"]
    full = sp.summarize_gemm_ops(ops, steps=1, top=10)
    assert len(full) == 3 and full[2]["kernels"] == ["Memset", "nvjet_x"]
    assert math.isclose(full[2]["us_per_call"], 16.0)


def test_gemm_op_calls_reads_the_innermost_launching_events():
    import types

    kernel = types.SimpleNamespace(name="nvjet_x", duration=15.0)
    events = [types.SimpleNamespace(name="aten::mm", input_shapes=[[2, 3], [3, 4]], kernels=[kernel]),
              types.SimpleNamespace(name="aten::linear", input_shapes=[[2, 3]], kernels=[]),
              types.SimpleNamespace(name="aten::mm", input_shapes=[[2, 3], [3, 4]], kernels=[])]
    assert sp.gemm_op_calls(events) == [("aten::mm", "[[2, 3], [3, 4]]", [("nvjet_x", 15.0)])]


def test_host_ops_are_ranked_by_self_cpu_time_per_step():
    ops = [("aten::mm", 300.0, 6), ("cudaLaunchKernel", 900.0, 30), ("aten::empty", 50.0, 10),
           ("never_ran", 0.0, 0), ("aten::view", 10.0, 4)]
    s = sp.summarize_host_ops(ops, steps=2, top=3)
    assert [h["name"] for h in s] == ["cudaLaunchKernel", "aten::mm", "aten::empty"]
    assert math.isclose(s[0]["self_cpu_ms_per_step"], 0.45)
    assert s[0]["calls_per_step"] == 15.0 and math.isclose(s[0]["us_per_call"], 30.0)
    assert [h["name"] for h in sp.summarize_host_ops(ops, steps=1, top=10)][-1] == "aten::view"


def test_host_op_totals_reads_a_real_cpu_profile():
    import torch

    a, b = torch.randn(8, 8), torch.randn(8, 8)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            torch.mm(a, b)
    totals = {name: (us, calls) for name, us, calls in sp.host_op_totals(prof)}
    assert totals["aten::mm"][1] == 3 and totals["aten::mm"][0] > 0
