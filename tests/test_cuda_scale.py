"""The CUDA scale_ kernel (x *= factor, the factor read on the device) against the CPU
implementation, bitwise: every dtype, sizes that take the 16-byte path with and without a tail,
misaligned x (the scalar path), a factor of 1 leaving x bitwise unchanged (NaN and -0 included)
and making no pass over it (timed: a launch against a full pass), no host synchronization, CUDA
graphs, and the argument errors of the CPU backend."""

from __future__ import annotations

import pytest
import torch

from cuda_helpers import CUDA_MARKS
from cutlass_nn import ops

pytestmark = CUDA_MARKS

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
INT_VIEW = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def stat_dtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def bits(x):
    return x.view(INT_VIEW[x.dtype.itemsize])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("numel", [1, 7, 8, 1000, 4096 + 3, 1 << 20])
@pytest.mark.parametrize("offset", [0, 1], ids=["aligned", "misaligned"])
def test_matches_cpu_bitwise(dtype, numel, offset):
    gen = torch.Generator(device="cuda").manual_seed(numel * 4 + offset)
    buf = (torch.randn(numel + offset, generator=gen, device="cuda", dtype=torch.float64) * 10).to(dtype)
    x = buf[offset:]
    factor = torch.tensor(-1.0 / 3.0, dtype=stat_dtype(dtype), device="cuda")
    want = x.cpu()
    ops.scale_(want, factor.cpu())
    ops.scale_(x, factor)
    assert torch.equal(bits(x.cpu()), bits(want))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_factor_one_leaves_x_bitwise_unchanged(dtype):
    special = torch.tensor([1.5, -0.0, float("inf"), -float("inf"), float("nan"), 3e-5], dtype=torch.float64)
    x = torch.cat([special, torch.randn(4099, dtype=torch.float64)]).to(dtype).cuda()
    before = x.clone()
    ops.scale_(x, torch.ones((), dtype=stat_dtype(dtype), device="cuda"))
    assert torch.equal(bits(x), bits(before))


def test_neighbours_of_a_slice_are_not_touched():
    buf = torch.full((1003,), 3.0, dtype=torch.bfloat16, device="cuda")
    ops.scale_(buf[5:998], torch.tensor(2.0, device="cuda"))
    assert (buf[:5] == 3).all() and (buf[998:] == 3).all() and (buf[5:998] == 6).all()


def test_no_host_synchronization():
    x = torch.randn(1 << 16, device="cuda", dtype=torch.bfloat16)
    factor = torch.tensor(0.5, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        ops.scale_(x, factor)
        ops.scale_(x, torch.ones((), device="cuda").mul_(2.0))
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_factor_one_makes_no_pass():
    """1 GiB of bfloat16: a full pass takes ~0.3+ ms on an H100/H200; with factor 1 the kernel
    only launches. A wide margin (3x) keeps clock noise out."""
    x = torch.randn(1 << 29, device="cuda", dtype=torch.bfloat16)
    one = torch.ones((), device="cuda")
    two = torch.full((), 2.0, device="cuda")

    def timed(factor):
        for _ in range(3):
            ops.scale_(x, factor)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(5):
            start.record()
            ops.scale_(x, factor)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return sorted(times)[2]

    full, skipped = timed(two), timed(one)
    assert skipped * 3 < full, (skipped, full)


def test_cuda_graph_replays_with_the_current_factor():
    x = torch.ones(4096, device="cuda", dtype=torch.bfloat16)
    factor = torch.tensor(2.0, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        ops.scale_(x, factor)  # warm up outside the capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ops.scale_(x, factor)
    x.fill_(1.0)
    factor.fill_(3.0)
    graph.replay()
    assert (x == 3).all()
    factor.fill_(1.0)
    graph.replay()
    assert (x == 3).all()


def test_errors_match_the_cpu_backend():
    x = torch.ones(4, 4, device="cuda").t()
    with pytest.raises(RuntimeError, match=r"cutlass_nn\.scale_: argument 'x' must be contiguous"):
        ops.scale_(x, torch.tensor(2.0, device="cuda"))
    y = torch.ones(4, device="cuda")
    with pytest.raises(RuntimeError, match=r"cutlass_nn\.scale_: argument 'factor' must be on"):
        ops.scale_(y, torch.tensor(2.0))
    with pytest.raises(RuntimeError, match=r"argument 'factor' must have dtype float32"):
        ops.scale_(y, torch.tensor(2.0, device="cuda", dtype=torch.float64))
    assert (y == 1).all()
