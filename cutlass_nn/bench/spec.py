"""What the benchmark measures: operations, precisions, shape lists, row specs, settings."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch


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
# --linact-set mlp: the fused epilogues at the shapes of GPT-2 / BERT-style MLPs (the up
# projection, T x 4h x h, hidden h = 768..4096, 4k and 16k tokens), in every activation form the
# layer fuses; each row tagged shape_set "mlp", with targets of their own.
LINACT_ACTIVATIONS = ("gelu_tanh", "gelu", "relu")
LINACT_MLP_SHAPES: list[tuple[int, int, int]] = [
    (tokens, 4 * hidden, hidden) for hidden in (768, 1024, 2048, 4096) for tokens in (4096, 16384)
]
LINACT_SETS = ("default", "mlp")
ADD2_SIZES: list[int] = [1 << 20, 1 << 24, 1 << 28]  # 1M, 16M, 256M elements
SMALL_M = 128  # rows with M <= this are "small M" in the summary

# GEMM operations: "sm80" is the forward inside ops.force_sm80_kernels() (CUTLASS 2.x kernels).
GEMM_OPS = ("fwd", "sm80", "dgrad", "wgrad", "fwdbwd")
# linact: one row per baseline of CutlassLinear(activation="gelu_tanh") forward+backward: eager
# nn.Sequential(nn.Linear, nn.GELU("tanh")), and torch.compile of that Sequential. A row of
# another activation names it after the baseline: "eager-relu", "compile-gelu" (linact_op).
LINACT_OPS = ("eager", "compile")


def linact_op(baseline: str, activation: str) -> str:
    """The op of a linact row: the baseline, suffixed with the activation unless it is GELU(tanh)
    (whose rows keep the names they always had)."""
    if baseline not in LINACT_OPS or activation not in LINACT_ACTIVATIONS:
        raise ValueError(
            f"linact_op: expected a baseline of {LINACT_OPS} and an activation of "
            f"{LINACT_ACTIVATIONS}, got {baseline!r}, {activation!r}"
        )
    return baseline if activation == LINACT_ACTIVATION else f"{baseline}-{activation}"


def split_linact_op(op: str) -> tuple[str, str]:
    """(baseline, activation) of a linact row's op; ValueError for any other name."""
    baseline, _, activation = op.partition("-")
    activation = activation or LINACT_ACTIVATION
    try:
        canonical = linact_op(baseline, activation)
    except ValueError:
        canonical = None
    if canonical != op:  # also "eager-gelu_tanh" and "eager-": each row has one name
        raise ValueError(f"unknown linact op {op!r}")
    return baseline, activation


LINACT_ALL_OPS = tuple(linact_op(b, a) for a in LINACT_ACTIVATIONS for b in LINACT_OPS)
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
