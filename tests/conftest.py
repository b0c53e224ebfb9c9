"""Shared fixtures and helpers of the cutlass_nn CPU test suite.

* hypothesis profiles: "ci" (deterministic, fixed example count; loaded when $CI is set) and
  "dev" (the default).
* ``sample_inputs()`` and friends: the argument sets reused by the correctness, gradcheck and
  opcheck tests (the pattern of pytorch/extension-cpp's tests).
* per-dtype tolerances and ``assert_close_ref`` (compare to the same-dtype torch result and to a
  float64 reference).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

import pytest
import torch
from hypothesis import HealthCheck, settings

import cutlass_nn  # noqa: F401  (registers torch.ops.cutlass_nn)

# ---------------------------------------------------------------------------------------------
# hypothesis
# ---------------------------------------------------------------------------------------------

settings.register_profile(
    "ci",
    deadline=None,
    max_examples=40,
    derandomize=True,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "dev",
    deadline=None,
    max_examples=60,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("ci" if os.environ.get("CI") else "dev")

ops = torch.ops.cutlass_nn
DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
DTYPE_IDS = ["f32", "f64", "bf16", "f16"]

# (rtol, atol) for a reduction of length ~1; atol is scaled by sqrt(reduction length).
TOLERANCES = {
    torch.float64: (1e-10, 1e-10),
    torch.float32: (1e-5, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-2),
    torch.float16: (2e-3, 2e-3),
}


def tol(dtype: torch.dtype, reduction: int = 1) -> dict:
    rtol, atol = TOLERANCES[dtype]
    return dict(rtol=rtol, atol=atol * math.sqrt(max(reduction, 1)))


def assert_close_ref(actual, expected_same_dtype, expected_f64, *, reduction: int = 1):
    """``actual`` matches both the same-dtype torch result and the float64 reference (computed
    from the same, already rounded, inputs) within the dtype's tolerance."""
    assert actual.dtype == expected_same_dtype.dtype, (actual.dtype, expected_same_dtype.dtype)
    assert actual.shape == expected_same_dtype.shape, (actual.shape, expected_same_dtype.shape)
    t = tol(actual.dtype, reduction)
    torch.testing.assert_close(actual, expected_same_dtype, **t)
    # the float64 reference: twice the tolerance (the same-dtype torch result is off too)
    torch.testing.assert_close(
        actual.double(), expected_f64.double(), rtol=2 * t["rtol"], atol=2 * t["atol"]
    )


def make(shape, dtype=torch.float32, requires_grad=False, *, seed_gen=None):
    g = seed_gen
    t = torch.randn(shape, dtype=torch.float64, generator=g).to(dtype)
    return t.requires_grad_(requires_grad)


# ---------------------------------------------------------------------------------------------
# Sample inputs
# ---------------------------------------------------------------------------------------------


@dataclass
class LinearCase:
    """One linear problem: input [*lead, K], weight [N, K], optional bias [N]."""

    name: str
    lead: tuple
    n: int
    k: int
    bias: bool

    @property
    def m(self) -> int:
        return math.prod(self.lead)

    def tensors(self, dtype=torch.float32, requires_grad=False, seed=0):
        g = torch.Generator().manual_seed(seed)
        x = make((*self.lead, self.k), dtype, requires_grad, seed_gen=g)
        w = make((self.n, self.k), dtype, requires_grad, seed_gen=g)
        b = make((self.n,), dtype, requires_grad, seed_gen=g) if self.bias else None
        dy = make((*self.lead, self.n), dtype, requires_grad, seed_gen=g)
        return x, w, b, dy


LINEAR_CASES = [
    LinearCase("2d_bias", (5,), 3, 4, True),
    LinearCase("2d_nobias", (5,), 3, 4, False),
    LinearCase("1d_input", (), 3, 4, True),
    LinearCase("3d_bias", (2, 3), 4, 5, True),
    LinearCase("4d_nobias", (2, 1, 3), 2, 3, False),
    LinearCase("odd_shapes", (7,), 13, 11, True),
    LinearCase("empty_batch", (0,), 3, 4, True),
    LinearCase("empty_batch_nd", (2, 0), 3, 4, False),
    LinearCase("N0", (3,), 0, 4, True),
    LinearCase("K0", (3,), 5, 0, True),
    LinearCase("K0_nd", (2, 3), 5, 0, False),
]


@dataclass
class PairCase:
    name: str
    a_shape: tuple
    b_shape: tuple
    # "contig", "t" (b given as a transposed view), "slice" (strided slices)
    layout: str = "contig"
    extra: dict = field(default_factory=dict)

    def tensors(self, dtype=torch.float32, requires_grad=False, seed=0):
        g = torch.Generator().manual_seed(seed)
        if self.layout == "contig":
            a = make(self.a_shape, dtype, seed_gen=g)
            b = make(self.b_shape, dtype, seed_gen=g)
        elif self.layout == "t":
            a = make(self.a_shape[::-1], dtype, seed_gen=g).t()
            b = make(self.b_shape[::-1], dtype, seed_gen=g).t()
        elif self.layout == "slice":
            a = make((self.a_shape[0] * 2, self.a_shape[1] + 3), dtype, seed_gen=g)[::2, 1:-2]
            b = make((self.b_shape[0] + 1, self.b_shape[1] * 2), dtype, seed_gen=g)[1:, ::2]
        else:
            raise ValueError(self.layout)
        assert a.shape == self.a_shape and b.shape == self.b_shape
        return a.requires_grad_(requires_grad), b.requires_grad_(requires_grad)


MM_CASES = [
    PairCase("square", (4, 4), (4, 4)),
    PairCase("odd", (5, 7), (7, 3)),
    PairCase("transposed", (5, 7), (7, 3), "t"),
    PairCase("sliced", (5, 7), (7, 3), "slice"),
    PairCase("empty_n", (0, 4), (4, 3)),
    PairCase("empty_p", (3, 4), (4, 0)),
    PairCase("m0", (3, 0), (0, 2)),
]

ADD2_CASES = [
    PairCase("1d", (7,), (7,)),
    PairCase("2d", (5, 7), (5, 7)),
    PairCase("3d", (2, 3, 4), (2, 3, 4)),
    PairCase("transposed", (5, 7), (5, 7), "t"),
    PairCase("sliced", (5, 7), (5, 7), "slice"),
    PairCase("scalar", (), ()),
    PairCase("empty", (0, 3), (0, 3)),
]


def sample_inputs(dtype=torch.float64, requires_grad=False):
    """(op name, args, kwargs, case id) for every operator; the pattern of
    pytorch/extension-cpp's ``sample_inputs``."""
    out = []
    for c in LINEAR_CASES:
        x, w, b, dy = c.tensors(dtype, requires_grad)
        out.append(("linear", (x, w, b), {}, c.name))
        out.append(("linear_dgrad", (dy, w), {}, c.name))
        out.append(("linear_wgrad", (dy, x), {}, c.name))
        out.append(("bias_grad", (dy,), {}, c.name))
        if not requires_grad:
            gw = make((c.n, c.k), dtype)
            out.append(("linear_wgrad_accumulate_", (gw, dy, x), {}, c.name))
    for c in MM_CASES:
        a, b = c.tensors(dtype, requires_grad)
        out.append(("mm", (a, b), {}, c.name))
        if not requires_grad:
            # `out` of the result's shape: resizing a graph input (an empty `out`) is not
            # traceable by AOTAutograd on torch 2.14 ("expand: the requested shape has too few
            # dimensions"); the resize semantics are tested eagerly in test_ops.py.
            shape = (a.shape[0], b.shape[1])
            out.append(("mm.out", (a, b), {"out": torch.full(shape, float("nan"), dtype=dtype)}, c.name))
    for c in ADD2_CASES:
        a, b = c.tensors(dtype, requires_grad)
        out.append(("add2", (a, b), {}, c.name))
    return out


def op_overload(name: str):
    if name == "mm.out":
        return ops.mm.out
    return getattr(ops, name).default


def as_params(samples):
    """pytest.param list, one per sample, with the id "op-case"."""
    return [
        pytest.param(op, args, kwargs, id=f"{op}-{case}") for op, args, kwargs, case in samples
    ]


@pytest.fixture
def gen(request):
    """A CUDA generator seeded from the test's node id (the GPU tests draw their inputs from it)."""
    from cuda_helpers import seeded_generator

    return seeded_generator(request.node.nodeid)


@pytest.fixture
def empty_autotune_table():
    """The autotune table empty and first-call mode off, before and after the test."""
    from cutlass_nn import autotune

    previous = autotune.enable(False)
    autotune.clear()
    yield
    autotune.clear()
    autotune.enable(previous)
