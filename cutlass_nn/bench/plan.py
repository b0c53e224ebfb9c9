"""The plan: which rows a run measures (--quick, --dtypes, --what, --shapes)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from cutlass_nn.bench.spec import (
    ADD2_OPS,
    ADD2_SIZES,
    FP32_QUICK_SHAPES,
    FP32_SHAPES,
    GEMM_OPS,
    GEMM_SHAPES,
    LINACT_ACTIVATIONS,
    LINACT_MLP_SHAPES,
    LINACT_OPS,
    LINACT_QUICK_SHAPES,
    LINACT_SETS,
    LINACT_SHAPES,
    PRECISIONS,
    QUICK_SHAPES,
    linact_op,
)
from cutlass_nn.bench.stats import add2_bytes, gemm_flops


@dataclass(frozen=True)
class RowSpec:
    """One row to measure. ``shape`` is (M, N, K) for "gemm" and "linact", (numel,) for "add2"."""

    group: str  # "gemm" | "linact" | "add2"
    op: str  # GEMM_OPS, LINACT_ALL_OPS (the baseline, and the activation if not GELU tanh), ADD2_OPS
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
    linact_set: str = "default",
) -> list[RowSpec]:
    """The rows of a run, most important and most predictable first (the run time limit skips
    the tail): 16-bit GEMMs (bf16, then fp16), add2, float32 "highest" GEMMs, linact (bf16; its
    torch.compile baseline compiles first), then the TF32 GEMMs (no target). ``--quick``: fewer
    shapes, add2 in bf16 only, float32 only "highest" at 4096^3. ``gemm_shapes`` (``--shapes``):
    only 16-bit GEMM rows, of these shapes, tagged with ``shape_set``. ``linact_set`` "mlp"
    (``--linact-set``): the linact rows are LINACT_MLP_SHAPES in every activation of
    LINACT_ACTIVATIONS, tagged with shape_set "mlp"."""
    if linact_set not in LINACT_SETS:
        raise ValueError(f"plan_rows: linact_set must be one of {LINACT_SETS}, got {linact_set!r}")
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
    if "linact" in what and "bf16" in dtypes and linact_set == "mlp":
        rows += [
            RowSpec("linact", linact_op(baseline, act), "bf16", shape, "mlp")
            for shape in LINACT_MLP_SHAPES
            for act in LINACT_ACTIVATIONS
            for baseline in LINACT_OPS
        ]
    elif "linact" in what and "bf16" in dtypes:
        for shape in LINACT_QUICK_SHAPES if quick else LINACT_SHAPES:
            rows += [RowSpec("linact", op, "bf16", shape) for op in LINACT_OPS]
    if fp32 and not quick:
        for shape in FP32_SHAPES:
            rows += [RowSpec("gemm", op, "tf32", shape) for op in fp32_ops]
    return rows
