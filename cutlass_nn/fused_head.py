"""The training loss of a ``transformers`` causal LM through
:func:`cutlass_nn.functional.linear_cross_entropy`, without the ``[tokens, vocab]`` logits.

:func:`fuse_lm_head` replaces the ``forward`` of one model instance (nothing global is patched):
a call with ``labels`` runs the base model, then the head and its loss as one chunked operation,
and returns the loss with ``logits=None``; a call without ``labels`` (generation, evaluation of
logits) runs the original forward unchanged. The loss is what ``transformers`` computes: labels
shifted by one with ``-100`` (ignored) appended, the mean over the non-ignored tokens, or the sum
divided by ``num_items_in_batch`` when the Trainer passes it.
"""

from __future__ import annotations

import types

import torch
from torch import nn

from cutlass_nn.linear_cross_entropy import linear_cross_entropy

__all__ = ["CAUSAL_LMS", "fuse_lm_head", "can_fuse_lm_head"]

#: ``transformers`` causal-LM classes whose loss is exactly the cross-entropy of
#: ``lm_head(last_hidden_state)`` (no logit soft-capping or scaling between the two).
CAUSAL_LMS = frozenset(
    {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"}
)

_IGNORE_INDEX = -100


def can_fuse_lm_head(model: nn.Module) -> bool:
    """Whether :func:`fuse_lm_head` takes ``model``."""
    head = getattr(model, "lm_head", None)
    return (
        type(model).__name__ in CAUSAL_LMS
        and type(model).__module__.startswith("transformers.")
        and isinstance(getattr(model, "model", None), nn.Module)
        and isinstance(head, nn.Linear)
        and getattr(head, "activation", None) is None  # a CutlassLinear without activation
        and isinstance(head.weight, torch.Tensor)
        and getattr(model.config, "final_logit_softcapping", None) is None
        and getattr(model.config, "logit_scale", None) is None
    )


def _fused_forward(self, input_ids=None, labels=None, **kwargs):
    if labels is None:
        return self._cutlass_nn_original_forward(input_ids=input_ids, **kwargs)
    num_items = kwargs.pop("num_items_in_batch", None)
    shift_labels = kwargs.pop("shift_labels", None)
    kwargs.pop("logits_to_keep", None)  # no logits are formed
    outputs = self.model(input_ids=input_ids, **kwargs)
    hidden = outputs.last_hidden_state
    if shift_labels is None:
        shift_labels = nn.functional.pad(labels, (0, 1), value=_IGNORE_INDEX)[..., 1:]
    shift_labels = shift_labels.to(hidden.device)
    head = self.lm_head
    if num_items is None:
        loss = linear_cross_entropy(hidden, head.weight, shift_labels, head.bias,
                                    ignore_index=_IGNORE_INDEX)
    else:
        loss = linear_cross_entropy(hidden, head.weight, shift_labels, head.bias,
                                    ignore_index=_IGNORE_INDEX, reduction="sum")
        if torch.is_tensor(num_items):
            num_items = num_items.to(loss.device)
        loss = loss / num_items
    from transformers.modeling_outputs import CausalLMOutputWithPast

    # the cache field is "cache" in recent transformers, "past_key_values" before (and an alias)
    key = next((k for k in ("cache", "past_key_values") if k in outputs), None)
    extra = {key: outputs[key]} if key is not None else {}
    return CausalLMOutputWithPast(loss=loss, logits=None, hidden_states=outputs.hidden_states,
                                  attentions=outputs.attentions, **extra)


def fuse_lm_head(model: nn.Module) -> nn.Module:
    """Make ``model`` (a causal LM of :data:`CAUSAL_LMS`) compute its training loss with
    ``linear_cross_entropy``; returns ``model``. Idempotent. The parameters, ``state_dict`` and
    the forward without ``labels`` are unchanged; with ``labels`` the output has ``logits=None``.

    Raises:
        TypeError: ``model`` is not one of the supported causal LMs.
    """
    if not can_fuse_lm_head(model):
        raise TypeError(
            "cutlass_nn.fuse_lm_head: argument 'model' must be a transformers causal LM of "
            f"{sorted(CAUSAL_LMS)} with an nn.Linear lm_head and no logit soft-capping, got "
            f"{type(model).__module__}.{type(model).__qualname__}"
        )
    if "_cutlass_nn_original_forward" not in model.__dict__:
        model._cutlass_nn_original_forward = model.forward
        model.forward = types.MethodType(_fused_forward, model)
    return model
