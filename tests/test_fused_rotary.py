"""The rotary embedding of transformers attention layers as one operator (cutlass_nn.fused_rotary,
applied by convert(fuse_rope=True)) on the CPU backend: for Llama, Mistral, Qwen2 and Qwen3 the
fused model is the unfused one bitwise in float64 (loss and every gradient) and matches stock in
float32; one rotary_embedding call per layer; the class, other instances and the transformers
module keep the stock function; state_dict, hooks, generation with a cache, filter_fn, a later
patch of the class's forward, modules whose functions differ, deepcopy, pickling and
torch.compile behave; it composes with fuse_norm."""

from __future__ import annotations

import copy
import io
import sys
import types

import pytest
import torch

import cutlass_nn
from cutlass_nn import functional as F
from cutlass_nn import fused_rotary

transformers = pytest.importorskip("transformers")

from tiny_transformers import FAMILIES, IDS, loss_and_grads, tiny  # noqa: E402
from tiny_transformers import unfuse as _unfuse  # noqa: E402


def attentions(model):
    return [m for m in model.modules() if type(m).__name__.endswith("Attention")]


def unfuse(model):
    _unfuse(attentions(model))
    return model


class _CountCalls:
    """Counts the rotary_embedding operator calls made through cutlass_nn.functional."""

    def __init__(self):
        self.calls = 0

    def __enter__(self):
        self.real = F._rotary_embedding

        def counted(*args):
            self.calls += 1
            return self.real(*args)

        F._rotary_embedding = counted
        return self

    def __exit__(self, *exc):
        F._rotary_embedding = self.real


@pytest.mark.parametrize("family", list(FAMILIES))
def test_fused_is_the_unfused_model_in_float64(family):
    fused = cutlass_nn.convert(tiny(family, dtype=torch.float64), fuse_rope=True)
    assert len(attentions(fused)) == 2 and all(fused_rotary.is_fused(a) for a in attentions(fused))
    plain = unfuse(copy.deepcopy(fused))
    assert not any(fused_rotary.is_fused(a) for a in attentions(plain))
    with _CountCalls() as counter:
        lf, gf = loss_and_grads(fused, IDS)
    assert counter.calls == 2
    with _CountCalls() as counter:
        lp, gp = loss_and_grads(plain, IDS)
    assert counter.calls == 0
    assert torch.equal(lf, lp)
    for name in gp:
        torch.testing.assert_close(gf[name], gp[name], rtol=1e-12, atol=1e-14, msg=name)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_fused_matches_stock_and_keeps_class_state_dict_and_module(family):
    stock = tiny(family)
    ours = cutlass_nn.convert(tiny(family), fuse_rope=True)
    module = sys.modules[type(attentions(ours)[0]).__module__]
    assert module.apply_rotary_pos_emb is not F.apply_rotary_pos_emb
    assert type(attentions(ours)[0]) is type(attentions(stock)[0])
    assert set(ours.state_dict()) == set(stock.state_dict())
    ls, gs = loss_and_grads(stock, IDS)
    lo, go = loss_and_grads(ours, IDS)
    torch.testing.assert_close(lo, ls, rtol=1e-5, atol=1e-5)
    for name in gs:
        torch.testing.assert_close(go[name], gs[name], rtol=1e-4, atol=1e-5, msg=name)
    # another instance of the class is untouched
    with _CountCalls() as counter:
        tiny(family)(input_ids=IDS)
    assert counter.calls == 0


def test_composes_with_the_other_fusions():
    stock = tiny()
    ours = cutlass_nn.convert(tiny(), fuse_rope=True, fuse_norm=True, fuse_mlp=True)
    ls, gs = loss_and_grads(stock, IDS)
    with _CountCalls() as counter:
        lo, go = loss_and_grads(ours, IDS)
    assert counter.calls == 2
    torch.testing.assert_close(lo, ls, rtol=1e-5, atol=1e-5)
    for name in gs:
        torch.testing.assert_close(go[name], gs[name], rtol=1e-4, atol=1e-5, msg=name)


def test_generation_with_a_cache_matches_stock():
    stock = tiny().eval()
    ours = cutlass_nn.convert(tiny(), fuse_rope=True).eval()
    prompt = IDS[:1, :5]
    kw = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
    with torch.no_grad(), _CountCalls() as counter:
        got = ours.generate(prompt, **kw)
    with torch.no_grad():
        want = stock.generate(prompt, **kw)
    assert torch.equal(got, want)
    assert counter.calls >= 2 * 6


def test_hooks_still_run():
    model = cutlass_nn.convert(tiny(), fuse_rope=True)
    seen = []
    attentions(model)[0].register_forward_hook(lambda m, a, kw_out: seen.append(type(m).__name__))
    model(input_ids=IDS)
    assert seen == ["LlamaAttention"]


def test_filter_fn_is_asked_about_attention_layers():
    asked = []

    def only_first(name, module):
        if type(module).__name__ == "LlamaAttention":
            asked.append(name)
            return name.startswith("model.layers.0.")
        return True

    model = cutlass_nn.convert(tiny(), only_first, fuse_rope=True)
    assert asked == ["model.layers.0.self_attn", "model.layers.1.self_attn"]
    assert [fused_rotary.is_fused(a) for a in attentions(model)] == [True, False]


def test_fuse_rope_alone_converts_without_warning_on_a_model_without_linears():
    # the attention layers count as converted: no "nothing converted" warning
    import warnings

    model = tiny()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cutlass_nn.convert(model, lambda name, m: type(m).__name__ == "LlamaAttention", fuse_rope=True)
    assert all(fused_rotary.is_fused(a) for a in attentions(model))


def test_a_later_patch_of_the_class_forward_is_run(monkeypatch):
    model = cutlass_nn.convert(tiny(), fuse_rope=True)
    cls = type(attentions(model)[0])
    original = cls.forward
    patched_calls = []

    def patched(self, *args, **kwargs):
        patched_calls.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(cls, "forward", patched)
    with _CountCalls() as counter:
        model(input_ids=IDS)
    assert len(patched_calls) == 2 and counter.calls == 0


def test_runtime_subclass_keeps_the_fused_forward():
    """FSDP2 swaps an instance's class for a subclass made at run time (same forward)."""
    model = cutlass_nn.convert(tiny(), fuse_rope=True)
    for attn in attentions(model):
        attn.__class__ = type("FSDP" + type(attn).__name__, (type(attn),), {})
    with _CountCalls() as counter:
        model(input_ids=IDS)
    assert counter.calls == 2


def _fake_modeling_module(rotate_half_source, kernelized=False):
    """A module named like a transformers modeling module with its own LlamaAttention and the
    given rotate_half; ``kernelized``: decorated as transformers >= 5.25 does when the
    ``kernels`` package is installed (the function becomes a function-module, the class's
    forward is wrapped)."""
    name = "transformers.models.cutlass_nn_test.modeling_fake"
    mod = types.ModuleType(name)
    src = (
        "import torch\n"
        "from torch import nn\n"
        + ("from kernels import use_kernel_forward_from_hub, use_kernelized_func\n" if kernelized else "")
        + rotate_half_source
        + ('@use_kernel_forward_from_hub("rotary_pos_emb")\n' if kernelized else "")
        + "def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):\n"
        "    cos = cos.unsqueeze(unsqueeze_dim)\n"
        "    sin = sin.unsqueeze(unsqueeze_dim)\n"
        "    q_embed = (q * cos) + (rotate_half(q) * sin)\n"
        "    k_embed = (k * cos) + (rotate_half(k) * sin)\n"
        "    return q_embed, k_embed\n"
        + ("@use_kernelized_func(apply_rotary_pos_emb)\n" if kernelized else "")
        + "class LlamaAttention(nn.Module):\n"
        "    def forward(self, q, k, cos, sin):\n"
        "        return apply_rotary_pos_emb(q, k, cos, sin)\n"
    )
    return name, mod, src


def _load_fake_modeling_module(tmp_path, monkeypatch, rotate_half_source, kernelized=False):
    """_fake_modeling_module executed from a file (inspect.getsource needs one) and registered
    in sys.modules for the test's duration."""
    name, mod, src = _fake_modeling_module(rotate_half_source, kernelized)
    path = tmp_path / "modeling_fake.py"
    path.write_text(src)
    mod.__file__ = str(path)
    monkeypatch.setitem(sys.modules, name, mod)
    exec(compile(src, str(path), "exec"), vars(mod))
    return mod


def _assert_fused_call_is_the_module_function(attn, mod):
    """Fuses ``attn``; one operator call gives what the module's own function gives."""
    fused_rotary.fuse_rotary(attn)
    q, k = torch.randn(1, 2, 3, 4, dtype=torch.float64), torch.randn(1, 1, 3, 4, dtype=torch.float64)
    cos, sin = torch.randn(1, 3, 4, dtype=torch.float64), torch.randn(1, 3, 4, dtype=torch.float64)
    with _CountCalls() as counter:
        got = attn(q, k, cos, sin)
    assert counter.calls == 1
    for g, w in zip(got, mod.apply_rotary_pos_emb(q, k, cos, sin)):
        assert torch.equal(g, w)


@pytest.mark.parametrize("standard", [True, False])
def test_a_module_with_another_formula_is_not_fused(tmp_path, monkeypatch, standard):
    rotate = (
        "def rotate_half(x):\n"
        "    x1 = x[..., : x.shape[-1] // 2]\n"
        "    x2 = x[..., x.shape[-1] // 2 :]\n"
        + ("    return torch.cat((-x2, x1), dim=-1)\n" if standard else "    return torch.cat((x2, -x1), dim=-1)\n")
    )
    mod = _load_fake_modeling_module(tmp_path, monkeypatch, rotate)
    attn = mod.LlamaAttention()
    assert fused_rotary.can_fuse_rotary(attn) is standard
    if not standard:
        with pytest.raises(TypeError, match=r"cutlass_nn\.fuse_rotary: argument 'attention'"):
            fused_rotary.fuse_rotary(attn)
        assert "forward" not in attn.__dict__
        return
    _assert_fused_call_is_the_module_function(attn, mod)
    assert mod.apply_rotary_pos_emb is not F.apply_rotary_pos_emb  # the module is untouched


STANDARD_ROTATE_HALF = (
    "def rotate_half(x):\n"
    "    x1 = x[..., : x.shape[-1] // 2]\n"
    "    x2 = x[..., x.shape[-1] // 2 :]\n"
    "    return torch.cat((-x2, x1), dim=-1)\n"
)


@pytest.mark.parametrize("hub_kernel", [False, True])
def test_a_kernels_decorated_module_is_fused_unless_a_hub_kernel_replaced_its_function(
    tmp_path, monkeypatch, hub_kernel
):
    """transformers >= 5.25 requires the ``kernels`` package, which makes the module's
    apply_rotary_pos_emb an nn.Module wrapping the function and wraps the class's forward: the
    function inside is checked, the wrapper rebuilt; a function whose forward was replaced (a
    hub kernel installed by kernelize) is left alone."""
    pytest.importorskip("kernels")
    mod = _load_fake_modeling_module(tmp_path, monkeypatch, STANDARD_ROTATE_HALF, kernelized=True)
    assert isinstance(mod.apply_rotary_pos_emb, torch.nn.Module)  # the decorator did wrap it
    if hub_kernel:
        fn = mod.apply_rotary_pos_emb
        fn.forward = types.MethodType(lambda self, q, k, cos, sin: (q, k), fn)
    attn = mod.LlamaAttention()
    assert fused_rotary.can_fuse_rotary(attn) is not hub_kernel
    if hub_kernel:
        return
    _assert_fused_call_is_the_module_function(attn, mod)


def test_other_modules_are_refused():
    assert not fused_rotary.can_fuse_rotary(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match=r"cutlass_nn\.fuse_rotary: argument 'attention' must be"):
        fused_rotary.fuse_rotary(torch.nn.MultiheadAttention(8, 2))


def test_deepcopy_and_pickle():
    model = cutlass_nn.convert(tiny(), fuse_rope=True)
    want = model(input_ids=IDS).logits
    clone = copy.deepcopy(model)
    assert all(fused_rotary.is_fused(a) for a in attentions(clone))
    torch.testing.assert_close(clone(input_ids=IDS).logits, want)
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    torch.testing.assert_close(loaded(input_ids=IDS).logits, want, rtol=1e-5, atol=1e-5)


def test_compile_matches_eager():
    import torch._dynamo

    torch._dynamo.reset()
    model = cutlass_nn.convert(tiny(), fuse_rope=True)
    want, grads = loss_and_grads(model, IDS)
    compiled = torch.compile(model)
    got, got_grads = loss_and_grads(compiled, IDS)
    got_grads = {n.removeprefix("_orig_mod."): g for n, g in got_grads.items()}
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for name in grads:
        torch.testing.assert_close(got_grads[name], grads[name], rtol=1e-4, atol=1e-5, msg=name)


def test_an_instance_with_a_forward_of_its_own_is_left_as_is():
    """A wrapper a library installed on the instance (as accelerate's hooks do) keeps running."""
    model = tiny()
    runs = []
    for attn in attentions(model):
        inner = attn.forward

        def wrapped(*args, _inner=inner, **kwargs):
            runs.append(1)
            return _inner(*args, **kwargs)

        attn.forward = wrapped
    with pytest.warns(UserWarning, match=r"fuse_rope: no attention layer"):
        cutlass_nn.convert(model, lambda name, m: type(m).__name__ == "LlamaAttention", fuse_rope=True)
    assert not any(fused_rotary.is_fused(a) for a in attentions(model))
    with _CountCalls() as counter:
        model(input_ids=IDS)
    assert len(runs) == 2 and counter.calls == 0


def test_the_module_globals_stay_live(monkeypatch):
    """The fused forward reads the modeling module's other globals at call time: a later change
    to one of them (here the eager attention function) is seen, as by the stock forward."""
    model = cutlass_nn.convert(tiny(), fuse_rope=True)
    model.config._attn_implementation = "eager"
    module = sys.modules[type(attentions(model)[0]).__module__]
    real = module.eager_attention_forward
    spy_calls = []

    def spy(*args, **kwargs):
        spy_calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, "eager_attention_forward", spy)
    with _CountCalls() as counter:
        model(input_ids=IDS)
    assert len(spy_calls) == 2 and counter.calls == 2
    assert module.apply_rotary_pos_emb is not F.apply_rotary_pos_emb


def test_autocast_takes_the_operator_and_matches_stock():
    """A float32 model under bfloat16 autocast: 16-bit q, k beside float32 cos, sin take the
    operator in float32 (the formula's promotion), with the stock model's results."""
    stock = tiny()
    ours = cutlass_nn.convert(tiny(), fuse_rope=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = stock(input_ids=IDS, labels=IDS).loss
        with _CountCalls() as counter:
            got = ours(input_ids=IDS, labels=IDS).loss
    assert counter.calls == 2
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
