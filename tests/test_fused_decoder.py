"""The decoder-layer residual add fused into the following RMSNorm (cutlass_nn.fused_decoder,
applied by convert(fuse_norm=True)) on the CPU backend: for Llama, Mistral, Qwen2 and Qwen3 the
fused model matches the unfused converted one in float64 (loss and every gradient) and the stock
model in float32, runs one add_rms_norm per layer, keeps its state_dict, generates like the stock
model with a cache; layers whose forward differs (by name, module or source) are not fused;
hooks on the norm, filter_fn, deepcopy, pickling and torch.compile behave."""

from __future__ import annotations

import copy
import io

import pytest
import torch
from torch import nn

import cutlass_nn
from cutlass_nn import fused_decoder

transformers = pytest.importorskip("transformers")

from tiny_transformers import FAMILIES, IDS, loss_and_grads, tiny  # noqa: E402
from tiny_transformers import unfuse as _unfuse  # noqa: E402


def layers(model):
    return [m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")]


def unfuse(model):
    _unfuse(layers(model))
    return model


@pytest.mark.parametrize("family", list(FAMILIES))
def test_fused_matches_unfused_in_float64(family):
    fused = cutlass_nn.convert(tiny(family, dtype=torch.float64), fuse_norm=True)
    assert all(fused_decoder.is_fused(layer) for layer in layers(fused)) and len(layers(fused)) == 2
    plain = unfuse(copy.deepcopy(fused))
    assert not any(fused_decoder.is_fused(layer) for layer in layers(plain))
    lf, gf = loss_and_grads(fused, IDS)
    lp, gp = loss_and_grads(plain, IDS)
    torch.testing.assert_close(lf, lp, rtol=1e-12, atol=1e-12)
    for name in gp:
        torch.testing.assert_close(gf[name], gp[name], rtol=1e-10, atol=1e-12, msg=name)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_fused_matches_stock_and_keeps_the_state_dict(family):
    stock = tiny(family)
    ours = cutlass_nn.convert(tiny(family), fuse_norm=True)
    assert set(ours.state_dict()) == set(stock.state_dict())
    ls, gs = loss_and_grads(stock, IDS)
    lo, go = loss_and_grads(ours, IDS)
    torch.testing.assert_close(lo, ls, rtol=1e-5, atol=1e-5)
    for name in gs:
        torch.testing.assert_close(go[name], gs[name], rtol=1e-4, atol=1e-5, msg=name)
    tiny(family, seed=1).load_state_dict(ours.state_dict(), strict=True)


def test_one_add_rms_norm_per_layer_and_one_add_fewer():
    def count(model):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            model(input_ids=IDS)
        def outside_cutlass_ops(e):  # the CPU kernels of cutlass_nn ops are ATen calls too
            p = e.cpu_parent
            while p is not None:
                if p.name.startswith("cutlass_nn::"):
                    return False
                p = p.cpu_parent
            return True

        events = prof.events()
        norms = sum(e.name == "cutlass_nn::add_rms_norm" for e in events)
        return norms, sum(e.name == "aten::add" and outside_cutlass_ops(e) for e in events)

    fused = cutlass_nn.convert(tiny("llama"), fuse_norm=True)
    plain = unfuse(copy.deepcopy(fused))
    fused_norms, fused_adds = count(fused)
    plain_norms, plain_adds = count(plain)
    assert (fused_norms, plain_norms) == (2, 0)
    assert plain_adds - fused_adds == 2


def test_generation_with_a_cache_matches_stock():
    stock = tiny("llama").eval()
    ours = cutlass_nn.convert(tiny("llama"), fuse_norm=True).eval()
    prompt = IDS[:1, :5]
    kw = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        assert torch.equal(ours.generate(prompt, **kw), stock.generate(prompt, **kw))


def test_without_fuse_norm_nothing_is_fused():
    model = cutlass_nn.convert(tiny("llama"))
    assert not any(fused_decoder.is_fused(layer) for layer in layers(model))


def test_filter_fn_is_asked_about_each_layer():
    asked = []

    def keep_first(name, module):
        if type(module).__name__ == "LlamaDecoderLayer":
            asked.append(name)
            return name.endswith(".0")
        return True

    model = cutlass_nn.convert(tiny("llama"), fuse_norm=True, filter_fn=keep_first)
    assert asked == ["model.layers.0", "model.layers.1"]
    assert [fused_decoder.is_fused(layer) for layer in layers(model)] == [True, False]


def test_a_layer_with_another_forward_is_not_fused():
    base = type(layers(tiny("llama"))[0])

    class LlamaDecoderLayer(base):  # same name and module, another forward
        def forward(self, hidden_states, attention_mask=None, position_ids=None, cache=None,
                    use_cache=False, position_embeddings=None, **kwargs):
            return 2 * super().forward(hidden_states, attention_mask, position_ids, cache,
                                       use_cache, position_embeddings, **kwargs)

    LlamaDecoderLayer.__module__ = base.__module__
    model = tiny("llama")
    for layer in layers(model):
        layer.__class__ = LlamaDecoderLayer
    assert not fused_decoder.can_fuse_residual_norm(layers(model)[0])
    cutlass_nn.convert(model, fuse_norm=True)
    assert not any(fused_decoder.is_fused(layer) for layer in layers(model))

    class MyDecoderLayer(base):  # the stock forward, but not a class the fusion knows
        pass

    assert not fused_decoder.can_fuse_residual_norm(MyDecoderLayer(tiny("llama").config, 0))


def test_fuse_residual_norm_rejects_other_modules():
    lin = nn.Linear(4, 4)
    with pytest.raises(TypeError, match=r"cutlass_nn\.fuse_residual_norm: argument 'layer' must be"):
        fused_decoder.fuse_residual_norm(lin)
    assert "forward" not in lin.__dict__


def test_hooks_on_the_norm_keep_the_unfused_path():
    model = cutlass_nn.convert(tiny("llama"), fuse_norm=True)
    seen = []
    layers(model)[0].post_attention_layernorm.register_forward_hook(lambda m, i, o: seen.append(o.shape))
    reference = unfuse(copy.deepcopy(model))
    seen.clear()
    torch.testing.assert_close(model(input_ids=IDS).logits, reference(input_ids=IDS).logits)
    assert len(seen) == 2  # the hook ran in both models


def test_deepcopy_and_pickle():
    model = cutlass_nn.convert(tiny("llama"), fuse_norm=True)
    clone = copy.deepcopy(model)
    assert all(fused_decoder.is_fused(layer) for layer in layers(clone))
    assert all(layer.forward.__self__ is layer for layer in layers(clone))
    want = model(input_ids=IDS).logits
    torch.testing.assert_close(clone(input_ids=IDS).logits, want)
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    torch.testing.assert_close(loaded(input_ids=IDS).logits, want, rtol=1e-5, atol=1e-5)


def test_compile_matches_eager():
    model = cutlass_nn.convert(tiny("llama"), fuse_norm=True)
    eager_loss, eager_grads = loss_and_grads(model, IDS)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="aot_eager")
    compiled.zero_grad(set_to_none=True)
    loss = compiled(input_ids=IDS, labels=IDS).loss
    loss.backward()
    torch.testing.assert_close(loss.detach(), eager_loss, rtol=1e-6, atol=1e-6)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, eager_grads[name], rtol=1e-5, atol=1e-6, msg=name)


# The decoder layer forwards of earlier transformers 5 releases (5.0: past_key_values and
# cache_position; 5.10 to 5.20: past_key_values), and one with a statement changed.
_FORWARD_5_0 = '''
def forward(self, hidden_states, attention_mask=None, position_ids=None, past_key_values=None,
            use_cache=False, cache_position=None, position_embeddings=None, **kwargs):
    residual = hidden_states
    hidden_states = self.input_layernorm(hidden_states)
    # Self Attention
    hidden_states, _ = self.self_attn(
        hidden_states=hidden_states,
        attention_mask=attention_mask,
        position_ids=position_ids,
        past_key_values=past_key_values,
        use_cache=use_cache,
        cache_position=cache_position,
        position_embeddings=position_embeddings,
        **kwargs,
    )
    hidden_states = residual + hidden_states
    residual = hidden_states
    hidden_states = self.post_attention_layernorm(hidden_states)
    hidden_states = self.mlp(hidden_states)
    hidden_states = residual + hidden_states
    return hidden_states
'''
_FORWARD_5_10 = _FORWARD_5_0.replace("use_cache=False, cache_position=None,", "use_cache=False,").replace(
    "        cache_position=cache_position,\n", "")
_FORWARD_CHANGED = _FORWARD_5_10.replace("hidden_states = self.mlp(hidden_states)",
                                         "hidden_states = self.mlp(hidden_states) * 0.5")


@pytest.mark.parametrize(
    "source,names",
    [
        (_FORWARD_5_0, ("attention_mask", "position_ids", "past_key_values", "use_cache",
                        "cache_position", "position_embeddings")),
        (_FORWARD_5_10, ("attention_mask", "position_ids", "past_key_values", "use_cache",
                         "position_embeddings")),
        (_FORWARD_CHANGED, None),
    ],
    ids=["5.0", "5.10", "changed"],
)
def test_forwards_of_other_transformers_5_releases(tmp_path, monkeypatch, source, names):
    import importlib.util
    import sys

    path = tmp_path / "old_modeling_llama.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("old_modeling_llama", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(sys.modules, "old_modeling_llama", module)
    base = type(layers(tiny("llama"))[0])
    cls = type("LlamaDecoderLayer", (base,), {"forward": module.forward,
                                               "__module__": "transformers.models.llama.old"})
    got = fused_decoder._spec_of(cls)
    assert (got.names if got else None) == names
    if names is None:
        return
    # the fused forward passes each of them to the attention by name, defaults included
    layer = layers(tiny("llama"))[0]
    layer.__class__ = cls
    seen = {}
    monkeypatch.setattr(layer.self_attn, "forward", lambda **kw: (seen.update(kw), (kw["hidden_states"], None))[1])
    fused_decoder.fuse_residual_norm(layer)
    layer(torch.randn(1, 3, 64), None, position_embeddings="pe")
    assert set(seen) == {"hidden_states", *names}
    assert seen["attention_mask"] is None and seen["position_embeddings"] == "pe" and seen["use_cache"] is False


def test_gradient_checkpointing_still_checkpoints():
    model = cutlass_nn.convert(tiny("llama"), fuse_norm=True)
    reference = unfuse(copy.deepcopy(model))
    model.gradient_checkpointing_enable()
    model.train()
    calls = []
    for layer in layers(model):
        inner = layer._gradient_checkpointing_func
        layer._gradient_checkpointing_func = lambda *a, _f=inner, **k: (calls.append(1), _f(*a, **k))[1]
    lm, gm = loss_and_grads(model, IDS)
    lr, gr = loss_and_grads(reference, IDS)
    assert len(calls) == 2  # each layer ran under the checkpoint (as the class's forward)
    torch.testing.assert_close(lm, lr)
    for name in gr:
        torch.testing.assert_close(gm[name], gr[name], rtol=1e-5, atol=1e-6, msg=name)


def test_a_cache_under_its_deprecated_name_is_used():
    model = cutlass_nn.convert(tiny("llama"), fuse_norm=True).eval()
    reference = unfuse(copy.deepcopy(model))
    outs = []
    for m in (model, reference):
        cache = transformers.DynamicCache(config=m.config)
        layer = layers(m)[0]
        hidden = torch.randn(1, 4, 64, generator=torch.Generator().manual_seed(0))
        pos = torch.arange(4)[None]
        pe = m.model.rotary_emb(hidden, position_ids=pos)
        with torch.no_grad():
            outs.append(layer(hidden, position_ids=pos, past_key_values=cache, use_cache=True,
                              position_embeddings=pe))
        assert cache.get_seq_length() == 4
    torch.testing.assert_close(outs[0], outs[1])


def test_a_layer_subclassed_at_run_time_keeps_working():
    """FSDP2 (fully_shard) swaps the layer's class for a subclass made at run time."""
    model = cutlass_nn.convert(tiny("llama"), fuse_norm=True)
    want = model(input_ids=IDS).logits
    for layer in layers(model):
        layer.__class__ = type("FSDP" + type(layer).__name__, (type(layer),), {})
    torch.testing.assert_close(model(input_ids=IDS).logits, want)


def test_backward_hooks_on_the_norm_keep_the_unfused_path():
    model = cutlass_nn.convert(tiny("llama"), fuse_norm=True)
    seen = []
    layers(model)[0].post_attention_layernorm.register_full_backward_hook(lambda m, gi, go: seen.append(1))
    model(input_ids=IDS, labels=IDS).loss.backward()
    assert seen == [1]


def test_a_patched_class_forward_is_followed():
    model = cutlass_nn.convert(tiny("llama"), fuse_norm=True)
    cls = type(layers(model)[0])
    original = cls.forward
    calls = []

    def patched(self, *args, **kwargs):
        calls.append(1)
        return original(self, *args, **kwargs)

    try:
        cls.forward = patched
        model(input_ids=IDS)
    finally:
        cls.forward = original
    assert len(calls) == 2


def test_a_layer_with_a_forward_of_its_own_is_left_as_is():
    """A wrapper a library installed on the instance (as accelerate's hooks do) keeps running."""
    model = tiny("llama")
    runs = []
    for layer in layers(model):
        inner = layer.forward

        def wrapped(*args, _inner=inner, **kwargs):
            runs.append(1)
            return _inner(*args, **kwargs)

        layer.forward = wrapped
    cutlass_nn.convert(model, fuse_norm=True)
    assert not any(fused_decoder.is_fused(layer) for layer in layers(model))
    model(input_ids=IDS)
    assert len(runs) == 2
