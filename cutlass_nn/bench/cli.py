"""The command line: arguments, run metadata, main() and its delegation to the model and host benchmarks."""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import time
import zlib
from collections.abc import Sequence
from dataclasses import asdict, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

import cutlass_nn
from cutlass_nn import ops
from cutlass_nn.bench.arg_types import (  # noqa: F401  (re-exported: bench.parse_shapes, ...)
    csv_choices,
    parse_shapes,
    parse_splits,
    parse_swizzles,
    positive_float,
)
from cutlass_nn.bench.cases import build_case, build_gemm_case, Case
from cutlass_nn.bench.plan import plan_rows, RowSpec
from cutlass_nn.bench.report import (
    format_progress,
    format_summary,
    format_tables,
    plot_results,
    summarize,
    write_json,
)
from cutlass_nn.bench.rows import cuda_healthy, measure_peaks, run_plan
from cutlass_nn.bench.spec import (
    DEFAULT_L2_BYTES,
    DTYPE_CHOICES,
    FULL,
    GEMM_OPS,
    GEMM_SHAPES,
    LINACT_SETS,
    Precision,
    PRECISION_ORDER,
    PRECISIONS,
    QUICK,
    scale_settings,
    Settings,
    SkipRow,
    SWEEP,
    SWEEP_OPS,
    SWEEP_SPLITS,
    SWEEP_SWIZZLES,
    WHAT_ITEMS,
)
from cutlass_nn.bench.stats import _first_line, gemm_flops
from cutlass_nn.bench.sweep import (
    finish_sweep_entries,
    format_sweep_best,
    format_sweep_progress,
    format_sweep_table,
    gemm_config_api,
    is_stream_k,
    run_sweep_group,
    sweep_best,
    sweep_plan,
    sweep_variants,
    variant_key,
)
from cutlass_nn.bench.timing import CudaTimer, release_memory, Timer


def _planned_rows(args: argparse.Namespace) -> list[RowSpec]:
    """plan_rows() for the parsed arguments (the --shapes rows when given)."""
    shapes = getattr(args, "shapes", None)
    linact_set = getattr(args, "linact_set", "default")
    if shapes is None:
        return plan_rows(args.quick, args.dtypes, args.what, linact_set=linact_set)
    return plan_rows(args.quick, args.dtypes, args.what, shapes, args.shape_set)


def _names_transformer(argv: Sequence[str] | None) -> bool:
    """Whether ``--shapes`` names the transformer set (rather than a list of shapes)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    for i, arg in enumerate(argv):
        value = argv[i + 1] if arg == "--shapes" and i + 1 < len(argv) else None
        if arg.startswith("--shapes="):
            value = arg.split("=", 1)[1]
        if value is not None:
            return value.strip().startswith("transformer")
    return False


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m cutlass_nn.bench",
        description="cutlass_nn vs PyTorch on this GPU: correctness check, then interleaved "
        "CUDA-event timing; writes JSON + PNG into --out and prints a table.",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="fewer repetitions and shapes: bf16 GEMMs (6 shapes), linact (2), add2 bf16, "
        "fp32 'highest' at 4096^3 (< 2 min)",
    )
    parser.add_argument(
        "--out", type=Path, default=Path("benchmarks/results"), help="output folder"
    )
    parser.add_argument(
        "--dtypes",
        type=csv_choices(DTYPE_CHOICES),
        default=None,
        help="bf16,fp16,fp32 (default: all; bf16,fp32 with --quick; bf16 with --sweep). fp32 = "
        "the float32 GEMM subset ('highest' and TF32) and float32 add2",
    )
    parser.add_argument(
        "--what",
        type=csv_choices(WHAT_ITEMS),
        default=list(WHAT_ITEMS),
        help="fwd,sm80,dgrad,wgrad,fwdbwd,linact,add2,fp32 (default: all). sm80 = forward with "
        "force_sm80_kernels(); linact = Linear+bias+GELU(tanh) fwd+bwd vs eager and "
        "torch.compile; fp32 = the float32 GEMM subset (the GEMM ops selected, or all). "
        "With --sweep: which of fwd,dgrad,wgrad",
    )
    parser.add_argument(
        "--linact-set",
        choices=LINACT_SETS,
        default="default",
        help="the linact rows: 'default' (GELU(tanh) at the GEMM shapes) or 'mlp' (GPT-2 / "
        "BERT-style MLP up projections T x 4h x h, h = 768..4096, T = 4096 / 16384, in every "
        "activation the layer fuses: gelu_tanh, gelu, relu; with their own targets)",
    )
    parser.add_argument(
        "--time-limit",
        type=float,
        default=None,
        help="seconds after which the remaining rows are skipped (default "
        f"{QUICK.time_limit_s:.0f} with --quick, {FULL.time_limit_s:.0f} otherwise, "
        f"{SWEEP.time_limit_s:.0f} with --sweep)",
    )
    parser.add_argument(
        "--budget-ms",
        type=positive_float,
        default=None,
        help="GPU time aimed at per row, ours and torch together (default "
        f"{QUICK.budget_ms:.0f} with --quick, {FULL.budget_ms:.0f} otherwise); with --sweep, "
        f"per configuration (default {SWEEP.budget_ms:.0f})",
    )
    parser.add_argument(
        "--shapes",
        type=parse_shapes,
        default=None,
        metavar="SET|MxNxK,...",
        help="time only 16-bit GEMM rows (the --what GEMM ops) of these layer shapes: "
        "'transformer' (the transformer shape set, with its targets), 'transformer:T1/T2' (at "
        "those token counts) or MxNxK,...",
    )
    parser.add_argument(
        "--autotune",
        action="store_true",
        help="cutlass_nn side with first-call autotune on (cutlass_nn.autotune): each GEMM "
        "problem is tuned at its first call (the correctness check), then timed with the kept "
        "configuration; the table goes into the JSON ('autotune')",
    )
    parser.add_argument(
        "--sweep",
        action="store_true",
        help="time every SM90 tile configuration and swizzle of each GEMM shape (fwd, dgrad, "
        "wgrad; bf16) against torch; writes sweep_*.json and prints the best per shape",
    )
    parser.add_argument(
        "--sweep-shapes",
        type=parse_shapes,
        default=None,
        metavar="MxNxK,...",
        help="--sweep only these shapes (default: the whole GEMM list)",
    )
    parser.add_argument(
        "--sweep-swizzles",
        type=parse_swizzles,
        default=None,
        metavar="S,...",
        help="tile-scheduler swizzles tried with each configuration (default "
        f"{','.join(map(str, SWEEP_SWIZZLES))}; 0 = the rule's choice)",
    )
    parser.add_argument(
        "--sweep-configs",
        type=parse_swizzles,
        default=None,
        metavar="C,...",
        help="SM90 tile configurations swept (indices into torch.ops.cutlass_nn._gemm_configs(); "
        "default: all); the rule's own choice is always timed too",
    )
    parser.add_argument(
        "--sweep-splits",
        type=parse_splits,
        default=None,
        metavar="K,...",
        help="split-K counts tried with each stream-K configuration (default "
        f"{','.join(map(str, SWEEP_SPLITS))}; 0 = the rule's choice, 1 = data-parallel, "
        "s > 1 = split into s, s <= -2 = batched split-K into -s slices, where the problem "
        "takes it); other configurations ignore it and run once",
    )
    parser.add_argument(
        "--plot",
        type=Path,
        metavar="JSON",
        help="only redraw the PNG of a results JSON (next to it; no GPU needed) and exit; for a "
        "sweep JSON, print its table",
    )
    args = parser.parse_args(argv)
    if args.plot:
        return args
    args.shape_set = None
    if args.linact_set != "default" and (
        args.quick or args.sweep or args.shapes is not None or "linact" not in args.what
    ):
        parser.error(
            f"--linact-set {args.linact_set} picks the linact rows: it needs 'linact' in --what "
            "and no --quick, --sweep or --shapes"
        )
    if args.shapes is not None:
        if args.sweep:
            parser.error("--sweep takes its shapes from --sweep-shapes")
        if args.quick:
            parser.error("--shapes and --quick do not mix")
        args.shape_set = "transformer" if _names_transformer(argv) else "custom"
        if args.dtypes is None:
            args.dtypes = ["bf16"]
        if not [op for op in GEMM_OPS if op in args.what]:
            parser.error("--shapes times GEMM rows: --what names no GEMM op")
    if args.sweep:
        if args.quick:
            parser.error("--sweep and --quick do not mix (use --budget-ms, --sweep-shapes)")
        if args.dtypes is None:
            args.dtypes = ["bf16"]
        if not set(args.dtypes) <= {"bf16", "fp16"}:
            parser.error("--sweep times 16-bit GEMMs: --dtypes bf16 and/or fp16")
        args.sweep_ops = [op for op in SWEEP_OPS if op in args.what]
        if not args.sweep_ops:
            parser.error(f"--sweep times {','.join(SWEEP_OPS)}: --what names none of them")
        args.sweep_shapes = args.sweep_shapes or list(GEMM_SHAPES)
        args.sweep_swizzles = (
            args.sweep_swizzles if args.sweep_swizzles is not None else list(SWEEP_SWIZZLES)
        )
        args.sweep_splits = (
            args.sweep_splits if args.sweep_splits is not None else list(SWEEP_SPLITS)
        )
        return args
    if (
        args.sweep_shapes is not None
        or args.sweep_swizzles is not None
        or args.sweep_splits is not None
        or args.sweep_configs is not None
    ):
        parser.error(
            "--sweep-shapes, --sweep-swizzles, --sweep-configs and --sweep-splits need --sweep"
        )
    if args.dtypes is None:
        args.dtypes = ["bf16", "fp32"] if args.quick else list(DTYPE_CHOICES)
    if not _planned_rows(args):
        parser.error(
            f"nothing to run for --dtypes {','.join(args.dtypes)} --what {','.join(args.what)}"
        )
    return args


def mode_settings(args: argparse.Namespace) -> Settings:
    """QUICK, FULL or SWEEP, with --budget-ms and --time-limit applied."""
    settings = SWEEP if args.sweep else QUICK if args.quick else FULL
    if args.budget_ms is not None:
        settings = replace(settings, budget_ms=args.budget_ms)
    if args.time_limit is not None:
        settings = replace(settings, time_limit_s=args.time_limit)
    return settings


def _git_commit() -> str | None:
    """The checkout's commit; CUTLASS_NN_GIT_COMMIT overrides it for runs on a copy of the tree
    whose git metadata is not the one the code came from (the GPU machine's copies)."""
    override = os.environ.get("CUTLASS_NN_GIT_COMMIT", "").strip()
    if override:
        return override
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            check=False,
            capture_output=True,
            text=True,
            timeout=10,
            cwd=Path(__file__).resolve().parent,
        )
        return out.stdout.strip() or None
    except Exception:
        return None


def _memory_gbps() -> int | None:
    """The peak DRAM bandwidth the GEMM rule sees for device 0 (scripts/rule_gaps.py plans a
    sweep's rows with it); None where the extension cannot say (the CPU flavor)."""
    try:
        return int(torch.ops.cutlass_nn._device_memory_gbps(0))
    except (AttributeError, RuntimeError):
        return None


def collect_meta(argv: Sequence[str]) -> dict:
    props = torch.cuda.get_device_properties(0)
    matmul = torch.backends.cuda.matmul
    return {
        "device": props.name,
        "capability": f"{props.major}.{props.minor}",
        "sm_count": props.multi_processor_count,
        "memory_gib": round(props.total_memory / 2**30, 1),
        "l2_bytes": getattr(props, "L2_cache_size", None),
        "memory_gbps": _memory_gbps(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "cutlass_nn": cutlass_nn.__version__,
        "build_info": cutlass_nn.build_info(),
        "git_commit": _git_commit(),
        "date_utc": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": "python -m cutlass_nn.bench" + (" " + shlex.join(argv) if argv else ""),
        "matmul_defaults": {
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "bf16_reduced_precision_reduction": matmul.allow_bf16_reduced_precision_reduction,
            "fp16_reduced_precision_reduction": matmul.allow_fp16_reduced_precision_reduction,
        },
    }


def gpu_run_meta(argv: Sequence[str]) -> dict | None:
    """The start every benchmark's ``main`` shares: None (the reason printed to stderr) when no
    CUDA GPU is visible, else the run's metadata (:func:`collect_meta`, the command line in it)."""
    if not torch.cuda.is_available():
        print(NO_CUDA_MESSAGE, file=sys.stderr)
        return None
    return collect_meta(argv)


def _plot_title(meta: dict) -> str:
    device, version, date = meta.get("device"), meta.get("torch"), meta.get("date_utc")
    return f"cutlass_nn vs torch: {device}, torch {version}, {date}"


def replot(json_path: Path) -> int:
    """``--plot``: the PNG of a results JSON, written next to it (a sweep JSON: its table)."""
    results = json.loads(Path(json_path).read_text())
    if results.get("mode") == "sweep":
        lines = format_sweep_table(results["rows"], results.get("configs") or [])
        for line in lines + format_sweep_best(sweep_best(results["rows"])):
            print(line)
        return 0
    png = plot_results(
        results["rows"], Path(json_path).with_suffix(".png"), _plot_title(results["meta"])
    )
    print(png or "(nothing to plot)")
    return 0


def _slug(meta: dict) -> str:
    return re.sub(r"[^a-z0-9]+", "-", str(meta["device"]).lower()).strip("-") or "gpu"


def _stamp() -> str:
    return f"{datetime.now(timezone.utc):%Y%m%d-%H%M%S}"


def build_sweep_case(op: str, shape: tuple[int, int, int], prec: Precision, l2_bytes: int) -> Case:
    """The GEMM case that a sweep group forces every configuration on (a GPU row's case)."""
    seed = zlib.crc32(f"sweep/{op}/{prec.name}/{'x'.join(map(str, shape))}".encode())
    return build_gemm_case(op, *shape, prec, l2_bytes=l2_bytes, device="cuda", seed=seed)


def sweep_main(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """``--sweep``: for each (precision, shape, op), every SM90 configuration x swizzle (x splits
    for the stream-K ones; and the automatic rule) checked, then timed against torch in the same
    interleaved repetitions."""
    try:
        names, set_config = gemm_config_api()
    except RuntimeError as exc:
        print(f"cutlass_nn.bench --sweep: {exc}", file=sys.stderr)
        return 2
    if not names:
        print(
            "cutlass_nn.bench --sweep: torch.ops.cutlass_nn._gemm_configs() lists no SM90 "
            "configuration (a build without sm90a kernels?)",
            file=sys.stderr,
        )
        return 2
    if any(args.sweep_splits) and getattr(set_config, "takes_splits", None) is False:
        print(
            "cutlass_nn.bench --sweep: this cutlass_nn build's _set_gemm_config takes no splits "
            f"argument (only config and swizzle), so --sweep-splits {args.sweep_splits} cannot "
            "be forced: rebuild cutlass_nn, or use --sweep-splits 0",
            file=sys.stderr,
        )
        return 2
    settings = mode_settings(args)
    t_start = time.monotonic()
    meta = collect_meta(argv)
    l2 = meta["l2_bytes"] or DEFAULT_L2_BYTES
    plan = sweep_plan(args.dtypes, args.sweep_shapes, args.sweep_ops)
    if args.sweep_configs is not None and max(args.sweep_configs) >= len(names):
        print(
            f"cutlass_nn.bench --sweep: --sweep-configs {args.sweep_configs}: this build has "
            f"configurations 0-{len(names) - 1} only",
            file=sys.stderr,
        )
        return 2
    variants = sweep_variants(names, args.sweep_swizzles, args.sweep_splits, args.sweep_configs)
    args.out.mkdir(parents=True, exist_ok=True)
    json_path = args.out / f"sweep_{_slug(meta)}_{_stamp()}.json"
    swept = list(range(len(names))) if args.sweep_configs is None else list(args.sweep_configs)
    splits_note = ""
    if list(args.sweep_splits) != [0]:
        n_stream_k = sum(is_stream_k(names[c]) for c in swept)
        splits_note = f" (x splits {args.sweep_splits} for the {n_stream_k} stream-K ones)"
    print(
        f"cutlass_nn.bench --sweep: {meta['device']}, torch {meta['torch']}; {len(swept)} "
        f"configurations x swizzles {args.sweep_swizzles}{splits_note} + auto = "
        f"{len(variants)} variants, {len(plan)} (shape, op) groups, time limit "
        f"{settings.time_limit_s:.0f} s",
        flush=True,
    )
    timer = CudaTimer(settings)
    results: dict[str, Any] = {
        "mode": "sweep",
        "meta": meta,
        "settings": dict(
            asdict(settings),
            scaling="budget_ms and row_cap_ms per timed configuration",
            sleep_cycles_per_ms=timer.cycles_per_ms,
        ),
        "configs": names,
        "swept_configs": swept,
        "swizzles": args.sweep_swizzles,
        "splits": args.sweep_splits,
        "variants": [variant_key(c, s, k) for c, s, k in variants],
        "rows": [],
    }
    write_json(json_path, results)

    def timer_for(n_timed: int) -> Timer:
        return timer.with_settings(scale_settings(settings, n_timed))

    context_ok, interrupted = True, False
    try:
        for gi, (prec_name, shape, op) in enumerate(plan):
            prec = PRECISIONS[prec_name]
            ident = {
                "precision": prec_name,
                "op": op,
                "shape": list(shape),
                "label": "x".join(map(str, shape)),
                "unit": "TFLOP/s",
                "work": gemm_flops(op, *shape),
            }
            base = None
            stop = None
            if not context_ok:
                stop = "skipped: the CUDA context is unusable after an earlier error"
            elif time.monotonic() - t_start > settings.time_limit_s:
                stop = f"skipped: time limit of {settings.time_limit_s:.0f} s reached"
            if stop:
                entries = [
                    {
                        "config": c,
                        "swizzle": sw,
                        "splits": k,
                        "key": variant_key(c, sw, k),
                        "status": "skipped",
                        "note": stop,
                    }
                    for c, sw, k in variants
                ]
            else:
                case = None
                try:
                    case = build_sweep_case(op, shape, prec, l2)
                    entries, base, context_ok = run_sweep_group(
                        case,
                        variants,
                        set_config,
                        timer_for,
                        kernel_name=ops.last_kernel_name,
                        healthy=cuda_healthy,
                    )
                except Exception as exc:  # building the inputs failed (SkipRow: too large)
                    status = "skipped" if isinstance(exc, SkipRow) else "error"
                    note = str(exc) if isinstance(exc, SkipRow) else _first_line(exc)
                    entries = [
                        {
                            "config": c,
                            "swizzle": sw,
                            "splits": k,
                            "key": variant_key(c, sw, k),
                            "status": status,
                            "note": note,
                        }
                        for c, sw, k in variants
                    ]
                    context_ok = isinstance(exc, SkipRow) or cuda_healthy()
                finally:
                    case = None
                    release_memory()
            rows = finish_sweep_entries(ident, entries, base, names)
            results["rows"] += rows
            write_json(json_path, results)
            print(
                format_sweep_progress(gi, len(plan), rows, time.monotonic() - t_start), flush=True
            )
    except KeyboardInterrupt:
        interrupted = True
    results["best"] = best = sweep_best(results["rows"])
    results["wall_s"] = time.monotonic() - t_start
    write_json(json_path, results)
    print()
    for line in format_sweep_table(results["rows"], names) + format_sweep_best(best):
        print(line)
    print(f"wall {results['wall_s']:.0f} s; json {json_path}", flush=True)
    if interrupted:
        return 130
    auto_bad = [
        r for r in results["rows"] if r["key"] == "auto" and r["status"] in ("FAIL", "error")
    ]
    return 3 if auto_bad else 0


NO_CUDA_MESSAGE = (
    "cutlass_nn.bench: no CUDA device is available (torch.cuda.is_available() is False); "
    "the benchmark needs a GPU and the CUDA flavor of cutlass_nn."
)


def _delegated_what(argv: Sequence[str]) -> str | None:
    """ "models", "host", "fused", "fp8", "step-profile" or "step-sweep" when ``--what`` names
    one of the benchmarks with their own options (cutlass_nn/bench/models.py, host.py, fused.py,
    fp8.py, step_profile.py, step_sweep.py), else None."""
    for i, arg in enumerate(argv):
        value = argv[i + 1] if arg == "--what" and i + 1 < len(argv) else None
        if arg.startswith("--what="):
            value = arg.split("=", 1)[1]
        if value in ("models", "host", "fused", "fp8", "step-profile", "step-sweep"):
            return value
    return None


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    delegated = _delegated_what(argv)
    if delegated == "models":
        from cutlass_nn.bench import models

        return models.main(argv)
    if delegated == "host":
        from cutlass_nn.bench import host

        return host.main(argv)
    if delegated == "fused":
        from cutlass_nn.bench import fused

        return fused.main(argv)
    if delegated == "fp8":
        from cutlass_nn.bench import fp8

        return fp8.main(argv)
    if delegated == "step-profile":
        from cutlass_nn.bench import step_profile

        return step_profile.main(argv)
    if delegated == "step-sweep":
        from cutlass_nn.bench import step_sweep

        return step_sweep.main(argv)
    args = parse_args(argv)
    if args.plot:
        return replot(args.plot)
    if not torch.cuda.is_available():
        print(NO_CUDA_MESSAGE, file=sys.stderr)
        return 2
    if not cutlass_nn.has_cuda_kernels():
        print(
            "cutlass_nn.bench: this cutlass_nn build has no CUDA kernels (the CPU flavor); build "
            "the CUDA flavor first (`pip install --no-build-isolation -e .` with CUDA_HOME set).",
            file=sys.stderr,
        )
        return 2
    if args.sweep:
        return sweep_main(args, argv)
    settings = mode_settings(args)
    time_limit = settings.time_limit_s
    t_start = time.monotonic()
    meta = collect_meta(argv)
    meta["autotune"] = bool(args.autotune)
    if args.autotune:
        cutlass_nn.autotune.enable(True)
    l2 = meta["l2_bytes"] or DEFAULT_L2_BYTES
    specs = _planned_rows(args)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"bench_{_slug(meta)}_{_stamp()}{'_quick' if args.quick else ''}"
    json_path, png_path = args.out / f"{stem}.json", args.out / f"{stem}.png"
    print(
        f"cutlass_nn.bench: {meta['device']} (sm {meta['capability']}, {meta['sm_count']} SMs, L2 "
        f"{l2 / 2**20:.0f} MiB), torch {meta['torch']}, CUDA {meta['cuda']}; {len(specs)} rows, "
        f"{'quick' if args.quick else 'full'} mode, time limit {time_limit:.0f} s",
        flush=True,
    )

    timer = CudaTimer(settings)
    results: dict[str, Any] = {
        "meta": meta,
        "settings": dict(
            asdict(settings), time_limit_s=time_limit, sleep_cycles_per_ms=timer.cycles_per_ms
        ),
        "peaks": {},
        "rows": [],
    }
    needed = [
        p
        for p in PRECISION_ORDER
        if p == "bf16" or any(s.group != "add2" and s.precision == p for s in specs)
    ]
    results["peaks"] = peaks = measure_peaks(timer, needed)
    print(format_summary(summarize([]), peaks, [])[0], flush=True)
    write_json(json_path, results)

    def on_row(i: int, total: int, row: dict) -> None:
        print(format_progress(i, total, row, time.monotonic() - t_start), flush=True)
        results["rows"].append(row)
        write_json(json_path, results)  # a run cut short still leaves its rows

    remaining = max(time_limit - (time.monotonic() - t_start), 0.0)
    rows, interrupted = run_plan(
        specs,
        lambda spec: build_case(spec, l2_bytes=l2),
        timer,
        peaks,
        time_limit_s=remaining,
        healthy=cuda_healthy,
        on_row=on_row,
    )
    results["rows"] = rows
    results["summary"] = summary = summarize(rows)
    results["wall_s"] = time.monotonic() - t_start
    if args.autotune:
        tuned = cutlass_nn.autotune.entries()
        results["autotune"] = [dict(asdict(e), speedup=e.speedup) for e in tuned]
        changed = sum(1 for e in tuned if (e.config, e.splits) != (e.rule_config, e.rule_splits))
        print(f"autotune: {len(tuned)} GEMM problems tuned, {changed} run another configuration "
              "than the rule's", flush=True)
    write_json(json_path, results)
    try:
        plotted = plot_results(rows, png_path, _plot_title(meta))
        plot_note = str(plotted) if plotted else "(nothing to plot)"
    except Exception as exc:  # matplotlib missing or broken: the numbers matter more
        plot_note = f"(no plot: {_first_line(exc)}; redraw later with --plot JSON)"

    print()
    for line in format_tables(rows) + format_summary(summary, peaks, rows):
        print(line)
    print(f"wall {results['wall_s']:.0f} s; json {json_path}; png {plot_note}", flush=True)
    if interrupted:
        return 130
    return 3 if summary["counts"].get("FAIL") or summary["counts"].get("error") else 0
