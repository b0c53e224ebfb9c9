"""Training step with gradient accumulation over micro-batches: fused weight-gradient
accumulation on vs off (GPU machine).

    python benchmarks/bench_wgrad_accumulation.py [--family llama] [--size gpu]
        [--micro-batches 4] [--steps 10] [--fuse-norm] [--fuse-mlp] [--fuse-head] [--fuse-rope]
        [--out DIR]

Three sides from the same seeded model of ``python -m cutlass_nn.bench --what models``:
``stock`` (nn.Linear), ``unfused`` (converted, fused accumulation off), ``fused`` (converted,
inside ``cutlass_nn.fused_wgrad_accumulation()``) and ``main_grad`` (converted, with
``cutlass_nn.attach_main_grads``: float32 buffers, rounded into ``.grad`` and zeroed before each
optimizer step). A step runs ``--micro-batches`` forward +
backward passes (loss divided by their number, no ``zero_grad`` in between), then fused AdamW and
``zero_grad(set_to_none=True)``. Reported per side: median step time over ``--steps`` timed steps
(CUDA events around each step, after two warm-up steps), peak memory of a step above what
stays allocated between steps (``resident_bytes``: weights, optimizer state, main gradients, and
for the sides after ``unfused`` its first-step gradients, kept for the comparison), how many
``linear_wgrad`` / ``linear_wgrad_accumulate_`` calls one step made (the proof that the fused
path engaged), and the accumulated gradients of the first step compared with the unfused side
(max |diff| / max |ref| per parameter, the largest over the model). Eager mode only: a compiled
backward takes the usual path. Prints a table and writes JSON (with device, versions, commit)
when ``--out`` is given.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import statistics
import sys
from pathlib import Path

import torch

import cutlass_nn
from cutlass_nn.bench import models as bench_models
from cutlass_nn.bench.cli import collect_meta

SIDES = ("stock", "unfused", "fused", "main_grad")


def build(side: str, args, size) -> torch.nn.Module:
    with torch.device("cuda"):
        model = bench_models.build_model(args.family, size).to(torch.bfloat16)
    if side == "stock":
        return model
    fuse_head = args.fuse_head and cutlass_nn.fused_head.can_fuse_lm_head(model)
    return cutlass_nn.convert(model, fuse_norm=args.fuse_norm, fuse_mlp=args.fuse_mlp,
                              fuse_head=fuse_head, fuse_rope=args.fuse_rope)


def accumulate(model, batches) -> None:
    for batch in batches:
        (model(**batch).loss / len(batches)).backward()


def wgrad_calls(model, batches) -> dict[str, int]:
    acts = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=acts) as prof:
        accumulate(model, batches)
    names = [e.name for e in prof.events()]
    return {op: names.count(f"cutlass_nn::{op}") for op in ("linear_wgrad", "linear_wgrad_accumulate_")}


def grad_difference(grads: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> tuple[float, str]:
    worst, where = 0.0, ""
    for name, g in grads.items():
        r = ref[name].float()
        rel = ((g.float() - r).abs().max() / r.abs().max().clamp_min(1e-30)).item()
        if rel > worst:
            worst, where = rel, name
    return worst, where


def optimizer_step(model, opt, main_grads: bool) -> None:
    if main_grads:  # the float32 sums, rounded once into the 16-bit .grad the optimizer reads
        for p in model.parameters():
            if hasattr(p, "main_grad"):
                p.grad = p.main_grad.to(p.dtype)
                p.main_grad.zero_()
    opt.step()
    opt.zero_grad(set_to_none=True)


def run_side(side: str, args, size, batches, ref_grads):
    model = build(side, args, size)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    main_grads = side == "main_grad"
    if main_grads:
        cutlass_nn.attach_main_grads(model)
    context = cutlass_nn.fused_wgrad_accumulation(side == "fused")
    with context:
        # First step from the seeded weights: its accumulated gradients are the comparison.
        calls = wgrad_calls(model, batches)
        grads = {n: (p.main_grad if main_grads else p.grad).detach().clone()
                 for n, p in model.named_parameters()
                 if (p.main_grad if main_grads else p.grad) is not None}
        optimizer_step(model, opt, main_grads)
        for _ in range(2):
            accumulate(model, batches)
            optimizer_step(model, opt, main_grads)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        times = []
        for _ in range(args.steps):
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            accumulate(model, batches)
            optimizer_step(model, opt, main_grads)
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop))
        peak = torch.cuda.max_memory_allocated() - base
    row = {"side": side, "step_ms": statistics.median(times), "step_ms_all": times,
           "peak_step_bytes": peak, "resident_bytes": base, **calls}
    if side in ("fused", "main_grad"):
        missing = sorted(set(ref_grads) ^ set(grads))
        if missing:
            raise RuntimeError(f"fused and unfused sides have different gradients: {missing[:4]}")
        row["max_rel_grad_diff_vs_unfused"], row["worst_param"] = grad_difference(grads, ref_grads)
    del model, opt
    gc.collect()
    torch.cuda.empty_cache()
    return row, grads


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--family", default="llama", choices=bench_models.FAMILIES)
    p.add_argument("--size", default="gpu", choices=bench_models.SIZES)
    p.add_argument("--micro-batches", type=int, default=4)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--fuse-norm", action="store_true", help="convert(fuse_norm=True)")
    p.add_argument("--fuse-mlp", action="store_true", help="convert(fuse_mlp=True)")
    p.add_argument("--fuse-head", action="store_true", help="convert(fuse_head=True)")
    p.add_argument("--fuse-rope", action="store_true", help="convert(fuse_rope=True)")
    p.add_argument("--out", type=Path, default=None, help="write a JSON record here")
    args = p.parse_args()
    size = bench_models.MODEL_SIZES[args.size]
    batches = bench_models.make_batches(size, args.micro_batches, "cuda")
    rows, ref = [], None
    for side in SIDES:
        row, grads = run_side(side, args, size, batches, ref)
        if side == "unfused":
            ref = grads
            row["max_rel_grad_diff_vs_unfused"] = 0.0
        # Only the unfused side's gradients are kept (as ``ref``): a previous side's copy left
        # alive would count in the next side's resident memory.
        grads = None
        rows.append(row)
    stock = rows[0]["step_ms"]
    tokens = size.batch * size.seq * args.micro_batches
    print(f"{args.family}-{args.size}, {args.micro_batches} micro-batches of {size.batch}x{size.seq} "
          f"tokens, eager, bf16, fusions: norm={args.fuse_norm} mlp={args.fuse_mlp} "
          f"head={args.fuse_head} rope={args.fuse_rope}")
    print(f"{'side':9} {'step ms':>9} {'vs stock':>9} {'tokens/s':>11} {'resident MiB':>13} {'peak MiB':>9} "
          f"{'wgrad':>6} {'wgrad+=':>8} {'grad diff':>10}")
    for r in rows:
        diff = r.get("max_rel_grad_diff_vs_unfused")
        print(f"{r['side']:9} {r['step_ms']:9.2f} {stock / r['step_ms']:8.3f}x "
              f"{tokens / r['step_ms'] * 1e3:11.0f} {r['resident_bytes'] / 2**20:13.0f} "
              f"{r['peak_step_bytes'] / 2**20:9.0f} "
              f"{r['linear_wgrad']:6d} {r['linear_wgrad_accumulate_']:8d} "
              f"{'' if diff is None else format(diff, '.2e'):>10}")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
        meta = collect_meta(["(benchmarks/bench_wgrad_accumulation.py)"])
        meta["command"] = "python benchmarks/bench_wgrad_accumulation.py " + " ".join(sys.argv[1:])
        meta["tokens_per_step"] = tokens
        path = args.out / f"wgrad_accumulation_{args.family}-{args.size}_{stamp}.json"
        path.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
