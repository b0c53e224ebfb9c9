"""Hardening on the GPU: numerical edge cases and determinism on every kernel path, threads on
their own streams, process-wide switches, long-run memory, out-of-memory inside a call.

A "path" is one way a GEMM can run: the SM90 rule (bf16, fp16), forced stream-K and split-K
reductions, the transposed small-M kernels, the fused activation epilogue, TF32 and 3xTF32
float32, the forced CUTLASS 2.x kernels, the plain-CUDA fallback (misaligned operands), the padded
path (odd K onto the TMA kernels) and float64. (GPU fuzzing: tests/test_cuda_fuzz.py.)"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

import cutlass_nn
from cuda_helpers import (
    CUDA_MARKS,
    check_close,
    forced_config,
    is_sm90_build,
    matmul_precision,
    run_ours,
    run_torch,
    to64,
)

pytestmark = CUDA_MARKS

ops = cutlass_nn.ops


@dataclass(frozen=True)
class Path:
    """One kernel path: dtype, (M, N, K) of the op's problem, operand layout, how it is forced."""

    name: str
    dtype: torch.dtype
    shape: tuple
    layout: str = "contig"
    config: int = -1  # forced SM90 configuration (-1: the rule)
    splits: int = 0
    sm80: bool = False
    tf32: bool = False
    activation: str | None = None  # the fused epilogue (linear only)
    hopper_only: bool = False

    @contextlib.contextmanager
    def active(self):
        if self.hopper_only and not is_sm90_build():
            pytest.skip(f"path {self.name} needs an SM90 GPU and an sm_90a build")
        with contextlib.ExitStack() as stack:
            stack.enter_context(ops.force_sm80_kernels(self.sm80))
            stack.enter_context(matmul_precision(self.tf32))
            if self.config >= 0:
                stack.enter_context(forced_config(self.config, 0, self.splits))
            yield


PATHS = [
    Path("sm90_bf16", torch.bfloat16, (512, 1024, 768), hopper_only=True),
    Path("sm90_f16", torch.float16, (512, 1024, 768), hopper_only=True),
    Path("streamk", torch.bfloat16, (256, 512, 4096), config=2, hopper_only=True),
    Path("splitk3", torch.bfloat16, (256, 512, 4096), config=2, splits=3, hopper_only=True),
    Path("splitk4_f16", torch.float16, (256, 512, 4096), config=2, splits=4, hopper_only=True),
    Path("small_m_transposed", torch.bfloat16, (16, 2048, 1024), hopper_only=True),
    Path("fused_gelu", torch.bfloat16, (512, 1024, 768), activation="gelu", hopper_only=True),
    Path("tf32", torch.float32, (512, 1024, 768), tf32=True),
    Path("3xtf32", torch.float32, (512, 1024, 768), hopper_only=True),
    Path("sm80_bf16", torch.bfloat16, (512, 1024, 768), sm80=True),
    Path("sm80_f16", torch.float16, (512, 1024, 768), sm80=True),
    Path("fallback_f16", torch.float16, (64, 96, 40), layout="offset"),
    Path("padded_f16", torch.float16, (1024, 1024, 1001), hopper_only=True),
    Path("f64", torch.float64, (128, 96, 80)),
]
PATH_IDS = [p.name for p in PATHS]
OPS = ["linear", "linear_dgrad", "linear_wgrad", "mm"]


def _operands(op: str, path: Path, gen) -> tuple:
    """The op's arguments on this path (plain random normal values)."""
    m, n, k = path.shape
    dt = path.dtype

    def mat(r, c):
        t = torch.randn(r * c + (1 if path.layout == "offset" else 0), device="cuda",
                        generator=gen).to(dt)  # fmt: skip
        return (t[1:] if path.layout == "offset" else t).view(r, c)

    if op == "linear":
        return (mat(m, k), mat(n, k), torch.randn(n, device="cuda", generator=gen).to(dt))
    return {
        "linear_dgrad": lambda: (mat(m, n), mat(n, k)),
        "linear_wgrad": lambda: (mat(m, n), mat(m, k)),
        "mm": lambda: (mat(m, k), mat(k, n)),
    }[op]()


def _ours(op: str, path: Path, args: tuple) -> torch.Tensor:
    if op == "linear" and path.activation is not None:
        return cutlass_nn.functional.linear(*args, activation=path.activation)
    return run_ours(op, args)


def _torch(op: str, path: Path, args: tuple) -> torch.Tensor:
    out = run_torch(op, args)
    if op == "linear" and path.activation == "gelu":
        out = F.gelu(out)
    return out


def _cases():
    for path in PATHS:
        for op in OPS:
            if path.activation is not None and op != "linear":
                continue
            yield pytest.param(path, op, id=f"{path.name}-{op}")


# ---------------------------------------------------------------------------------------------
# NaN / Inf propagation, fp16 overflow, -0.0 and subnormals
# ---------------------------------------------------------------------------------------------


def _masks_agree(ours: torch.Tensor, ref: torch.Tensor, context: str) -> None:
    for name, fn in (("NaN", torch.isnan), ("+Inf", torch.isposinf), ("-Inf", torch.isneginf)):
        a, b = fn(ours), fn(ref)
        differ = int((a != b).sum())
        assert differ == 0, (
            f"[{context}] {name} pattern differs from torch's in {differ} element(s): ours "
            f"{int(a.sum())}, torch {int(b.sum())}"
        )


@pytest.mark.parametrize("path,op", list(_cases()))
@pytest.mark.parametrize("poison", ["nan", "inf"])
def test_non_finite_inputs_propagate_like_torch(path, op, poison, gen):
    with path.active():
        args = list(_operands(op, path, gen))
        first = args[0].clone()
        rows, cols = first.shape
        first[rows // 3, cols // 2] = float("nan") if poison == "nan" else float("inf")
        first[rows - 1, 0] = float("nan") if poison == "nan" else float("-inf")
        args[0] = first
        ours = _ours(op, path, tuple(args))
        ref = _torch(op, path, tuple(args))
        _masks_agree(ours, ref, f"{path.name} {op} {poison}")
        finite = torch.isfinite(ref)
        assert finite.any()
        assert torch.isfinite(ours[finite]).all(), f"[{path.name} {op}] finite elements lost"


F16_PATHS = [p for p in PATHS if p.dtype == torch.float16]


@pytest.mark.parametrize("path", F16_PATHS, ids=[p.name for p in F16_PATHS])
@pytest.mark.parametrize("op", OPS)
def test_fp16_overflow_gives_inf_where_torch_does(path, op, gen):
    with path.active():
        args = list(_operands(op, path, gen))
        a = args[0].clone()
        # Two lines of the first operand whose products with the (positive, 30-60) second
        # operand sum far past fp16's range, the rest of normal size: every output element is
        # either far above 65504 or far below it. The lines are the ones summed into one output
        # line: rows of A, or for the weight gradient (dY^T X, summed over rows) columns of dY.
        if op == "linear_wgrad":
            a[:, 0] = 60.0
            a[:, a.shape[1] // 2] = -60.0
        else:
            a[0] = 60.0
            a[a.shape[0] // 2] = -60.0
        args[0] = a
        b = args[1].clone().abs_().clamp_(min=0.5).mul_(60.0).clamp_(max=60.0)
        args[1] = b
        ours = _ours(op, path, tuple(args))
        ref = _torch(op, path, tuple(args))
        assert torch.isinf(ref).any(), "the case does not overflow in torch"
        _masks_agree(ours, ref, f"{path.name} {op} overflow")


@pytest.mark.parametrize("path,op", list(_cases()))
def test_negative_zero_and_subnormal_inputs(path, op, gen):
    with path.active():
        args = list(_operands(op, path, gen))
        tiny = torch.finfo(path.dtype).tiny
        for i in (0, 1):
            t = args[i].clone()
            mask = torch.rand(t.shape, device="cuda", generator=gen)
            t[mask < 0.2] = -0.0
            t[(mask >= 0.2) & (mask < 0.3)] = tiny / 4  # subnormal
            t[(mask >= 0.3) & (mask < 0.35)] = -tiny / 8
            args[i] = t
        ours = _ours(op, path, tuple(args))
        ref = _torch(op, path, tuple(args))
        ref64 = _torch(op, path, to64(tuple(args)))
        floor = {torch.float16: 2e-3, torch.bfloat16: 2e-3, torch.float32: 1e-3,
                 torch.float64: 1e-10}[path.dtype]  # fmt: skip
        check_close(ours, ref, ref64, floor, f"{path.name} {op} -0.0/subnormal")


# ---------------------------------------------------------------------------------------------
# Empty problems
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "f32"])
def test_empty_problems(dtype, gen):
    x0 = torch.randn(5, 0, device="cuda", dtype=dtype)
    w0 = torch.randn(7, 0, device="cuda", dtype=dtype)
    b = torch.randn(7, device="cuda", dtype=dtype)
    assert torch.equal(ops.linear(x0, w0, b), b.expand(5, 7))  # K = 0: the bias
    assert torch.equal(ops.linear(x0, w0), torch.zeros(5, 7, device="cuda", dtype=dtype))
    assert torch.equal(ops.mm(x0, w0.t()), torch.zeros(5, 7, device="cuda", dtype=dtype))
    layer = cutlass_nn.CutlassLinear(6, 4, device="cuda", dtype=dtype)
    for shape in [(0, 6), (3, 0, 6)]:  # M = 0
        x = torch.randn(shape, device="cuda", dtype=dtype, requires_grad=True)
        y = layer(x)
        assert y.shape == (*shape[:-1], 4)
        y.sum().backward()
        assert x.grad.shape == x.shape
        assert torch.equal(layer.weight.grad, torch.zeros_like(layer.weight))
        assert torch.equal(layer.bias.grad, torch.zeros_like(layer.bias))
        layer.zero_grad()
    empty_out = cutlass_nn.CutlassLinear(6, 0, device="cuda", dtype=dtype)  # N = 0
    x = torch.randn(3, 6, device="cuda", dtype=dtype, requires_grad=True)
    y = empty_out(x)
    assert y.shape == (3, 0)
    y.sum().backward()
    assert torch.equal(x.grad, torch.zeros_like(x))
    assert empty_out.weight.grad.shape == (0, 6)


# ---------------------------------------------------------------------------------------------
# Determinism
# ---------------------------------------------------------------------------------------------

# The stream-K scheduler's own decomposition (splits 0) on a problem it splits: few tiles, long K.
DETERMINISM_PATHS = PATHS + [
    Path("streamk_heuristic_long_k", torch.bfloat16, (128, 256, 16384), config=2,
         hopper_only=True),  # fmt: skip
    Path("streamk_split4_long_k", torch.bfloat16, (256, 512, 16384), config=2, splits=4,
         hopper_only=True),  # fmt: skip
]


@pytest.mark.parametrize(
    "path", DETERMINISM_PATHS, ids=[p.name for p in DETERMINISM_PATHS]
)
def test_repeated_calls_are_bitwise_identical(path, gen):
    with path.active():
        for op in OPS:
            if path.activation is not None and op != "linear":
                continue
            args = _operands(op, path, gen)
            first = _ours(op, path, args)
            for _ in range(8):
                again = _ours(op, path, args)
                assert torch.equal(first, again), f"[{path.name} {op}] repeated call differs"
        # A module's forward + backward (its GEMMs are the ones above, same path)
        m, n, k = path.shape
        layer = cutlass_nn.CutlassLinear(k, n, device="cuda", dtype=path.dtype,
                                         activation=path.activation)  # fmt: skip
        x = torch.randn(m, k, device="cuda", generator=gen).to(path.dtype).requires_grad_()
        results = []
        for _ in range(4):
            y = layer(x)
            grads = torch.autograd.grad(y.float().square().sum(), [x, layer.weight, layer.bias])
            results.append((y.detach(), *grads))
        for r in results[1:]:
            for a, b in zip(results[0], r):
                assert torch.equal(a, b), f"[{path.name}] module forward/backward differs"


# ---------------------------------------------------------------------------------------------
# Threads and streams
# ---------------------------------------------------------------------------------------------

THREAD_ITERS = 3000


def _thread_cases(gen, dtype):
    """(name, fn, args) whose results each thread checks against a serial run."""
    x = torch.randn(96, 256, device="cuda", generator=gen).to(dtype)
    w = torch.randn(384, 256, device="cuda", generator=gen).to(dtype)
    b = torch.randn(384, device="cuda", generator=gen).to(dtype)
    a1 = torch.randn(65, 130, device="cuda", generator=gen).to(dtype)
    a2 = torch.randn(130, 33, device="cuda", generator=gen).to(dtype)
    layer = cutlass_nn.CutlassLinear(256, 384, device="cuda", dtype=dtype)

    def module_step(inp):
        inp = inp.detach().requires_grad_()
        y = layer(inp)
        gx, gw, gb = torch.autograd.grad(y.float().square().sum(), [inp, layer.weight, layer.bias])
        return torch.cat([y.flatten().float(), gx.flatten().float(), gw.flatten().float(),
                          gb.flatten().float()])  # fmt: skip

    return [
        ("linear", lambda: ops.linear(x, w, b)),
        ("mm", lambda: ops.mm(a1, a2)),
        ("add2", lambda: cutlass_nn.add2(a1, a1)),
        ("module", lambda: module_step(x)),
    ]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "f32"])
def test_two_threads_on_their_own_streams_match_serial(dtype, gen):
    cases = _thread_cases(gen, dtype)
    expected = [fn() for _, fn in cases]
    torch.cuda.synchronize()
    mismatches: list = [None, None]
    errors: list = []

    def work(slot: int) -> None:
        try:
            stream = torch.cuda.Stream()
            bad = torch.zeros((), dtype=torch.int64, device="cuda")
            with torch.cuda.stream(stream):
                for _ in range(THREAD_ITERS):
                    for (_, fn), want in zip(cases, expected):
                        bad += (fn() != want).sum()
                stream.synchronize()
            mismatches[slot] = int(bad)
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert mismatches == [0, 0], f"elements differing from the serial results: {mismatches}"


def test_kernel_switches_and_last_kernel_name_are_process_wide(gen):
    """Documented behaviour: a forced configuration (or force_sm80_kernels) set on one thread
    applies to every thread, and last_kernel_name() names the last GEMM of any thread."""
    x = torch.randn(256, 512, device="cuda", generator=gen).bfloat16()
    w = torch.randn(512, 512, device="cuda", generator=gen).bfloat16()
    seen: dict = {}

    def other_thread() -> None:
        ops.linear(x, w)
        torch.cuda.synchronize()
        seen["name"] = ops.last_kernel_name()

    with ops.force_sm80_kernels(True):
        t = threading.Thread(target=other_thread)
        t.start()
        t.join()
    assert seen["name"].startswith("sm80"), seen
    assert ops.last_kernel_name() == seen["name"]  # read on the main thread


# ---------------------------------------------------------------------------------------------
# Memory: long runs, out of memory
# ---------------------------------------------------------------------------------------------


def test_ten_thousand_steps_keep_allocated_memory_flat(gen):
    torch.manual_seed(0)
    model = cutlass_nn.convert(
        torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256))
    ).to("cuda", torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    x = torch.randn(128, 256, device="cuda", generator=gen).bfloat16()
    readings = []
    for step in range(10_000):
        model(x).float().square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step >= 100 and step % 1000 == 0 or step == 9_999:
            torch.cuda.synchronize()
            readings.append(torch.cuda.memory_allocated())
    assert len(set(readings)) == 1, f"allocated bytes moved: {readings}"


@contextlib.contextmanager
def _memory_cap(headroom_bytes: int):
    """Caps this process's CUDA memory at what is reserved now plus `headroom_bytes`."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(0).total_memory
    fraction = (torch.cuda.memory_reserved() + headroom_bytes) / total
    torch.cuda.set_per_process_memory_fraction(fraction)
    try:
        yield
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
        torch.cuda.empty_cache()


def test_out_of_memory_inside_a_call_changes_nothing(gen):
    x = torch.randn(8192, 4096, device="cuda", generator=gen).bfloat16()
    w = torch.randn(8192, 4096, device="cuda", generator=gen).bfloat16()
    dy = torch.randn(8192, 8192, device="cuda", generator=gen).bfloat16()
    layer = cutlass_nn.CutlassLinear(4096, 8192, device="cuda", dtype=torch.bfloat16)
    layer.weight.grad = torch.randn_like(layer.weight)
    saved = [t.clone() for t in (x, w, dy, layer.weight, layer.bias, layer.weight.grad)]
    xr = x.detach().clone().requires_grad_()
    y = layer(xr)  # the graph exists before the cap
    with _memory_cap(16 << 20):  # far less than any output here (64-128 MiB)
        for name, call in (
            ("linear", lambda: ops.linear(x, w)),
            ("mm", lambda: ops.mm(x, w.t())),
            ("linear_wgrad", lambda: ops.linear_wgrad(dy, x)),
            ("module forward", lambda: layer(x)),
            ("module backward", lambda: y.backward(dy, retain_graph=True)),
        ):
            with pytest.raises(torch.OutOfMemoryError):
                call()
                pytest.fail(f"{name} did not run out of memory")
    now = (x, w, dy, layer.weight, layer.bias, layer.weight.grad)
    for i, (a, b) in enumerate(zip(now, saved)):
        assert torch.equal(a, b), f"tensor {i} changed by a call that ran out of memory"
    assert xr.grad is None and layer.bias.grad is None
    # The next calls succeed, the interrupted backward included.
    out = ops.linear(x, w)
    check_close(out, F.linear(x, w), F.linear(x.double(), w.double()), 2e-3, "after OOM")
    y.backward(dy)
    assert xr.grad is not None and torch.isfinite(xr.grad).all()
    assert not torch.equal(layer.weight.grad, saved[-1])
