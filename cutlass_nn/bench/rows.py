"""Rows: run one planned row (check, warm-up, time) and the whole plan, never raising."""

from __future__ import annotations

import math
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import torch

from cutlass_nn.bench.cases import Case, precision_context
from cutlass_nn.bench.plan import RowSpec
from cutlass_nn.bench.spec import PRECISIONS, SkipRow
from cutlass_nn.bench.stats import _first_line, rate, time_stats
from cutlass_nn.bench.timing import release_memory, Timer


def fill_timing(row: dict, times: dict[str, list[float]], peak: float | None) -> None:
    """Adds each side's statistics, rates, the ratio (base / ours time: > 1 means ours is
    faster) and the fraction of the device peak to ``row``."""
    unit, work = row["unit"], row["work"]
    for side in ("ours", "base"):
        stats = time_stats(times[side])
        row[side] = stats
        row[f"{side}_rate"] = rate(work, stats["median_ms"], unit)
        row[f"{side}_frac_peak"] = row[f"{side}_rate"] / peak if peak else None
    o, b = row["ours"]["median_ms"], row["base"]["median_ms"]
    row["ratio"] = b / o if o > 0 else math.nan


def fill_eager(row: dict, eager: dict[str, list[float]]) -> None:
    """Adds the eager latency (median ms of one call as a user waits for it, host included) of
    each side and their ratio (base / ours: > 1 means ours returns sooner)."""
    for side in ("ours", "base"):
        row[f"{side}_eager_ms"] = time_stats(eager[side])["median_ms"]
    o, b = row["ours_eager_ms"], row["base_eager_ms"]
    row["eager_ratio"] = b / o if o > 0 else math.nan


def run_row(meta: dict, build: Callable[[], Case], timer: Timer, peak: float | None = None) -> dict:
    """Builds, checks and times one row. Never raises (but KeyboardInterrupt): an exception is
    recorded as status "error"; a failed check is status "FAIL" and the row is not timed."""
    row: dict[str, Any] = dict(meta, status="error", note="")
    case = None
    try:
        case = build()
        row["input_sets"] = case.n_sets
        with case.context():
            check = case.check()
            row["check"] = check
            row["kernel"] = case.kernel_name()
            if not check["ok"]:
                row["status"] = "FAIL"
                row["note"] = f"wrong result, not timed: {check['summary']}"
                return row
            times = timer(case.fns, case.n_sets)
            eager = timer.eager(case.fns, case.n_sets) if hasattr(timer, "eager") else None
        fill_timing(row, times, peak)
        if eager is not None:
            fill_eager(row, eager)
        row["status"] = "ok"
    except SkipRow as exc:
        row["status"] = "skipped"
        row["note"] = str(exc)
    except Exception as exc:
        row["status"] = "error"
        row["note"] = _first_line(exc)
        row["traceback"] = traceback.format_exc(limit=12)
    finally:
        case = None
        release_memory()
    return row


def peak_for(meta: dict, peaks: dict) -> float | None:
    """The measured ceiling a row is compared with: torch.mm at 8192^3 in the row's precision
    for GEMMs, the device-to-device copy for add2."""
    if meta["group"] in ("gemm", "linact"):
        return (peaks.get("mm_tflops") or {}).get(meta["precision"])
    return peaks.get("copy_gbps")


def run_plan(
    specs: Sequence[RowSpec],
    build: Callable[[RowSpec], Case],
    timer: Timer,
    peaks: dict,
    *,
    time_limit_s: float,
    healthy: Callable[[], bool] = lambda: True,
    on_row: Callable[[int, int, dict], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[list[dict], bool]:
    """Runs every row; returns (rows, interrupted). Rows that would start after
    ``time_limit_s``, or after an error that left the CUDA context unusable (``healthy()`` is
    False), are recorded as skipped with the reason."""
    start = clock()
    rows: list[dict] = []
    stop_note = None
    try:
        for i, spec in enumerate(specs):
            meta = spec.meta()
            if stop_note is None and clock() - start > time_limit_s:
                stop_note = (
                    f"skipped: run time limit of {time_limit_s:.0f} s reached (--time-limit)"
                )
            if stop_note:
                row = dict(meta, status="skipped", note=stop_note)
            else:
                row = run_row(meta, lambda spec=spec: build(spec), timer, peak_for(meta, peaks))
                if row["status"] == "error" and not healthy():
                    stop_note = "skipped: the CUDA context is unusable after an earlier error"
            rows.append(row)
            if on_row:
                on_row(i, len(specs), row)
    except KeyboardInterrupt:
        rows += [
            dict(s.meta(), status="skipped", note="skipped: interrupted")
            for s in specs[len(rows) :]
        ]
        return rows, True
    return rows, False


def cuda_healthy() -> bool:
    try:
        torch.ones(1, device="cuda").add_(1)
        torch.cuda.synchronize()
        return True
    except Exception:
        return False


def measure_peaks(timer: Timer, precisions: Sequence[str], device="cuda") -> dict:
    """The two ceilings of the device: torch.mm 8192^3 TFLOP/s for each precision, and a large
    device-to-device copy in GB/s (bytes read + bytes written)."""
    peaks: dict[str, Any] = {
        "mm_shape": [8192, 8192, 8192],
        "mm_tflops": {},
        "copy_gbps": None,
        "errors": {},
    }
    gen = torch.Generator(device=device).manual_seed(1)
    for name in precisions:
        prec = PRECISIONS[name]
        try:
            with precision_context(prec):
                a = torch.randn((8192, 8192), dtype=prec.dtype, device=device, generator=gen)
                b = torch.randn((8192, 8192), dtype=prec.dtype, device=device, generator=gen)
                times = timer({"mm": lambda i, a=a, b=b: torch.mm(a, b)}, 1)
            peaks["mm_tflops"][name] = rate(
                2 * 8192**3, time_stats(times["mm"])["median_ms"], "TFLOP/s"
            )
        except Exception as exc:
            peaks["errors"][f"mm_{name}"] = _first_line(exc)
        finally:
            a = b = None
            release_memory()
    try:
        free, _ = torch.cuda.mem_get_info()
        nbytes = 2**30 if free > 8 * 2**30 else 2**28
        src = torch.randn((nbytes // 4,), device=device, generator=gen)
        dst = torch.empty_like(src)
        times = timer({"copy": lambda i: dst.copy_(src)}, 1)
        peaks["copy_bytes"] = nbytes
        peaks["copy_gbps"] = rate(2 * nbytes, time_stats(times["copy"])["median_ms"], "GB/s")
    except Exception as exc:
        peaks["errors"]["copy"] = _first_line(exc)
    finally:
        src = dst = None
        release_memory()
    return peaks
