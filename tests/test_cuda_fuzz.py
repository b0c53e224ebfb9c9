"""GPU fuzzing: hypothesis draws GEMM problems (shapes 0..5000 per dimension, operand layouts,
dtypes and float32 precisions, activations, bias layouts) and each cutlass_nn result must be as
close to a float64 reference as torch's own result on the same inputs: err(ours) <= 2 err(torch)
+ a small floor, or, where torch's result came from a kernel of another precision (float32 gemv
without TF32 on tiny problems), within the classical error bound of the dtype (within_error_bound).

``CUTLASS_NN_FUZZ_EXAMPLES`` sets the number of examples (default 300; the GPU record runs
10,000). A failing example is appended as JSON to the file named by ``CUTLASS_NN_FUZZ_FAILURES``
(when set) and belongs in ``tests/fuzz_regressions.json``, which ``test_fuzz_regressions`` replays
on every run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

import cutlass_nn
from cuda_helpers import CUDA_MARKS, check_close, matmul_precision

pytestmark = CUDA_MARKS

EXAMPLES = int(os.environ.get("CUTLASS_NN_FUZZ_EXAMPLES", "300"))
REGRESSIONS = Path(__file__).with_name("fuzz_regressions.json")

# dtype name -> (dtype, TF32 allowed, floor of the accuracy rule)
PRECISIONS = {
    "f16": (torch.float16, False, 2e-3),
    "bf16": (torch.bfloat16, False, 2e-3),
    "f32_tf32": (torch.float32, True, 1e-3),
    "f32_highest": (torch.float32, False, 1e-5),
    "f64": (torch.float64, False, 1e-10),
}
OPS = ["linear", "linear_dgrad", "linear_wgrad", "mm"]
LAYOUTS = ["contig", "transposed", "colslice", "offset"]
BIAS = ["none", "contig", "offset", "strided", "broadcast"]
ACTIVATIONS = [None, "relu", "gelu", "gelu_tanh"]
TORCH_ACT = {
    None: lambda t: t,
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
}


def _matrix(rows: int, cols: int, dtype, layout: str, gen) -> torch.Tensor:
    def randn(n):
        return torch.randn(n, device="cuda", generator=gen).to(dtype)

    if layout == "transposed":
        return randn(rows * cols).view(cols, rows).t()
    if layout == "colslice":
        return randn(rows * (cols + 3)).view(rows, cols + 3)[:, :cols]
    if layout == "offset":
        return randn(rows * cols + 1)[1:].view(rows, cols)
    return randn(rows * cols).view(rows, cols)


def _bias(n: int, dtype, layout: str, gen) -> torch.Tensor | None:
    if layout == "none":
        return None
    if layout == "broadcast":  # one value, stride 0
        return torch.randn(1, device="cuda", generator=gen).to(dtype).expand(n)
    if layout == "strided":
        return torch.randn(2 * n, device="cuda", generator=gen).to(dtype)[::2]
    if layout == "offset":
        return torch.randn(n + 1, device="cuda", generator=gen).to(dtype)[1:]
    return torch.randn(n, device="cuda", generator=gen).to(dtype)


# Unit roundoff of the GEMM inputs as the kernels see them (TF32: 10-bit mantissa; the 3xTF32
# split of float32 "highest" drops the small x small product, about 2^-22 of each term) and of
# the output dtype.
INPUT_UNIT = {"f16": 0.0, "bf16": 0.0, "f32_tf32": 2.0**-11, "f32_highest": 2.0**-21, "f64": 0.0}
OUTPUT_UNIT = {"f16": 2.0**-11, "bf16": 2.0**-8, "f32_tf32": 2.0**-24, "f32_highest": 2.0**-24,
               "f64": 2.0**-53}  # fmt: skip


def within_error_bound(case: dict, ours, ref, abs_a_abs_b, abs_bias) -> bool:
    """The classical elementwise bound of a dot product with rounded inputs and float32 (float64)
    accumulation: |ours - ref| <= (2 u_in + (K + 2) u_acc) (|A| |B| + |bias|) L + 2 u_out |ref|,
    L = 1.2 the activations' Lipschitz bound. torch's own result on tiny problems may come from
    a kernel that ignores TF32 (gemv for M = 1), so the rule relative to torch's error cannot
    judge those; this bound can."""
    p = case["precision"]
    u_acc = 2.0**-53 if p == "f64" else 2.0**-24
    k = case["k"]
    scale = abs_a_abs_b if abs_bias is None else abs_a_abs_b + abs_bias
    bound = (2 * INPUT_UNIT[p] + (k + 2) * u_acc) * scale * 1.2 + 2 * OUTPUT_UNIT[p] * ref.abs()
    diff = (ours.double() - ref).abs()
    return bool((diff <= bound + 1e-300).all())


def run_case(case: dict) -> None:
    """One fuzz case: builds the operands, runs ours, torch's and the float64 reference, checks
    the accuracy rule (raises AssertionError with the case in the message)."""
    dtype, tf32, floor = PRECISIONS[case["precision"]]
    m, n, k = case["m"], case["n"], case["k"]
    gen = torch.Generator(device="cuda").manual_seed(case["seed"])
    op, act = case["op"], case.get("activation")
    with matmul_precision(tf32):
        if op == "linear":
            x = _matrix(m, k, dtype, case["layout_a"], gen)
            w = _matrix(n, k, dtype, case["layout_b"], gen)
            b = _bias(n, dtype, case["bias"], gen)
            ours = cutlass_nn.functional.linear(x, w, b, activation=act)
            theirs = TORCH_ACT[act](F.linear(x, w, b))
            ref = TORCH_ACT[act](F.linear(x.double(), w.double(), None if b is None else b.double()))
            abs_ab = F.linear(x.double().abs(), w.double().abs())
            abs_bias = None if b is None else b.double().abs()
        else:
            shapes = {"linear_dgrad": ((m, n), (n, k)), "linear_wgrad": ((m, n), (m, k)),
                      "mm": ((m, k), (k, n))}[op]  # fmt: skip
            a = _matrix(*shapes[0], dtype, case["layout_a"], gen)
            b = _matrix(*shapes[1], dtype, case["layout_b"], gen)
            fn = {"linear_dgrad": lambda p, q: p @ q, "linear_wgrad": lambda p, q: p.t() @ q,
                  "mm": lambda p, q: p @ q}[op]  # fmt: skip
            ours = getattr(cutlass_nn.ops, op)(a, b)
            theirs = fn(a, b)
            ref = fn(a.double(), b.double())
            abs_ab, abs_bias = fn(a.double().abs(), b.double().abs()), None
        try:
            check_close(ours, theirs, ref, floor, json.dumps(case))
        except AssertionError:
            if not within_error_bound(case, ours, ref, abs_ab, abs_bias):
                raise


@st.composite
def cases(draw) -> dict:
    dim = st.one_of(st.integers(0, 16), st.integers(0, 300), st.integers(0, 5000))
    op = draw(st.sampled_from(OPS))
    return {
        "op": op,
        "m": draw(dim),
        "n": draw(dim),
        "k": draw(dim),
        "precision": draw(st.sampled_from(list(PRECISIONS))),
        "layout_a": draw(st.sampled_from(LAYOUTS)),
        "layout_b": draw(st.sampled_from(LAYOUTS)),
        "bias": draw(st.sampled_from(BIAS)) if op == "linear" else "none",
        "activation": draw(st.sampled_from(ACTIVATIONS)) if op == "linear" else None,
        "seed": draw(st.integers(0, 2**31 - 1)),
    }


def _keep_failure(case: dict) -> None:
    path = os.environ.get("CUTLASS_NN_FUZZ_FAILURES")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(case) + "\n")


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,  # the GPU machine is fresh each time: failures go to fuzz_regressions.json
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(case=cases())
def test_fuzz_against_float64(case):
    note(json.dumps(case))
    try:
        run_case(case)
    except AssertionError:
        _keep_failure(case)
        raise


def _regressions() -> list[dict]:
    return json.loads(REGRESSIONS.read_text()) if REGRESSIONS.exists() else []


@pytest.mark.parametrize("case", _regressions() or [None], ids=lambda c: "none" if c is None else
                         f"{c['op']}-{c['m']}x{c['n']}x{c['k']}-{c['precision']}")  # fmt: skip
def test_fuzz_regressions(case):
    if case is None:
        pytest.skip("no regression case recorded")
    run_case(case)
