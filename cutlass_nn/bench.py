"""``python -m cutlass_nn.bench``: cutlass_nn kernels against PyTorch (cuBLAS / ATen) on one GPU.

Usage::

    python -m cutlass_nn.bench [--quick] [--out DIR] [--dtypes bf16,fp16,fp32]
                               [--what fwd,sm80,dgrad,wgrad,fwdbwd,linact,add2,fp32]
                               [--budget-ms MS] [--time-limit S]
    python -m cutlass_nn.bench --what models [...]   # whole-model training steps (bench_models)
    python -m cutlass_nn.bench --what host [...]     # host time per call (bench_host)
    python -m cutlass_nn.bench --sweep [--sweep-shapes MxNxK,...] [--sweep-swizzles 1,4]
                               [--sweep-splits 0,1,2,4] [--what fwd,dgrad,wgrad]
                               [--budget-ms MS] [--out DIR]

Each row is one problem (an operation, a precision, a shape) timed twice in the same process:
"ours" (the cutlass_nn operator) and "base" (the PyTorch expression it replaces). Method, in the
order it happens (benchmarks/README.md says why):

1. Correctness first: ours and base run once on random inputs; both are compared with a float64
   reference on a sampled submatrix (up to 256 x 256 output elements); ours passes when
   ``err(ours) <= 2 * err(torch) + floor`` and its whole output is finite (the allocator is
   poisoned with NaN first, so unwritten elements show). A failing row is marked FAIL and NOT
   timed.
2. Warm-up, then repetitions; each repetition is ``torch.cuda.synchronize()`` (barrier), a short
   GPU sleep kernel (so the host can queue the whole repetition: launch and Python overhead are not
   timed), then ours and base, each between two CUDA events. The order alternates every
   repetition. Inputs rotate among several random input sets when one set would fit in L2.
3. Median, p10 and p90 of each side; rate (TFLOP/s with 2*M*N*K per GEMM, or GB/s with 2 reads +
   1 write for add2); ratio = base median / ours median (> 1: ours is faster); fraction of the
   device peaks measured at the start (torch.mm 8192^3 per precision, device-to-device copy).

Any exception in a row is caught, printed and recorded in the JSON, and the run goes on. Results:
a JSON file (device, versions, date, command, peaks, every row) rewritten after each row, a PNG
plot, and a compact table printed last, then the summary with the issue's targets (PASS / MISS).

``--sweep`` forces each SM90 tile configuration (``torch.ops.cutlass_nn._set_gemm_config``) with
each swizzle asked for (and, for the stream-K ones, each split-K count asked for), checks it like a
row, then times all that passed and the baseline in the
same interleaved repetitions; it writes ``sweep_*.json`` and prints the best per shape and op.

Exit codes: 0 every row ok (or skipped), 3 the run finished but some rows are FAIL / error
(--sweep: the automatic rule's own configuration failed somewhere; a forced configuration that
cannot run a shape is expected), 2 no CUDA device or no CUDA kernels (or bad arguments, or no
configuration override for --sweep), 130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import itertools
import json
import math
import os
import platform
import re
import shlex
import subprocess
import sys
import time
import traceback
import zlib
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import cutlass_nn
from cutlass_nn import ops, transformer_shapes

# ---------------------------------------------------------------------------------------------
# What is measured
# ---------------------------------------------------------------------------------------------

# (M, N, K): y[M, N] = x[M, K] @ W[N, K]^T. Large square-ish, wide, deep, LLM-like, small-M
# (decode-like) and one with odd N and K (the misaligned, lower-alignment kernels).
GEMM_SHAPES: list[tuple[int, int, int]] = [
    (16384, 4096, 4096),
    (16384, 16384, 4096),
    (16384, 4096, 16384),
    (8192, 8192, 8192),
    (4096, 4096, 4096),
    (2048, 11008, 4096),
    (1024, 4096, 4096),
    (128, 8192, 8192),
    (16, 8192, 8192),
    (16384, 4093, 4091),
]
QUICK_SHAPES: list[tuple[int, int, int]] = [
    (16384, 4096, 4096),
    (8192, 8192, 8192),
    (2048, 11008, 4096),
    (128, 8192, 8192),
    (16, 8192, 8192),
    (16384, 4093, 4091),
]
# The float32 subset, each shape twice: "tf32" (TF32 allowed, matmul precision "high") and "fp32"
# (matmul precision "highest": cuBLAS runs IEEE float32, cutlass_nn a 3xTF32 kernel).
FP32_SHAPES: list[tuple[int, int, int]] = [
    (8192, 8192, 8192),
    (4096, 4096, 4096),
    (2048, 11008, 4096),
    (16384, 4093, 4091),
]
FP32_QUICK_SHAPES: list[tuple[int, int, int]] = [(4096, 4096, 4096)]  # "highest" only
# Linear + bias + GELU(tanh), forward+backward: every GEMM shape whose N and K are multiples of 8.
LINACT_SHAPES: list[tuple[int, int, int]] = [
    s for s in GEMM_SHAPES if s[1] % 8 == 0 and s[2] % 8 == 0
]
LINACT_QUICK_SHAPES: list[tuple[int, int, int]] = [(16384, 4096, 4096), (2048, 11008, 4096)]
LINACT_ACTIVATION = "gelu_tanh"  # cutlass_nn's name of F.gelu(approximate="tanh")
ADD2_SIZES: list[int] = [1 << 20, 1 << 24, 1 << 28]  # 1M, 16M, 256M elements
SMALL_M = 128  # rows with M <= this are "small M" in the summary

# GEMM operations: "sm80" is the forward inside ops.force_sm80_kernels() (CUTLASS 2.x kernels).
GEMM_OPS = ("fwd", "sm80", "dgrad", "wgrad", "fwdbwd")
# linact: one row per baseline of CutlassLinear(activation="gelu_tanh") forward+backward: eager
# nn.Sequential(nn.Linear, nn.GELU("tanh")), and torch.compile of that Sequential.
LINACT_OPS = ("eager", "compile")
ADD2_OPS = ("fwd", "fwdbwd")
WHAT_ITEMS = (*GEMM_OPS, "linact", "add2", "fp32")
OP_TITLES = {
    "fwd": "fwd",
    "sm80": "fwd sm80",
    "dgrad": "dgrad",
    "wgrad": "wgrad",
    "fwdbwd": "fwd+bwd",
    "eager": "vs eager",
    "compile": "vs compile",
}
# --sweep: the operations, default swizzles and split-K counts timed for every SM90 tile
# configuration (splits only matter to the stream-K configurations: the others get 0 only)
SWEEP_OPS = ("fwd", "dgrad", "wgrad")
SWEEP_SWIZZLES = (1, 4)
SWEEP_SPLITS = (0,)
# config -1: the per-shape rule; swizzle 0 and splits 0: the rule's choice
AUTO_CONFIG = (-1, 0, 0)


@dataclass(frozen=True)
class Precision:
    """A dtype and, for float32, whether matmuls may use TF32; ``floor`` is the error floor of the
    accuracy rule (the values of tests/cuda_helpers.py)."""

    name: str
    dtype: torch.dtype
    tf32: bool | None  # None: leave torch's matmul precision setting alone (16-bit dtypes)
    floor: float


PRECISIONS = {
    "bf16": Precision("bf16", torch.bfloat16, None, 2e-3),
    "fp16": Precision("fp16", torch.float16, None, 2e-3),
    "tf32": Precision("tf32", torch.float32, True, 1e-3),  # float32 with TF32 allowed ("high")
    "fp32": Precision("fp32", torch.float32, False, 1e-5),  # float32, "highest" (IEEE)
}
PRECISION_ORDER = ("bf16", "fp16", "tf32", "fp32")
DTYPE_CHOICES = ("bf16", "fp16", "fp32")


@dataclass(frozen=True)
class Settings:
    """Timing effort. ``budget_ms`` is the GPU time aimed at per row, ours and base together;
    ``min_reps`` / ``max_reps`` bound the repetitions; ``row_cap_ms`` keeps a very slow row short;
    ``time_limit_s``: rows that would start later than this are skipped (the run stays bounded)."""

    budget_ms: float
    min_reps: int
    max_reps: int
    warmup: int
    row_cap_ms: float
    time_limit_s: float


QUICK = Settings(
    budget_ms=25, min_reps=5, max_reps=200, warmup=2, row_cap_ms=1500, time_limit_s=100
)
FULL = Settings(
    budget_ms=300, min_reps=10, max_reps=1000, warmup=3, row_cap_ms=4000, time_limit_s=450
)
# Calls per side of the eager-latency measurement of each row (CudaTimer.eager).
EAGER_CALLS = 30
# --sweep: budget_ms and row_cap_ms are per timed configuration (see scale_settings); one
# (shape, op) times all its configurations and the baseline in the same repetitions.
SWEEP = Settings(budget_ms=40, min_reps=5, max_reps=200, warmup=2, row_cap_ms=600, time_limit_s=240)


def scale_settings(settings: Settings, n_timed: int) -> Settings:
    """The settings of one sweep timing that interleaves ``n_timed`` configurations with the
    baseline: the budget and the row cap grow with the number of configurations, so each gets
    about ``budget_ms`` of GPU time whatever their number."""
    n = max(n_timed, 1)
    return replace(settings, budget_ms=settings.budget_ms * n, row_cap_ms=settings.row_cap_ms * n)


DEFAULT_L2_BYTES = 50 * 2**20  # H100 / H200; the device's own value is used when torch reports it
SAMPLE = 256  # rows / columns of the float64-checked submatrix (elements x 256 for 1-D outputs)
REF_CHUNK_ELEMENTS = 1 << 25  # float64 reference products go through x in chunks of this size


class SkipRow(Exception):
    """Raised by a case builder when a row cannot run here (e.g. not enough GPU memory)."""


# ---------------------------------------------------------------------------------------------
# Pure helpers: statistics, work counts, geometric mean (tested on the CPU)
# ---------------------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation (numpy's default); NaN if empty."""
    xs = sorted(values)
    if not xs:
        return math.nan
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def time_stats(ms: Sequence[float]) -> dict[str, float]:
    """Median, p10, p90, min (milliseconds) and count of one side's repetitions."""
    return {
        "median_ms": percentile(ms, 50),
        "p10_ms": percentile(ms, 10),
        "p90_ms": percentile(ms, 90),
        "min_ms": min(ms) if ms else math.nan,
        "n": len(ms),
    }


def gemm_flops(op: str, m: int, n: int, k: int) -> int:
    """2*M*N*K per GEMM; forward+backward is 3 GEMMs (y, dX, dW), and so is a linact row (its
    ops name the baseline). Bias and activation work is not counted."""
    return (3 if op in ("fwdbwd", *LINACT_OPS) else 1) * 2 * m * n * k


def add2_bytes(numel: int, element_size: int) -> int:
    """2 reads + 1 write: the least traffic of ``a + b`` (also used for forward+backward, whose
    backward needs no traffic at all: both gradients are the incoming gradient)."""
    return 3 * numel * element_size


def rate(work: float, ms: float, unit: str) -> float:
    """``work`` (FLOP or bytes) done in ``ms`` milliseconds, in TFLOP/s or GB/s."""
    if not ms or ms <= 0 or not math.isfinite(ms):
        return math.nan
    scale = 1e12 if unit == "TFLOP/s" else 1e9
    return work / (ms * 1e-3) / scale


def geomean(values: Sequence[float | None]) -> float | None:
    """Geometric mean of the positive finite values (None when there are none)."""
    xs = [v for v in values if v is not None and math.isfinite(v) and v > 0]
    if not xs:
        return None
    return math.exp(sum(math.log(v) for v in xs) / len(xs))


def rotation_sets(input_bytes: int, l2_bytes: int, max_sets: int = 64) -> int:
    """How many input sets to cycle through so that one pass over them is at least twice L2:
    then each call finds its inputs in device memory, not left in L2 by the previous call."""
    if input_bytes <= 0:
        return 1
    return max(1, min(max_sets, math.ceil(2 * l2_bytes / input_bytes)))


def gemm_input_bytes(op: str, m: int, n: int, k: int, es: int) -> int:
    """Bytes of one input set of a GEMM row (what a cache could keep between calls)."""
    return (
        es
        * {
            "fwd": m * k + n * k + n,
            "sm80": m * k + n * k + n,
            "dgrad": m * n + n * k,
            "wgrad": m * n + m * k,
            "fwdbwd": m * k + n * k + n + m * n,
        }[op]
    )


def gemm_memory_bytes(op: str, m: int, n: int, k: int, es: int, n_sets: int) -> int:
    """A generous estimate of the device memory a GEMM row needs: its input sets, ours' and
    base's outputs alive together during the check, plus one spare output."""
    outputs = {
        "fwd": m * n,
        "sm80": m * n,
        "dgrad": m * k,
        "wgrad": n * k,
        "fwdbwd": m * n + m * k + n * k + n,
    }[op]
    return es * (n_sets * gemm_input_bytes(op, m, n, k, 1) + 3 * outputs) + outputs  # + bool mask


def linact_input_bytes(m: int, n: int, k: int, es: int) -> int:
    """One input set of a linact row: x, W, b and the incoming gradient dY."""
    return es * (m * k + n * k + n + m * n)


def linact_memory_bytes(m: int, n: int, k: int, es: int, n_sets: int) -> int:
    """A generous estimate for a linact row: the input sets; per side y, the saved
    pre-activation, its gradient, dX, dW, db (ours' and base's alive together, plus one spare);
    the float64 reference (256 full rows and columns of the pre-activation, a chunk of x)."""
    per_side = 3 * m * n + m * k + n * k + n
    ref64 = 8 * (4 * SAMPLE * (m + n + k) + REF_CHUNK_ELEMENTS)
    return es * (n_sets * (m * k + n * k + n + m * n) + 3 * per_side) + ref64


def add2_memory_bytes(op: str, numel: int, es: int, n_sets: int) -> int:
    per_set = (2 if op == "fwd" else 3) * numel
    outputs = (1 if op == "fwd" else 3) * numel
    return es * (n_sets * per_set + 3 * outputs) + outputs


# ---------------------------------------------------------------------------------------------
# The plan: which rows to run
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RowSpec:
    """One row to measure. ``shape`` is (M, N, K) for "gemm" and "linact", (numel,) for "add2"."""

    group: str  # "gemm" | "linact" | "add2"
    op: str  # GEMM_OPS, LINACT_OPS (the baseline) or ADD2_OPS
    precision: str  # PRECISIONS key ("fp32" = IEEE float32 for GEMMs, plain float32 for add2)
    shape: tuple[int, ...]
    shape_set: str | None = None  # "transformer" for the rows of --shapes transformer

    @property
    def label(self) -> str:
        return "x".join(str(s) for s in self.shape)

    def meta(self) -> dict[str, Any]:
        """The row's identity and work, the first fields of its JSON record."""
        es = torch.empty((), dtype=PRECISIONS[self.precision].dtype).element_size()
        if self.group in ("gemm", "linact"):
            m, n, k = self.shape
            unit, work = "TFLOP/s", gemm_flops(self.op, m, n, k)
        else:
            unit, work = "GB/s", add2_bytes(self.shape[0], es)
        meta = {
            "group": self.group,
            "op": self.op,
            "precision": self.precision,
            "dtype": str(PRECISIONS[self.precision].dtype).removeprefix("torch."),
            "shape": list(self.shape),
            "label": self.label,
            "unit": unit,
            "work": work,
        }
        if self.shape_set:
            meta["shape_set"] = self.shape_set
        return meta


def plan_rows(
    quick: bool,
    dtypes: Sequence[str],
    what: Sequence[str],
    gemm_shapes: Sequence[tuple[int, int, int]] | None = None,
    shape_set: str | None = None,
) -> list[RowSpec]:
    """The rows of a run, most important and most predictable first (the run time limit skips
    the tail): 16-bit GEMMs (bf16, then fp16), add2, float32 "highest" GEMMs, linact (bf16; its
    torch.compile baseline compiles first), then the TF32 GEMMs (no target). ``--quick``: fewer
    shapes, add2 in bf16 only, float32 only "highest" at 4096^3. ``gemm_shapes`` (``--shapes``):
    only 16-bit GEMM rows, of these shapes, tagged with ``shape_set``."""
    gemm_ops = [op for op in GEMM_OPS if op in what]
    if gemm_shapes is not None:
        return [
            RowSpec("gemm", op, prec, tuple(shape), shape_set)
            for prec in ("bf16", "fp16")
            if prec in dtypes
            for shape in gemm_shapes
            for op in gemm_ops
        ]
    fp32_ops = gemm_ops or list(GEMM_OPS)  # the GEMM ops asked for, or all when --what named none
    fp32 = "fp32" in what and "fp32" in dtypes
    rows: list[RowSpec] = []
    for prec in ("bf16", "fp16"):
        if prec in dtypes:
            for shape in QUICK_SHAPES if quick else GEMM_SHAPES:
                rows += [RowSpec("gemm", op, prec, shape) for op in gemm_ops]
    if "add2" in what:
        for prec in ("bf16",) if quick else ("bf16", "fp32"):
            if prec in dtypes:
                for numel in ADD2_SIZES:
                    rows += [RowSpec("add2", op, prec, (numel,)) for op in ADD2_OPS]
    if fp32:
        for shape in FP32_QUICK_SHAPES if quick else FP32_SHAPES:
            rows += [RowSpec("gemm", op, "fp32", shape) for op in fp32_ops]
    if "linact" in what and "bf16" in dtypes:
        for shape in LINACT_QUICK_SHAPES if quick else LINACT_SHAPES:
            rows += [RowSpec("linact", op, "bf16", shape) for op in LINACT_OPS]
    if fp32 and not quick:
        for shape in FP32_SHAPES:
            rows += [RowSpec("gemm", op, "tf32", shape) for op in fp32_ops]
    return rows


# ---------------------------------------------------------------------------------------------
# Correctness: float64 reference on a sampled submatrix
# ---------------------------------------------------------------------------------------------


def rel_err(x: Tensor, ref64: Tensor) -> float:
    """``||x - ref|| / ||ref||`` in float64 (the absolute error when ``ref`` is zero)."""
    if ref64.numel() == 0:
        return 0.0
    diff = torch.linalg.vector_norm(x.detach().double() - ref64).item()
    denom = torch.linalg.vector_norm(ref64).item()
    return diff / denom if denom > 0 else diff


def sample_index(n: int, count: int, gen: torch.Generator, device) -> Tensor:
    """``count`` sorted distinct random indices in [0, n) (all of them when n <= count)."""
    if n <= count:
        return torch.arange(n, device=device)
    return torch.randperm(n, generator=gen)[:count].sort().values.to(device)


def take(t: Tensor, rows: Tensor | None, cols: Tensor) -> Tensor:
    """The sampled part of an output: ``t[rows][:, cols]`` (``t[cols]`` for a 1-D ``t``)."""
    if t.dim() == 1:
        return t.index_select(0, cols)
    return t.index_select(0, rows).index_select(1, cols)


def sampled_mm(a: Tensor, b: Tensor, rows: Tensor, cols: Tensor) -> Tensor:
    """``(a @ b)[rows][:, cols]`` computed in float64 from the (already rounded) inputs."""
    return a.detach().index_select(0, rows).double() @ b.detach().index_select(1, cols).double()


def compare_outputs(items: dict[str, tuple], floor: float) -> dict[str, Any]:
    """The accuracy rule for each named output ``(ours, base, ref64, rows, cols)``: ours is
    finite everywhere, has base's shape and dtype, and ``err(ours) <= 2 * err(base) + floor``
    on the sampled elements, errors being relative to the float64 reference ``ref64``."""
    outputs, parts, ok_all = {}, [], True
    for name, (ours, base, ref64, rows, cols) in items.items():
        ours, base = ours.detach(), base.detach()
        meta_ok = ours.shape == base.shape and ours.dtype == base.dtype
        nonfinite = int((~torch.isfinite(ours)).sum()) if meta_ok else -1
        ours_s, base_s = (
            (take(ours, rows, cols), take(base, rows, cols)) if meta_ok else (None, None)
        )
        e_ours = rel_err(ours_s, ref64) if meta_ok else math.nan
        e_base = rel_err(base_s, ref64) if meta_ok else math.nan
        bound = 2 * e_base + floor
        ok = meta_ok and nonfinite == 0 and e_ours <= bound  # False for NaN errors too
        ok_all &= ok
        outputs[name] = {
            "ok": ok,
            "err_ours": e_ours,
            "err_torch": e_base,
            "err_ours_vs_torch": rel_err(ours_s, base_s.double()) if meta_ok else math.nan,
            "bound": bound,
            "nonfinite": nonfinite,
            "shape_dtype_ok": meta_ok,
        }
        if not meta_ok:
            parts.append(
                f"{name}: got {tuple(ours.shape)} {ours.dtype}, "
                f"torch {tuple(base.shape)} {base.dtype}"
            )
        elif nonfinite:
            parts.append(f"{name}: {nonfinite} non-finite element(s)")
        else:
            parts.append(f"{name}: err {e_ours:.2e} ({'<=' if ok else '>'} bound {bound:.2e})")
    return {"ok": ok_all, "floor": floor, "outputs": outputs, "summary": "; ".join(parts)}


def poison(numels: Sequence[int], dtype: torch.dtype, device) -> None:
    """Frees NaN-filled blocks of these sizes so that the caching allocator likely hands them to
    the next outputs: an element the kernel never writes then reads as NaN. CUDA only."""
    if torch.device(device).type != "cuda":
        return
    blocks = [torch.full((max(n, 1),), math.nan, dtype=dtype, device=device) for n in numels]
    del blocks


# ---------------------------------------------------------------------------------------------
# Cases: the two functions to time and the correctness check of one row
# ---------------------------------------------------------------------------------------------


@dataclass
class Case:
    """What a builder hands to :func:`run_row`.

    ``fns``: ``{"ours": f, "base": f}``, ``f(set_index)`` runs the operation once on input set
    ``set_index`` (0 <= set_index < n_sets). ``check()`` returns :func:`compare_outputs`' record.
    ``context()`` is entered around the check and the timing (precision mode, forced SM80).
    ``kernel_name()`` names the cutlass_nn kernel that ran last (read right after the check).
    """

    fns: dict[str, Callable[[int], Any]]
    check: Callable[[], dict]
    n_sets: int = 1
    context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    kernel_name: Callable[[], str] = ops.last_kernel_name


@contextlib.contextmanager
def precision_context(prec: Precision) -> Iterator[None]:
    """Sets TF32 on or off for float32 matmuls (legacy API only, like tests/cuda_helpers.py:
    torch refuses a mix of the legacy and the new fp32_precision APIs); restores it after."""
    if prec.tf32 is None:
        yield
        return
    previous = torch.get_float32_matmul_precision()
    previous_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = prec.tf32
    torch.set_float32_matmul_precision("high" if prec.tf32 else "highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)
        torch.backends.cuda.matmul.allow_tf32 = previous_tf32


@contextlib.contextmanager
def row_context(prec: Precision, sm80: bool) -> Iterator[None]:
    with precision_context(prec), ops.force_sm80_kernels() if sm80 else contextlib.nullcontext():
        yield


def guard_memory(need_bytes: int, device) -> None:
    """Raises SkipRow when a row would need more than ~85% of the free device memory."""
    if torch.device(device).type != "cuda":
        return
    free, _total = torch.cuda.mem_get_info()
    avail = free + torch.cuda.memory_reserved() - torch.cuda.memory_allocated()
    if need_bytes > 0.85 * avail:
        raise SkipRow(
            f"skipped: needs about {need_bytes / 2**30:.1f} GiB of device memory, "
            f"{avail / 2**30:.1f} GiB available"
        )


def build_gemm_case(
    op: str,
    m: int,
    n: int,
    k: int,
    prec: Precision,
    *,
    l2_bytes: int = DEFAULT_L2_BYTES,
    device="cuda",
    seed: int = 0,
) -> Case:
    """A GEMM row: forward (with bias; "sm80" the same under force_sm80_kernels), dgrad, wgrad,
    or a whole CutlassLinear forward+backward against nn.Linear with the same parameters."""
    dtype = prec.dtype
    es = torch.empty((), dtype=dtype).element_size()
    n_sets = rotation_sets(gemm_input_bytes(op, m, n, k, es), l2_bytes)
    guard_memory(gemm_memory_bytes(op, m, n, k, es, n_sets), device)
    gen = torch.Generator(device=device).manual_seed(seed)
    sample_gen = torch.Generator().manual_seed(seed)  # CPU: randperm of the sampled indices

    def rnd(*shape: int) -> Tensor:
        return torch.randn(shape, dtype=dtype, device=device, generator=gen)

    def context():
        return row_context(prec, op == "sm80")

    if op == "fwdbwd":
        return _fwdbwd_case(m, n, k, prec, rnd, n_sets, sample_gen, device, context)

    # ours(*inputs), base(*inputs), ref(*inputs, rows, cols) and the output's [rows, cols]
    if op in ("fwd", "sm80"):
        sets = [(rnd(m, k), rnd(n, k), rnd(n)) for _ in range(n_sets)]
        ours, base = cutlass_nn.functional.linear, F.linear

        def ref(x, w, b, rows, cols):
            return sampled_mm(x, w.t(), rows, cols) + b.index_select(0, cols).double()

        out_rows, out_cols = m, n
    elif op == "dgrad":  # dX[M, K] = dY[M, N] @ W[N, K]
        sets = [(rnd(m, n), rnd(n, k)) for _ in range(n_sets)]
        ours, base = ops.linear_dgrad, torch.matmul

        def ref(dy, w, rows, cols):
            return sampled_mm(dy, w, rows, cols)

        out_rows, out_cols = m, k
    elif op == "wgrad":  # dW[N, K] = dY[M, N]^T @ X[M, K]
        sets = [(rnd(m, n), rnd(m, k)) for _ in range(n_sets)]
        ours = ops.linear_wgrad

        def base(dy, x):
            return dy.t() @ x

        def ref(dy, x, rows, cols):
            return sampled_mm(dy.t(), x, rows, cols)

        out_rows, out_cols = n, k
    else:
        raise ValueError(f"unknown GEMM op {op!r}")

    def check() -> dict:
        args = sets[0]
        base_out = base(*args)
        poison([out_rows * out_cols], dtype, device)
        ours_out = ours(*args)  # last, so that kernel_name() names its kernel
        rows = sample_index(out_rows, SAMPLE, sample_gen, device)
        cols = sample_index(out_cols, SAMPLE, sample_gen, device)
        ref64 = ref(*args, rows, cols)
        return compare_outputs({"out": (ours_out, base_out, ref64, rows, cols)}, prec.floor)

    fns = {"ours": lambda i: ours(*sets[i]), "base": lambda i: base(*sets[i])}
    return Case(fns=fns, check=check, n_sets=n_sets, context=context)


def _fwdbwd_case(m, n, k, prec, rnd, n_sets, sample_gen, device, context) -> Case:
    """CutlassLinear vs nn.Linear sharing the same parameters; one step = zero the gradients
    (set_to_none), forward, backward with a random grad_output (input, weight, bias gradients)."""
    sets = []
    for _ in range(n_sets):
        lin = nn.Linear(k, n, bias=True, device="meta", dtype=prec.dtype)
        lin.weight = nn.Parameter(rnd(n, k))
        lin.bias = nn.Parameter(rnd(n))
        sets.append(
            SimpleNamespace(
                x=rnd(m, k).requires_grad_(True),
                dy=rnd(m, n),
                base=lin,
                ours=cutlass_nn.CutlassLinear.from_linear(lin),  # shares lin's parameters
            )
        )

    def step(s, module) -> None:
        s.base.zero_grad(set_to_none=True)  # the parameters of both modules
        s.x.grad = None
        module(s.x).backward(s.dy)

    def check() -> dict:
        s = sets[0]
        got = {}
        for name in ("base", "ours"):  # ours last: kernel_name() then names its last GEMM
            if name == "ours":
                poison([m * n, m * k, n * k], prec.dtype, device)
            s.base.zero_grad(set_to_none=True)
            s.x.grad = None
            y = getattr(s, name)(s.x)
            y.backward(s.dy)
            got[name] = {
                "y": y.detach(),
                "dx": s.x.grad,
                "dw": s.base.weight.grad,
                "db": s.base.bias.grad,
            }
        s.base.zero_grad(set_to_none=True)
        s.x.grad = None
        x, w, b, dy = s.x.detach(), s.base.weight.detach(), s.base.bias.detach(), s.dy
        rm, rn = (sample_index(d, SAMPLE, sample_gen, device) for d in (m, n))
        cn, ck = (sample_index(d, SAMPLE, sample_gen, device) for d in (n, k))
        refs = {
            "y": (sampled_mm(x, w.t(), rm, cn) + b.index_select(0, cn).double(), rm, cn),
            "dx": (sampled_mm(dy, w, rm, ck), rm, ck),
            "dw": (sampled_mm(dy.t(), x, rn, ck), rn, ck),
            "db": (dy.index_select(1, cn).double().sum(0), None, cn),
        }
        items = {key: (got["ours"][key], got["base"][key], *ref) for key, ref in refs.items()}
        return compare_outputs(items, prec.floor)

    fns = {
        "ours": lambda i: step(sets[i], sets[i].ours),
        "base": lambda i: step(sets[i], sets[i].base),
    }
    return Case(fns=fns, check=check, n_sets=n_sets, context=context)


def make_linact_module(in_features: int, out_features: int, dtype: torch.dtype) -> nn.Module:
    """``cutlass_nn.CutlassLinear(..., activation="gelu_tanh")`` on the meta device (the caller
    gives it real parameters). SkipRow when this cutlass_nn has no ``activation`` argument."""
    try:
        return cutlass_nn.CutlassLinear(
            in_features,
            out_features,
            bias=True,
            device="meta",
            dtype=dtype,
            activation=LINACT_ACTIVATION,
        )
    except TypeError as exc:
        raise SkipRow(
            "skipped: this cutlass_nn has no CutlassLinear(activation=...) "
            f"({_first_line(exc, 150)})"
        ) from exc


def compile_baseline(module: nn.Module) -> Callable[[Tensor], Tensor]:
    """The torch.compile baseline of a linact row: default mode, static shapes (one compile per
    shape, the fastest code inductor makes for it)."""
    return torch.compile(module, dynamic=False)


def gelu_tanh_reference(
    x: Tensor, w: Tensor, b: Tensor, dy: Tensor, rm: Tensor, cn: Tensor, ck: Tensor
) -> dict[str, tuple[Tensor, Tensor | None, Tensor]]:
    """Float64 reference of ``y = gelu_tanh(x @ w.T + b)`` and of its gradients for the
    incoming gradient ``dy``, on sampled elements: ``{name: (ref64, rows, cols)}`` for y [rm, cn],
    dx [rm, ck], dw [cn, ck] and db [cn]. dx needs the pre-activation of the sampled rows over all
    N columns, dw and db that of all M rows over the sampled columns."""
    x, w, b, dy = x.detach(), w.detach(), b.detach(), dy.detach()
    m, k = x.shape
    n = w.shape[0]
    z_rows = sampled_mm(x, w.t(), rm, torch.arange(n, device=x.device)) + b.double()  # [r, N]
    dz_rows = torch.ops.aten.gelu_backward(
        dy.index_select(0, rm).double(), z_rows, approximate="tanh"
    )
    w_cols = w.index_select(0, cn).double()  # [c, K]
    chunk = max(1, REF_CHUNK_ELEMENTS // max(k, 1))
    z_cols = (
        torch.cat([x[i : i + chunk].double() @ w_cols.t() for i in range(0, m, chunk)])
        + b.index_select(0, cn).double()
    )  # [M, c]
    dz_cols = torch.ops.aten.gelu_backward(
        dy.index_select(1, cn).double(), z_cols, approximate="tanh"
    )
    return {
        "y": (F.gelu(z_rows.index_select(1, cn), approximate="tanh"), rm, cn),
        "dx": (dz_rows @ w.index_select(1, ck).double(), rm, ck),
        "dw": (dz_cols.t() @ x.index_select(1, ck).double(), cn, ck),
        "db": (dz_cols.sum(0), None, cn),
    }


def build_linact_case(
    op: str,
    m: int,
    n: int,
    k: int,
    prec: Precision,
    *,
    l2_bytes: int = DEFAULT_L2_BYTES,
    device="cuda",
    seed: int = 0,
) -> Case:
    """Linear + bias + GELU(tanh), forward+backward: ours is ``CutlassLinear(K, N,
    activation="gelu_tanh")``, the baseline ``nn.Sequential(nn.Linear, nn.GELU("tanh"))`` run
    eagerly (op "eager") or through ``torch.compile`` (op "compile"), all three sharing the same
    parameters. One step = zero the gradients (set_to_none), forward, backward(dY)."""
    if op not in LINACT_OPS:
        raise ValueError(f"unknown linact op {op!r}")
    dtype = prec.dtype
    es = torch.empty((), dtype=dtype).element_size()
    n_sets = rotation_sets(linact_input_bytes(m, n, k, es), l2_bytes)
    guard_memory(linact_memory_bytes(m, n, k, es, n_sets), device)
    gen = torch.Generator(device=device).manual_seed(seed)
    sample_gen = torch.Generator().manual_seed(seed)

    def rnd(*shape: int) -> Tensor:
        return torch.randn(shape, dtype=dtype, device=device, generator=gen)

    if op == "compile":
        from torch import _dynamo  # heavy: imported only when a compile row runs

        _dynamo.reset()  # a fresh cache per row: no recompile limit, no dynamic shapes
    sets = []
    for _ in range(n_sets):
        ours = make_linact_module(k, n, dtype)
        lin = nn.Linear(k, n, bias=True, device="meta", dtype=dtype)
        lin.weight = nn.Parameter(rnd(n, k))
        lin.bias = nn.Parameter(rnd(n))
        ours.weight, ours.bias = lin.weight, lin.bias  # shared, as the baseline's
        eager = nn.Sequential(lin, nn.GELU(approximate="tanh"))
        sets.append(
            SimpleNamespace(
                x=rnd(m, k).requires_grad_(True),
                dy=rnd(m, n),
                lin=lin,
                ours=ours,
                base=eager if op == "eager" else compile_baseline(eager),
            )
        )

    def zero(s) -> None:
        s.lin.zero_grad(set_to_none=True)  # the parameters of all three modules
        s.x.grad = None

    def step(s, module) -> None:
        zero(s)
        module(s.x).backward(s.dy)

    def check() -> dict:
        s = sets[0]
        got = {}
        for name in ("base", "ours"):  # ours last: kernel_name() then names its last GEMM
            if name == "ours":
                poison([m * n, m * n, m * k, n * k], dtype, device)
            zero(s)
            y = getattr(s, name)(s.x)
            y.backward(s.dy)
            got[name] = {"y": y.detach(), "dx": s.x.grad, "dw": s.lin.weight.grad}
            got[name]["db"] = s.lin.bias.grad
        zero(s)
        rm = sample_index(m, SAMPLE, sample_gen, device)
        cn = sample_index(n, SAMPLE, sample_gen, device)
        ck = sample_index(k, SAMPLE, sample_gen, device)
        refs = gelu_tanh_reference(s.x, s.lin.weight, s.lin.bias, s.dy, rm, cn, ck)
        items = {key: (got["ours"][key], got["base"][key], *ref) for key, ref in refs.items()}
        result = compare_outputs(items, prec.floor)
        for other in sets[1:]:  # compile (and warm) the baseline on every input set now
            step(other, other.base)
            zero(other)
        return result

    fns = {
        "ours": lambda i: step(sets[i], sets[i].ours),
        "base": lambda i: step(sets[i], sets[i].base),
    }
    return Case(fns=fns, check=check, n_sets=n_sets, context=lambda: precision_context(prec))


def build_add2_case(
    op: str,
    numel: int,
    prec: Precision,
    *,
    l2_bytes: int = DEFAULT_L2_BYTES,
    device="cuda",
    seed: int = 0,
) -> Case:
    """cutlass_nn.add2(a, b) vs a + b: forward, or forward+backward (with a random grad_output)."""
    dtype = prec.dtype
    es = torch.empty((), dtype=dtype).element_size()
    n_sets = rotation_sets((2 if op == "fwd" else 3) * numel * es, l2_bytes)
    guard_memory(add2_memory_bytes(op, numel, es, n_sets), device)
    gen = torch.Generator(device=device).manual_seed(seed)
    sample_gen = torch.Generator().manual_seed(seed)

    def rnd() -> Tensor:
        return torch.randn((numel,), dtype=dtype, device=device, generator=gen)

    grad = op == "fwdbwd"
    sets = [
        SimpleNamespace(
            a=rnd().requires_grad_(grad), b=rnd().requires_grad_(grad), dy=rnd() if grad else None
        )
        for _ in range(n_sets)
    ]
    impls = {"ours": cutlass_nn.add2, "base": torch.add}

    def step(s, fn):
        if not grad:
            return fn(s.a, s.b)
        s.a.grad = None
        s.b.grad = None
        fn(s.a, s.b).backward(s.dy)
        return None

    def check() -> dict:
        s = sets[0]
        got = {}
        for name in ("base", "ours"):
            if name == "ours":
                poison([numel] * (3 if grad else 1), dtype, device)
            s.a.grad = s.b.grad = None
            y = impls[name](s.a, s.b)
            if grad:
                y.backward(s.dy)
            got[name] = {"y": y.detach(), "da": s.a.grad, "db": s.b.grad}
        s.a.grad = s.b.grad = None
        idx = sample_index(numel, SAMPLE * SAMPLE, sample_gen, device)
        a, b = s.a.detach(), s.b.detach()
        refs = {"y": a.index_select(0, idx).double() + b.index_select(0, idx).double()}
        if grad:
            refs["da"] = refs["db"] = s.dy.index_select(0, idx).double()
        items = {
            key: (got["ours"][key], got["base"][key], ref, None, idx) for key, ref in refs.items()
        }
        return compare_outputs(items, prec.floor)

    fns = {name: (lambda i, fn=fn: step(sets[i], fn)) for name, fn in impls.items()}
    return Case(fns=fns, check=check, n_sets=n_sets, kernel_name=lambda: "")


def build_case(spec: RowSpec, *, l2_bytes: int = DEFAULT_L2_BYTES, device="cuda") -> Case:
    """The Case of a planned row, with inputs seeded from the row's identity."""
    seed = zlib.crc32(f"{spec.group}/{spec.op}/{spec.precision}/{spec.label}".encode())
    prec = PRECISIONS[spec.precision]
    if spec.group == "gemm":
        return build_gemm_case(
            spec.op, *spec.shape, prec, l2_bytes=l2_bytes, device=device, seed=seed
        )
    if spec.group == "linact":
        return build_linact_case(
            spec.op, *spec.shape, prec, l2_bytes=l2_bytes, device=device, seed=seed
        )
    return build_add2_case(
        spec.op, spec.shape[0], prec, l2_bytes=l2_bytes, device=device, seed=seed
    )


# ---------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------

Timer = Callable[[dict[str, Callable[[int], Any]], int], dict[str, list[float]]]


class CudaTimer:
    """Times functions against each other with CUDA events, interleaved (see the module doc).

    ``timer(fns, n_sets)`` returns ``{name: [milliseconds of each repetition]}``.
    """

    def __init__(self, settings: Settings):
        self.settings = settings
        self.cycles_per_ms = self._calibrate_sleep()

    def with_settings(self, settings: Settings) -> CudaTimer:
        """The same timer (sleep calibration included) with other settings."""
        other = copy.copy(self)
        other.settings = settings
        return other

    @staticmethod
    def _calibrate_sleep() -> float | None:
        """GPU clock cycles per millisecond of ``torch.cuda._sleep`` (None: not available; the
        repetitions then run without the head start, and small kernels include launch latency)."""
        try:
            torch.cuda._sleep(1000)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.cuda._sleep(2_000_000)
            end.record()
            end.synchronize()
            ms = start.elapsed_time(end)
            return 2_000_000 / ms if ms > 0 else None
        except Exception:  # a private API: never let it stop the benchmark
            return None

    def _sleep_cycles(self, host_ms: float) -> int:
        """A head start of 1.5x the host time of one repetition (+ 20 us), at most 50 ms."""
        if not self.cycles_per_ms:
            return 0
        return int(min(1.5 * host_ms + 0.02, 50.0) * self.cycles_per_ms)

    @staticmethod
    def _repetition(order, call, sleep_cycles: int) -> dict[str, float]:
        torch.cuda.synchronize()  # barrier: nothing of the previous repetition is still running
        if sleep_cycles:
            torch.cuda._sleep(sleep_cycles)  # keeps the GPU busy while the host queues the rest
        events = []
        for name in order:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            call(name)
            end.record()
            events.append((name, start, end))
        events[-1][2].synchronize()
        return {name: start.elapsed_time(end) for name, start, end in events}

    def __call__(self, fns: dict[str, Callable[[int], Any]], n_sets: int) -> dict[str, list[float]]:
        s = self.settings
        names = list(fns)
        counter = itertools.count()  # one counter for all sides: consecutive calls use other sets

        def call(name: str) -> None:
            fns[name](next(counter) % n_sets)

        host_ms = dict.fromkeys(names, 0.0)
        for _ in range(max(s.warmup, 1)):
            for name in names:
                t0 = time.perf_counter()
                call(name)
                host_ms[name] = (time.perf_counter() - t0) * 1e3  # the last (warm) pass counts
        sleep = self._sleep_cycles(sum(host_ms.values()))
        probe = self._repetition(names, call, sleep)  # one repetition sizes the rest
        per_rep = max(sum(probe.values()), 1e-3)
        reps = int(min(max(s.budget_ms / per_rep, s.min_reps), s.max_reps))
        if per_rep * reps > s.row_cap_ms:  # a very slow row: fewer repetitions, never below 3
            reps = max(3, int(s.row_cap_ms / per_rep))
        times: dict[str, list[float]] = {name: [] for name in names}
        for r in range(reps):
            order = names if r % 2 == 0 else names[::-1]  # alternate which side goes first
            for name, ms in self._repetition(order, call, sleep).items():
                times[name].append(ms)
        return times

    def eager(
        self, fns: dict[str, Callable[[int], Any]], n_sets: int, calls: int = EAGER_CALLS
    ) -> dict[str, list[float]]:
        """What an eager user waits for: per side, ``calls`` times ``synchronize, event, one
        call, event`` (the GPU idles while the host enqueues the call, so host cost shows),
        sides alternating; ``{name: [milliseconds of each call]}``."""
        names = list(fns)
        counter = itertools.count()
        out: dict[str, list[float]] = {name: [] for name in names}
        for r in range(calls):
            for name in names if r % 2 == 0 else names[::-1]:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize()
                start.record()
                fns[name](next(counter) % n_sets)
                end.record()
                end.synchronize()
                out[name].append(start.elapsed_time(end))
        return out


def release_memory() -> None:
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------
# Rows
# ---------------------------------------------------------------------------------------------


def _first_line(exc: BaseException, limit: int = 300) -> str:
    text = str(exc).strip().splitlines()
    msg = f"{type(exc).__name__}: {text[0] if text else ''}"
    return msg if len(msg) <= limit else msg[: limit - 3] + "..."


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


# ---------------------------------------------------------------------------------------------
# --sweep: every SM90 tile configuration (and tile-scheduler swizzle) of each GEMM shape
# ---------------------------------------------------------------------------------------------

SetConfig = Callable[..., list[int]]  # set_config(config, swizzle, splits=0) -> previous


def parse_config_names(text: str) -> list[str]:
    """The names of ``torch.ops.cutlass_nn._gemm_configs()``: one per line, a configuration's
    index is its line number ("" in the CPU flavor: no configuration)."""
    return [line.strip() for line in text.splitlines()]


def is_stream_k(name: str) -> bool:
    """Whether a configuration (by its name) uses the stream-K tile scheduler, the only one that
    reads the ``splits`` of ``_set_gemm_config``."""
    return "streamk" in name.lower()


def _too_many_arguments(exc: Exception) -> bool:
    """Whether calling the setter with (config, swizzle, splits) failed because it takes only
    (config, swizzle): a build from before ``splits`` (torch's schema check says "expected at
    most 2 argument(s)"; a Python stand-in raises TypeError)."""
    if isinstance(exc, TypeError):
        return True
    return bool(re.search(r"expected at most \d+ argument", str(exc)))


class ConfigSetter:
    """``set_config(config, swizzle, splits=0)``: forces a configuration through ``setter`` (the
    operator ``_set_gemm_config``) and returns the previous setting as a list (``[config,
    swizzle, splits]``, or ``[config, swizzle]`` from an older build; ``set_config(*previous)``
    restores either). An older setter that takes no ``splits`` still serves splits == 0; other
    splits raise RuntimeError. ``takes_splits``: True / False, or None until the first call shows
    it (when the setter has no schema to read)."""

    def __init__(self, setter: Callable[..., Any], takes_splits: bool | None = None):
        self.setter = setter
        self.takes_splits = takes_splits

    def __call__(self, config: int, swizzle: int, splits: int = 0) -> list[int]:
        config, swizzle, splits = int(config), int(swizzle), int(splits)
        if self.takes_splits is not False:
            try:
                previous = self.setter(config, swizzle, splits)
            except (TypeError, RuntimeError) as exc:
                if self.takes_splits or not _too_many_arguments(exc):
                    raise
                self.takes_splits = False
            else:
                self.takes_splits = True
                return [int(v) for v in previous]
        if splits != 0:
            raise RuntimeError(
                f"this cutlass_nn build's _set_gemm_config takes no splits argument (only config "
                f"and swizzle): cannot force splits={splits}; rebuild cutlass_nn, or sweep with "
                "--sweep-splits 0"
            )
        return [int(v) for v in self.setter(config, swizzle)]


def _schema_takes_splits(setter: Any) -> bool | None:
    """From the operator's schema: whether it has a third argument (None: no schema to read)."""
    try:
        return len(setter.default._schema.arguments) >= 3
    except Exception:
        return None


def gemm_config_api() -> tuple[list[str], SetConfig]:
    """The configuration names and the setter ``set_config(config, swizzle, splits=0)`` (a
    ConfigSetter: returns the previous setting). RuntimeError when this build has no such
    operators."""
    namespace = torch.ops.cutlass_nn
    try:
        text = namespace._gemm_configs()
        setter = namespace._set_gemm_config
    except (AttributeError, RuntimeError) as exc:
        raise RuntimeError(
            "this cutlass_nn build has no configuration override "
            f"(torch.ops.cutlass_nn._gemm_configs / _set_gemm_config): {_first_line(exc)}"
        ) from exc
    return parse_config_names(text), ConfigSetter(setter, _schema_takes_splits(setter))


def sweep_variants(
    names: Sequence[str], swizzles: Sequence[int], splits: Sequence[int] = SWEEP_SPLITS
) -> list[tuple[int, int, int]]:
    """(config, swizzle, splits) of a sweep: the automatic rule first, then every configuration
    (by index into ``names``) with every swizzle asked for, and every splits asked for when the
    configuration is a stream-K one (the others ignore splits: 0 only, once)."""
    variants = [AUTO_CONFIG]
    for c, name in enumerate(names):
        ks = list(dict.fromkeys(splits)) if is_stream_k(name) else [0]
        variants += [(c, s, k) for s in swizzles for k in ks]
    return variants


def variant_key(config: int, swizzle: int, splits: int = 0) -> str:
    """ "auto" for the rule's own choice, else e.g. "c3/s4" (config 3, swizzle 4, splits the
    rule's) or "c2/s1/k4" (split-K into 4)."""
    if (config, swizzle, splits) == AUTO_CONFIG:
        return "auto"
    key = f"{'auto' if config < 0 else f'c{config}'}/s{swizzle}"
    return f"{key}/k{splits}" if splits else key


def sweep_plan(
    dtypes: Sequence[str], shapes: Sequence[tuple[int, int, int]], ops_: Sequence[str]
) -> list[tuple[str, tuple[int, int, int], str]]:
    """(precision, shape, op) of each timed group of a sweep, in order."""
    return [(p, shape, op) for p in dtypes for shape in shapes for op in ops_]


def _with_config(
    set_config: SetConfig, config: int, swizzle: int, splits: int, fn: Callable[[int], Any]
):
    def run(i: int) -> Any:
        set_config(config, swizzle, splits)  # host state only: read by the next launch
        return fn(i)

    return run


def run_sweep_group(
    case: Case,
    variants: Sequence[tuple[int, int, int]],
    set_config: SetConfig,
    timer_for: Callable[[int], Timer],
    *,
    kernel_name: Callable[[], str] = ops.last_kernel_name,
    healthy: Callable[[], bool] = lambda: True,
) -> tuple[list[dict], dict | None, bool]:
    """One (shape, op) of the sweep. Each variant (config, swizzle, splits) is forced and checked
    like a row (a configuration that cannot run the shape raises: status "error" with the message's
    first line; a wrong result: "FAIL"); then the baseline and every variant that passed are timed
    together, interleaved (``timer_for(n_variants)``). The configuration in force before is
    restored at the end, also after an error. Returns (entries, baseline stats or None, whether
    the CUDA context is still usable)."""
    entries: list[dict] = []
    base_stats = None
    previous: list[int] | None = None
    context_ok = True
    try:
        with case.context():
            for config, swizzle, splits in variants:
                entry = {
                    "config": config,
                    "swizzle": swizzle,
                    "splits": splits,
                    "key": variant_key(config, swizzle, splits),
                    "status": "error",
                    "note": "",
                }
                entries.append(entry)
                if not context_ok:
                    entry["status"] = "skipped"
                    entry["note"] = "skipped: the CUDA context is unusable after an earlier error"
                    continue
                try:
                    prev = set_config(config, swizzle, splits)
                    if previous is None:
                        previous = prev
                    check = case.check()
                    entry["kernel"] = kernel_name()  # ours ran last in the check
                    entry["err_ours"], entry["err_torch"] = worst_errors({"check": check})
                    entry["status"] = "ok" if check["ok"] else "FAIL"
                    if not check["ok"]:
                        entry["note"] = f"wrong result, not timed: {check['summary']}"[:300]
                except Exception as exc:
                    entry["status"] = "error"
                    entry["note"] = _first_line(exc)
                    context_ok = healthy()
            timed = [e for e in entries if e["status"] == "ok"]
            if timed and context_ok:
                fns: dict[str, Callable[[int], Any]] = {"base": case.fns["base"]}
                for e in timed:
                    fns[e["key"]] = _with_config(
                        set_config, e["config"], e["swizzle"], e["splits"], case.fns["ours"]
                    )
                try:
                    times = timer_for(len(timed))(fns, case.n_sets)
                except Exception as exc:
                    for e in timed:
                        e["status"] = "error"
                        e["note"] = f"while timing: {_first_line(exc)}"
                    context_ok = healthy()
                else:
                    base_stats = time_stats(times["base"])
                    for e in timed:
                        e["ours"] = time_stats(times[e["key"]])
                        o = e["ours"]["median_ms"]
                        e["ratio"] = base_stats["median_ms"] / o if o > 0 else math.nan
    finally:
        if previous is not None:
            try:
                set_config(*previous)
            except Exception:
                if context_ok:  # with a broken context, the error that broke it matters more
                    raise
    return entries, base_stats, context_ok


def finish_sweep_entries(
    ident: dict, entries: Sequence[dict], base: dict | None, names: Sequence[str]
) -> list[dict]:
    """The JSON rows of one sweep group: identity (precision, op, shape, label, work), the
    configuration's name, the shared baseline statistics, and ours' rate."""
    rows = []
    for e in entries:
        row = dict(ident, **e)
        row["config_name"] = (
            "auto" if e["config"] < 0 else (names[e["config"]] if e["config"] < len(names) else "?")
        )
        if base is not None and "ours" in e:
            row["base"] = base
            row["ours_rate"] = rate(ident["work"], e["ours"]["median_ms"], "TFLOP/s")
            row["base_rate"] = rate(ident["work"], base["median_ms"], "TFLOP/s")
        rows.append(row)
    return rows


def sweep_best(rows: Sequence[dict]) -> list[dict]:
    """Per (precision, shape, op): the fastest measured variant (largest ratio) and the ratio and
    kernel of the automatic rule, for comparison."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        groups[(r["precision"], r["label"], r["op"])].append(r)
    out = []
    for (prec, label, op), rs in groups.items():
        measured = [r for r in rs if _good_ratio(r) is not None]
        auto = next((r for r in rs if r["key"] == "auto"), None)
        best = max(measured, key=lambda r: r["ratio"]) if measured else None
        out.append(
            {
                "precision": prec,
                "label": label,
                "op": op,
                "config": None if best is None else best["config"],
                "swizzle": None if best is None else best["swizzle"],
                "splits": None if best is None else best.get("splits", 0),
                "config_name": None if best is None else best["config_name"],
                "kernel": None if best is None else best.get("kernel"),
                "ratio": None if best is None else best["ratio"],
                "ours_median_ms": None if best is None else best["ours"]["median_ms"],
                "auto_ratio": None if auto is None else _good_ratio(auto),
                "auto_kernel": None if auto is None else auto.get("kernel"),
                "n_measured": len(measured),
            }
        )
    return out


_STATUS_CELL = {"FAIL": "FAIL", "error": "ERR", "skipped": "skip"}


def format_sweep_table(rows: Sequence[dict], names: Sequence[str], width: int = 6) -> list[str]:
    """The sweep as a table: one line per (precision, shape, op), one column per configuration
    ("auto" = the rule's choice, then c0, c1, ...); a cell is the best ratio (torch time / ours
    time) over the swizzles (and splits) tried, or ERR / FAIL / skip when none of them was
    measured."""
    lines = []
    legend = [f"c{i} {name}" for i, name in enumerate(names)]
    line = "configs:"
    for item in legend:
        if len(line) + len(item) + 3 > 190:
            lines.append(line)
            line = "        "
        line += f" {item} |"
    lines.append(line.rstrip(" |"))
    columns = ["auto"] + [f"c{i}" for i in range(len(names))]
    lines.append(
        "sweep: ratio = torch time / ours time, best over the swizzles and splits tried "
        "(>1: ours faster)"
    )
    lines.append(
        f"{'prec':<5} {'M x N x K':<18} {'op':<5} {'torch ms':>8}"
        + "".join(f"{c:>{width}}" for c in columns)
    )
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        groups[(r["precision"], r["label"], r["op"])].append(r)
    for (prec, label, op), rs in groups.items():
        base = next((r["base"]["median_ms"] for r in rs if r.get("base")), None)
        cells = []
        for i, _ in enumerate(columns):
            config = -1 if i == 0 else i - 1
            mine = [r for r in rs if r["config"] == config]
            ratios = [v for v in (_good_ratio(r) for r in mine) if v is not None]
            if ratios:
                text = f"{max(ratios):.3f}"
            elif not mine:
                text = "-"
            else:
                statuses = {r.get("status") for r in mine}
                status = next((s for s in ("FAIL", "error", "skipped") if s in statuses), "?")
                text = _STATUS_CELL.get(status, "?")
            cells.append(text.rjust(width))
        lines.append(f"{prec:<5} {label:<18} {op:<5} {_fmt(base, '8.4f'):>8}" + "".join(cells))
    return lines


def format_sweep_best(best: Sequence[dict]) -> list[str]:
    """One line per (precision, shape, op): the best configuration, swizzle and splits vs the
    rule's."""
    lines = ["best configuration per shape and op (ratio = torch time / ours time):"]
    for b in best:
        head = f"  {b['precision']} {b['label']} {b['op']}:"
        if b["config"] is None:
            lines.append(f"{head} nothing measured")
            continue
        auto = f"auto {_fmt(b['auto_ratio'])} {b.get('auto_kernel') or ''}".strip()
        line = (
            f"{head} {variant_key(b['config'], b['swizzle'], b.get('splits') or 0)} "
            f"{b['config_name']} "
            f"ratio {_fmt(b['ratio'])} ({auto})"
        )
        lines.append(line[:200])
    return lines


def format_sweep_progress(i: int, total: int, rows: Sequence[dict], elapsed_s: float) -> str:
    """One line per finished sweep group."""
    if not rows:
        return f"[{i + 1:3d}/{total} {elapsed_s:5.0f}s] (no variants)"
    r0 = rows[0]
    head = (
        f"[{i + 1:3d}/{total} {elapsed_s:5.0f}s] {r0['precision']} {r0['op']:<5} {r0['label']:<18}"
    )
    (best,) = sweep_best(rows)
    counts = Counter(r.get("status") for r in rows)
    base = next((r["base"]["median_ms"] for r in rows if r.get("base")), None)
    parts = [f"torch {_fmt(base, '.4f')} ms", f"auto {_fmt(best['auto_ratio'])}"]
    if best["config"] is not None:
        key = variant_key(best["config"], best["swizzle"], best["splits"] or 0)
        parts.append(f"best {key} {_fmt(best['ratio'])}")
    parts.append(", ".join(f"{n} {s}" for s, n in counts.items()))
    if counts.get("skipped") == len(rows) or counts.get("error") == len(rows):
        parts.append(str(r0.get("note", "")))
    return f"{head} " + "; ".join(parts)[:200]


# ---------------------------------------------------------------------------------------------
# Summary, table, JSON, plot (pure; tested on the CPU)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """One performance target of the issue: the ``reduce`` ("geomean" or "min") of the ratios of
    the rows it selects must be >= ``threshold``."""

    key: str  # its key in summary["targets"]
    title: str
    group: str
    ops: tuple[str, ...]
    precisions: tuple[str, ...]
    reduce: str
    threshold: float
    max_m: int | None = None  # GEMM rows with M <= max_m only
    min_numel: int = 0  # add2 rows with at least this many elements only
    shape_set: str | None = None  # rows of this --shapes set only (None: the default shapes)

    def selects(self, row: dict) -> bool:
        shape = row.get("shape") or [0]
        return (
            row.get("shape_set") == self.shape_set
            and row.get("group") == self.group
            and row.get("op") in self.ops
            and row.get("precision") in self.precisions
            and (self.max_m is None or shape[0] <= self.max_m)
            and shape[0] >= self.min_numel
        )


TARGETS: tuple[Target, ...] = (
    *(
        Target(f"{p}_fwd_geomean", f"{p} fwd geomean", "gemm", ("fwd",), (p,), "geomean", 1.00)
        for p in ("bf16", "fp16")
    ),
    *(
        Target(f"{p}_fwd_min", f"{p} fwd min", "gemm", ("fwd",), (p,), "min", 0.90)
        for p in ("bf16", "fp16")
    ),
    *(
        Target(
            f"{p}_fwdbwd_geomean",
            f"{p} fwd+bwd geomean",
            "gemm",
            ("fwdbwd",),
            (p,),
            "geomean",
            1.00,
        )
        for p in ("bf16", "fp16")
    ),
    Target(
        "small_m_fwdbwd_min",
        f"small-M (M<={SMALL_M}) fwd+bwd min",
        "gemm",
        ("fwdbwd",),
        ("bf16", "fp16"),
        "min",
        1.5,
        max_m=SMALL_M,
    ),
    Target(
        "linact_eager_geomean",
        "linact vs eager geomean",
        "linact",
        ("eager",),
        ("bf16", "fp16"),
        "geomean",
        1.10,
    ),
    Target(
        "linact_compile_geomean",
        "linact vs compile geomean",
        "linact",
        ("compile",),
        ("bf16", "fp16"),
        "geomean",
        1.03,
    ),
    Target(
        "add2_16m_256m_min",
        "add2 16M/256M min",
        "add2",
        ADD2_OPS,
        ("bf16", "fp32"),
        "min",
        0.95,
        min_numel=1 << 24,
    ),
    # "Real models, part 2": the transformer shape set (--shapes transformer), per operation
    *(
        Target(
            f"transformer_{op}_{reduce}",
            f"transformer {op} {reduce}",
            "gemm",
            (op,),
            ("bf16", "fp16"),
            reduce,
            threshold,
            shape_set="transformer",
        )
        for op in ("fwd", "dgrad", "wgrad")
        for reduce, threshold in (("geomean", 1.00), ("min", 0.90))
    ),
    Target(
        "fp32_highest_geomean",
        "fp32 highest vs cuBLAS geomean",
        "gemm",
        ("fwd", "dgrad", "wgrad", "fwdbwd"),
        ("fp32",),
        "geomean",
        2.0,
    ),
)


def evaluate_targets(rows: Sequence[dict], targets: Sequence[Target] = TARGETS) -> dict:
    """``{key: record}`` for each target: the value over the rows that were measured (status ok),
    the status PASS (value >= threshold and no selected row FAILed or errored), MISS, or "n/a"
    (no selected row was measured), the row counts, and for "min" the worst row."""
    out = {}
    for t in targets:
        sel = [r for r in rows if t.selects(r)]
        good = [(r, _good_ratio(r)) for r in sel]
        good = [(r, v) for r, v in good if v is not None]
        counts = Counter(r.get("status", "?") for r in sel)
        bad = counts.get("FAIL", 0) + counts.get("error", 0)
        value, worst = None, None
        if good:
            if t.reduce == "min":
                worst, value = min(good, key=lambda rv: rv[1])
            else:
                value = geomean([v for _, v in good])
        if value is None:
            status = "MISS" if bad else "n/a"
        else:
            status = "PASS" if value >= t.threshold and not bad else "MISS"
        out[t.key] = {
            "title": t.title,
            "reduce": t.reduce,
            "threshold": t.threshold,
            "value": value,
            "status": status,
            "n_ok": len(good),
            "n_rows": len(sel),
            "not_ok": {k: v for k, v in counts.items() if k != "ok"},
            "worst": None if worst is None else describe(worst),
        }
    return out


def _max_or_nan(values: Sequence[float | None]) -> float | None:
    """The largest value; NaN if one is not finite; None if there are none."""
    xs = [v for v in values if v is not None]
    if not xs:
        return None
    return max(xs) if all(math.isfinite(v) for v in xs) else math.nan


def worst_errors(row: dict) -> tuple[float | None, float | None]:
    """The largest relative error of ours and of torch over a row's checked outputs."""
    outputs = list(((row.get("check") or {}).get("outputs") or {}).values())
    return (
        _max_or_nan([o.get("err_ours") for o in outputs]),
        _max_or_nan([o.get("err_torch") for o in outputs]),
    )


def summarize(rows: Sequence[dict]) -> dict:
    """Geometric means of the ratio per (group, op, precision), the fwd and fwd+bwd geomeans per
    precision, the smallest ratio, the small-M GEMM ratios, the errors of the float32 "highest"
    rows (ours and cuBLAS vs float64), the issue's targets and the row counts by status."""
    ok = [r for r in rows if r.get("status") == "ok" and r.get("ratio") is not None]
    groups: dict[tuple, list[float]] = defaultdict(list)
    eager_groups: dict[tuple, list[float]] = defaultdict(list)
    for r in ok:
        groups[(r["group"], r["op"], r["precision"])].append(r["ratio"])
        if r.get("eager_ratio") is not None:
            eager_groups[(r["group"], r["op"], r["precision"])].append(r["eager_ratio"])
    geomeans = [
        {
            "group": g,
            "op": op,
            "precision": p,
            "geomean": geomean(v),
            "eager_geomean": geomean(eager_groups.get((g, op, p), [])),
            "n": len(v),
        }
        for (g, op, p), v in groups.items()
    ]

    def per_precision(op: str) -> dict[str, float | None]:
        return {
            e["precision"]: e["geomean"] for e in geomeans if e["group"] == "gemm" and e["op"] == op
        }

    valid = [r for r in ok if math.isfinite(r["ratio"])]
    worst = min(valid, key=lambda r: r["ratio"]) if valid else None
    small_m = [
        {"precision": r["precision"], "op": r["op"], "label": r["label"], "ratio": r["ratio"]}
        for r in ok
        if r["group"] == "gemm" and r["shape"][0] <= SMALL_M
    ]
    fp32_errors = []
    for r in rows:
        if r.get("group") == "gemm" and r.get("precision") == "fp32" and r.get("check"):
            e_ours, e_torch = worst_errors(r)
            fp32_errors.append(
                {
                    "label": r["label"],
                    "op": r["op"],
                    "status": r.get("status"),
                    "err_ours": e_ours,
                    "err_torch": e_torch,
                }
            )
    return {
        "ratio_definition": "base median time / ours median time (> 1: cutlass_nn is faster)",
        "geomeans": geomeans,
        "fwd_geomean": per_precision("fwd"),
        "fwdbwd_geomean": per_precision("fwdbwd"),
        "min_ratio": None if worst is None else {"ratio": worst["ratio"], "row": describe(worst)},
        "small_m": small_m,
        "fp32_highest_errors": fp32_errors,
        "targets": evaluate_targets(rows),
        "counts": dict(Counter(r.get("status", "?") for r in rows)),
    }


def describe(row: dict) -> str:
    """e.g. "gemm bf16 fwd 16384x4096x4096"."""
    return f"{row['group']} {row['precision']} {row['op']} {row['label']}"


def _cell(row: dict | None, width: int, show_rate: bool = False) -> str:
    """A table cell: the ratio (with ours' rate before it) or the row's status."""
    if row is None:
        text = "-"
    elif row.get("status") != "ok":
        text = {"FAIL": "FAIL", "error": "ERR", "skipped": "skip"}.get(row.get("status"), "?")
    else:
        ratio = row.get("ratio")
        text = f"{ratio:.3f}" if ratio is not None and math.isfinite(ratio) else "nan"
        if show_rate:
            r = row.get("ours_rate")
            text = f"{r:7.1f} {text}" if r is not None and math.isfinite(r) else f"    nan {text}"
    return text.rjust(width)


def format_tables(rows: Sequence[dict]) -> list[str]:
    """The compact tables: GEMM ratios per (precision, shape) and add2 GB/s per (dtype, size)."""
    lines: list[str] = []
    index = {(r["group"], r["op"], r["precision"], r["label"]): r for r in rows}
    gemm_keys = list(
        dict.fromkeys(
            (r["precision"], r["label"]) for r in rows if r["group"] in ("gemm", "linact")
        )
    )
    linact = any(r["group"] == "linact" for r in rows)
    if gemm_keys:
        lines.append(
            "GEMM: ratio = torch time / ours time (>1: ours faster); TF = ours TFLOP/s; "
            "tf32 = float32 with TF32, fp32 = 'highest'"
            + ("; linact = Linear+GELU(tanh) fwd+bwd vs eager / torch.compile" if linact else "")
        )
        lines.append(
            f"{'prec':<5} {'M x N x K':<18} {'fwd TF':>7} {'ratio':>6} {'sm80':>6} {'dgrad':>6} "
            f"{'wgrad':>6} {'f+b TF':>7} {'ratio':>6}"
            + (f" {'act/eg':>6} {'act/cp':>6}" if linact else "")
        )
        for prec, label in sorted(gemm_keys, key=lambda k: PRECISION_ORDER.index(k[0])):
            c = {op: index.get(("gemm", op, prec, label)) for op in GEMM_OPS}
            line = (
                f"{prec:<5} {label:<18} {_cell(c['fwd'], 14, True)} {_cell(c['sm80'], 6)} "
                f"{_cell(c['dgrad'], 6)} {_cell(c['wgrad'], 6)} {_cell(c['fwdbwd'], 14, True)}"
            )
            if linact:
                for op in LINACT_OPS:
                    line += " " + _cell(index.get(("linact", op, prec, label)), 6)
            lines.append(line)
    add2_keys = list(
        dict.fromkeys((r["precision"], r["label"]) for r in rows if r["group"] == "add2")
    )
    if add2_keys:
        lines.append("add2: GB/s counting 2 reads + 1 write; ratio = torch time / ours time")
        lines.append(
            f"{'dtype':<5} {'elements':>10} {'fwd ours':>9} {'torch':>7} {'ratio':>6} "
            f"{'f+b ours':>9} {'torch':>7} {'ratio':>6}"
        )
        for prec, label in add2_keys:
            cells = []
            for op in ADD2_OPS:
                r = index.get(("add2", op, prec, label))
                if r is not None and r.get("status") == "ok":
                    cells.append(f"{r['ours_rate']:9.0f} {r['base_rate']:7.0f} {_cell(r, 6)}")
                else:
                    cells.append(f"{'':9} {'':7} {_cell(r, 6)}")
            lines.append(f"{prec:<5} {int(label):>10} " + " ".join(cells))
    return lines


def _fmt(x: float | None, spec: str = ".3f") -> str:
    return "n/a" if x is None or not math.isfinite(x) else format(x, spec)


def format_summary(
    summary: dict, peaks: dict, rows: Sequence[dict], max_problems: int = 6
) -> list[str]:
    """Peaks, geometric means, the minimum, small-M ratios, problems (FAIL / error) and counts."""
    lines = []
    mm = ", ".join(f"{p} {_fmt(v, '.0f')}" for p, v in (peaks.get("mm_tflops") or {}).items())
    lines.append(
        f"peaks: torch.mm 8192^3 {mm or 'n/a'} TFLOP/s; "
        f"copy {_fmt(peaks.get('copy_gbps'), '.0f')} GB/s (read+write)"
    )
    by_op: dict[tuple[str, str], list[str]] = defaultdict(list)
    by_op_eager: dict[tuple[str, str], list[str]] = defaultdict(list)
    for e in summary["geomeans"]:
        by_op[(e["group"], e["op"])].append(f"{e['precision']} {_fmt(e['geomean'])} ({e['n']})")
        if e.get("eager_geomean") is not None:
            by_op_eager[(e["group"], e["op"])].append(
                f"{e['precision']} {_fmt(e['eager_geomean'])}"
            )
    for heading, table in (
        ("geomean ratio (>1: ours faster), rows in ():", by_op),
        ("geomean eager-latency ratio (one call, host included; >1: ours returns sooner):",
         by_op_eager),
    ):
        if not table:
            continue
        lines.append(heading)
        for (group, op), parts in table.items():
            title = OP_TITLES.get(op, op)
            name = title if group == "gemm" else f"{group} {title}"
            lines.append(f"  {name:<17} " + "  ".join(parts))
    if summary["min_ratio"]:
        lines.append(
            f"min ratio: {_fmt(summary['min_ratio']['ratio'])} ({summary['min_ratio']['row']})"
        )
    small: dict[tuple[str, str], list[str]] = defaultdict(list)
    for e in summary["small_m"]:
        small[(e["precision"], e["label"])].append(
            f"{OP_TITLES.get(e['op'], e['op'])} {_fmt(e['ratio'])}"
        )
    for (prec, label), parts in small.items():
        lines.append(f"small M {prec} {label}: " + ", ".join(parts))
    lines += format_fp32_errors(summary.get("fp32_highest_errors") or [])
    problems = [r for r in rows if r.get("status") in ("FAIL", "error")]
    for r in problems[:max_problems]:
        lines.append(f"{r['status'].upper()} {describe(r)}: {r.get('note', '')}"[:200])
    if len(problems) > max_problems:
        lines.append(f"... {len(problems) - max_problems} more FAIL / error rows in the JSON")
    skipped = [r for r in rows if r.get("status") == "skipped"]
    if skipped:
        first = skipped[0]
        line = f"skipped {len(skipped)} row(s), e.g. {describe(first)}: {first.get('note', '')}"
        lines.append(line[:200])
    lines += format_targets(summary.get("targets") or {})
    counts = summary["counts"]
    lines.append(
        "rows: " + ", ".join(f"{counts.get(s, 0)} {s}" for s in ("ok", "FAIL", "error", "skipped"))
    )
    return lines


def _fmt_err(x: float | None) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{x:.2e}"


def format_fp32_errors(entries: Sequence[dict]) -> list[str]:
    """One line per float32 "highest" shape: the worst relative error (vs float64) of ours and
    of cuBLAS over its fwd / dgrad / wgrad / fwd+bwd rows (sm80 is left out)."""
    by_label: dict[str, list[dict]] = defaultdict(list)
    for e in entries:
        if e["op"] != "sm80":
            by_label[e["label"]].append(e)
    lines = []
    for label, es in by_label.items():
        ops_ = ",".join(OP_TITLES.get(e["op"], e["op"]) for e in es)
        lines.append(
            f"fp32 highest {label}: ours err {_fmt_err(_max_or_nan([e['err_ours'] for e in es]))}"
            f" vs cuBLAS err {_fmt_err(_max_or_nan([e['err_torch'] for e in es]))} "
            f"(worst of {ops_})"
        )
    return lines


def format_targets(targets: dict) -> list[str]:
    """The issue's targets, one line each: PASS / MISS / n/a, the threshold and the value."""
    if not targets:
        return []
    lines = ["targets (PASS: met on the rows measured; MISS also when a selected row failed):"]
    for t in targets.values():
        extra = []
        if t.get("worst"):
            extra.append(f"worst {t['worst']}")
        extra.append(f"{t['n_ok']}/{t['n_rows']} rows")
        extra += [f"{n} {status}" for status, n in (t.get("not_ok") or {}).items()]
        lines.append(
            f"  {t['status']:<4} {t['title']:<30} >= {t['threshold']:.2f}: "
            f"{_fmt(t['value'])} ({', '.join(extra)})"[:200]
        )
    return lines


def format_progress(i: int, total: int, row: dict, elapsed_s: float) -> str:
    """One line per finished row, printed while the run goes."""
    head = (
        f"[{i + 1:3d}/{total} {elapsed_s:5.0f}s] "
        f"{row['precision']:<4} {row['group']:<6} {row['op']:<7} {row['label']:<18}"
    )
    if row.get("status") != "ok":
        return f"{head} {row.get('status', '?').upper()}: {row.get('note', '')}"[:240]
    o = row["ours"]
    return (
        f"{head} ours {row['ours_rate']:7.1f} {row['unit']} "
        f"[{o['p10_ms']:.4g}-{o['p90_ms']:.4g} ms] "
        f"torch {row['base_rate']:7.1f} ratio {row['ratio']:.3f} "
        + (
            f"eager {row['ours_eager_ms'] * 1e3:.0f}/{row['base_eager_ms'] * 1e3:.0f} us "
            f"{row['eager_ratio']:.3f} "
            if row.get("eager_ratio") is not None
            else ""
        )
        + f"(n={o['n']}, sets={row.get('input_sets')}) "
        f"{row.get('kernel') or ''}"
    )[:240]


def to_jsonable(obj: Any) -> Any:
    """Plain JSON: NaN / inf become null, tuples lists, anything unknown its str()."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, (bool, int, str)) or obj is None:
        return obj
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    return str(obj)


def write_json(path: Path, results: dict) -> None:
    """Writes atomically (a partial file never replaces a complete one)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(to_jsonable(results), indent=1, allow_nan=False) + "\n")
    os.replace(tmp, path)


def _good_ratio(row: dict) -> float | None:
    """The row's ratio when it was measured (status ok, finite), else None."""
    ratio = row.get("ratio")
    ok = row.get("status") == "ok" and ratio is not None and math.isfinite(ratio)
    return ratio if ok else None


def plot_results(rows: Sequence[dict], path: Path, title: str) -> Path | None:
    """Bars of the ratio per shape, one panel per GEMM precision (one bar per operation) and one
    for add2, with the 1.0 line. Rows that are not ok get a status letter instead of a bar."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        ("gemm", p)
        for p in PRECISION_ORDER
        if any(r["group"] in ("gemm", "linact") and r["precision"] == p for r in rows)
    ]
    panels += [
        ("add2", p)
        for p in ("bf16", "fp32")
        if any(r["group"] == "add2" and r["precision"] == p for r in rows)
    ]
    if not panels:
        return None
    fig, axes = plt.subplots(
        len(panels), 1, figsize=(13, 1.2 + 3.4 * len(panels)), squeeze=False, layout="constrained"
    )
    for ax, (group, prec) in zip(axes[:, 0], panels):
        groups = ("gemm", "linact") if group == "gemm" else (group,)
        sel = [r for r in rows if r["group"] in groups and r["precision"] == prec]
        labels = list(dict.fromkeys(r["label"] for r in sel))
        candidates = (
            [("gemm", op) for op in GEMM_OPS] + [("linact", op) for op in LINACT_OPS]
            if group == "gemm"
            else [(group, op) for op in ADD2_OPS]
        )
        op_list = [
            (g, op) for g, op in candidates if any((r["group"], r["op"]) == (g, op) for r in sel)
        ]
        width = 0.8 / max(len(op_list), 1)
        index = {(r["group"], r["op"], r["label"]): r for r in sel}
        for j, (g, op) in enumerate(op_list):
            xs, ys = [], []
            for i, label in enumerate(labels):
                r = index.get((g, op, label))
                x = i - 0.4 + width * (j + 0.5)
                if r is None:
                    continue
                if _good_ratio(r) is not None:
                    xs.append(x)
                    ys.append(r["ratio"])
                else:
                    ax.text(
                        x,
                        0.02,
                        {"FAIL": "F", "error": "E", "skipped": "S"}.get(r.get("status"), "?"),
                        ha="center",
                        va="bottom",
                        fontsize=8,
                        color="red",
                    )
            op_title = OP_TITLES.get(op, op)
            ax.bar(xs, ys, width, label=op_title if g != "linact" else f"linact {op_title}")
        ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
        top = max([_good_ratio(r) or 0.0 for r in sel] + [1.0])
        ax.set_ylim(0, min(top, 20.0) * 1.3)  # headroom for the legend
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, rotation=15, fontsize=8)
        ax.set_ylabel("torch time / ours time")
        ax.set_title(
            f"{group} {prec}  (>1: cutlass_nn faster; F fail, E error, S skipped)", fontsize=10
        )
        ax.legend(fontsize=8, ncol=len(op_list), loc="upper right")
    fig.suptitle(title, fontsize=11)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------


def _csv(choices: Sequence[str]) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        items = [t.strip() for t in text.split(",") if t.strip()]
        bad = [t for t in items if t not in choices]
        if bad or not items:
            raise argparse.ArgumentTypeError(f"choose from {','.join(choices)} (got {text!r})")
        return items

    return parse


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    """``--sweep-shapes`` / ``--shapes``: comma-separated MxNxK labels, e.g.
    "128x8192x8192,16x8192x8192", or a named set: "transformer" (every layer of the model families
    of cutlass_nn/transformer_shapes.py at its default token counts) or "transformer:T1/T2/..."
    (at those token counts)."""
    if text.strip().startswith("transformer"):
        try:
            return transformer_shapes.parse_shape_set(text.strip())
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    shapes = []
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        parts = item.lower().split("x")
        if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise argparse.ArgumentTypeError(f"expected MxNxK with positive sizes, got {item!r}")
        shapes.append((int(parts[0]), int(parts[1]), int(parts[2])))
    if not shapes:
        raise argparse.ArgumentTypeError(f"no shape in {text!r}")
    return list(dict.fromkeys(shapes))


def parse_swizzles(text: str) -> list[int]:
    """``--sweep-swizzles``: comma-separated non-negative integers (0 = the rule's choice)."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items or not all(t.isdigit() for t in items):
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 0, got {text!r}")
    return list(dict.fromkeys(int(t) for t in items))


def parse_splits(text: str) -> list[int]:
    """``--sweep-splits``: comma-separated non-negative integers (0 = the rule's choice, 1 = no
    split, s > 1 = split-K into s pieces)."""
    return parse_swizzles(text)


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def _planned_rows(args: argparse.Namespace) -> list[RowSpec]:
    """plan_rows() for the parsed arguments (the --shapes rows when given)."""
    shapes = getattr(args, "shapes", None)
    if shapes is None:
        return plan_rows(args.quick, args.dtypes, args.what)
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
        type=_csv(DTYPE_CHOICES),
        default=None,
        help="bf16,fp16,fp32 (default: all; bf16,fp32 with --quick; bf16 with --sweep). fp32 = "
        "the float32 GEMM subset ('highest' and TF32) and float32 add2",
    )
    parser.add_argument(
        "--what",
        type=_csv(WHAT_ITEMS),
        default=list(WHAT_ITEMS),
        help="fwd,sm80,dgrad,wgrad,fwdbwd,linact,add2,fp32 (default: all). sm80 = forward with "
        "force_sm80_kernels(); linact = Linear+bias+GELU(tanh) fwd+bwd vs eager and "
        "torch.compile; fp32 = the float32 GEMM subset (the GEMM ops selected, or all). "
        "With --sweep: which of fwd,dgrad,wgrad",
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
        "--sweep-splits",
        type=parse_splits,
        default=None,
        metavar="K,...",
        help="split-K counts tried with each stream-K configuration (default "
        f"{','.join(map(str, SWEEP_SPLITS))}; 0 = the rule's choice, 1 = data-parallel, "
        "s > 1 = split into s); other configurations ignore it and run once",
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
    ):
        parser.error("--sweep-shapes, --sweep-swizzles and --sweep-splits need --sweep")
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


def collect_meta(argv: Sequence[str]) -> dict:
    props = torch.cuda.get_device_properties(0)
    matmul = torch.backends.cuda.matmul
    return {
        "device": props.name,
        "capability": f"{props.major}.{props.minor}",
        "sm_count": props.multi_processor_count,
        "memory_gib": round(props.total_memory / 2**30, 1),
        "l2_bytes": getattr(props, "L2_cache_size", None),
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
    variants = sweep_variants(names, args.sweep_swizzles, args.sweep_splits)
    args.out.mkdir(parents=True, exist_ok=True)
    json_path = args.out / f"sweep_{_slug(meta)}_{_stamp()}.json"
    splits_note = ""
    if list(args.sweep_splits) != [0]:
        n_stream_k = sum(is_stream_k(n) for n in names)
        splits_note = f" (x splits {args.sweep_splits} for the {n_stream_k} stream-K ones)"
    print(
        f"cutlass_nn.bench --sweep: {meta['device']}, torch {meta['torch']}; {len(names)} "
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
    """ "models" or "host" when ``--what`` names one of the benchmarks with their own options
    (cutlass_nn/bench_models.py, cutlass_nn/bench_host.py), else None."""
    for i, arg in enumerate(argv):
        value = argv[i + 1] if arg == "--what" and i + 1 < len(argv) else None
        if arg.startswith("--what="):
            value = arg.split("=", 1)[1]
        if value in ("models", "host"):
            return value
    return None


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    delegated = _delegated_what(argv)
    if delegated == "models":
        from cutlass_nn import bench_models

        return bench_models.main(argv)
    if delegated == "host":
        from cutlass_nn import bench_host

        return bench_host.main(argv)
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


if __name__ == "__main__":
    sys.exit(main())
