"""``python -m cutlass_nn.bench --what step-profile``: where the GPU time of one training step goes.

The model benchmark (``--what models``) says how long a step takes; this says why. It builds the
same ``transformers`` model as a row of the model benchmark (same family, size, weights and
batches; :mod:`cutlass_nn.bench.models`), stock and converted (with the same options: ``--fp8``,
``--fuse-*``) in ``--mode`` (eager, ``torch.compile``, or ``mode="reduce-overhead"``: the kernels
Inductor generates and fuses around the GEMMs differ from eager's), runs ``--warmup`` steps (the
compiling ones included), then ``--steps`` steps under ``torch.profiler`` with CUDA activity, and
reports for each side the GPU time per step of every kernel, summed into categories by kernel
name (:data:`CATEGORIES`: GEMMs of cutlass_nn and of cuBLAS, FP8 quantization, attention, the
optimizer, Inductor's Triton kernels, normalization, other elementwise work), the GPU time of
each matrix-product operator by its input shapes (:data:`GEMM_OPS`; not in ``reduce-overhead``
mode, whose graph replays record no operators), plus the host time of the step and the host-side
events that take it (self CPU time per event name: operators, Python ranges, CUDA runtime calls). JSON to
``--out``; a table on stdout.

Usage::

    python -m cutlass_nn.bench --what step-profile [--family llama] [--size gpu] [--mode eager]
        [--fp8 tensorwise|rowwise[-fast-accum]] [--fuse-norm] [--fuse-mlp] [--fuse-rope] [--fuse-head]
        [--steps 3] [--warmup 2] [--top 12] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Sequence

import torch

#: (category, pattern) in order: a kernel takes the first category whose pattern its name matches
#: (case-insensitive search). Names are CUDA kernel names as the profiler records them. cuBLAS
#: runs some kernels of its own built from CUTLASS templates, so on the stock side the
#: "CUTLASS-named" GEMMs are cuBLAS's; on the converted side they are mostly cutlass_nn's.
CATEGORIES: tuple[tuple[str, str], ...] = (
    ("fp8 quantize", r"amax_(rows|tensor|cols)_kernel|cast_(transposed_|transposed_packs_)?kernel<"),
    # before the GEMMs: torch's flash / memory-efficient attention kernels carry CUTLASS types
    ("attention", r"flash|fmha|attention|sdpa|efficient"),
    ("gemm (CUTLASS-named)", r"cutlass::|GemmUniversal|gemm_fallback_kernel"),
    ("cutlass_nn other", r"cutlass_nn::"),
    ("gemm (cuBLAS-named)", r"nvjet|xmma|cublas|gemm|sm90_|sm80_"),
    ("optimizer", r"adam|multi_tensor|foreach"),
    # Inductor's generated kernels (compiled modes): fused elementwise and reduction work
    ("inductor (Triton)", r"^triton_"),
    ("normalization", r"norm"),
    ("cross entropy / softmax", r"softmax|cross_entropy|log_softmax|nll"),
)


def categorize(name: str) -> str:
    for category, pattern in CATEGORIES:
        if re.search(pattern, name, re.IGNORECASE):
            return category
    return "other"


def summarize_kernels(kernels: Sequence[tuple[str, float]], steps: int, top: int) -> dict[str, Any]:
    """``kernels``: (name, GPU microseconds) of every kernel launch over ``steps`` steps. Per step:
    total, per category, and the ``top`` kernels by time (name truncated to 160 characters)."""
    per_name: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    for name, us in kernels:
        per_name[name] += us
        calls[name] += 1
    per_category: dict[str, float] = defaultdict(float)
    for name, us in per_name.items():
        per_category[categorize(name)] += us
    total = sum(per_name.values())
    ranked = sorted(per_name.items(), key=lambda kv: -kv[1])[:top]
    return {
        "gpu_ms_per_step": total / steps / 1e3,
        "categories_ms_per_step": {k: v / steps / 1e3 for k, v in
                                   sorted(per_category.items(), key=lambda kv: -kv[1])},
        "top_kernels": [{"name": n[:160], "category": categorize(n), "ms_per_step": us / steps / 1e3,
                         "calls_per_step": calls[n] / steps} for n, us in ranked],
    }


#: The operators whose GPU time :func:`summarize_gemm_ops` lists per input shape: the matrix
#: products of both sides (cutlass_nn's, and the aten ones that ``nn.Linear``, attention and
#: Inductor's extern kernels call).
#: A GEMM operator's time is that of the kernels it launches itself: where cutlass_nn pads
#: misaligned operands, the pad and copy-back passes are ``aten::constant_pad_nd`` / ``copy_``
#: calls of their own (in the kernel table, not here).
GEMM_OPS: frozenset[str] = frozenset({
    "cutlass_nn::linear", "cutlass_nn::linear_act", "cutlass_nn::linear_act_aux",
    "cutlass_nn::linear_dgrad", "cutlass_nn::linear_wgrad", "cutlass_nn::linear_wgrad_accumulate_",
    "cutlass_nn::mm", "cutlass_nn::fp8_scaled_mm", "aten::mm", "aten::addmm", "aten::bmm",
    "aten::baddbmm", "aten::_scaled_mm",
})


def summarize_gemm_ops(ops: Sequence[tuple[str, str, Sequence[tuple[str, float]]]], steps: int,
                       top: int) -> list[dict[str, Any]]:
    """``ops``: (operator name, its input shapes as text, the (kernel name, GPU microseconds) it
    launched) of every GEMM operator call over ``steps`` steps. The ``top`` (operator, shapes)
    pairs by GPU time per step, each with its calls per step, GPU microseconds per call and the
    kernels it ran: which GEMM of the step costs what, named by what a user recognizes (the op and
    its shapes) rather than by a kernel name."""
    total: dict[tuple[str, str], float] = defaultdict(float)
    calls: dict[tuple[str, str], int] = defaultdict(int)
    names: dict[tuple[str, str], set[str]] = defaultdict(set)
    for op, shapes, kernels in ops:
        if op not in GEMM_OPS or not kernels:
            continue
        key = (op, shapes)
        total[key] += sum(us for _, us in kernels)
        calls[key] += 1
        names[key].update(n[:100] for n, _ in kernels)
    ranked = sorted(total.items(), key=lambda kv: -kv[1])[:top]
    return [{"op": op, "shapes": shapes, "calls_per_step": calls[(op, shapes)] / steps,
             "us_per_call": us / calls[(op, shapes)], "ms_per_step": us / steps / 1e3,
             "kernels": sorted(names[(op, shapes)])} for (op, shapes), us in ranked]


def summarize_host_ops(ops: Sequence[tuple[str, float, int]], steps: int,
                       top: int) -> list[dict[str, Any]]:
    """``ops``: (name, self CPU microseconds, calls) of each host-side event name over ``steps``
    steps (the profiler's ``key_averages()``). The ``top`` names by self CPU time per step, with
    calls per step and microseconds per call: where a host-bound step's enqueue time goes (the
    profiler adds its own cost to every event, so compare the two sides, not to the step time)."""
    ranked = sorted((o for o in ops if o[2] > 0 and o[1] > 0), key=lambda o: -o[1])[:top]
    return [{"name": name, "self_cpu_ms_per_step": us / steps / 1e3,
             "calls_per_step": calls / steps, "us_per_call": us / calls}
            for name, us, calls in ranked]


def host_op_totals(prof) -> list[tuple[str, float, int]]:
    """(name, self CPU microseconds, calls) per event name of CPU-side events (operators, Python
    ranges and CUDA runtime calls) of a finished profile."""
    return [(a.key, float(a.self_cpu_time_total), int(a.count))
            for a in prof.key_averages() if a.device_type == torch.autograd.DeviceType.CPU]


def gemm_op_calls(events) -> list[tuple[str, str, list[tuple[str, float]]]]:
    """(name, input shapes, kernels) of the profiler's operator events that launched kernels
    themselves (the innermost operator of each launch: a kernel is attached to one event)."""
    out = []
    for e in events:
        kernels = [(k.name, k.duration) for k in getattr(e, "kernels", ()) or ()]
        if e.name in GEMM_OPS and kernels:
            out.append((e.name, str(getattr(e, "input_shapes", "")), kernels))
    return out


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    from cutlass_nn.bench import fp8 as bench_fp8
    from cutlass_nn.bench import models

    p = argparse.ArgumentParser(prog="python -m cutlass_nn.bench --what step-profile")
    p.add_argument("--what", choices=["step-profile"], default="step-profile")
    p.add_argument("--family", choices=models.FAMILIES, default="llama")
    p.add_argument("--size", choices=models.SIZES, default="gpu")
    p.add_argument("--mode", choices=models.MODES, default="eager")
    p.add_argument("--fp8", choices=bench_fp8.FP8_CHOICES, default=None)
    p.add_argument("--fp8-reuse", action="store_true",
                   help="turn on cutlass_nn.fp8.reuse_quantized_inputs (off by default)")
    for flag in ("norm", "mlp", "rope", "head"):
        p.add_argument(f"--fuse-{flag}", action="store_true")
    p.add_argument("--steps", type=int, default=3, help="profiled steps per side")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--top", type=int, default=12, help="kernels listed per side")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = p.parse_args(list(argv))
    if args.steps < 1:
        p.error(f"--steps must be >= 1, got {args.steps}")
    if args.mode != "eager" and args.warmup < 2:
        p.error(f"--mode {args.mode} compiles in its first steps: --warmup must be >= 2, got {args.warmup}")
    return args


def is_kernel(event) -> bool:
    """A GPU kernel (or copy / memset) of the trace: device time on CUDA, not a user annotation
    (``record_function`` ranges, e.g. the optimizer's ``Optimizer.step#AdamW.step``, appear on the
    GPU timeline too, spanning kernels already counted)."""
    return (event.device_type == torch.autograd.DeviceType.CUDA and event.device_time > 0
            and not getattr(event, "is_user_annotation", False)
            and not event.name.startswith(("Optimizer.", "ProfilerStep")))


def profile_side(model: torch.nn.Module, batches, steps: int, warmup: int, top: int,
                 mode: str = "eager") -> dict:
    from cutlass_nn.bench.models import Trainer

    torch._dynamo.reset()  # each side compiles on its own
    trainer = Trainer(model, mode, "cuda")
    for i in range(warmup):
        trainer.step(batches[i % len(batches)])
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    host = time.perf_counter()
    # Input shapes recorded (host cost only: the numbers here are GPU times) so that each GEMM
    # is reported by operator and shapes (summarize_gemm_ops).
    with torch.profiler.profile(activities=acts, record_shapes=True) as prof:
        for i in range(steps):
            trainer.step(batches[i % len(batches)])
        enqueue_s = time.perf_counter() - host
        torch.cuda.synchronize()
    kernels = [(e.name, e.device_time) for e in prof.events() if is_kernel(e)]
    out = summarize_kernels(kernels, steps, top)
    out["gemm_ops"] = summarize_gemm_ops(gemm_op_calls(prof.events()), steps, top)
    out["host_enqueue_ms_per_step"] = enqueue_s / steps * 1e3
    out["host_ops"] = summarize_host_ops(host_op_totals(prof), steps, top)
    out["cutlass_nn_ops"] = sorted({e.name for e in prof.events() if e.name.startswith("cutlass_nn::")})
    return out


def main(argv: Sequence[str]) -> int:
    from cutlass_nn.bench import cli as bench
    from cutlass_nn.bench import models

    args = parse_args(argv)
    meta = bench.gpu_run_meta(argv)
    if meta is None:
        return 2
    import cutlass_nn

    cutlass_nn.fp8.reuse_quantized_inputs(bool(args.fp8_reuse))
    size = models.MODEL_SIZES[args.size]
    batches = models.make_batches(size, 4, "cuda")
    result: dict[str, Any] = {"mode": "step-profile", "meta": meta, "settings": vars(args) | {"out": str(args.out)},
                              "sides": {}}
    for side in models.SIDES:
        with torch.device("cuda"):
            model = models.build_model(args.family, size).to(dtype=torch.bfloat16)
        if side == "cutlass_nn":
            model = models.convert_side(model, fp8=args.fp8, fuse_norm=args.fuse_norm,
                                        fuse_mlp=args.fuse_mlp, fuse_rope=args.fuse_rope,
                                        fuse_head=args.fuse_head)
        result["sides"][side] = profile_side(model, batches, args.steps, args.warmup, args.top,
                                             args.mode)
        del model
        torch.cuda.empty_cache()
    for side, r in result["sides"].items():
        print(f"== {side}: GPU {r['gpu_ms_per_step']:.2f} ms/step, host enqueue "
              f"{r['host_enqueue_ms_per_step']:.2f} ms/step")
        for cat, ms in r["categories_ms_per_step"].items():
            print(f"   {cat:26s} {ms:8.3f} ms")
        for k in r["top_kernels"]:
            print(f"   {k['ms_per_step']:8.3f} ms {k['calls_per_step']:6.1f}x  {k['name'][:110]}")
        print("   host: self CPU time per step by event (profiled, so inflated; compare sides):")
        for h in r["host_ops"]:
            print(f"   {h['self_cpu_ms_per_step']:8.3f} ms {h['calls_per_step']:6.1f}x "
                  f"{h['us_per_call']:8.1f} us  {h['name'][:90]}")
        print("   GEMM operators by input shapes:")
        for g in r["gemm_ops"]:
            print(f"   {g['ms_per_step']:8.3f} ms {g['calls_per_step']:6.1f}x {g['us_per_call']:8.1f} us  "
                  f"{g['op']} {g['shapes']}")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"step_profile_{bench._slug(meta)}_{bench._stamp()}.json"
    path.write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(f"json {path}", flush=True)
    return 0
