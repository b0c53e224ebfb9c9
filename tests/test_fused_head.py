"""fuse_lm_head / convert(fuse_head=True) on a transformers causal LM (CPU, float32): the loss
and every parameter gradient equal the stock model's (mean, with ignored labels, and the
Trainer's sum / num_items_in_batch form), a forward without labels still returns the logits,
the state_dict is unchanged, the patch is per instance and idempotent, and unsupported models
are refused (TypeError) or left as they are with a warning (convert)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import cutlass_nn

transformers = pytest.importorskip("transformers")


def pair(seed=0):
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=300)
    torch.manual_seed(seed)
    stock = transformers.LlamaForCausalLM(cfg)
    ours = transformers.LlamaForCausalLM(cfg)
    ours.load_state_dict(stock.state_dict())
    return stock, ours


@pytest.mark.parametrize("num_items", [None, 17])
def test_loss_and_gradients_match_stock(num_items):
    stock, ours = pair()
    cutlass_nn.convert(ours, fuse_norm=True, fuse_mlp=True, fuse_head=True)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 300, (2, 24), generator=gen)
    labels = ids.clone()
    labels[0, :5] = -100
    kw = {} if num_items is None else {"num_items_in_batch": torch.tensor(num_items)}
    a = stock(input_ids=ids, labels=labels, **kw)
    b = ours(input_ids=ids, labels=labels, **kw)
    assert b.logits is None
    torch.testing.assert_close(b.loss, a.loss, rtol=1e-6, atol=1e-6)
    a.loss.backward()
    b.loss.backward()
    for (name, p), q in zip(stock.named_parameters(), ours.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6, msg=name)
    assert ours.state_dict().keys() == stock.state_dict().keys()


def test_forward_without_labels_is_unchanged_and_the_patch_is_per_instance():
    stock, ours = pair()
    cutlass_nn.fuse_lm_head(ours)
    cutlass_nn.fuse_lm_head(ours)  # idempotent
    ids = torch.randint(0, 300, (1, 10), generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(ours(input_ids=ids).logits, stock(input_ids=ids).logits)
    assert stock(input_ids=ids, labels=ids).logits is not None  # the other instance: stock
    assert "forward" not in type(ours).__dict__ or type(ours).forward is type(stock).forward


def test_unsupported_models():
    with pytest.raises(TypeError, match="cutlass_nn.fuse_lm_head: argument 'model'"):
        cutlass_nn.fuse_lm_head(nn.Linear(3, 4))
    with pytest.warns(UserWarning, match="fuse_head"):
        cutlass_nn.convert(nn.Sequential(nn.Linear(3, 4)), fuse_head=True)
