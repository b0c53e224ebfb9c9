"""Where a host-bound training step's host time goes, stock vs converted, phase by phase (GPU machine).

    python benchmarks/step_phases.py [--family llama] [--size host] [--mode compile]
        [--steps 400] [--block 5] [--warmup 8] [--reset] [--profiled-first-step] [--out DIR]

The model benchmark's host-size rows are host-bound: their step time is the time the host takes
to enqueue the step. When the converted step enqueues longer than stock's, the profiler does not
say why (it inflates every operator it records, so its per-operator self times rank the items but
do not sum to the step). This script times the phases of each step without a profiler, with
``time.perf_counter`` at their boundaries: ``forward`` (the model's call, the compiled graph's
guards and launches included, returning the loss), ``backward`` (``loss.backward()``),
``optimizer`` (the fused AdamW step) and ``zero_grad``. The sides are built and warmed up as the
model benchmark builds them (the same process, stock compiled first, no ``torch._dynamo.reset()``
between them unless ``--reset`` is given, which instead gives each side a fresh Dynamo cache
before its own warm-up and then times that side alone, all its blocks, after the other's; with
``--profiled-first-step`` each side's first step runs under the CPU profiler before its
``--warmup`` steps, as the model benchmark ran it until 2026-12-02 to see which operators ran), timed
in alternating blocks of ``--block`` steps with a synchronization after each block, and reported
as the median microseconds per phase per side, their difference and ratio. JSON into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch

import cutlass_nn
from cutlass_nn.bench import cli as bench_cli, models as bench_models
from cutlass_nn.bench.block_probe import alternating_blocks, frozen_heap

PHASES = ("forward", "backward", "optimizer", "zero_grad", "step")


def timed_step(trainer: bench_models.Trainer, batch) -> dict[str, float]:
    """One training step as ``Trainer.step`` runs it (eager or compiled, not CUDA graphs), with
    the host's microseconds per phase."""
    t0 = time.perf_counter()
    loss = trainer.forward(**batch).loss
    t1 = time.perf_counter()
    loss.backward()
    t2 = time.perf_counter()
    trainer.opt.step()
    t3 = time.perf_counter()
    trainer.opt.zero_grad(set_to_none=True)
    t4 = time.perf_counter()
    return {"forward": (t1 - t0) * 1e6, "backward": (t2 - t1) * 1e6,
            "optimizer": (t3 - t2) * 1e6, "zero_grad": (t4 - t3) * 1e6, "step": (t4 - t0) * 1e6}


def build_side(side: str, family: str, size) -> torch.nn.Module:
    with torch.device("cuda"):
        model = bench_models.build_model(family, size).to(torch.bfloat16)
    return cutlass_nn.convert(model) if side == "cutlass_nn" else model


def run(args: argparse.Namespace) -> dict:
    size = bench_models.MODEL_SIZES[args.size]
    batches = bench_models.make_batches(size, 4, "cuda")
    trainers: dict[str, bench_models.Trainer] = {}
    samples: dict[str, list[dict[str, float]]] = {}
    order = ("stock", "cutlass_nn")
    for side in order:
        if args.reset:
            torch._dynamo.reset()
        trainers[side] = bench_models.Trainer(build_side(side, args.family, size), args.mode, "cuda")
        if args.profiled_first_step:  # as the model benchmark checks which operators ran
            bench_models._ran_cutlass_ops(trainers[side], batches[0])
        for i in range(args.warmup):
            timed_step(trainers[side], batches[i % len(batches)])
        torch.cuda.synchronize()
        samples[side] = []
        if args.reset:  # this side alone, now, while its Dynamo cache is the only one
            time_blocks({side: trainers[side]}, samples, batches, args)
    if not args.reset:
        time_blocks(trainers, samples, batches, args)
    phases = {}
    for phase in PHASES:
        med = {side: statistics.median(s[phase] for s in samples[side]) for side in order}
        phases[phase] = {"stock_us": med["stock"], "cutlass_nn_us": med["cutlass_nn"],
                         "difference_us": med["cutlass_nn"] - med["stock"],
                         "ratio": med["cutlass_nn"] / med["stock"] if med["stock"] else None}
    return {"family": args.family, "size": args.size, "mode": args.mode, "steps": args.steps,
            "block": args.block, "warmup": args.warmup, "reset": args.reset,
            "profiled_first_step": args.profiled_first_step, "phases": phases,
            "samples": {side: samples[side] for side in order}}


def time_blocks(trainers, samples, batches, args) -> None:
    """The model benchmark's schedule: alternating blocks of ``args.block`` steps per side (the
    side that goes first alternates), on the frozen heap."""
    with frozen_heap():
        for side, first, n in alternating_blocks(list(trainers), args.steps, args.block):
            torch.cuda.synchronize()
            for j in range(n):
                samples[side].append(timed_step(trainers[side], batches[(first + j) % len(batches)]))
            torch.cuda.synchronize()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--family", default="llama", choices=bench_models.FAMILIES)
    p.add_argument("--size", default="host", choices=bench_models.SIZES)
    p.add_argument("--mode", default="compile", choices=("eager", "compile"))
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--block", type=int, default=5)
    p.add_argument("--warmup", type=int, default=8)
    p.add_argument("--reset", action="store_true",
                   help="a fresh Dynamo cache per side, each side timed alone after its warm-up")
    p.add_argument("--profiled-first-step", action="store_true",
                   help="run each side's first (compiling) step under the CPU profiler, as the "
                        "model benchmark does to see which operators ran")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = p.parse_args()
    meta = bench_cli.gpu_run_meta(sys.argv[1:])
    if meta is None:
        return 2
    meta["command"] = "python benchmarks/step_phases.py " + shlex.join(sys.argv[1:])
    result = {"mode": "step_phases", "meta": meta, **run(args)}
    print(f"{args.family}-{args.size} {args.mode}, {args.steps} steps per side"
          f"{' (fresh Dynamo cache per side)' if args.reset else ''}: median host us per phase")
    print("| phase | stock | cutlass_nn | difference | ratio |")
    print("|---|---|---|---|---|")
    for phase, r in result["phases"].items():
        print(f"| {phase} | {r['stock_us']:.1f} | {r['cutlass_nn_us']:.1f} | "
              f"{r['difference_us']:+.1f} | "
              f"{'-' if r['ratio'] is None else format(r['ratio'], '.3f')} |")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"step_phases_{bench_cli._slug(meta)}_{args.family}-{args.size}-{args.mode}_{bench_cli._stamp()}.json"
    path.write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(f"json {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
