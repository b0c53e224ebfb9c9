"""Under torch.compile (Inductor), the bias gradient of a linear layer is Inductor's own sum, which
it can fuse; eager and other backends keep cutlass_nn::bias_grad (CPU)."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch
import torch._dynamo
from torch import nn

import cutlass_nn


def _compiled_code(fn, *args, dynamic=False):
    """``fn(*args)`` compiled by Inductor (fresh: no cached compile, whose keys do not include
    the lowerings) and the code it generated."""
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, dynamic=dynamic)
    with torch._inductor.config.patch(fx_graph_cache=False), \
            torch._functorch.config.patch(enable_autograd_cache=False):
        out, codes = run_and_get_code(compiled, *args)
    return out, "\n".join(codes)


@pytest.mark.slow
@pytest.mark.parametrize("shape", [(7,), (1, 7), (5, 7), (2, 3, 7), (0, 7), (2, 0, 7)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_lowered_bias_grad_is_the_operator(shape, dtype):
    """What Inductor computes for bias_grad (its own kernel, not the operator) equals the
    operator: shape, dtype, values, a new tensor."""
    g = torch.randn(shape, dtype=torch.float64).to(dtype)
    want = cutlass_nn.ops.bias_grad(g)
    got, code = _compiled_code(torch.ops.cutlass_nn.bias_grad, g)
    assert "cutlass_nn.bias_grad" not in code
    assert got.shape == want.shape == (7,) and got.dtype == want.dtype == dtype
    exact = len(shape) == 1 or math.prod(shape[:-1]) <= 1
    torch.testing.assert_close(got, want, **({"atol": 0, "rtol": 0} if exact else {}))
    if len(shape) == 1:
        assert got.data_ptr() != g.data_ptr()


@pytest.mark.slow
def test_lowered_bias_grad_dynamic_shapes_and_strides():
    for batch in (6, 9):
        for x in (torch.randn(batch, 11), torch.randn(11, batch).t(), torch.randn(2, batch, 11)):
            got, code = _compiled_code(torch.ops.cutlass_nn.bias_grad, x, dynamic=True)
            assert "cutlass_nn.bias_grad" not in code
            torch.testing.assert_close(got, cutlass_nn.ops.bias_grad(x))


def test_registration_waits_for_inductor_and_never_imports_it():
    """Importing cutlass_nn and running fake implementations (what opcheck and export do) leaves
    Inductor unloaded; once it is loaded, the next fake call registers the lowering."""
    code = (
        "import sys, torch, cutlass_nn\n"
        "from torch._subclasses.fake_tensor import FakeTensorMode\n"
        "from cutlass_nn import _inductor_lowerings as l\n"
        "op = torch.ops.cutlass_nn.bias_grad.default\n"
        "with FakeTensorMode():\n"
        "    cutlass_nn.ops.linear(torch.empty(4, 8), torch.empty(3, 8), torch.empty(3))\n"
        "assert 'torch._inductor.lowering' not in sys.modules\n"
        "assert not l.register()\n"
        "import torch._inductor.lowering as t\n"
        "assert op not in t.lowerings\n"
        "with FakeTensorMode():\n"
        "    cutlass_nn.ops.linear(torch.empty(4, 8), torch.empty(3, 8), torch.empty(3))\n"
        "assert op in t.lowerings and l.register()\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]


def _train_step_code(module, x):
    """Runs a compiled forward + backward of ``module``; returns the generated code."""
    from torch._inductor.utils import run_and_get_code

    compiled = torch.compile(module, fullgraph=True)

    def step():
        y = compiled(x)
        (y * torch.sin(y.detach())).sum().backward()
        return y

    # no cached compile: what this process's Inductor does (the caches' keys do not include
    # the lowerings)
    with torch._inductor.config.patch(fx_graph_cache=False), \
            torch._functorch.config.patch(enable_autograd_cache=False):
        return run_and_get_code(step)


@pytest.mark.slow
def test_compiled_bias_gradient_is_inductors_sum_after_other_compiles():
    """The order the model benchmark has: a stock model compiled first (Inductor caches tables at
    its first compile), then the converted one; the backward then has no bias_grad call and the
    gradients match eager."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    stock = nn.Sequential(nn.Linear(16, 12), nn.GELU(), nn.Linear(12, 8))
    _train_step_code(stock, torch.randn(4, 16))
    torch._dynamo.reset()
    model = cutlass_nn.convert(nn.Sequential(nn.Linear(16, 12), nn.GELU(), nn.Linear(12, 8)))
    eager = cutlass_nn.convert(nn.Sequential(nn.Linear(16, 12), nn.GELU(), nn.Linear(12, 8)))
    eager.load_state_dict(model.state_dict())
    for batch in (5, 9):
        for m in (model, eager):
            m.zero_grad(set_to_none=True)
        x = torch.randn(batch, 3, 16)
        y, codes = _train_step_code(model, x)
        y2 = eager(x)
        (y2 * torch.sin(y2.detach())).sum().backward()
        torch.testing.assert_close(y, y2)
        for (name, p), p2 in zip(model.named_parameters(), eager.parameters()):
            torch.testing.assert_close(p.grad, p2.grad, msg=name)
    code = "\n".join(codes)
    assert "cutlass_nn.linear_wgrad" in code and "cutlass_nn.linear.default" in code
    assert "cutlass_nn.bias_grad" not in code  # Inductor's own kernel (named "..._fused_bias_grad_...")


@pytest.mark.slow
def test_other_backends_keep_the_operator():
    class Capture:
        def __init__(self):
            self.graphs = []

        def __call__(self, gm, example_inputs):
            self.graphs.append(gm)
            return gm.forward

    from torch._dynamo.backends.common import aot_autograd

    torch._dynamo.reset()
    cap = Capture()
    layer = cutlass_nn.CutlassLinear(16, 12)
    y = torch.compile(layer, backend=aot_autograd(fw_compiler=cap, bw_compiler=cap),
                      fullgraph=True)(torch.randn(3, 16))
    y.sum().backward()
    backward = [str(n.target) for n in cap.graphs[-1].graph.nodes if n.op == "call_function"]
    assert any("cutlass_nn.bias_grad" in t for t in backward), backward


def test_register_never_raises(monkeypatch, caplog):
    """An Inductor whose lowering API differs (or a module still being imported) must not break
    the fake implementations that call register(): it warns once and leaves the operator."""
    import types

    from cutlass_nn import _inductor_lowerings as lowerings

    monkeypatch.setattr(lowerings, "_registered", False)
    monkeypatch.setattr(lowerings, "_failed", False)
    half_imported = types.ModuleType("torch._inductor.lowering")  # no register_lowering yet
    monkeypatch.setitem(sys.modules, "torch._inductor.lowering", half_imported)
    assert lowerings.register() is False and not lowerings._failed

    def broken(*args, **kwargs):
        raise TypeError("register_lowering() got an unexpected keyword argument")

    other_api = types.ModuleType("torch._inductor.lowering")
    other_api.lowerings = {}
    other_api.register_lowering = broken
    monkeypatch.setitem(sys.modules, "torch._inductor.lowering", other_api)
    with caplog.at_level("WARNING"):
        assert lowerings.register() is False
        assert lowerings.register() is False  # no second try, no second warning
    assert lowerings._failed and len(caplog.records) == 1
    assert "bias_grad stays an opaque operator" in caplog.records[0].getMessage()
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():  # the fake implementations still work
        out = cutlass_nn.ops.linear(torch.empty(4, 8), torch.empty(3, 8), torch.empty(3))
    assert out.shape == (4, 3)
