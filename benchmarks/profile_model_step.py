"""Host-side profile of one whole-model training step, stock vs converted (GPU machine).

    python benchmarks/profile_model_step.py [--family llama] [--size host] [--mode compile]
        [--sort cpu|cuda] [--fuse-norm] [--fuse-mlp] [--fuse-head]

Builds the model of ``python -m cutlass_nn.bench --what models`` (same family / size / mode /
fusion flags), warms it up (compiles), then profiles ``--steps`` steps of each side with
torch.profiler (CPU and CUDA activity) and prints the operators with the most host (self CPU)
time, or with ``--sort cuda`` the most GPU (self CUDA) time, with their call counts and the
step's totals: a converted model slower than its kernels shows where its host time goes, and a
GPU-bound step shows which kernels separate the two sides.
"""

from __future__ import annotations

import argparse
import gc

import torch

import cutlass_nn
from cutlass_nn.bench import models as bench_models


def profile_side(model, mode: str, batches, steps: int, rows: int, sort: str = "cpu") -> None:
    trainer = bench_models.Trainer(model, mode, "cuda")
    for i in range(3):
        trainer.step(batches[i % len(batches)])
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for i in range(steps):
            trainer.step(batches[i % len(batches)])
        torch.cuda.synchronize()
    key = "self_cpu_time_total" if sort == "cpu" else "self_device_time_total"
    print(prof.key_averages().table(sort_by=key, row_limit=rows))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--family", default="llama", choices=bench_models.FAMILIES)
    p.add_argument("--size", default="host", choices=bench_models.SIZES)
    p.add_argument("--mode", default="compile", choices=bench_models.MODES)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--rows", type=int, default=25)
    p.add_argument("--sort", default="cpu", choices=("cpu", "cuda"),
                   help="order operators by self CPU time (host cost) or self CUDA time")
    p.add_argument("--fuse-norm", action="store_true", help="convert(fuse_norm=True)")
    p.add_argument("--fuse-mlp", action="store_true", help="convert(fuse_mlp=True)")
    p.add_argument("--fuse-head", action="store_true", help="convert(fuse_head=True)")
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
                                       fuse_head=fuse_head)
        torch._dynamo.reset()
        profile_side(model, args.mode, batches, args.steps, args.rows, args.sort)
        del model
        gc.collect()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
