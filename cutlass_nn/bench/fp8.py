"""``python -m cutlass_nn.bench --what fp8``: the FP8 GEMMs of a linear layer, cutlass_nn's SM90
kernels (``ops.fp8_scaled_mm``) against ``torch._scaled_mm`` (cuBLASLt FP8) with the same recipe,
at the transformer shape set.

Usage::

    python -m cutlass_nn.bench --what fp8 [--tokens 512,4096,16384] [--families ...]
        [--scalings tensorwise,rowwise] [--grad-format e4m3|e5m2] [--fast-accum-forward]
        [--reps 25] [--configs 0,1,3,0s2] [--quantize] [--out DIR]

Per layer (N out, K in) and token count T, the three GEMMs of an FP8 linear layer on operands
quantized as the recipe says (cutlass_nn.fp8_reference): forward ``x [T, K] @ w^T`` (e4m3 x
e4m3), input gradient ``dy [T, N] @ w`` (gradient format x e4m3, the weight transposed), weight
gradient ``dy^T [N, T] @ x [T, K]`` (both transposed). Each operand is laid out as both
implementations need it (A row-major, B column-major), so the timing is the GEMM alone; both
produce bfloat16. Before timing, each row checks that the two results agree (relative difference
in the norm). GPU time: each side's call captured ``GRAPH_CALLS`` times in a CUDA graph, the
replay timed with CUDA events, per call, the median of ``--reps`` replays, the sides interleaved
(the same operands every call: what fits in L2 stays there for both sides alike); ``ratio`` =
torch's time / ours (> 1: ours faster). Latency (``*_latency_ms``): one call between two events
on an idle GPU, the host's launch work included, what an eager caller waits for.
``bf16_ratio`` = the bfloat16 GEMM of the same shape (``torch.mm``, cuBLAS) / ours: what FP8 gains
over bf16. Rows torch cannot run (``torch._scaled_mm`` takes no e5m2 operand with rowwise scales)
say so and have no ratio. The summary gives the geometric mean per GEMM and the rows below 0.90.
"""

from __future__ import annotations

import argparse
import re
import json
import math
import statistics
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from cutlass_nn import fp8_reference as R
from cutlass_nn import ops
from cutlass_nn.transformer_shapes import MODEL_LAYERS, TOKENS, layer_shapes, transformer_shapes

OPS = ("fwd", "dgrad", "wgrad")
#: rows under this ratio are listed (the issue's floor)
FLOOR = 0.90
#: calls per CUDA graph in the GPU-time measurement
GRAPH_CALLS = 10


def _csv(text: str) -> list[str]:
    return [t for t in text.split(",") if t]


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m cutlass_nn.bench --what fp8")
    p.add_argument("--what", default="fp8")
    p.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    p.add_argument("--families", default=",".join(MODEL_LAYERS))
    p.add_argument("--scalings", default="tensorwise,rowwise")
    p.add_argument("--grad-format", default="e4m3", choices=("e4m3", "e5m2"))
    p.add_argument("--fast-accum-forward", action="store_true",
                   help="both sides accumulate the forward GEMM without promotion")
    p.add_argument("--reps", type=int, default=25)
    p.add_argument("--quantize", action="store_true",
                   help="time ops.fp8_quantize instead of the GEMMs: every activation shape "
                   "[T, K] of the set, each axis, plain and transposed, against the same "
                   "arithmetic in torch operations (fp8_reference.quantize_unchecked)")
    p.add_argument("--configs", default="",
                   help="also time these forced FP8 tile configurations (indices into "
                   "cutlass_nn.ops.fp8_configs(), e.g. 0,1,3) on every row: config<N>_ms; "
                   "<N>s<S> runs configuration N with rasterization swizzle S (1, 2, 4, 8): "
                   "config<N>s<S>_ms")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = p.parse_args(list(argv))
    for c in _csv(args.configs):
        if not re.fullmatch(r"\d+(s[1248])?", c):
            p.error(f"--configs: {c!r} is not a configuration index N or NsS (S = 1, 2, 4, 8)")
    for s in _csv(args.scalings):
        if s not in R.SCALINGS:
            p.error(f"--scalings: unknown scaling {s!r}; known: {', '.join(R.SCALINGS)}")
    return args


#: The model benchmark's ``--fp8`` values: a scaling, optionally with fast accumulation in the
#: forward GEMM (``Fp8Recipe.fast_accum_forward``, as torchao's and TransformerEngine's recipes).
FAST_ACCUM_SUFFIX = "-fast-accum"
FP8_CHOICES = tuple(s + suffix for suffix in ("", FAST_ACCUM_SUFFIX) for s in R.SCALINGS)


def recipe_of(spec: str) -> R.Fp8Recipe:
    """The :class:`Fp8Recipe` of an ``--fp8`` value (:data:`FP8_CHOICES`)."""
    fast = spec.endswith(FAST_ACCUM_SUFFIX)
    return R.Fp8Recipe(scaling=spec[: -len(FAST_ACCUM_SUFFIX)] if fast else spec,
                       fast_accum_forward=fast)


def convert_args(spec: str) -> dict[str, Any]:
    """``cutlass_nn.convert``'s arguments of an FP8 row of the model benchmark (``--what models
    --fp8 SPEC``, one of :data:`FP8_CHOICES`): ``precision="fp8"`` with that recipe, the LM head
    left an ``nn.Linear`` (as the FP8 peers are run)."""
    return dict(precision="fp8", fp8_recipe=recipe_of(spec),
                filter_fn=lambda name, m: not name.endswith("lm_head"))


def _time_interleaved(fns: dict[str, Callable[[], Any]], reps: int) -> dict[str, float]:
    """What an eager caller waits for: CUDA events around one call on an idle GPU (the host's
    launch work included), median over ``reps``, the functions interleaved."""
    for fn in fns.values():
        for _ in range(3):
            fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            fn()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end))
    return {k: statistics.median(v) for k, v in times.items()}


def _time_graphs(fns: dict[str, Callable[[], Any]], reps: int, calls: int = GRAPH_CALLS) -> dict[str, float]:
    """What the GPU does: each function captured ``calls`` times back to back in a CUDA graph,
    the replay timed with CUDA events; milliseconds per call, median over ``reps`` replays, the
    functions interleaved (no host work inside the timed span, so launch costs cannot hide or
    dominate a short kernel)."""
    graphs = {}
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for name, fn in fns.items():
            for _ in range(3):
                fn()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                for _ in range(calls):
                    fn()
            graphs[name] = graph
    torch.cuda.current_stream().wait_stream(stream)
    for graph in graphs.values():
        graph.replay()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(reps):
        for name, graph in graphs.items():
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end) / calls)
    del graphs
    return {k: statistics.median(v) for k, v in times.items()}


def gemm_operands(op: str, t: int, n: int, k: int, scaling: str, grad_format: str, device="cuda"):
    """(a [M, K'] row-major, a_scale, b [K', N'] column-major, b_scale) of one GEMM of the layer,
    quantized by the reference with the recipe's scale axes."""
    rowwise = scaling == "rowwise"
    gen = torch.Generator(device=device).manual_seed(t * 7 + n * 3 + k)

    def rand(*shape):
        return torch.randn(*shape, generator=gen, device=device, dtype=torch.bfloat16)

    if op == "fwd":  # x [t, k] @ w[n, k]^T
        a, sa = R.quantize(rand(t, k), "e4m3", dim=1 if rowwise else None)
        w, sw = R.quantize(rand(n, k), "e4m3", dim=1 if rowwise else None)
        return a, sa, w.t(), (sw.t() if rowwise else sw)
    if op == "dgrad":  # dy [t, n] @ w [n, k]: b = w column-major = w^T [k, n] row-major, .t()
        a, sa = R.quantize(rand(t, n), grad_format, dim=1 if rowwise else None)
        wt, swt = R.quantize(rand(k, n), "e4m3", dim=1 if rowwise else None)  # w^T, per column of w
        return a, sa, wt.t(), (swt.t() if rowwise else swt)
    # wgrad: dy^T [n, t] @ x [t, k]: a = dy^T row-major, b = x column-major = x^T [k, t] .t()
    a, sa = R.quantize(rand(n, t), grad_format, dim=1 if rowwise else None)
    xt, sxt = R.quantize(rand(k, t), "e4m3", dim=1 if rowwise else None)
    return a, sa, xt.t(), (sxt.t() if rowwise else sxt)


def measure_row(op, shape, scaling, grad_format, fast_accum, reps, configs=()) -> dict:
    t, n, k = shape
    m, nn_, kk = {"fwd": (t, n, k), "dgrad": (t, k, n), "wgrad": (n, k, t)}[op]
    a, sa, b, sb = gemm_operands(op, t, n, k, scaling, grad_format)
    fast = fast_accum and op == "fwd"
    row: dict[str, Any] = {"op": op, "tokens": t, "n": n, "k": k, "m_n_k": [m, nn_, kk],
                           "scaling": scaling, "format_a": str(a.dtype), "fast_accum": fast}
    ours = lambda: ops.fp8_scaled_mm(a, b, sa, sb, None, torch.bfloat16, fast)  # noqa: E731
    theirs = lambda: torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16,  # noqa: E731
                                      use_fast_accum=fast)
    a16, b16 = torch.randn(m, kk, device="cuda", dtype=torch.bfloat16), torch.randn(
        kk, nn_, device="cuda", dtype=torch.bfloat16)
    bf16 = lambda: torch.mm(a16, b16)  # noqa: E731
    got = ours()
    row["kernel"] = torch.ops.cutlass_nn._last_kernel_name.default()
    fns = {"ours": ours, "bf16": bf16}
    for c in configs:
        config, _, swizzle = str(c).partition("s")

        def forced(config=int(config), swizzle=int(swizzle or 0)):
            with ops.force_fp8_config(config, swizzle):
                return ops.fp8_scaled_mm(a, b, sa, sb, None, torch.bfloat16, fast)

        fns[f"config{c}"] = forced
    try:
        want = theirs()
        row["rel_diff"] = ((got.float() - want.float()).norm() / want.float().norm()).item()
        fns["torch"] = theirs
    except RuntimeError as exc:
        row["torch_error"] = str(exc).splitlines()[0][:200]
    ms = _time_graphs(fns, reps)
    row.update({f"{name}_ms": v for name, v in ms.items()})
    latency = _time_interleaved({k: fns[k] for k in ("ours", "torch") if k in fns}, reps)
    row.update({f"{name}_latency_ms": v for name, v in latency.items()})
    row["tflops"] = 2 * m * nn_ * kk / (ms["ours"] * 1e-3) / 1e12
    if "torch" in ms:
        row["ratio"] = ms["torch"] / ms["ours"]
    row["bf16_ratio"] = ms["bf16"] / ms["ours"]
    return row


def quantize_rows(tokens: list[int], families: list[str], reps: int) -> list[dict]:
    """``ops.fp8_quantize`` against ``fp8_reference.quantize_unchecked`` (torch operations) on
    bf16 activations ``[T, K]``: GPU time per call (graph replays), the kernel's bandwidth
    (bytes read twice and written once)."""
    ks = sorted({k for _, k in layer_shapes(families)})
    rows = []
    for t in tokens:
        for k in ks:
            x = torch.randn(t, k, device="cuda", dtype=torch.bfloat16)
            for axis, dim in (("tensor", None), ("row", 1), ("column", 0)):
                for transpose in (False, True):
                    fns = {"ours": lambda: ops.fp8_quantize(x, "e4m3", axis, transpose),
                           "torch": lambda: R.quantize_unchecked(x, "e4m3", dim)}
                    ms = _time_graphs(fns, reps)
                    rows.append({"tokens": t, "k": k, "axis": axis, "transpose": transpose,
                                 "ours_ms": ms["ours"], "torch_ms": ms["torch"],
                                 "ratio": ms["torch"] / ms["ours"],
                                 "ours_gbs": x.numel() * 5 / (ms["ours"] * 1e-3) / 1e9})
                    r = rows[-1]
                    print(f"quantize T={t:5d} K={k:5d} {axis:6s} transpose={transpose!s:5s} "
                          f"ours {r['ours_ms']:.4f} ms ({r['ours_gbs']:.0f} GB/s) torch ops "
                          f"{r['torch_ms']:.4f} ms: {r['ratio']:.2f}x", flush=True)
    return rows


def summarize(rows: list[dict]) -> dict:
    out: dict[str, Any] = {}
    for scaling in sorted({r["scaling"] for r in rows}):
        for op in OPS:
            sel = [r for r in rows if r["op"] == op and r["scaling"] == scaling and "ratio" in r]
            if not sel:
                continue
            gm = math.exp(sum(math.log(r["ratio"]) for r in sel) / len(sel))
            gm16 = math.exp(sum(math.log(r["bf16_ratio"]) for r in sel) / len(sel))
            lat = [r["torch_latency_ms"] / r["ours_latency_ms"] for r in sel
                   if "torch_latency_ms" in r and "ours_latency_ms" in r]
            out[f"{scaling}/{op}"] = {
                "rows": len(sel),
                "geomean_ratio": gm,
                "geomean_latency_ratio": (
                    math.exp(sum(map(math.log, lat)) / len(lat)) if lat else None),
                "geomean_bf16_ratio": gm16,
                "below_floor": sum(r["ratio"] < FLOOR for r in sel),
                "worst": min(r["ratio"] for r in sel),
                "configs": _config_geomeans(sel),
            }
    return out


def _config_geomeans(rows: list[dict]) -> dict[str, float]:
    """For each configuration forced with ``--configs`` (the rows' ``config<N>_ms``), the geomean
    of torch's time over its time, as ``ratio`` is for the rule's choice (a sweep's summary);
    empty without ``--configs``."""
    keys = sorted({k for r in rows for k in r if k.startswith("config") and k.endswith("_ms")})
    out = {}
    for key in keys:
        ratios = [r["torch_ms"] / r[key] for r in rows if key in r and "torch_ms" in r]
        if ratios:
            out[key[len("config"):-len("_ms")]] = math.exp(sum(map(math.log, ratios)) / len(ratios))
    return out


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    from cutlass_nn.bench import cli as bench

    meta = bench.gpu_run_meta(argv)
    if meta is None:
        return 2
    if args.quantize:
        qrows = quantize_rows([int(t) for t in _csv(args.tokens)], _csv(args.families), args.reps)
        gm = math.exp(sum(math.log(r["ratio"]) for r in qrows) / len(qrows))
        print(f"summary quantize: {gm:.2f}x the torch operations (geomean of {len(qrows)} rows)")
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / f"fp8_quantize_{bench._slug(meta)}_{bench._stamp()}.json"
        path.write_text(json.dumps({"mode": "fp8_quantize", "meta": meta,
                                    "settings": vars(args) | {"out": str(args.out)},
                                    "summary": {"geomean_ratio": gm}, "rows": qrows},
                                   indent=1, default=str) + "\n")
        print(f"json {path}", flush=True)
        return 0
    shapes = transformer_shapes([int(t) for t in _csv(args.tokens)], _csv(args.families))
    rows = []
    for scaling in _csv(args.scalings):
        for shape in shapes:
            for op in OPS:
                row = measure_row(op, shape, scaling, args.grad_format, args.fast_accum_forward,
                                  args.reps, _csv(args.configs))
                rows.append(row)
                ratio = f"{row['ratio']:.3f}" if "ratio" in row else "n/a"
                print(f"{scaling:10s} {op:5s} T={shape[0]:5d} N={shape[1]:5d} K={shape[2]:5d} "
                      f"ours {row['ours_ms']:.3f} ms ({row['tflops']:.0f} TFLOP/s) "
                      f"ratio {ratio} bf16x {row['bf16_ratio']:.2f} {row['kernel']}", flush=True)
    summary = summarize(rows)
    for key, s in summary.items():
        lat = s["geomean_latency_ratio"]
        print(f"summary {key}: geomean {s['geomean_ratio']:.3f} vs torch._scaled_mm "
              f"(latency {'n/a' if lat is None else format(lat, '.3f')}), "
              f"{s['geomean_bf16_ratio']:.2f}x bf16, worst {s['worst']:.3f}, "
              f"{s['below_floor']} of {s['rows']} below {FLOOR}"
              + "".join(f"; config {c} {g:.3f}" for c, g in s["configs"].items()))
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"fp8_{bench._slug(meta)}_{bench._stamp()}.json"
    settings = vars(args) | {"out": str(args.out)}
    path.write_text(json.dumps({"mode": "fp8", "meta": meta, "settings": settings,
                                "summary": summary, "rows": rows}, indent=1, default=str) + "\n")
    print(f"json {path}", flush=True)
    return 0
