"""CutlassLinear / Add2 modules and convert()."""

from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch
from torch import nn

import cutlass_nn
from cutlass_nn import Add2, CutlassLinear, convert


@pytest.mark.parametrize("bias", [True, False])
def test_same_init_as_nn_linear(bias):
    torch.manual_seed(0)
    ref = nn.Linear(37, 23, bias=bias)
    torch.manual_seed(0)
    layer = CutlassLinear(37, 23, bias=bias)
    assert isinstance(layer, nn.Linear)
    assert torch.equal(layer.weight, ref.weight)
    assert (layer.bias is None) == (not bias)
    if bias:
        assert torch.equal(layer.bias, ref.bias)
    assert list(layer.state_dict()) == list(ref.state_dict())
    assert [n for n, _ in layer.named_parameters()] == [n for n, _ in ref.named_parameters()]


def test_default_init_statistics():
    torch.manual_seed(1)
    w = CutlassLinear(400, 300).weight
    bound = 1 / 400**0.5  # kaiming_uniform(a=sqrt(5)) of nn.Linear
    assert w.abs().max() <= bound
    assert w.abs().max() > 0.99 * bound
    assert abs(w.mean().item()) < 0.01 * bound
    torch.testing.assert_close(w.std().item(), bound / 3**0.5, rtol=0.02, atol=0)


def test_factory_kwargs():
    layer = CutlassLinear(3, 2, dtype=torch.float64, device="cpu")
    assert layer.weight.dtype == torch.float64 and layer.bias.dtype == torch.float64
    assert layer(torch.randn(4, 3, dtype=torch.float64)).dtype == torch.float64


@pytest.mark.parametrize("bias", [True, False])
def test_repr_matches_nn_linear(bias):
    ref, layer = nn.Linear(5, 7, bias=bias), CutlassLinear(5, 7, bias=bias)
    assert layer.extra_repr() == ref.extra_repr()
    assert repr(layer) == repr(ref).replace("Linear", "CutlassLinear", 1)
    assert repr(layer).startswith("CutlassLinear(")
    seq = nn.Sequential(ref)
    assert repr(convert(seq)) == repr(nn.Sequential(nn.Linear(5, 7, bias=bias))).replace(
        "Linear", "CutlassLinear"
    )


@pytest.mark.parametrize("lead", [(0,), (2, 0, 3), (4,), (2, 3), (2, 1, 3), ()])
@pytest.mark.parametrize("bias", [True, False])
def test_forward_backward_matches_nn_linear(lead, bias):
    ref = nn.Linear(6, 4, bias=bias)
    layer = CutlassLinear.from_linear(copy.deepcopy(ref))
    x = torch.randn(*lead, 6, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    y, y2 = layer(x), ref(x2)
    assert y.shape == (*lead, 4)
    torch.testing.assert_close(y, y2)
    g = torch.randn_like(y)
    y.backward(g)
    y2.backward(g)
    torch.testing.assert_close(x.grad, x2.grad)
    torch.testing.assert_close(layer.weight.grad, ref.weight.grad)
    if bias:
        torch.testing.assert_close(layer.bias.grad, ref.bias.grad)


@pytest.mark.parametrize("bias", [True, False])
def test_from_linear_shares_parameters(bias):
    ref = nn.Linear(3, 2, bias=bias)
    ref.eval()
    layer = CutlassLinear.from_linear(ref)
    assert type(layer) is CutlassLinear
    assert layer.weight is ref.weight
    assert layer.bias is ref.bias
    assert (layer.in_features, layer.out_features) == (3, 2)
    assert not layer.training
    with torch.no_grad():
        ref.weight.add_(1.0)  # visible through the shared parameter
    torch.testing.assert_close(layer(torch.ones(1, 3)), ref(torch.ones(1, 3)))


def test_from_linear_carries_hooks():
    ref = nn.Linear(4, 3)
    calls = []
    ref.register_forward_pre_hook(lambda m, args: calls.append("pre"))
    ref.register_forward_pre_hook(lambda m, args, kwargs: calls.append("pre_kw"), with_kwargs=True)
    ref.register_forward_hook(lambda m, args, out: calls.append("fwd"))
    ref.register_forward_hook(lambda m, args, kw, out: calls.append("fwd_kw"), with_kwargs=True)
    ref.register_full_backward_pre_hook(lambda m, go: calls.append("bwd_pre"))
    ref.register_full_backward_hook(lambda m, gi, go: calls.append("bwd"))
    x = torch.randn(2, 4, requires_grad=True)
    ref(x).sum().backward()
    expected = list(calls)
    calls.clear()
    layer = CutlassLinear.from_linear(ref)
    layer(x).sum().backward()
    assert calls == expected
    assert set(expected) == {"pre", "pre_kw", "fwd", "fwd_kw", "bwd_pre", "bwd"}


@pytest.mark.parametrize("bias", [True, False])
def test_state_dict_round_trip_strict(bias):
    ref = nn.Linear(5, 3, bias=bias)
    layer = CutlassLinear(5, 3, bias=bias)
    layer.load_state_dict(ref.state_dict(), strict=True)
    x = torch.randn(2, 5)
    torch.testing.assert_close(layer(x), ref(x))
    back = nn.Linear(5, 3, bias=bias)
    back.load_state_dict(layer.state_dict(), strict=True)
    for k, v in ref.state_dict().items():
        assert torch.equal(back.state_dict()[k], v)
    buf = io.BytesIO()
    torch.save(layer.state_dict(), buf)
    buf.seek(0)
    back2 = nn.Linear(5, 3, bias=bias)
    back2.load_state_dict(torch.load(buf), strict=True)
    torch.testing.assert_close(back2(x), ref(x))


def test_state_dict_bias_mismatch_rejected():
    with pytest.raises(RuntimeError, match="Unexpected key"):
        CutlassLinear(5, 3, bias=False).load_state_dict(nn.Linear(5, 3).state_dict(), strict=True)


def test_add2_module():
    m = Add2()
    a = torch.randn(2, 3, requires_grad=True)
    b = torch.randn(2, 3, requires_grad=True)
    y = m(a, b)
    torch.testing.assert_close(y, a + b)
    y.backward(torch.full_like(y, 2.0))
    torch.testing.assert_close(a.grad, torch.full_like(a, 2.0))
    torch.testing.assert_close(b.grad, torch.full_like(b, 2.0))
    assert list(m.parameters()) == [] and m.state_dict() == {}
    assert repr(m) == "Add2()"


# ---------------------------------------------------------------------------------------------
# convert()
# ---------------------------------------------------------------------------------------------


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
        self.head = nn.Linear(8, 3, bias=False)

    def forward(self, x):
        x = x + self.mlp(x)
        x = x + self.attn(x, x, x, need_weights=False)[0]
        return self.head(x)


def _run(model, x):
    x = x.clone().requires_grad_()
    y = model(x)
    y.backward(torch.ones_like(y))
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    return y.detach(), x.grad, grads


def test_convert_nested_and_mha():
    torch.manual_seed(0)
    model = Block()
    reference = copy.deepcopy(model)
    params_before = {n: p for n, p in model.named_parameters()}
    out = convert(model)
    assert out is model
    assert type(model.mlp[0]) is CutlassLinear and type(model.mlp[2]) is CutlassLinear
    assert type(model.head) is CutlassLinear
    # MultiheadAttention reads out_proj.weight directly: its out_proj (an nn.Linear subclass)
    # must not be converted; its in-projection is a bare parameter, no Linear
    assert type(model.attn.out_proj) is type(reference.attn.out_proj)
    assert type(model.attn.out_proj) is not CutlassLinear
    assert not any(isinstance(m, nn.Linear) for m in model.attn.children() if m is not model.attn.out_proj)
    # parameters are the same objects (shared, not copied)
    assert {n: p for n, p in model.named_parameters()} == params_before
    assert list(model.state_dict()) == list(reference.state_dict())
    x = torch.randn(2, 5, 8)
    y, gx, grads = _run(model, x)
    y_ref, gx_ref, grads_ref = _run(reference, x)
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(gx, gx_ref)
    assert grads.keys() == grads_ref.keys()
    for n in grads:
        torch.testing.assert_close(grads[n], grads_ref[n], msg=n)


def test_convert_filter_fn():
    model = Block()
    seen = []

    def only_mlp(name, mod):
        seen.append(name)
        assert isinstance(mod, nn.Linear)
        return name.startswith("mlp.")

    convert(model, filter_fn=only_mlp)
    assert type(model.mlp[0]) is CutlassLinear and type(model.mlp[2]) is CutlassLinear
    assert type(model.head) is nn.Linear
    assert {"mlp.0", "mlp.2", "head"} <= set(seen)
    assert "attn.out_proj" not in seen  # not an exact nn.Linear: never offered


def test_convert_root_linear():
    lin = nn.Linear(4, 2)
    out = convert(lin)
    assert type(out) is CutlassLinear and out.weight is lin.weight and out.bias is lin.bias
    with pytest.warns(UserWarning, match="cutlass_nn.convert: no nn.Linear layer"):
        same = convert(nn.Linear(4, 2), filter_fn=lambda name, m: name != "")
    assert type(same) is nn.Linear


@pytest.mark.parametrize(
    "model", [nn.Sequential(nn.ReLU()), nn.MultiheadAttention(4, 1)], ids=["no_linear", "mha"]
)
def test_convert_warns_when_nothing_converted(model):
    with pytest.warns(UserWarning, match="no nn.Linear layer of this .* was converted"):
        assert convert(model) is model


def test_convert_keeps_shared_linear_shared():
    shared = nn.Linear(4, 4)
    model = nn.Module()
    model.a = shared
    model.b = nn.Sequential(shared, nn.ReLU())
    model.c = nn.Linear(4, 4)
    convert(model)
    assert type(model.a) is CutlassLinear
    assert model.a is model.b[0]
    assert model.a.weight is shared.weight
    assert type(model.c) is CutlassLinear and model.c is not model.a
    assert len(list(model.parameters())) == 4  # shared parameters counted once


def test_convert_already_converted_warns_and_changes_nothing():
    model = convert(nn.Sequential(nn.Linear(2, 2)))
    layer = model[0]
    with pytest.warns(UserWarning):
        convert(model)
    assert model[0] is layer


def test_deepcopy_and_pickle_of_converted_model():
    torch.manual_seed(0)
    model = convert(Block()).eval()
    x = torch.randn(2, 3, 8)
    y = model(x)
    for clone in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert type(clone.mlp[0]) is CutlassLinear
        assert clone.mlp[0].weight is not model.mlp[0].weight
        torch.testing.assert_close(clone(x), y, rtol=0, atol=0)
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    torch.testing.assert_close(loaded(x), y, rtol=0, atol=0)


@pytest.mark.parametrize("shape", [(3, 4), (2, 3, 4)], ids=["2d", "3d"])
def test_outputs_are_not_views_so_inplace_ops_work(shape):
    """Regression: linear / linear_dgrad returned a view of their buffer, so an in-place op on a
    CutlassLinear output (ReLU(inplace=True)) failed in autograd."""
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(4, 8), nn.ReLU(inplace=True), nn.Linear(8, 2))
    ours = cutlass_nn.convert(copy.deepcopy(ref))
    x = torch.randn(shape, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    y = ours(x)
    y.sum().backward()
    ref(x_ref).sum().backward()
    assert not torch.ops.cutlass_nn.linear(x.detach(), ours[0].weight.detach())._is_view()
    torch.testing.assert_close(y, ref(x_ref.detach()))
    torch.testing.assert_close(x.grad, x_ref.grad)
    g = torch.randn(*shape[:-1], 8)
    assert not torch.ops.cutlass_nn.linear_dgrad(g, ours[0].weight.detach())._is_view()


@pytest.mark.parametrize(
    "module, expected",
    [("model.pt", "builtins.str"), (None, "builtins.NoneType"), (torch.randn(2, 2), "torch.Tensor")],
)
def test_convert_rejects_non_modules(module, expected):
    """convert of something that is not an nn.Module: a TypeError naming the argument and the
    type it got (not an AttributeError from deep inside)."""
    with pytest.raises(TypeError, match=rf"cutlass_nn.convert: argument 'module' must be a "
                       rf"torch.nn.Module, got {expected}"):
        cutlass_nn.convert(module)


def test_convert_rejects_a_non_callable_filter_and_changes_nothing():
    model = nn.Sequential(nn.Linear(4, 4))
    with pytest.raises(TypeError, match="argument 'filter_fn' must be None or a callable"):
        cutlass_nn.convert(model, filter_fn="0")
    assert type(model[0]) is nn.Linear
