"""torch.compile(fullgraph=True) of a small model built on CutlassLinear and Add2: forward and
backward match eager. Kept small: compiling on 2 CPU cores is slow."""

from __future__ import annotations

import copy

import pytest
import torch
import torch._dynamo
from torch import nn

import cutlass_nn

pytestmark = pytest.mark.slow


class ResidualMLP(nn.Module):
    def __init__(self, d=16, h=32):
        super().__init__()
        self.fc1 = cutlass_nn.CutlassLinear(d, h)
        self.fc2 = cutlass_nn.CutlassLinear(h, d, bias=False)
        self.add = cutlass_nn.Add2()

    def forward(self, x):
        return self.add(x, self.fc2(torch.relu(self.fc1(x))))


class _OpCounter:
    """Counts cutlass_nn ops in the graphs that dynamo hands to the backend."""

    def __init__(self):
        self.graphs = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return gm.forward


def _run(fn, module, x):
    x = x.clone().requires_grad_()
    y = fn(x)
    y.backward(torch.cos(y.detach()))
    return y.detach(), x.grad, {n: p.grad.clone() for n, p in module.named_parameters()}


def _assert_same(a, b):
    y, gx, grads = a
    y2, gx2, grads2 = b
    torch.testing.assert_close(y, y2)
    torch.testing.assert_close(gx, gx2)
    assert grads.keys() == grads2.keys() and len(grads) == 3
    for n in grads:
        torch.testing.assert_close(grads[n], grads2[n], msg=n)


def _eager_and_compiled(make):
    """A fresh module (seeded) and a compiled (fullgraph) copy of it: (eager, compiled fn, copy)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    eager = make()
    compiled_model = copy.deepcopy(eager)
    return eager, torch.compile(compiled_model, fullgraph=True), compiled_model


def test_compile_fullgraph_matches_eager():
    eager, compiled, compiled_model = _eager_and_compiled(ResidualMLP)
    x = torch.randn(4, 5, 16)
    _assert_same(_run(compiled, compiled_model, x), _run(eager, eager, x))


def test_compile_graph_contains_cutlass_ops():
    """The ops are traced as cutlass_nn ops (no graph break, not decomposed to aten)."""
    torch._dynamo.reset()
    backend = _OpCounter()
    model = ResidualMLP()
    x = torch.randn(3, 16)
    torch.testing.assert_close(torch.compile(model, backend=backend, fullgraph=True)(x), model(x))
    assert len(backend.graphs) == 1
    targets = [str(n.target) for n in backend.graphs[0].graph.nodes if n.op == "call_function"]
    assert sum("cutlass_nn.linear" in t for t in targets) == 2, targets
    assert sum("cutlass_nn.add2" in t for t in targets) == 1, targets


def test_compile_dynamic_batch_sizes():
    torch._dynamo.reset()
    torch.manual_seed(1)
    eager = ResidualMLP()
    compiled_model = copy.deepcopy(eager)
    compiled = torch.compile(compiled_model, fullgraph=True, dynamic=True)
    for batch in (3, 7, 1):
        for m in (eager, compiled_model):
            m.zero_grad(set_to_none=True)
        x = torch.randn(batch, 2, 16)
        _assert_same(_run(compiled, compiled_model, x), _run(eager, eager, x))


def test_converted_model_compiles_without_graph_breaks():
    """A model built from nn.Linear and converted: no graph break (dynamo's explain), and
    fullgraph=True with mode="reduce-overhead" (CUDA graphs on a GPU; the GPU variant is in
    test_cuda_integration.py) matches eager in forward and backward."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    eager = cutlass_nn.convert(nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16)))
    assert all(type(m) is not nn.Linear for m in eager.modules())
    x = torch.randn(4, 16)
    explanation = torch._dynamo.explain(eager)(x)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    torch._dynamo.reset()
    compiled_model = copy.deepcopy(eager)
    compiled = torch.compile(compiled_model, fullgraph=True, mode="reduce-overhead")
    y, gx, grads = _run(compiled, compiled_model, x)
    y2, gx2, grads2 = _run(eager, eager, x)
    torch.testing.assert_close(y, y2)
    torch.testing.assert_close(gx, gx2)
    assert grads.keys() == grads2.keys() and len(grads) == 4
    for n in grads:
        torch.testing.assert_close(grads[n], grads2[n], msg=n)


BACKWARD_GEMMS = ("linear_dgrad", "linear_wgrad", "bias_grad")


@pytest.mark.parametrize("name", BACKWARD_GEMMS)
def test_backward_gemms_ask_inductor_for_contiguous_inputs(name):
    # Inductor's default for a custom operator is the traced strides exactly; these operators
    # copy a gradient whose leading dimensions do not flatten, so they ask for contiguous inputs
    # (benchmarks/NOTES.md v0.22: the copies of a compiled BERT step)
    from torch._library.utils import get_layout_constraint_tag

    op = getattr(torch.ops.cutlass_nn, name).default
    assert torch.Tag.needs_contiguous_strides in op.tags
    assert torch.Tag.pt2_compliant_tag in op.tags
    assert get_layout_constraint_tag(op) == torch.Tag.needs_contiguous_strides
    # the forward keeps Inductor's default: it reads column slices and transposed views in place
    assert torch.Tag.needs_contiguous_strides not in torch.ops.cutlass_nn.linear.default.tags


class HeadsSplit(nn.Module):
    """A projection whose output is split into heads and transposed, as attention does: the
    projection's output gradient comes back through the transpose."""

    def __init__(self, d=32, heads=4):
        super().__init__()
        self.proj = cutlass_nn.CutlassLinear(d, d)
        self.heads = heads

    def forward(self, x):
        b, s, d = x.shape
        y = self.proj(x).view(b, s, self.heads, d // self.heads).transpose(1, 2)
        return torch.tanh(y) * 2.0


def test_compiled_backward_with_a_transposed_gradient_matches_eager():
    eager, compiled, compiled_model = _eager_and_compiled(HeadsSplit)
    x = torch.randn(3, 5, 32)
    (y, gx, grads), (y2, gx2, grads2) = _run(compiled, compiled_model, x), _run(eager, eager, x)
    torch.testing.assert_close(y, y2)
    torch.testing.assert_close(gx, gx2)
    assert grads.keys() == grads2.keys() == {"proj.weight", "proj.bias"}
    for n in grads:
        torch.testing.assert_close(grads[n], grads2[n], msg=n)


def test_misaligned_rows_padded_only_when_compiled_on_cuda(monkeypatch):
    """The padded-rows form of a linear layer (out_features not a multiple of 8, 16-bit, large:
    a language-model head) is chosen only while torch.compile traces a CUDA layer."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from cutlass_nn import functional as F

    with FakeTensorMode():
        head = torch.empty(50257, 768, dtype=torch.bfloat16, device="cuda")
        aligned = torch.empty(50264, 768, dtype=torch.bfloat16, device="cuda")
        small = torch.empty(1001, 768, dtype=torch.bfloat16, device="cuda")
        fp32 = torch.empty(50257, 768, dtype=torch.float32, device="cuda")
    cpu_head = torch.empty(50257, 768, dtype=torch.bfloat16)
    assert not F._pads_rows_when_compiled(head)  # eager
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert F._pads_rows_when_compiled(head)
    assert not F._pads_rows_when_compiled(aligned)
    assert not F._pads_rows_when_compiled(small)  # 1001 x 768 < 2^20 elements
    assert not F._pads_rows_when_compiled(fp32)  # float32 outside autocast
    assert not F._pads_rows_when_compiled(cpu_head)
    monkeypatch.setattr(torch, "is_autocast_enabled", lambda device_type=None: device_type == "cuda")
    assert F._pads_rows_when_compiled(fp32)  # float32 weight under CUDA autocast


@pytest.mark.parametrize("bias", [True, False])
def test_linear_padded_rows_matches_linear_under_compile(monkeypatch, bias):
    """The padded-rows form gives linear's values and gradients, eager and compiled
    (fullgraph, the form forced on this CPU so that the compiled graph really contains it)."""
    from cutlass_nn import functional as F

    torch.manual_seed(0)
    layer = cutlass_nn.CutlassLinear(24, 37, bias=bias)  # 37 output rows: not a multiple of 8
    x = torch.randn(5, 3, 24)
    y = F._linear_padded_rows(x, layer.weight, layer.bias)
    assert y.shape == (5, 3, 37) and y.is_contiguous()  # strides as F.linear's
    torch.testing.assert_close(y, torch.nn.functional.linear(x, layer.weight, layer.bias))

    monkeypatch.setattr(F, "_pads_rows_when_compiled", lambda weight: weight.shape[0] % 8 != 0)
    seen = []
    real = F._linear_padded_rows
    monkeypatch.setattr(F, "_linear_padded_rows", lambda *a: seen.append(1) or real(*a))
    torch._dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True)
    eager = _run(lambda t: torch.nn.functional.linear(t, layer.weight, layer.bias), layer, x)
    for p in layer.parameters():
        p.grad = None
    got = _run(compiled, layer, x)
    assert seen, "the compiled forward did not take the padded-rows form"
    assert compiled(x).is_contiguous()  # users' .view() of the output keeps working
    assert compiled(x).view(-1).shape == (5 * 3 * 37,)
    torch.testing.assert_close(got[0], eager[0])
    torch.testing.assert_close(got[1], eager[1])
    assert got[2].keys() == eager[2].keys()
    for n in got[2]:
        torch.testing.assert_close(got[2][n], eager[2][n], msg=n)
