"""Pure helpers: statistics, work counts, geometric mean, number formatting (no GPU)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from cutlass_nn.bench.spec import LINACT_ALL_OPS, REF_CHUNK_ELEMENTS, SAMPLE


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


def paired_ratio_spread(stock_ms: Sequence[float], ours_ms: Sequence[float]) -> dict[str, float]:
    """Spread of the per-round ratios stock / ours of two sides timed in alternating blocks
    (block i of each side ran in the same round, next to each other in time): their median,
    25th and 75th percentiles and count. A row whose blocks are disturbed (a slow block on one
    side: host jitter, a background compile) shows it as a wide interquartile range, which the
    ratio of the two sides' medians alone hides."""
    ratios = [s / o for s, o in zip(stock_ms, ours_ms) if o > 0 and math.isfinite(s / o)]
    lo, hi = median_ci95(ratios)
    return {
        "median": percentile(ratios, 50),
        "p25": percentile(ratios, 25),
        "p75": percentile(ratios, 75),
        "n": len(ratios),
        "ci95_lo": lo,
        "ci95_hi": hi,
    }


def median_ci95(values: Sequence[float]) -> tuple[float | None, float | None]:
    """A distribution-free 95% confidence interval of the median of ``values``: the order
    statistics x_(j) and x_(n+1-j), j the largest rank with P(Binomial(n, 1/2) < j) <= 0.025, so
    that the interval holds the true median with at least 95% probability whatever the
    distribution, provided the values are independent draws of one distribution (rounds whose
    host drifts together make it too narrow). (None, None) below 6 values, where even the whole
    range is not a 95% interval (None, not NaN: the JSON stays standard). Host-bound rows of the
    model benchmark need it: their rounds' ratios spread by 10-20% (host jitter that adjacent
    blocks do not share), so a median of a few dozen rounds cannot tell a 2% difference from none
    (NOTES, thirty-sixth session)."""
    xs = sorted(values)
    n = len(xs)
    if n < 6:
        return None, None
    below = 0.0  # P(Binomial(n, 1/2) < j), for j = 1, 2, ...
    j = 0
    while True:
        nxt = below + math.comb(n, j) / 2**n  # P(B < j + 1)
        if nxt > 0.025:
            break
        below = nxt
        j += 1
    # j = the largest rank (1-based) with P(B < j) <= 0.025; at n >= 6, j >= 1
    return xs[j - 1], xs[n - j]


def gemm_flops(op: str, m: int, n: int, k: int) -> int:
    """2*M*N*K per GEMM; forward+backward is 3 GEMMs (y, dX, dW), and so is a linact row (its
    ops name the baseline). Bias and activation work is not counted."""
    return (3 if op in ("fwdbwd", *LINACT_ALL_OPS) else 1) * 2 * m * n * k


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
# Rows
# ---------------------------------------------------------------------------------------------


def _first_line(exc: BaseException, limit: int = 300) -> str:
    text = str(exc).strip().splitlines()
    msg = f"{type(exc).__name__}: {text[0] if text else ''}"
    return msg if len(msg) <= limit else msg[: limit - 3] + "..."


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


def _fmt(x: float | None, spec: str = ".3f") -> str:
    return "n/a" if x is None or not math.isfinite(x) else format(x, spec)


def _fmt_err(x: float | None) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{x:.2e}"


def _good_ratio(row: dict) -> float | None:
    """The row's ratio when it was measured (status ok, finite), else None."""
    ratio = row.get("ratio")
    ok = row.get("status") == "ok" and ratio is not None and math.isfinite(ratio)
    return ratio if ok else None
