"""Host-side profile of one whole-model training step, stock vs converted (GPU machine).

    python benchmarks/profile_model_step.py [--family llama] [--size host] [--mode compile]

Builds the model of ``python -m cutlass_nn.bench --what models`` (same family / size / mode),
warms it up (compiles), then profiles ``--steps`` steps of each side with torch.profiler (CPU
and CUDA activity) and prints the operators with the most host (self CPU) time, their call
counts and the step's totals, so that a converted model slower than its kernels shows where its
host time goes.
"""

from __future__ import annotations

import argparse
import gc

import torch

import cutlass_nn
from cutlass_nn.bench import models as bench_models


def profile_side(model, mode: str, batches, steps: int, rows: int) -> None:
    trainer = bench_models.Trainer(model, mode, "cuda")
    for i in range(3):
        trainer.step(batches[i % len(batches)])
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for i in range(steps):
            trainer.step(batches[i % len(batches)])
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--family", default="llama", choices=bench_models.FAMILIES)
    p.add_argument("--size", default="host", choices=bench_models.SIZES)
    p.add_argument("--mode", default="compile", choices=bench_models.MODES)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--rows", type=int, default=25)
    args = p.parse_args()
    size = bench_models.MODEL_SIZES[args.size]
    batches = bench_models.make_batches(size, 4, "cuda")
    for side in ("stock", "cutlass_nn"):
        print(f"==== {side}: {args.family}-{args.size} {args.mode}, {args.steps} steps ====")
        with torch.device("cuda"):
            model = bench_models.build_model(args.family, size).to(torch.bfloat16)
        if side == "cutlass_nn":
            model = cutlass_nn.convert(model)
        torch._dynamo.reset()
        profile_side(model, args.mode, batches, args.steps, args.rows)
        del model
        gc.collect()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
