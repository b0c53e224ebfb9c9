"""What attention a compiled ``transformers`` model runs: a mask or ``is_causal``.

Some ``transformers`` versions (5.17 among them) build a materialized causal mask whenever Dynamo
traces the model, and call ``scaled_dot_product_attention(..., attn_mask=mask, is_causal=False)``
where eager mode calls it with ``attn_mask=None, is_causal=True``. The fused attention kernels
then skip no masked blocks and read the mask: on an H200 the same cuDNN kernels took 2.6-2.8x
as long, 1.04-1.07 ms more per step of the Llama model at hidden 4096, on the stock and the
converted side alike (``benchmarks/NOTES.md`` v0.35). The model benchmark records what this probe finds, so
that a compiled row's attention time can be read for what it is.

The probe runs a tiny model of the family on the CPU, eager under a ``TorchFunctionMode`` that
records the attention calls, and compiled with a Dynamo backend that only inspects the traced
graph (no Inductor, no kernels): a few seconds per family.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch

#: the attention operator, as eager code calls it and as a Dynamo graph records it (Dynamo keeps
#: torch-level calls; aten's variants appear only after AOTAutograd, which the probe never runs)
_SDPA = torch.nn.functional.scaled_dot_product_attention


def _mask_argument(args, kwargs):
    """The ``attn_mask`` of a ``scaled_dot_product_attention`` call (keyword or 4th positional)."""
    return kwargs.get("attn_mask", args[3] if len(args) > 3 else None)


def _masks_in_graph(gm: torch.fx.GraphModule) -> list[bool]:
    """For each attention call in ``gm``: whether it is given a mask tensor."""
    return [isinstance(_mask_argument(node.args, node.kwargs), torch.fx.Node)
            for node in gm.graph.nodes if node.op == "call_function" and node.target is _SDPA]


class _EagerAttentionCalls(torch.overrides.TorchFunctionMode):
    """Records, for each eager ``scaled_dot_product_attention`` call, whether it gets a mask."""

    def __init__(self):
        super().__init__()
        self.masks: list[bool] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is _SDPA:
            self.masks.append(isinstance(_mask_argument(args, kwargs), torch.Tensor))
        return func(*args, **kwargs)


def attention_masks(family: str, *, padded: bool = False) -> dict[str, Optional[bool]]:
    """Whether a model of ``family`` (one of :data:`cutlass_nn.bench.models.FAMILIES`) hands its
    attention a mask tensor, eager and compiled: ``{"eager": ..., "compile": ...}``, each ``True``
    if any attention call has one, ``False`` if none has, ``None`` if the model calls no
    ``scaled_dot_product_attention`` (e.g. an attention written out in matrix products). The
    batch is unpadded, as the model benchmark's are; ``padded=True`` gives it an attention mask
    with padding (which every version has to pass on as a mask). The random generators are left
    as they were (the model is built seeded); ``torch._dynamo.reset()`` runs before and after the
    compiled call, so code the caller compiled before is compiled again at its next call."""
    cuda = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=cuda):
        return _probe(family, padded)


def _probe(family: str, padded: bool) -> dict[str, Optional[bool]]:
    from cutlass_nn.bench import models

    tiny = models.ModelSize(hidden=64, layers=1, heads=4, batch=2, seq=16, vocab=128)
    model = models.build_model(family, tiny)
    model.config._attn_implementation = "sdpa"
    ids = torch.randint(0, tiny.vocab, (tiny.batch, tiny.seq))
    inputs = {"input_ids": ids}
    if padded:
        mask = torch.ones_like(ids)
        mask[0, -tiny.seq // 4:] = 0  # the first sequence ends early
        inputs["attention_mask"] = mask
    compiled: list[bool] = []

    def inspect(gm: torch.fx.GraphModule, example_inputs):
        compiled.extend(_masks_in_graph(gm))
        return gm.forward

    with torch.no_grad():
        with _EagerAttentionCalls() as eager:
            model(**inputs)
        torch._dynamo.reset()
        try:
            torch.compile(model, backend=inspect)(**inputs)
        finally:
            torch._dynamo.reset()  # leave no compiled code of the probe behind
    return {"eager": any(eager.masks) if eager.masks else None,
            "compile": any(compiled) if compiled else None}


def probe_attention_masks(families: Sequence[str]) -> dict[str, Any]:
    """:func:`cutlass_nn.bench.attention_probe.attention_masks` of each family, for the run's
    metadata; a probe that fails is recorded as its error, not raised (it explains rows, it is
    not one)."""
    found: dict[str, Any] = {}
    for family in families:
        try:
            found[family] = attention_masks(family)
        except Exception as exc:  # noqa: BLE001 - recorded in the JSON instead
            found[family] = {"error": f"{type(exc).__name__}: {exc}"}
    return found


def format_attention_masks(found: dict[str, Any]) -> list[str]:
    """One line per family whose compiled attention gets a mask that its eager attention does
    not get (both sides' compiled rows then carry masked attention), or whose probe failed."""
    lines = []
    for family, masks in found.items():
        if "error" in masks:
            lines.append(f"attention probe, {family}: failed ({masks['error']})")
        elif masks.get("compile") and not masks.get("eager"):
            lines.append(f"attention, {family}: compiled with a materialized mask, eager without "
                         "one: the compiled rows' attention (both sides) is slower than "
                         "eager's (benchmarks/NOTES.md v0.35)")
    return lines
