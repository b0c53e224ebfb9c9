"""Under torch.autocast the cutlass_nn ops run in the autocast dtype, like nn.Linear / torch.mm."""

import pytest
import torch
from torch import nn

import cutlass_nn


@pytest.mark.parametrize("bias", [True, False])
def test_linear_follows_cpu_autocast_like_nn_linear(bias):
    torch.manual_seed(0)
    ref = nn.Linear(16, 8, bias=bias)
    ours = cutlass_nn.CutlassLinear.from_linear(nn.Linear(16, 8, bias=bias))
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(4, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y_ref = ref(x)
        y = ours(x)
    assert y.dtype == y_ref.dtype == torch.bfloat16
    torch.testing.assert_close(y, y_ref)
    y.float().square().sum().backward()
    y_ref.float().square().sum().backward()
    assert ours.weight.grad.dtype == torch.float32
    torch.testing.assert_close(ours.weight.grad, ref.weight.grad, rtol=2e-2, atol=2e-2)


def test_mm_follows_autocast_and_float64_is_left_alone():
    a, b = torch.randn(5, 6), torch.randn(6, 3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert cutlass_nn.mm(a, b).dtype == torch.bfloat16
        assert cutlass_nn.mm(a.double(), b.double()).dtype == torch.float64
    assert cutlass_nn.mm(a, b).dtype == torch.float32


@pytest.mark.cuda
@pytest.mark.skipif(
    not (torch.cuda.is_available() and cutlass_nn.has_cuda_kernels()),
    reason="needs a CUDA GPU and the CUDA flavor of cutlass_nn",
)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_linear_follows_cuda_autocast_like_nn_linear(dtype):
    torch.manual_seed(0)
    ref = nn.Linear(64, 32, device="cuda")
    ours = cutlass_nn.CutlassLinear(64, 32, device="cuda")
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(8, 64, device="cuda")
    with torch.autocast("cuda", dtype=dtype):
        y_ref = ref(x)
        y = ours(x)
    assert y.dtype == y_ref.dtype == dtype
    torch.testing.assert_close(y, y_ref, rtol=2e-2, atol=2e-2)
    y.float().square().sum().backward()
    y_ref.float().square().sum().backward()
    assert ours.weight.grad.dtype == torch.float32
    torch.testing.assert_close(ours.weight.grad, ref.weight.grad, rtol=3e-2, atol=3e-2)
