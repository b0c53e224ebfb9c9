"""cutlass_nn on a CUDA GPU within PyTorch's machinery: streams, CUDA graphs, torch.compile, a
second GPU, memory, the new fp32_precision API; and (marked slow) problems whose element counts
pass 2^31."""

from __future__ import annotations

import copy
import gc
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import cutlass_nn
from cuda_helpers import (
    CUDA_MARKS,
    GEMM_OPS,
    NAN,
    PATHS,
    check_close,
    gemm_args,
    kernel_path,
    matmul_precision,
    run_ours,
    run_torch,
    to64,
)

pytestmark = CUDA_MARKS

ops = cutlass_nn.ops


@pytest.fixture
def path(request):
    """A kernel path (indirect parameter), active for the whole test."""
    with kernel_path(request.param):
        yield request.param


@pytest.fixture
def ieee_fp32():
    """float32 matmuls in full IEEE precision (torch and cutlass_nn alike) for the test."""
    with matmul_precision(False):
        yield


_path_params = pytest.mark.parametrize("path", PATHS, indirect=True)
_dtype_params = pytest.mark.parametrize(
    "dtype", [torch.bfloat16, torch.float32], ids=["bf16", "f32"]
)
FLOOR = {torch.bfloat16: 2e-3, torch.float16: 2e-3, torch.float32: 1e-5}

# ---------------------------------------------------------------------------------------------
# Every operator as (argument shapes, cutlass_nn call returning the result, torch formula)
# ---------------------------------------------------------------------------------------------

M, N, K = 64, 128, 96


def _accumulate(gw, dy, x):
    ops.linear_wgrad_accumulate_(gw, dy, x)
    return gw


OP_TABLE = {
    "linear": ([(M, K), (N, K), (N,)], ops.linear, F.linear),
    "linear_nobias": ([(M, K), (N, K)], ops.linear, F.linear),
    "linear_dgrad": ([(M, N), (N, K)], ops.linear_dgrad, torch.mm),
    "linear_wgrad": ([(M, N), (M, K)], ops.linear_wgrad, lambda dy, x: torch.mm(dy.t(), x)),
    "linear_wgrad_accumulate_": (
        [(N, K), (M, N), (M, K)],
        _accumulate,
        lambda gw, dy, x: gw + torch.mm(dy.t(), x),
    ),
    "bias_grad": ([(M, N)], ops.bias_grad, lambda dy: dy.sum(0)),
    "mm": ([(M, K), (K, N)], ops.mm, torch.mm),
    "mm_out": ([(M, K), (K, N), (M, N)], ops.mm_out, lambda a, b, out: torch.mm(a, b)),
    "add2": ([(M, K), (M, K)], ops.add2, torch.add),
}


def _fresh_args(op, dtype, gen, device="cuda"):
    """New random arguments of ``op`` (the ``out`` of mm_out NaN-filled)."""
    shapes = OP_TABLE[op][0]
    args = [torch.randn(s, device=device, generator=gen).to(dtype) for s in shapes]
    if op == "mm_out":
        args[-1].fill_(NAN)
    return args


def _expected(op, args):
    torch_fn = OP_TABLE[op][2]
    return torch_fn(*args), torch_fn(*to64(tuple(args)))


# ---------------------------------------------------------------------------------------------
# Streams
# ---------------------------------------------------------------------------------------------


@_path_params
@pytest.mark.parametrize("op", OP_TABLE)
def test_runs_on_current_stream(op, path, ieee_fp32, gen):
    """Inputs are written on a side stream that is kept busy first; an op that launched on any
    stream but the current one would read them before they are written (NaN) or race."""
    dtype = torch.bfloat16
    new = _fresh_args(op, dtype, gen)
    static = [torch.full_like(t, NAN) for t in new]
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)
        for s, t in zip(static, new):
            s.copy_(t)
        out = OP_TABLE[op][1](*static)
    torch.cuda.synchronize()
    same, ref64 = _expected(op, new)
    check_close(out, same, ref64, FLOOR[dtype], f"{op} on a side stream, path={path}")


@_path_params
@_dtype_params
@pytest.mark.parametrize("op", OP_TABLE)
def test_cuda_graph_capture_and_replay(op, dtype, path, ieee_fp32, gen):
    """Capture fails if the op launches on the legacy default stream or does anything else that
    a capture forbids; each replay recomputes from the current contents of the inputs."""
    fn = OP_TABLE[op][1]
    static = _fresh_args(op, dtype, gen)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn(*static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(*static)
    for replay in range(2):
        new = _fresh_args(op, dtype, gen)
        for s, t in zip(static, new):
            s.copy_(t)
        graph.replay()
        torch.cuda.synchronize()
        same, ref64 = _expected(op, new)
        check_close(out, same, ref64, FLOOR[dtype], f"{op} graph replay {replay}, path={path}")


@_path_params
@_dtype_params
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_cuda_graph_cutlass_linear_forward_backward(bias, dtype, path, ieee_fp32, gen):
    """Whole forward + backward of a CutlassLinear captured as one graph (torch docs' recipe:
    warm up on a side stream, grads set to None before capture), replayed on new data."""
    layer = cutlass_nn.CutlassLinear(K, N, bias=bias, device="cuda", dtype=dtype)
    x = torch.randn(4, 16, K, device="cuda", generator=gen).to(dtype).requires_grad_()
    gy = torch.randn(4, 16, N, device="cuda", generator=gen).to(dtype)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            layer.zero_grad(set_to_none=True)
            x.grad = None
            layer(x).backward(gy)
    torch.cuda.current_stream().wait_stream(side)
    layer.zero_grad(set_to_none=True)
    x.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = layer(x)
        y.backward(gy)

    for replay in range(2):
        new_x = torch.randn(x.shape, device="cuda", generator=gen).to(dtype)
        new_gy = torch.randn(gy.shape, device="cuda", generator=gen).to(dtype)
        with torch.no_grad():
            x.copy_(new_x)
            gy.copy_(new_gy)
        graph.replay()
        torch.cuda.synchronize()
        ours = {"y": y, "x.grad": x.grad, "weight.grad": layer.weight.grad}
        if bias:
            ours["bias.grad"] = layer.bias.grad
        same = _linear_fwd_bwd(new_x, layer.weight, layer.bias, new_gy)
        bias64 = None if layer.bias is None else layer.bias.double()
        ref = _linear_fwd_bwd(new_x.double(), layer.weight.double(), bias64, new_gy.double())
        for name in ours:
            check_close(
                ours[name], same[name], ref[name], FLOOR[dtype], f"graph replay {replay} {name}"
            )


def _linear_fwd_bwd(x, weight, bias, gy):
    """torch's nn.Linear forward and gradients (the comparison for CutlassLinear)."""
    x = x.detach().requires_grad_()
    weight = weight.detach().requires_grad_()
    bias = None if bias is None else bias.detach().requires_grad_()
    y = F.linear(x, weight, bias)
    y.backward(gy)
    out = {"y": y.detach(), "x.grad": x.grad, "weight.grad": weight.grad}
    if bias is not None:
        out["bias.grad"] = bias.grad
    return out


# ---------------------------------------------------------------------------------------------
# torch.compile
# ---------------------------------------------------------------------------------------------


class _SmallNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = cutlass_nn.CutlassLinear(64, 128)
        self.fc2 = cutlass_nn.CutlassLinear(128, 64, bias=False)
        self.add = cutlass_nn.Add2()

    def forward(self, x):
        return self.add(self.fc2(torch.relu(self.fc1(x))), x)


def test_torch_compile_reduce_overhead(ieee_fp32, gen):
    pytest.importorskip("triton")
    torch._dynamo.reset()
    eager = _SmallNet().cuda()
    compiled_model = copy.deepcopy(eager)
    compiled = torch.compile(compiled_model, mode="reduce-overhead")
    for step in range(4):
        x = torch.randn(8, 64, device="cuda", generator=gen)
        gy = torch.randn(8, 64, device="cuda", generator=gen)
        x_e = x.clone().requires_grad_()
        x_c = x.clone().requires_grad_()
        torch.compiler.cudagraph_mark_step_begin()
        y_c = compiled(x_c)
        y_c.backward(gy)
        y_e = eager(x_e)
        y_e.backward(gy)
        tol = dict(rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(y_c.detach().clone(), y_e.detach(), **tol, msg=f"step {step} y")
        torch.testing.assert_close(x_c.grad, x_e.grad, **tol, msg=f"step {step} input grad")
        for (name, p_c), p_e in zip(compiled_model.named_parameters(), eager.parameters()):
            torch.testing.assert_close(p_c.grad, p_e.grad, **tol, msg=f"step {step} {name}.grad")
        compiled_model.zero_grad(set_to_none=True)
        eager.zero_grad(set_to_none=True)
    torch._dynamo.reset()


# ---------------------------------------------------------------------------------------------
# A second GPU
# ---------------------------------------------------------------------------------------------


@_path_params
def test_inputs_on_second_gpu(path, ieee_fp32):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    dev = torch.device("cuda:1")
    gen1 = torch.Generator(device=dev).manual_seed(1)
    with torch.cuda.device(0):
        for op in GEMM_OPS:
            args = gemm_args(op, 48, 40, 72, torch.bfloat16, "contig", gen1, device=dev)
            ours = run_ours(op, args)
            assert ours.device == dev, op
            same, ref64 = run_torch(op, args), run_torch(op, to64(args))
            check_close(ours, same, ref64, 2e-3, f"{op} on {dev}")
        for op in ("bias_grad", "add2", "linear_wgrad_accumulate_", "mm_out"):
            args = _fresh_args(op, torch.float32, gen1, device=dev)
            # the reference from copies, before linear_wgrad_accumulate_ updates its argument
            same, ref64 = _expected(op, [t.clone() for t in args])
            out = OP_TABLE[op][1](*args)
            assert out.device == dev, op
            check_close(out, same, ref64, 1e-5, f"{op} on {dev}")

        layer = cutlass_nn.CutlassLinear(72, 40, device=dev)
        x = torch.randn(3, 5, 72, device=dev, generator=gen1, requires_grad=True)
        layer(x).sum().backward()
        assert x.grad.device == dev and layer.weight.grad.device == dev
        assert layer.bias.grad.device == dev
        torch.cuda.synchronize(dev)
        assert torch.cuda.current_device() == 0


# ---------------------------------------------------------------------------------------------
# Memory
# ---------------------------------------------------------------------------------------------


@_path_params
def test_no_memory_growth(path, gen):
    """After warm-up, 50 forward + backward steps (and the other operators) leave the allocated
    memory exactly where it was: no leaked workspace or operand copies."""
    layer = cutlass_nn.CutlassLinear(256, 512, device="cuda", dtype=torch.bfloat16)
    add = cutlass_nn.Add2()
    x = torch.randn(4, 32, 256, device="cuda", generator=gen).bfloat16().requires_grad_()
    main_grad = torch.zeros(512, 256, device="cuda")
    a = torch.randn(33, 65, device="cuda", generator=gen)
    b = torch.randn(65, 17, device="cuda", generator=gen)
    out = torch.empty(33, 17, device="cuda")

    def step():
        y = layer(x)
        add(y, y).float().sum().backward()
        ops.linear_wgrad_accumulate_(main_grad, y.detach(), x.detach())
        cutlass_nn.mm(a.t().contiguous().t(), b, out=out)
        cutlass_nn.mm(a, b)

    for _ in range(2):
        step()
    # Earlier tests of the same worker can leave cyclic garbage holding CUDA tensors; collected
    # inside the measured window it made the count drop (2048 bytes, GPU run of 2026-11-26). So:
    # collect it first, and no automatic collection inside the window (a collection there could
    # also hide cycles that the steps themselves leak).
    gc.collect()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    gc.disable()
    try:
        for _ in range(50):
            step()
        torch.cuda.synchronize()
        after = torch.cuda.memory_allocated()
    finally:
        gc.enable()
    assert after == base


# ---------------------------------------------------------------------------------------------
# The new fp32_precision API of torch (>= 2.9)
# ---------------------------------------------------------------------------------------------


def test_new_fp32_precision_api(tmp_path):
    """A user who sets TF32 only through torch's new API (``fp32_precision``, which torch
    recommends and which must not be mixed with the legacy one) can still run cutlass_nn GEMMs,
    and the setting is honoured. Runs in a subprocess: the setting is process-wide and cannot be
    mixed with the legacy API the other tests use."""
    if not hasattr(torch.backends.cuda.matmul, "fp32_precision"):
        pytest.skip("this torch has no fp32_precision API")
    code = textwrap.dedent(
        """
        import torch, cutlass_nn
        x = torch.randn(64, 64, device="cuda")
        torch.backends.cuda.matmul.fp32_precision = "tf32"
        cutlass_nn.linear(x, x, None)
        tf32_name = cutlass_nn.ops.last_kernel_name()
        torch.backends.cuda.matmul.fp32_precision = "ieee"
        y = cutlass_nn.linear(x, x, None)
        ieee_name = cutlass_nn.ops.last_kernel_name()
        torch.cuda.synchronize()
        assert "tf32" in tf32_name and "3xtf32" not in tf32_name, tf32_name
        # "ieee" is fp32 accuracy: 3xTF32 (split operands) or SIMT fp32, never plain TF32
        assert "3xtf32" in ieee_name or "simt" in ieee_name, ieee_name
        ref = x.double() @ x.double().t()
        err = float((y.double() - ref).norm() / ref.norm())
        assert err < 1e-5, err
        """
    )
    # The child imports the cutlass_nn this process imported, whatever the working directory.
    package_root = str(Path(cutlass_nn.__file__).resolve().parents[1])
    pythonpath = os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": pythonpath}
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]


# ---------------------------------------------------------------------------------------------
# Sizes past 2^31 elements (slow; at most ~13 GB of GPU memory)
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def big_memory():
    """Skips without ~16 GB free; releases the cached blocks afterwards."""
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info()
    if free < 16 * 2**30:
        pytest.skip(f"needs ~16 GiB of free GPU memory, {free / 2**30:.1f} GiB free")
    yield
    torch.cuda.empty_cache()


def _chunked_wgrad64(dy, x, rows=8192):
    """float64 dy^T @ x accumulated over row chunks (x in float64 whole would be 17 GB)."""
    acc = torch.zeros(dy.shape[1], x.shape[1], dtype=torch.float64, device=dy.device)
    for r in range(0, dy.shape[0], rows):
        acc += dy[r : r + rows].double().t() @ x[r : r + rows].double()
    return acc


def _chunked_colsum64(x, rows=8192):
    acc = torch.zeros(x.shape[1], dtype=torch.float64, device=x.device)
    for r in range(0, x.shape[0], rows):
        acc += x[r : r + rows].double().sum(0)
    return acc


@pytest.mark.slow
@_path_params
def test_linear_products_past_2_31(path, big_memory, gen):
    """fp16 linear with M*K > 2^31 (input 4.3 GB): forward and dgrad checked on sampled rows
    (including the row that straddles element 2^31 and the last row), wgrad and bias_grad (a
    reduction over 2^17 rows of a 2^31-element input) checked whole."""
    m, k, n = 2**17 + 3, 2**14 + 8, 64
    assert m * k > 2**31
    dtype = torch.float16
    x = torch.randn(m, k, device="cuda", dtype=dtype, generator=gen)
    w = torch.randn(n, k, device="cuda", dtype=dtype, generator=gen)
    b = torch.randn(n, device="cuda", dtype=dtype, generator=gen)
    dy = torch.randn(m, n, device="cuda", dtype=dtype, generator=gen)
    straddle = 2**31 // k
    rows = torch.tensor([0, 1, m // 2, straddle, straddle + 1, m - 2, m - 1], device="cuda")

    y = ops.linear(x, w, b)
    check_close(
        y[rows], F.linear(x[rows], w, b), F.linear(x[rows].double(), w.double(), b.double()),
        2e-3, f"linear rows past 2^31, path={path}",
    )
    del y
    dx = ops.linear_dgrad(dy, w)
    check_close(
        dx[rows], dy[rows] @ w, dy[rows].double() @ w.double(), 2e-3, f"dgrad rows, path={path}"
    )
    del dx
    dw = ops.linear_wgrad(dy, x)
    check_close(dw, torch.mm(dy.t(), x), _chunked_wgrad64(dy, x), 2e-3, f"wgrad, path={path}")
    db = ops.bias_grad(x)
    check_close(db, x.sum(0), _chunked_colsum64(x), 2e-3, f"bias_grad of [{m}, {k}]")


@pytest.mark.slow
@_path_params
def test_linear_taller_than_2_30_rows(path, big_memory, gen):
    """M = 2^30 + 5 rows: the binding runs the GEMM as slabs of 2^30 rows (CUTLASS sizes are
    32-bit); rows on both sides of the slab boundary are checked."""
    m, k, n = 2**30 + 5, 2, 2
    dtype = torch.float16
    x = torch.randn(m, k, device="cuda", dtype=dtype, generator=gen)
    w = torch.randn(n, k, device="cuda", dtype=dtype, generator=gen)
    b = torch.randn(n, device="cuda", dtype=dtype, generator=gen)
    y = ops.linear(x, w, b)
    rows = torch.tensor([0, 2**30 - 1, 2**30, 2**30 + 1, m - 1], device="cuda")
    check_close(
        y[rows], F.linear(x[rows], w, b), F.linear(x[rows].double(), w.double(), b.double()),
        2e-3, f"linear slabs, path={path}",
    )


@pytest.mark.slow
@pytest.mark.parametrize("offset", [0, 1], ids=["aligned", "misaligned"])
def test_add2_numel_past_2_31(offset, big_memory, gen):
    """add2 of fp16 tensors of 2^31 + 17 elements (4.3 GB each), 16-byte aligned (vector
    kernel) or at an odd offset (scalar kernel); checked whole, chunk by chunk."""
    numel = 2**31 + 17
    a = torch.randn(numel + offset, device="cuda", dtype=torch.float16, generator=gen)[offset:]
    b = torch.randn(numel + offset, device="cuda", dtype=torch.float16, generator=gen)[offset:]
    out = ops.add2(a, b)
    assert out.shape == (numel,)
    chunk = 2**27
    for start in range(0, numel, chunk):
        sl = slice(start, start + chunk)
        check_close(
            out[sl], a[sl] + b[sl], a[sl].double() + b[sl].double(), 2e-3,
            f"add2 elements [{start}, {start + chunk}) offset={offset}",
        )
