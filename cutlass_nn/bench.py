"""``python -m cutlass_nn.bench``: cutlass_nn kernels against PyTorch (cuBLAS / ATen) on one GPU.

Usage::

    python -m cutlass_nn.bench [--quick] [--out DIR] [--dtypes bf16,fp16,fp32]
                               [--what fwd,sm80,dgrad,wgrad,fwdbwd,add2,fp32]

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
plot, and a compact table printed last.

Exit codes: 0 every row ok (or skipped), 3 the run finished but some rows are FAIL / error,
2 no CUDA device or no CUDA kernels (or bad arguments), 130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
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
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import cutlass_nn
from cutlass_nn import ops

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
FP32_SHAPES: list[tuple[int, int, int]] = [(4096, 4096, 4096), (8192, 8192, 8192)]
ADD2_SIZES: list[int] = [1 << 20, 1 << 24, 1 << 28]  # 1M, 16M, 256M elements
SMALL_M = 128  # rows with M <= this are "small M" in the summary

# GEMM operations: "sm80" is the forward inside ops.force_sm80_kernels() (CUTLASS 2.x kernels).
GEMM_OPS = ("fwd", "sm80", "dgrad", "wgrad", "fwdbwd")
ADD2_OPS = ("fwd", "fwdbwd")
WHAT_ITEMS = (*GEMM_OPS, "add2", "fp32")
OP_TITLES = {
    "fwd": "fwd",
    "sm80": "fwd sm80",
    "dgrad": "dgrad",
    "wgrad": "wgrad",
    "fwdbwd": "fwd+bwd",
}


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
    budget_ms=300, min_reps=10, max_reps=1000, warmup=3, row_cap_ms=4000, time_limit_s=380
)

DEFAULT_L2_BYTES = 50 * 2**20  # H100 / H200; the device's own value is used when torch reports it
SAMPLE = 256  # rows / columns of the float64-checked submatrix (elements x 256 for 1-D outputs)


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
    """2*M*N*K per GEMM; forward+backward is 3 GEMMs (y, dX, dW). Bias work is not counted."""
    return (3 if op == "fwdbwd" else 1) * 2 * m * n * k


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


def add2_memory_bytes(op: str, numel: int, es: int, n_sets: int) -> int:
    per_set = (2 if op == "fwd" else 3) * numel
    outputs = (1 if op == "fwd" else 3) * numel
    return es * (n_sets * per_set + 3 * outputs) + outputs


# ---------------------------------------------------------------------------------------------
# The plan: which rows to run
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RowSpec:
    """One row to measure. ``shape`` is (M, N, K) for "gemm", (numel,) for "add2"."""

    group: str  # "gemm" | "add2"
    op: str  # GEMM_OPS or ADD2_OPS
    precision: str  # PRECISIONS key ("fp32" = IEEE float32 for GEMMs, plain float32 for add2)
    shape: tuple[int, ...]

    @property
    def label(self) -> str:
        return "x".join(str(s) for s in self.shape)

    def meta(self) -> dict[str, Any]:
        """The row's identity and work, the first fields of its JSON record."""
        es = torch.empty((), dtype=PRECISIONS[self.precision].dtype).element_size()
        if self.group == "gemm":
            m, n, k = self.shape
            unit, work = "TFLOP/s", gemm_flops(self.op, m, n, k)
        else:
            unit, work = "GB/s", add2_bytes(self.shape[0], es)
        return {
            "group": self.group,
            "op": self.op,
            "precision": self.precision,
            "dtype": str(PRECISIONS[self.precision].dtype).removeprefix("torch."),
            "shape": list(self.shape),
            "label": self.label,
            "unit": unit,
            "work": work,
        }


def plan_rows(quick: bool, dtypes: Sequence[str], what: Sequence[str]) -> list[RowSpec]:
    """The rows of a run, most important first (the run time limit skips the tail):
    16-bit GEMMs, add2, then the float32 GEMM subset (TF32, then IEEE)."""
    gemm_ops = [op for op in GEMM_OPS if op in what]
    rows: list[RowSpec] = []
    for prec in ("bf16", "fp16"):
        if prec in dtypes:
            for shape in QUICK_SHAPES if quick else GEMM_SHAPES:
                rows += [RowSpec("gemm", op, prec, shape) for op in gemm_ops]
    if "add2" in what:
        for prec in ("bf16", "fp32"):
            if prec in dtypes:
                for numel in ADD2_SIZES:
                    rows += [RowSpec("add2", op, prec, (numel,)) for op in ADD2_OPS]
    if "fp32" in what and "fp32" in dtypes:
        # the GEMM operations asked for, or all of them when --what named none
        for prec in ("tf32", "fp32"):
            for shape in FP32_SHAPES:
                rows += [RowSpec("gemm", op, prec, shape) for op in gemm_ops or GEMM_OPS]
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
        fill_timing(row, times, peak)
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
    if meta["group"] == "gemm":
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
# Summary, table, JSON, plot (pure; tested on the CPU)
# ---------------------------------------------------------------------------------------------


def summarize(rows: Sequence[dict]) -> dict:
    """Geometric means of the ratio per (group, op, precision), the fwd and fwd+bwd geomeans per
    precision, the smallest ratio, the small-M GEMM ratios and the row counts by status."""
    ok = [r for r in rows if r.get("status") == "ok" and r.get("ratio") is not None]
    groups: dict[tuple, list[float]] = defaultdict(list)
    for r in ok:
        groups[(r["group"], r["op"], r["precision"])].append(r["ratio"])
    geomeans = [
        {"group": g, "op": op, "precision": p, "geomean": geomean(v), "n": len(v)}
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
    return {
        "ratio_definition": "base median time / ours median time (> 1: cutlass_nn is faster)",
        "geomeans": geomeans,
        "fwd_geomean": per_precision("fwd"),
        "fwdbwd_geomean": per_precision("fwdbwd"),
        "min_ratio": None if worst is None else {"ratio": worst["ratio"], "row": describe(worst)},
        "small_m": small_m,
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
        dict.fromkeys((r["precision"], r["label"]) for r in rows if r["group"] == "gemm")
    )
    if gemm_keys:
        lines.append(
            "GEMM: ratio = torch time / ours time (>1: ours faster); TF = ours TFLOP/s; "
            "tf32 = float32 with TF32, fp32 = 'highest'"
        )
        lines.append(
            f"{'prec':<5} {'M x N x K':<18} {'fwd TF':>7} {'ratio':>6} {'sm80':>6} {'dgrad':>6} "
            f"{'wgrad':>6} {'f+b TF':>7} {'ratio':>6}"
        )
        for prec, label in sorted(gemm_keys, key=lambda k: PRECISION_ORDER.index(k[0])):
            c = {op: index.get(("gemm", op, prec, label)) for op in GEMM_OPS}
            lines.append(
                f"{prec:<5} {label:<18} {_cell(c['fwd'], 14, True)} {_cell(c['sm80'], 6)} "
                f"{_cell(c['dgrad'], 6)} {_cell(c['wgrad'], 6)} {_cell(c['fwdbwd'], 14, True)}"
            )
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
    for e in summary["geomeans"]:
        by_op[(e["group"], e["op"])].append(f"{e['precision']} {_fmt(e['geomean'])} ({e['n']})")
    if by_op:
        lines.append("geomean ratio (>1: ours faster), rows in ():")
        for (group, op), parts in by_op.items():
            name = OP_TITLES.get(op, op) if group == "gemm" else f"add2 {OP_TITLES.get(op, op)}"
            lines.append(f"  {name:<13} " + "  ".join(parts))
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
    counts = summary["counts"]
    lines.append(
        "rows: " + ", ".join(f"{counts.get(s, 0)} {s}" for s in ("ok", "FAIL", "error", "skipped"))
    )
    return lines


def format_progress(i: int, total: int, row: dict, elapsed_s: float) -> str:
    """One line per finished row, printed while the run goes."""
    head = (
        f"[{i + 1:3d}/{total} {elapsed_s:5.0f}s] "
        f"{row['precision']:<4} {row['group']:<4} {row['op']:<6} {row['label']:<18}"
    )
    if row.get("status") != "ok":
        return f"{head} {row.get('status', '?').upper()}: {row.get('note', '')}"[:240]
    o = row["ours"]
    return (
        f"{head} ours {row['ours_rate']:7.1f} {row['unit']} "
        f"[{o['p10_ms']:.4g}-{o['p90_ms']:.4g} ms] "
        f"torch {row['base_rate']:7.1f} ratio {row['ratio']:.3f} "
        f"(n={o['n']}, sets={row.get('input_sets')}) "
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
        if any(r["group"] == "gemm" and r["precision"] == p for r in rows)
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
        sel = [r for r in rows if r["group"] == group and r["precision"] == prec]
        labels = list(dict.fromkeys(r["label"] for r in sel))
        op_list = [
            op
            for op in (GEMM_OPS if group == "gemm" else ADD2_OPS)
            if any(r["op"] == op for r in sel)
        ]
        width = 0.8 / max(len(op_list), 1)
        index = {(r["op"], r["label"]): r for r in sel}
        for j, op in enumerate(op_list):
            xs, ys = [], []
            for i, label in enumerate(labels):
                r = index.get((op, label))
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
            ax.bar(xs, ys, width, label=OP_TITLES.get(op, op))
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


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m cutlass_nn.bench",
        description="cutlass_nn vs PyTorch on this GPU: correctness check, then interleaved "
        "CUDA-event timing; writes JSON + PNG into --out and prints a table.",
    )
    parser.add_argument(
        "--quick", action="store_true", help="fewer repetitions, 6 shapes, bf16 only (< 2 min)"
    )
    parser.add_argument(
        "--out", type=Path, default=Path("benchmarks/results"), help="output folder"
    )
    parser.add_argument(
        "--dtypes",
        type=_csv(DTYPE_CHOICES),
        default=None,
        help="bf16,fp16,fp32 (default: all; bf16 with --quick). fp32 = the float32 GEMM subset "
        "(TF32 and 'highest') and float32 add2",
    )
    parser.add_argument(
        "--what",
        type=_csv(WHAT_ITEMS),
        default=list(WHAT_ITEMS),
        help="fwd,sm80,dgrad,wgrad,fwdbwd,add2,fp32 (default: all). sm80 = forward with "
        "force_sm80_kernels(); fp32 = the float32 GEMM subset (the GEMM ops selected, or all)",
    )
    parser.add_argument(
        "--time-limit",
        type=float,
        default=None,
        help="seconds after which the remaining rows are skipped (default "
        f"{QUICK.time_limit_s:.0f} with --quick, {FULL.time_limit_s:.0f} otherwise)",
    )
    parser.add_argument(
        "--plot",
        type=Path,
        metavar="JSON",
        help="only redraw the PNG of a results JSON (next to it; no GPU needed) and exit",
    )
    args = parser.parse_args(argv)
    if args.dtypes is None:
        args.dtypes = ["bf16"] if args.quick else list(DTYPE_CHOICES)
    if not plan_rows(args.quick, args.dtypes, args.what):
        parser.error(
            f"nothing to run for --dtypes {','.join(args.dtypes)} --what {','.join(args.what)}"
        )
    return args


def _git_commit() -> str | None:
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
    """``--plot``: the PNG of a results JSON, written next to it."""
    results = json.loads(Path(json_path).read_text())
    png = plot_results(
        results["rows"], Path(json_path).with_suffix(".png"), _plot_title(results["meta"])
    )
    print(png or "(nothing to plot)")
    return 0


NO_CUDA_MESSAGE = (
    "cutlass_nn.bench: no CUDA device is available (torch.cuda.is_available() is False); "
    "the benchmark needs a GPU and the CUDA flavor of cutlass_nn."
)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
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
    settings = QUICK if args.quick else FULL
    time_limit = args.time_limit if args.time_limit is not None else settings.time_limit_s
    t_start = time.monotonic()
    meta = collect_meta(argv)
    l2 = meta["l2_bytes"] or DEFAULT_L2_BYTES
    specs = plan_rows(args.quick, args.dtypes, args.what)
    args.out.mkdir(parents=True, exist_ok=True)
    slug = re.sub(r"[^a-z0-9]+", "-", meta["device"].lower()).strip("-") or "gpu"
    stem = (
        f"bench_{slug}_{datetime.now(timezone.utc):%Y%m%d-%H%M%S}{'_quick' if args.quick else ''}"
    )
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
        if p == "bf16" or any(s.group == "gemm" and s.precision == p for s in specs)
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
