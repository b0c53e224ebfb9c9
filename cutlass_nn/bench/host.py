"""``python -m cutlass_nn.bench --what host``: host time per call, cutlass_nn against torch.

Usage::

    python -m cutlass_nn.bench --what host [--calls 2000] [--repeats 15] [--out DIR]

What a host-bound model pays per layer is the CPU time to get a call onto the GPU's queue. Each
case calls one operation in a tight loop on tiny CUDA tensors (so the GPU keeps up and the loop is
bound by the host): ``--calls`` calls, then one synchronization, timed with ``time.perf_counter``;
``--repeats`` such loops per side, the sides alternating; reported: the median microseconds per
call of each side and their ratio (ours / torch: <= 1.05 is the target, the same work done in C++
should cost the same). Cases: ``F.linear`` (with bias), ``torch.mm``, ``a + b``, and a module
forward + backward (``nn.Linear`` vs ``CutlassLinear``, ``y.backward(g)``, parameters' gradients
reset to None each call as an optimizer's ``zero_grad`` does).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

import cutlass_nn

#: ours / torch host time per call at most this (the issue's target)
TARGET_RATIO = 1.05


def make_cases(device="cuda", dtype=torch.bfloat16) -> dict[str, dict[str, Callable[[], Any]]]:
    """{case: {"torch": fn, "ours": fn}}, each fn one call on tiny tensors."""
    opts = dict(device=device, dtype=dtype)
    x, w, b = torch.randn(8, 64, **opts), torch.randn(64, 64, **opts), torch.randn(64, **opts)
    a, c = torch.randn(64, 64, **opts), torch.randn(64, 64, **opts)
    torch.manual_seed(0)
    stock = nn.Linear(64, 64, **opts)
    ours = cutlass_nn.CutlassLinear(64, 64, **opts)
    xg = torch.randn(8, 64, **opts, requires_grad=True)
    g = torch.randn(8, 64, **opts)

    def fwd_bwd(layer: nn.Module) -> Callable[[], Any]:
        def call():
            for p in layer.parameters():
                p.grad = None
            xg.grad = None
            layer(xg).backward(g)

        return call

    return {
        "linear": {"torch": lambda: F.linear(x, w, b), "ours": lambda: cutlass_nn.functional.linear(x, w, b)},
        "mm": {"torch": lambda: torch.mm(a, c), "ours": lambda: cutlass_nn.mm(a, c)},
        "add": {"torch": lambda: a + c, "ours": lambda: cutlass_nn.add2(a, c)},
        "module_fwd_bwd": {"torch": fwd_bwd(stock), "ours": fwd_bwd(ours)},
    }


def time_loop(fn: Callable[[], Any], calls: int, sync: Callable[[], None]) -> float:
    """Microseconds per call of ``calls`` back-to-back calls (one synchronization at the end)."""
    sync()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return (time.perf_counter() - t0) / calls * 1e6


def measure(
    cases: dict[str, dict[str, Callable[[], Any]]],
    *,
    calls: int,
    repeats: int,
    sync: Callable[[], None],
) -> list[dict[str, Any]]:
    rows = []
    for name, sides in cases.items():
        for fn in sides.values():  # warm-up: plans, caches, kernels' attributes
            for _ in range(max(calls // 10, 5)):
                fn()
        us: dict[str, list[float]] = {"torch": [], "ours": []}
        for r in range(repeats):
            order = ["torch", "ours"] if r % 2 == 0 else ["ours", "torch"]
            for side in order:
                us[side].append(time_loop(sides[side], calls, sync))
        t, o = statistics.median(us["torch"]), statistics.median(us["ours"])
        rows.append({
            "case": name,
            "torch_us": t,
            "ours_us": o,
            "ratio": o / t,
            "pass": o / t <= TARGET_RATIO,
            "torch_all_us": us["torch"],
            "ours_all_us": us["ours"],
        })
    return rows


def format_rows(rows: Sequence[dict]) -> list[str]:
    lines = [
        "| call | torch us | cutlass_nn us | ours / torch | target <= 1.05 |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['case']} | {r['torch_us']:.1f} | {r['ours_us']:.1f} | {r['ratio']:.3f} | "
            f"{'PASS' if r['pass'] else 'MISS'} |"
        )
    return lines


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m cutlass_nn.bench --what host",
        description="Host time per call on tiny CUDA tensors, cutlass_nn vs torch.",
    )
    p.add_argument("--what", choices=["host"], default="host")
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    return p.parse_args(argv)


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    from cutlass_nn.bench import cli as bench

    meta = bench.gpu_run_meta(argv)
    if meta is None:
        return 2
    rows = measure(make_cases(), calls=args.calls, repeats=args.repeats, sync=torch.cuda.synchronize)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"host_{bench._slug(meta)}_{bench._stamp()}.json"
    path.write_text(json.dumps({"mode": "host", "meta": meta, "settings": vars(args) | {"out": str(args.out)},
                                "rows": rows}, indent=1, default=str) + "\n")
    for line in format_rows(rows):
        print(line)
    print(f"json {path}", flush=True)
    return 0
