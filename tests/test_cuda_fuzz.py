"""GPU fuzzing: hypothesis draws GEMM problems (shapes 0..5000 per dimension, operand layouts,
dtypes and float32 precisions, activations, bias layouts) and each cutlass_nn result must be as
close to a float64 reference as torch's own result on the same inputs: err(ours) <= 2 err(torch)
+ a small floor.

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
        check_close(ours, theirs, ref, floor, json.dumps(case))


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
