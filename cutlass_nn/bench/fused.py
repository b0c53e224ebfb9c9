"""``python -m cutlass_nn.bench --what fused``: the fused transformer operators against what a
user runs without them.

Usage::

    python -m cutlass_nn.bench --what fused [--tokens 4096,16384] [--hidden 4096]
        [--dtype bfloat16] [--reps 50] [--out DIR]

Cases (each on random data, checked against a float64 reference before it is timed):

* ``rms_norm`` forward, and forward + backward: cutlass_nn's kernel against the Llama RMSNorm of
  ``transformers`` written out in torch ops (what a converted model ran before), against
  ``torch.nn.functional.rms_norm`` and against that compiled with ``torch.compile``.
* ``add_rms_norm`` (the residual add + RMSNorm) forward and forward + backward against
  ``x + residual`` followed by each of the above.
* ``gated_mlp`` (``--cases mlp``): :class:`cutlass_nn.GatedMLP` against the Llama MLP of
  ``transformers`` at the Llama intermediate size for the hidden size (8/3 x, rounded to 256),
  stock (``nn.Linear``), converted without ``fuse_mlp`` (three ``CutlassLinear``) and compiled
  with ``torch.compile``: forward, one eager forward + backward step, and the peak memory of that
  step above the inputs; plus the gated-activation kernels alone with their bandwidth.
* ``linear_cross_entropy`` (``--cases head``): the language-model head's loss at ``--vocab``
  (default 128256) against ``F.cross_entropy(F.linear(...))``: an eager forward + backward and
  its peak memory (the issue's targets: time <= 0.9x, memory <= 0.25x of the unfused head).

Reported per case: the median milliseconds of ``--reps`` CUDA-event-timed repetitions (after
warm-up, the sides interleaved), the ratio baseline / ours (> 1: ours is faster) and, for the
forward and backward kernels, the achieved bandwidth as a fraction of the device-copy ceiling
measured in the same process (``dst.copy_(src)`` of a 1 GiB buffer, i.e. HBM; the issue's target
is >= 0.85). The fwd+bwd rows time one eager training step of the layer (host included).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

import cutlass_nn

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
#: achieved forward bandwidth / device-copy bandwidth at least this (the issue's target)
TARGET_BANDWIDTH_FRACTION = 0.85


def time_ms(fns: dict[str, Callable[[], Any]], reps: int, warmup: int = 5) -> dict[str, float]:
    """Median CUDA-event milliseconds of each function, the functions interleaved."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end))
    return {name: statistics.median(ms) for name, ms in times.items()}


#: bytes of the buffer the device-copy ceiling is measured on: far larger than L2, so that it is
#: the HBM ceiling, one number for every row
CEILING_BYTES = 1 << 30


def copy_ceiling_gbs(reps: int, nbytes: int = CEILING_BYTES) -> float:
    """Device-copy bandwidth (read + write bytes per second, GB/s) for a buffer of ``nbytes``."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    ms = time_ms({"copy": lambda: dst.copy_(src)}, reps)["copy"]
    return 2 * nbytes / (ms * 1e-3) / 1e9


def llama_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The Llama RMSNorm forward of ``transformers``, as torch ops."""
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def reference_rms_norm(x, residual, weight, eps):
    """float64 (out, h) for the correctness check."""
    h = x if residual is None else (x + residual)  # rounded in x's dtype, as the kernels do
    hd = h.double()
    out = hd * torch.rsqrt(hd.pow(2).mean(-1, keepdim=True) + eps) * weight.double()
    return out, h


def check_close(name: str, got: torch.Tensor, ref: torch.Tensor) -> float:
    """Max abs error relative to the reference's max magnitude; raises past 2 rounding steps."""
    err = (got.double() - ref.double()).abs().max().item() / max(ref.abs().max().item(), 1e-30)
    bound = 2 * torch.finfo(got.dtype).eps
    if not err <= bound:
        raise AssertionError(f"{name}: relative error {err:.3g} > {bound:.3g}")
    return err


def norm_cases(
    tokens: int, hidden: int, dtype: torch.dtype, reps: int, ceiling: float, eps: float = 1e-6
) -> list[dict]:
    gen = torch.Generator(device="cuda").manual_seed(tokens * 7 + hidden)
    opts = dict(device="cuda", dtype=dtype)
    x = torch.randn(tokens, hidden, generator=gen, **opts)
    res = torch.randn(tokens, hidden, generator=gen, **opts)
    w = (1 + 0.1 * torch.randn(hidden, generator=gen, **opts))
    g = torch.randn(tokens, hidden, generator=gen, **opts)
    es = x.element_size()
    rows = []
    compiled = torch.compile(lambda a, b: torch.nn.functional.rms_norm(a, (hidden,), b, eps))

    # correctness first
    out = cutlass_nn.rms_norm(x, w, eps)
    err = check_close("rms_norm", out, reference_rms_norm(x, None, w, eps)[0])
    out2, h2 = cutlass_nn.add_rms_norm(x, res, w, eps)
    ref2, href = reference_rms_norm(x, res, w, eps)
    err2 = max(check_close("add_rms_norm", out2, ref2), check_close("add_rms_norm h", h2, href))

    for case, residual, nbytes, e in (
        ("rms_norm", None, 2 * tokens * hidden * es, err),
        ("add_rms_norm", res, 4 * tokens * hidden * es, err2),
    ):

        def ours_fwd(residual=residual):
            if residual is None:
                return cutlass_nn.rms_norm(x, w, eps)
            return cutlass_nn.add_rms_norm(x, residual, w, eps)

        def base(fn, residual=residual):
            if residual is None:
                return lambda: fn(x, w)
            return lambda: fn(x + residual, w)

        fwd = {
            "ours": ours_fwd,
            "llama_eager": base(lambda a, b: llama_rms_norm(a, b, eps)),
            "torch_rms_norm": base(lambda a, b: torch.nn.functional.rms_norm(a, (hidden,), b, eps)),
            "torch_compile": base(compiled),
        }
        ms = time_ms(fwd, reps)
        gbs = nbytes / (ms["ours"] * 1e-3) / 1e9
        rows.append({
            "case": f"{case} fwd", "tokens": tokens, "hidden": hidden, "dtype": str(dtype),
            "ms": ms, "speedup": {k: v / ms["ours"] for k, v in ms.items() if k != "ours"},
            "bytes": nbytes, "gbs": gbs, "copy_gbs": ceiling, "bandwidth_fraction": gbs / ceiling,
            "pass": gbs / ceiling >= TARGET_BANDWIDTH_FRACTION, "max_rel_err": e,
        })

        # the backward kernel alone: reads grad_output and h (and the residual's gradient),
        # writes grad_h (the weight-gradient partials and their sum are small)
        if residual is None:
            h_saved, rstd = x, cutlass_nn.ops.rms_norm(x, w, eps)[1]
        else:
            _, h_saved, rstd = cutlass_nn.ops.add_rms_norm(x, residual, w, eps)
        gh = g if residual is not None else None
        bwd_bytes = (3 + (residual is not None)) * tokens * hidden * es
        ms = time_ms({"ours": lambda: cutlass_nn.ops.rms_norm_backward(g, gh, h_saved, w, rstd, True)}, reps)
        gbs = bwd_bytes / (ms["ours"] * 1e-3) / 1e9
        rows.append({
            "case": f"{case} bwd kernel", "tokens": tokens, "hidden": hidden, "dtype": str(dtype),
            "ms": ms, "speedup": {}, "bytes": bwd_bytes, "gbs": gbs, "copy_gbs": ceiling,
            "bandwidth_fraction": gbs / ceiling, "pass": gbs / ceiling >= TARGET_BANDWIDTH_FRACTION,
        })

        xg = x.clone().requires_grad_(True)
        rg = None if residual is None else residual.clone().requires_grad_(True)
        wg = w.clone().requires_grad_(True)

        def step(fn):
            def call():
                xg.grad = wg.grad = None
                if rg is not None:
                    rg.grad = None
                y = fn()
                y.backward(g)
            return call

        def ours_y():
            if rg is None:
                return cutlass_nn.rms_norm(xg, wg, eps)
            return cutlass_nn.add_rms_norm(xg, rg, wg, eps)[0]

        def base_y(fn):
            return (lambda: fn(xg, wg)) if rg is None else (lambda: fn(xg + rg, wg))

        bwd = {
            "ours": step(ours_y),
            "llama_eager": step(base_y(lambda a, b: llama_rms_norm(a, b, eps))),
            "torch_rms_norm": step(base_y(lambda a, b: torch.nn.functional.rms_norm(a, (hidden,), b, eps))),
            "torch_compile": step(base_y(compiled)),
        }
        ms = time_ms(bwd, reps)
        rows.append({
            "case": f"{case} fwd+bwd", "tokens": tokens, "hidden": hidden, "dtype": str(dtype),
            "ms": ms, "speedup": {k: v / ms["ours"] for k, v in ms.items() if k != "ours"},
        })
    return rows


def llama_intermediate(hidden: int) -> int:
    """The intermediate size the models benchmark gives a Llama of this hidden size."""
    return int(hidden * 8 / 3 / 256 + 0.5) * 256


def peak_step_bytes(step: Callable[[], Any]) -> int:
    """Peak bytes allocated during one call of ``step`` above what was allocated before it."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def mlp_cases(tokens: int, hidden: int, dtype: torch.dtype, reps: int, ceiling: float) -> list[dict]:
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaMLP

    inter = llama_intermediate(hidden)
    torch.manual_seed(tokens + hidden)
    cfg = LlamaConfig(hidden_size=hidden, intermediate_size=inter)
    with torch.device("cuda"):
        stock = LlamaMLP(cfg).to(dtype)
    unfused = LlamaMLP(cfg).to(device="cuda", dtype=dtype)
    unfused.load_state_dict(stock.state_dict())
    cutlass_nn.convert(unfused)
    ours = cutlass_nn.GatedMLP(hidden, inter, device="cuda", dtype=dtype)
    ours.load_state_dict(stock.state_dict())
    compiled = torch.compile(stock)
    gen = torch.Generator(device="cuda").manual_seed(tokens * 3 + hidden)
    x = torch.randn(tokens, hidden, generator=gen, device="cuda", dtype=dtype)
    g = torch.randn(tokens, hidden, generator=gen, device="cuda", dtype=dtype)
    sides = {"ours": ours, "llama_eager": stock, "unfused": unfused, "torch_compile": compiled}

    # correctness first: ours against a float64 evaluation of the same weights
    with torch.no_grad():
        sd = {k: v.double() for k, v in stock.state_dict().items()}
        x64 = x.double()
        ref = torch.nn.functional.linear(
            torch.nn.functional.silu(x64 @ sd["gate_proj.weight"].T) * (x64 @ sd["up_proj.weight"].T),
            sd["down_proj.weight"])
        err = check_close("gated_mlp", ours(x), ref)

    fwd = {}
    for name, mod in sides.items():
        fwd[name] = (lambda mod=mod: mod(x))
    with torch.no_grad():
        ms = time_ms(fwd, reps)
    rows = [{
        "case": "gated_mlp fwd", "tokens": tokens, "hidden": hidden, "intermediate": inter,
        "dtype": str(dtype), "ms": ms,
        "speedup": {k: v / ms["ours"] for k, v in ms.items() if k != "ours"}, "max_rel_err": err,
    }]

    xg = x.clone().requires_grad_(True)

    def step(mod):
        def call():
            xg.grad = None
            for p in mod.parameters():
                p.grad = None
            mod(xg).backward(g)
        return call

    steps = {name: step(mod) for name, mod in sides.items()}
    ms = time_ms(steps, reps)
    peak = {name: peak_step_bytes(fn) for name, fn in steps.items()}
    rows.append({
        "case": "gated_mlp fwd+bwd", "tokens": tokens, "hidden": hidden, "intermediate": inter,
        "dtype": str(dtype), "ms": ms,
        "speedup": {k: v / ms["ours"] for k, v in ms.items() if k != "ours"},
        "peak_bytes": peak, "memory_ratio": {k: peak["ours"] / v for k, v in peak.items() if k != "ours"},
    })

    # the gated-activation kernels alone: forward reads [tokens, 2n] and writes [tokens, n]; the
    # backward reads grad [tokens, n] and [tokens, 2n], writes [tokens, 2n] and [tokens, n]
    es = x.element_size()
    gate_up = torch.randn(tokens, 2 * inter, generator=gen, device="cuda", dtype=dtype)
    grad_h = torch.randn(tokens, inter, generator=gen, device="cuda", dtype=dtype)
    for case, fn, nbytes in (
        ("gated_act fwd kernel", lambda: cutlass_nn.ops.gated_act(gate_up, "silu"), 3 * tokens * inter * es),
        ("gated_act bwd kernel", lambda: cutlass_nn.ops.gated_act_backward(grad_h, gate_up, "silu"),
         6 * tokens * inter * es),
    ):
        ms = time_ms({"ours": fn}, reps)
        gbs = nbytes / (ms["ours"] * 1e-3) / 1e9
        rows.append({
            "case": case, "tokens": tokens, "hidden": hidden, "intermediate": inter,
            "dtype": str(dtype), "ms": ms, "speedup": {}, "bytes": nbytes, "gbs": gbs,
            "copy_gbs": ceiling, "bandwidth_fraction": gbs / ceiling,
            "pass": gbs / ceiling >= TARGET_BANDWIDTH_FRACTION,
        })
    return rows


def head_cases(tokens: int, hidden: int, vocab: int, dtype: torch.dtype, reps: int) -> list[dict]:
    gen = torch.Generator(device="cuda").manual_seed(tokens + hidden + vocab)
    h = torch.randn(tokens, hidden, generator=gen, device="cuda", dtype=dtype).requires_grad_()
    w = (torch.randn(vocab, hidden, generator=gen, device="cuda") * hidden ** -0.5).to(dtype)
    w.requires_grad_()
    t = torch.randint(0, vocab, (tokens,), generator=gen, device="cuda")

    def step(loss_fn):
        def call():
            h.grad = w.grad = None
            loss_fn().backward()
        return call

    sides = {
        "ours": step(lambda: cutlass_nn.functional.linear_cross_entropy(h, w, t)),
        "unfused": step(lambda: torch.nn.functional.cross_entropy(torch.nn.functional.linear(h, w), t)),
    }
    # correctness first: the two losses and weight gradients agree
    ours = cutlass_nn.functional.linear_cross_entropy(h, w, t)
    ref = torch.nn.functional.cross_entropy(torch.nn.functional.linear(h, w).float(), t)
    rel = abs(ours.item() - ref.item()) / abs(ref.item())
    ms = time_ms(sides, reps, warmup=2)
    peak = {name: peak_step_bytes(fn) for name, fn in sides.items()}
    return [{
        "case": "linear_cross_entropy fwd+bwd", "tokens": tokens, "hidden": hidden,
        "intermediate": vocab, "dtype": str(dtype), "ms": ms,
        "speedup": {"unfused": ms["unfused"] / ms["ours"]}, "peak_bytes": peak,
        "memory_ratio": {"unfused": peak["ours"] / peak["unfused"]}, "loss_rel_diff": rel,
        "pass": ms["ours"] <= 0.9 * ms["unfused"] and peak["ours"] <= 0.25 * peak["unfused"],
    }]


def format_head_rows(rows: Sequence[dict]) -> list[str]:
    lines = ["| case | tokens x hidden x vocab | ours ms | unfused ms | time ratio (target <= 0.90) | "
             "peak memory ratio (target <= 0.25) | loss rel. diff |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['case']} | {r['tokens']}x{r['hidden']}x{r['intermediate']} | "
                     f"{r['ms']['ours']:.3f} | {r['ms']['unfused']:.3f} | "
                     f"{r['ms']['ours'] / r['ms']['unfused']:.2f} | "
                     f"{r['memory_ratio']['unfused']:.2f} | {r['loss_rel_diff']:.1e} |")
    return lines


def format_mlp_rows(rows: Sequence[dict]) -> list[str]:
    lines = [
        "| case | tokens x hidden (x inter) | ours ms | vs llama eager | vs unfused cutlass_nn | "
        "vs compile | peak memory vs llama eager / compile | GB/s (of copy) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        sp = r["speedup"]
        vs = " | ".join(f"{sp[k]:.2f}x" if k in sp else "" for k in ("llama_eager", "unfused", "torch_compile"))
        mem = r.get("memory_ratio", {})
        mem_text = (f"{mem['llama_eager']:.2f}x / {mem['torch_compile']:.2f}x" if mem else "")
        bw = (f"{r['gbs']:.0f} ({r['bandwidth_fraction']:.2f})") if "gbs" in r else ""
        lines.append(f"| {r['case']} | {r['tokens']}x{r['hidden']}x{r['intermediate']} | "
                     f"{r['ms']['ours']:.4f} | {vs} | {mem_text} | {bw} |")
    return lines


def format_rows(rows: Sequence[dict]) -> list[str]:
    lines = [
        "| case | tokens x hidden | ours ms | vs llama eager | vs F.rms_norm | vs compile | "
        "GB/s (of copy) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        sp = r["speedup"]
        bw = (f"{r['gbs']:.0f} ({r['bandwidth_fraction']:.2f} "
              f"{'PASS' if r['pass'] else 'MISS'})") if "gbs" in r else ""
        vs = " | ".join(f"{sp[k]:.2f}x" if k in sp else "" for k in ("llama_eager", "torch_rms_norm", "torch_compile"))
        lines.append(f"| {r['case']} | {r['tokens']}x{r['hidden']} | {r['ms']['ours']:.4f} | {vs} | {bw} |")
    return lines


def _ints(text: str) -> list[int]:
    return [int(t) for t in text.split(",") if t]


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m cutlass_nn.bench --what fused",
        description="Fused transformer operators (RMSNorm, add + RMSNorm) against torch.",
    )
    p.add_argument("--what", choices=["fused"], default="fused")
    p.add_argument("--tokens", type=_ints, default=[4096, 16384])
    p.add_argument("--hidden", type=_ints, default=[1024, 4096, 8192])
    p.add_argument("--dtype", choices=sorted(_DTYPES), default="bfloat16")
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--cases", type=lambda t: [c for c in t.split(",") if c], default=["norm"],
                   help="comma-separated: norm (rms_norm, add_rms_norm), mlp (gated_mlp), "
                   "head (linear_cross_entropy)")
    p.add_argument("--vocab", type=int, default=128256, help="vocabulary of the head cases")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    return p.parse_args(argv)


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    from cutlass_nn.bench import cli as bench

    meta = bench.gpu_run_meta(argv)
    if meta is None:
        return 2
    rows: list[dict] = []
    ceiling = copy_ceiling_gbs(args.reps)
    meta["copy_ceiling_gbs"] = ceiling
    print(f"device copy ceiling: {ceiling:.0f} GB/s ({CEILING_BYTES >> 20} MiB copy)", flush=True)
    unknown = set(args.cases) - {"norm", "mlp", "head"}
    if unknown:
        print(f"--cases: unknown {sorted(unknown)} (norm, mlp, head)", file=sys.stderr)
        return 2
    for hidden in args.hidden:
        for tokens in args.tokens:
            if "norm" in args.cases:
                rows += norm_cases(tokens, hidden, _DTYPES[args.dtype], args.reps, ceiling)
                for line in format_rows(rows[-6:]):
                    print(line, flush=True)
            if "mlp" in args.cases:
                rows += mlp_cases(tokens, hidden, _DTYPES[args.dtype], args.reps, ceiling)
                for line in format_mlp_rows(rows[-4:]):
                    print(line, flush=True)
            if "head" in args.cases:
                rows += head_cases(tokens, hidden, args.vocab, _DTYPES[args.dtype], args.reps)
                for line in format_head_rows(rows[-1:]):
                    print(line, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"fused_{bench._slug(meta)}_{bench._stamp()}.json"
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    path.write_text(json.dumps({"mode": "fused", "meta": meta, "settings": settings, "rows": rows},
                               indent=1, default=str) + "\n")
    print()
    head_rows = [r for r in rows if r["case"].startswith("linear_cross_entropy")]
    mlp_rows = [r for r in rows if r["case"].startswith("gated")]
    norm_rows = [r for r in rows if r not in head_rows and r not in mlp_rows]
    for line in (format_rows(norm_rows) if norm_rows else []) + (
            format_mlp_rows(mlp_rows) if mlp_rows else []) + (
            format_head_rows(head_rows) if head_rows else []):
        print(line)
    print(f"json {path}", flush=True)
    return 0
