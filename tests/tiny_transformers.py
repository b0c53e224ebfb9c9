"""Tiny randomly initialized transformers causal LMs shared by the tests of the fusions that
rewrite transformers layers in place (tests/test_fused_decoder.py, tests/test_fused_rotary.py).
Importing it needs transformers: import it after pytest.importorskip("transformers")."""

from __future__ import annotations

import torch
import transformers

FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
}

#: A batch of token ids for the tiny models' vocabulary of 97.
IDS = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(3))


def tiny(family="llama", seed=0, dtype=torch.float32):
    """A 2-layer model of `family` (hidden 64, 4 query / 2 key-value heads), its norm weights
    drawn around 1 (not all ones: a wrong weight path would show)."""
    config_name, model_name = FAMILIES[family]
    cfg = getattr(transformers, config_name)(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=97, max_position_embeddings=64,
    )
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(cfg).to(dtype)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.normal_(1.0, 0.2)
    return model


def unfuse(modules):
    """Drop the instance-level forward of each module (back to its class's forward)."""
    for m in modules:
        m.__dict__.pop("forward", None)


def loss_and_grads(model, ids):
    """The training loss on ids (labels = ids) and every parameter's gradient, by name."""
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}
