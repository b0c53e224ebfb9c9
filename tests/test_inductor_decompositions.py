"""Under torch.compile (Inductor), the bias gradient of a linear layer is a plain sum that Inductor
can fuse; eager and other backends keep cutlass_nn::bias_grad (CPU)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torch._dynamo

import cutlass_nn
from cutlass_nn import _inductor_decompositions as decomps


@pytest.mark.parametrize("shape", [(7,), (5, 7), (2, 3, 7), (0, 7), (2, 0, 7)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bias_grad_as_sum_is_bias_grad(shape, dtype):
    g = torch.randn(shape, dtype=torch.float64).to(dtype)
    got = decomps.bias_grad_as_sum(g)
    want = cutlass_nn.ops.bias_grad(g)
    assert got.shape == want.shape == (7,) and got.dtype == want.dtype == dtype
    tol = {"atol": 0, "rtol": 0} if dtype == torch.float32 and len(shape) == 1 else {}
    torch.testing.assert_close(got, want, **tol)
    reference = g.double().reshape(-1, 7).sum(0) if g.numel() else torch.zeros(7, dtype=torch.float64)
    torch.testing.assert_close(got.double(), reference, atol=1e-2 if dtype == torch.bfloat16 else 1e-5,
                               rtol=1e-2 if dtype == torch.bfloat16 else 1e-5)
    if len(shape) == 1:
        assert got.data_ptr() != g.data_ptr()  # a new tensor, as the operator returns


def test_registration_waits_for_inductor_and_never_imports_it():
    """Importing cutlass_nn and running fake implementations (what opcheck and export do) leaves
    Inductor unloaded; once it is loaded, the next fake call registers the decomposition."""
    code = (
        "import sys, torch, cutlass_nn\n"
        "from torch._subclasses.fake_tensor import FakeTensorMode\n"
        "from cutlass_nn import _inductor_decompositions as d\n"
        "with FakeTensorMode():\n"
        "    cutlass_nn.ops.linear(torch.empty(4, 8), torch.empty(3, 8), torch.empty(3))\n"
        "assert 'torch._inductor.decomposition' not in sys.modules\n"
        "assert not d.register()\n"
        "import torch._inductor.decomposition as t\n"
        "assert torch.ops.cutlass_nn.bias_grad.default not in t.decompositions\n"
        "with FakeTensorMode():\n"
        "    cutlass_nn.ops.linear(torch.empty(4, 8), torch.empty(3, 8), torch.empty(3))\n"
        "assert t.decompositions[torch.ops.cutlass_nn.bias_grad.default] is d.bias_grad_as_sum\n"
        "assert torch.ops.cutlass_nn.bias_grad.default in t.select_decomp_table()\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]


class _Captured:
    """An aot_autograd backend with Inductor's decomposition table that keeps its graphs."""

    def __init__(self):
        self.graphs = []

    def compiler(self, gm, example_inputs):
        self.graphs.append(gm)
        return gm.forward


@pytest.mark.slow
def test_compiled_backward_sums_the_bias_gradient():
    from torch._dynamo.backends.common import aot_autograd
    from torch._inductor.decomposition import select_decomp_table

    torch._dynamo.reset()
    torch.manual_seed(0)
    layer = cutlass_nn.CutlassLinear(16, 12)
    eager = cutlass_nn.CutlassLinear(16, 12)
    eager.load_state_dict(layer.state_dict())
    cap = _Captured()
    # the table is read when the backend is called, after Dynamo traced (and registered)
    backend = aot_autograd(fw_compiler=cap.compiler, bw_compiler=cap.compiler,
                           decompositions=lambda: select_decomp_table())
    compiled = torch.compile(layer, backend=backend, fullgraph=True)
    x = torch.randn(3, 5, 16)
    y = compiled(x)
    y.backward(torch.cos(y.detach()))
    y2 = eager(x)
    y2.backward(torch.cos(y2.detach()))
    torch.testing.assert_close(y, y2)
    torch.testing.assert_close(layer.bias.grad, eager.bias.grad)
    torch.testing.assert_close(layer.weight.grad, eager.weight.grad)
    backward = [str(n.target) for n in cap.graphs[-1].graph.nodes if n.op == "call_function"]
    assert not any("bias_grad" in t for t in backward), backward
    assert any("aten.sum" in t for t in backward), backward
    assert any("cutlass_nn.linear_wgrad" in t for t in backward), backward


@pytest.mark.slow
def test_inductor_compiled_bias_gradient_matches_eager():
    torch._dynamo.reset()
    torch.manual_seed(1)
    layer = cutlass_nn.CutlassLinear(16, 12)
    eager = cutlass_nn.CutlassLinear(16, 12)
    eager.load_state_dict(layer.state_dict())
    compiled = torch.compile(layer, fullgraph=True)
    for batch in (4, 9):
        for m in (layer, eager):
            m.zero_grad(set_to_none=True)
        x = torch.randn(batch, 16)
        y, y2 = compiled(x), eager(x)
        (y * torch.sin(y.detach())).sum().backward()
        (y2 * torch.sin(y2.detach())).sum().backward()
        torch.testing.assert_close(layer.bias.grad, eager.bias.grad)
        torch.testing.assert_close(layer.weight.grad, eager.weight.grad)
