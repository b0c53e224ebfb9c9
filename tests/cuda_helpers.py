"""Helpers shared by the GPU tests (tests/test_cuda_ops.py, tests/test_cuda_integration.py).

* ``CUDA_MARKS``: the module-level marks that skip the GPU tests on machines without a GPU or with
  the CPU flavor of the extension.
* ``Precision`` / ``PRECISIONS`` and ``matmul_precision()``: the dtype / TF32 modes under test.
* ``check_close()``: the accuracy rule, ``err(ours) <= 2 * err(torch) + floor`` with errors
  measured against a float64 reference.
* ``make_matrix()`` / ``make_vector()``: operands in a given memory layout (contiguous, storage
  offset breaking 16-byte alignment, column slice of a wider buffer, transposed view).
* ``gemm_args()`` / ``run_ours()`` / ``run_torch()``: one GEMM operator problem, its cutlass_nn call
  and the same formula in plain torch (which also serves as the float64 reference).
"""

from __future__ import annotations

import contextlib
import zlib
from dataclasses import dataclass
from typing import Iterator

import pytest
import torch
import torch.nn.functional as F

import cutlass_nn

CUDA_OK = torch.cuda.is_available() and cutlass_nn.has_cuda_kernels()
CUDA_MARKS = [
    pytest.mark.cuda,
    pytest.mark.skipif(
        not CUDA_OK, reason="needs a CUDA GPU and the CUDA flavor of the cutlass_nn extension"
    ),
]

NAN = float("nan")

# ---------------------------------------------------------------------------------------------
# Precision modes
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Precision:
    """A dtype under test, whether float32 matmuls may use TF32, and the error floor of the
    accuracy rule (relative, in the norm)."""

    name: str
    dtype: torch.dtype
    tf32: bool
    floor: float


# Floors: float64 far below what a float32 computation would give; IEEE float32 well below
# TF32's error (~5e-4), so a TF32 kernel under "highest" fails; TF32 at about 2x its unit
# roundoff (cuBLAS may pick a non-TF32 kernel for some shapes, e.g. gemv when M == 1, so
# err(torch) can be IEEE-small while ours is legitimately TF32-sized); 16-bit outputs at about
# half a bfloat16 ulp.
PRECISIONS = [
    Precision("f16", torch.float16, False, 2e-3),
    Precision("bf16", torch.bfloat16, False, 2e-3),
    Precision("f32_tf32", torch.float32, True, 1e-3),
    Precision("f32_ieee", torch.float32, False, 1e-5),
    Precision("f64", torch.float64, False, 1e-10),
]
PRECISION_IDS = [p.name for p in PRECISIONS]
# 16-bit products summed into a float32 result (fp32 main gradient): fp32 accumulation error.
FLOOR_16BIT_INTO_F32 = 1e-4

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
DTYPE_IDS = ["f16", "bf16", "f32", "f64"]
# Floors for elementwise / reduction results of a dtype (no TF32 involved).
DTYPE_FLOOR = {
    torch.float16: 2e-3,
    torch.bfloat16: 2e-3,
    torch.float32: 1e-5,
    torch.float64: 1e-10,
}

PATHS = ["default", "sm80"]


@contextlib.contextmanager
def matmul_precision(tf32: bool) -> Iterator[None]:
    """Sets TF32 for float32 matmuls (legacy API only: torch refuses a mix of the legacy and new
    fp32_precision APIs) and restores the previous setting."""
    previous = torch.get_float32_matmul_precision()
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)


@contextlib.contextmanager
def kernel_path(path: str) -> Iterator[None]:
    """``"default"`` (SM90 kernels where they fit on Hopper) or ``"sm80"`` (forced CUTLASS 2.x)."""
    with cutlass_nn.ops.force_sm80_kernels(path == "sm80"):
        yield


# ---------------------------------------------------------------------------------------------
# Accuracy rule
# ---------------------------------------------------------------------------------------------


def rel_err(x: torch.Tensor, ref64: torch.Tensor) -> float:
    """``||x - ref64|| / ||ref64||`` in float64 (the absolute error when ``ref64`` is zero)."""
    if ref64.numel() == 0:
        return 0.0
    diff = torch.linalg.vector_norm(x.detach().double() - ref64).item()
    denom = torch.linalg.vector_norm(ref64).item()
    return diff / denom if denom > 0 else diff


def check_close(
    ours: torch.Tensor,
    torch_same_dtype: torch.Tensor,
    ref64: torch.Tensor,
    floor: float,
    context: str = "",
) -> None:
    """Asserts ``err(ours) <= 2 * err(torch) + floor`` where ``err`` is the relative error in the
    norm against the float64 reference ``ref64`` and ``torch_same_dtype`` is PyTorch's own result
    in the same dtype and TF32 setting; also that ``ours`` has no NaN and the right metadata."""
    where = (
        f"[{context}] shape {tuple(ours.shape)}, dtype {ours.dtype}, device {ours.device}, "
        f"TF32 {torch.get_float32_matmul_precision()!r}"
    )
    assert ours.shape == ref64.shape, f"{where}: shape differs from the reference {ref64.shape}"
    assert ours.dtype == torch_same_dtype.dtype, f"{where}: torch gives {torch_same_dtype.dtype}"
    assert ours.device == torch_same_dtype.device, f"{where}: torch gives {torch_same_dtype.device}"
    nans = int(torch.isnan(ours).sum())
    assert nans == 0, f"{where}: {nans} NaN element(s) of {ours.numel()}"
    err_ours = rel_err(ours, ref64)
    err_torch = rel_err(torch_same_dtype, ref64)
    assert err_ours <= 2 * err_torch + floor, (
        f"{where}: relative error {err_ours:.3e} > 2 * {err_torch:.3e} (torch) + {floor:.1e}"
    )


def assert_finite(t: torch.Tensor, context: str = "") -> None:
    bad = int((~torch.isfinite(t)).sum())
    assert bad == 0, (
        f"[{context}] {bad} non-finite element(s) of {t.numel()}, shape {tuple(t.shape)}"
    )


def poison_allocator(numel: int, dtype: torch.dtype, device="cuda") -> None:
    """Frees a NaN-filled block of ``numel`` elements, so that the caching allocator likely hands
    that memory to the next allocation of the same size: an output element the op never writes
    then shows up as NaN."""
    block = torch.full((max(numel, 1),), NAN, dtype=dtype, device=device)
    del block


def seeded_generator(key: str, device="cuda") -> torch.Generator:
    """A generator seeded from ``key`` (e.g. a test's node id): each test draws its own inputs,
    reproducibly."""
    return torch.Generator(device=device).manual_seed(zlib.crc32(key.encode()))


# ---------------------------------------------------------------------------------------------
# SM90 kernel selection
# ---------------------------------------------------------------------------------------------


def is_sm90_build() -> bool:
    """An SM 9.0 (Hopper) GPU and an extension built with its sm_90a kernels."""
    return (
        torch.cuda.get_device_capability() == (9, 0)
        and "90a" in cutlass_nn.build_info()["cuda_archs"]
    )


def needs_sm90() -> None:
    """Skips the calling test unless is_sm90_build(), saying which part is missing."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an SM 9.0 (Hopper) GPU")
    if "90a" not in cutlass_nn.build_info()["cuda_archs"]:
        pytest.skip("the extension was built without sm_90a kernels")


def sm90_config_names() -> list[str]:
    """The SM90 tile configuration names, in index order."""
    return [n for n in torch.ops.cutlass_nn._gemm_configs().split("\n") if n]


@contextlib.contextmanager
def forced_config(config: int, swizzle: int = 0, splits: int = 0) -> Iterator[None]:
    """Within the block every GEMM is forced to one SM90 configuration (process-wide)."""
    previous = torch.ops.cutlass_nn._set_gemm_config(config, swizzle, splits)
    try:
        yield
    finally:
        torch.ops.cutlass_nn._set_gemm_config(*previous)


# ---------------------------------------------------------------------------------------------
# Operands in a given memory layout
# ---------------------------------------------------------------------------------------------

LAYOUTS = ["contig", "offset", "colslice", "transposed"]


def _randn(n, dtype, gen, device="cuda") -> torch.Tensor:
    return torch.randn(n, generator=gen, device=device, dtype=torch.float32).to(dtype)


def make_matrix(rows: int, cols: int, dtype, layout: str, gen, device="cuda") -> torch.Tensor:
    """A random [rows, cols] matrix stored as ``layout``:

    * ``contig``: contiguous.
    * ``offset``: contiguous at storage offset 1 (the data pointer is not 16-byte aligned).
    * ``colslice``: ``buf[:, :cols]`` of a [rows, cols + 3] buffer (odd leading dimension).
    * ``transposed``: ``buf.t()`` of a contiguous [cols, rows] buffer (column-major).
    """
    if layout == "contig":
        return _randn(rows * cols, dtype, gen, device).view(rows, cols)
    if layout == "offset":
        return _randn(rows * cols + 1, dtype, gen, device)[1:].view(rows, cols)
    if layout == "colslice":
        return _randn(rows * (cols + 3), dtype, gen, device).view(rows, cols + 3)[:, :cols]
    if layout == "transposed":
        return _randn(rows * cols, dtype, gen, device).view(cols, rows).t()
    raise ValueError(layout)


def make_vector(n: int, dtype, layout: str, gen, device="cuda") -> torch.Tensor:
    """A random [n] vector: ``offset`` breaks 16-byte alignment, ``colslice`` is strided
    (``buf[::2]``), the other layouts are contiguous."""
    if layout == "offset":
        return _randn(n + 1, dtype, gen, device)[1:]
    if layout == "colslice":
        return _randn(2 * n, dtype, gen, device)[::2]
    return _randn(n, dtype, gen, device)


# ---------------------------------------------------------------------------------------------
# GEMM operator problems
# ---------------------------------------------------------------------------------------------

# "linear" has a bias, "linear_nobias" not; M rows, N = out_features, K = in_features.
GEMM_OPS = ["linear", "linear_nobias", "linear_dgrad", "linear_wgrad", "mm"]


def gemm_args(op: str, m: int, n: int, k: int, dtype, layout: str, gen, device="cuda") -> tuple:
    """The arguments of ``op`` for an [M, N, K] problem, every operand in ``layout``."""
    if op in ("linear", "linear_nobias"):
        x = make_matrix(m, k, dtype, layout, gen, device)
        w = make_matrix(n, k, dtype, layout, gen, device)
        b = make_vector(n, dtype, layout, gen, device) if op == "linear" else None
        return (x, w, b)
    shapes = {
        "linear_dgrad": [(m, n), (n, k)],
        "linear_wgrad": [(m, n), (m, k)],
        "mm": [(m, k), (k, n)],
    }[op]
    return tuple(make_matrix(r, c, dtype, layout, gen, device) for r, c in shapes)


def gemm_out_shape(op: str, m: int, n: int, k: int) -> tuple:
    if op == "linear_dgrad":
        return (m, k)
    if op == "linear_wgrad":
        return (n, k)
    return (m, n)


def run_ours(op: str, args: tuple) -> torch.Tensor:
    ops = cutlass_nn.ops
    if op in ("linear", "linear_nobias"):
        return ops.linear(*args)
    if op == "linear_dgrad":
        return ops.linear_dgrad(*args)
    if op == "linear_wgrad":
        return ops.linear_wgrad(*args)
    if op == "mm":
        return ops.mm(*args)
    raise ValueError(op)


def run_torch(op: str, args: tuple) -> torch.Tensor:
    """The same formula in torch (any dtype; with float64 arguments it is the reference)."""
    if op in ("linear", "linear_nobias"):
        return F.linear(*args)
    if op == "linear_dgrad":
        dy, w = args
        return torch.matmul(dy, w)
    if op == "linear_wgrad":
        dy, x = args
        return torch.mm(dy.flatten(0, -2).t(), x.flatten(0, -2))
    if op == "mm":
        return torch.mm(*args)
    raise ValueError(op)


def to64(args: tuple) -> tuple:
    return tuple(None if a is None else a.detach().double() for a in args)


def clone_all(args: tuple) -> tuple:
    return tuple(None if a is None else a.clone() for a in args)


def assert_unchanged(args: tuple, before: tuple, context: str = "") -> None:
    """Every tensor in ``args`` still equals its clone in ``before`` (the inputs hold no NaN, so
    ``torch.equal`` is an exact comparison)."""
    for i, (a, b) in enumerate(zip(args, before)):
        if a is not None:
            assert torch.equal(a, b), f"[{context}] argument {i} was modified by the op"
