"""Host-side profile of one whole-model training step, stock vs converted (GPU machine).

    python benchmarks/profile_model_step.py [--family llama] [--size host] [--mode compile]
        [--sort cpu|cuda] [--fuse-norm] [--fuse-mlp] [--fuse-head] [--fuse-rope] [--gaps N] [--sync-check]

Builds the model of ``python -m cutlass_nn.bench --what models`` (same family / size / mode /
fusion flags), warms it up (compiles), then profiles ``--steps`` steps of each side with
torch.profiler (CPU and CUDA activity) and prints the operators with the most host (self CPU)
time, or with ``--sort cuda`` the most GPU (self CUDA) time, with their call counts and the
step's totals: a converted model slower than its kernels shows where its host time goes, and a
GPU-bound step shows which kernels separate the two sides. ``--gaps N`` also prints the GPU's
busy time per step against its wall time and the N longest idle gaps between kernels (with the
kernels on either side); ``--sync-check`` runs one step with torch's CUDA sync debug mode on
"warn", so every host synchronization inside a step is reported with where it came from.
"""

from __future__ import annotations

import argparse
import gc

import torch

import cutlass_nn
from cutlass_nn.bench import models as bench_models


def print_gaps(prof, steps: int, count: int) -> None:
    """GPU busy time vs the profiled span, and the longest idle gaps between kernels."""
    kernels = sorted(
        (e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
        key=lambda e: e.time_range.start,
    )
    if not kernels:
        print("no GPU events")
        return
    busy, end, gaps = 0.0, kernels[0].time_range.start, []
    prev = None
    for e in kernels:
        start, stop = e.time_range.start, e.time_range.end
        if start > end and prev is not None:
            gaps.append((start - end, prev.name, e.name))
        busy += max(0.0, stop - max(start, end))
        if stop > end:
            end, prev = stop, e
    span = end - kernels[0].time_range.start
    print(f"GPU busy {busy / steps / 1e3:.2f} ms per step of {span / steps / 1e3:.2f} ms "
          f"(first kernel to last; idle {100 * (1 - busy / span):.1f}%)")
    for gap, before, after in sorted(gaps, reverse=True)[:count]:
        print(f"  idle {gap:8.1f} us  after {before[:60]}  before {after[:60]}")


def profile_side(model, mode: str, batches, steps: int, rows: int, sort: str = "cpu",
                 gaps: int = 0, sync_check: bool = False) -> None:
    trainer = bench_models.Trainer(model, mode, "cuda")
    for i in range(3):
        trainer.step(batches[i % len(batches)])
    torch.cuda.synchronize()
    if sync_check:
        torch.cuda.set_sync_debug_mode("warn")
        try:
            trainer.step(batches[0])
        finally:
            torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for i in range(steps):
            trainer.step(batches[i % len(batches)])
        torch.cuda.synchronize()
    key = "self_cpu_time_total" if sort == "cpu" else "self_device_time_total"
    print(prof.key_averages().table(sort_by=key, row_limit=rows))
    if gaps:
        print_gaps(prof, steps, gaps)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--family", default="llama", choices=bench_models.FAMILIES)
    p.add_argument("--size", default="host", choices=bench_models.SIZES)
    p.add_argument("--mode", default="compile", choices=bench_models.MODES)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--rows", type=int, default=25)
    p.add_argument("--sort", default="cpu", choices=("cpu", "cuda"),
                   help="order operators by self CPU time (host cost) or self CUDA time")
    p.add_argument("--gaps", type=int, default=0, help="print the N longest GPU idle gaps")
    p.add_argument("--sync-check", action="store_true",
                   help="run one step with torch.cuda.set_sync_debug_mode('warn') first")
    p.add_argument("--fuse-norm", action="store_true", help="convert(fuse_norm=True)")
    p.add_argument("--fuse-mlp", action="store_true", help="convert(fuse_mlp=True)")
    p.add_argument("--fuse-head", action="store_true", help="convert(fuse_head=True)")
    p.add_argument("--fuse-rope", action="store_true", help="convert(fuse_rope=True)")
    args = p.parse_args()
    size = bench_models.MODEL_SIZES[args.size]
    batches = bench_models.make_batches(size, 4, "cuda")
    for side in ("stock", "cutlass_nn"):
        print(f"==== {side}: {args.family}-{args.size} {args.mode}, {args.steps} steps ====")
        with torch.device("cuda"):
            model = bench_models.build_model(args.family, size).to(torch.bfloat16)
        if side == "cutlass_nn":
            fuse_head = args.fuse_head and cutlass_nn.fused_head.can_fuse_lm_head(model)
            model = cutlass_nn.convert(model, fuse_norm=args.fuse_norm, fuse_mlp=args.fuse_mlp,
                                       fuse_head=fuse_head, fuse_rope=args.fuse_rope)
        torch._dynamo.reset()
        profile_side(model, args.mode, batches, args.steps, args.rows, args.sort, args.gaps,
                     args.sync_check)
        del model
        gc.collect()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
