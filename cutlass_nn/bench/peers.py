"""Peer sides of the model benchmark (``--what models``): the same stock model put through another
project's speed-up, trained in the same process, on the same weights and batches, as a third side
of a row. A peer that cannot be imported, or does not apply to the row's model family, is recorded
with a status and a note instead of a time.

* ``liger`` (``--liger``): Liger-Kernel's Llama patch on the instance (RMSNorm, SwiGLU MLP, fused
  linear + cross-entropy); Llama rows only.
* ``torchao`` (``--torchao``, with ``--fp8 SCALING``): torchao's float8 training conversion
  (``convert_to_float8_training``) with its recipe of the same name as the row's FP8 scaling
  (torchao's "tensorwise": e4m3 input and weight, e5m2 output gradient, the forward GEMM with fast
  accumulation; "rowwise": e4m3 everywhere, per-row scales). The layers it converts are the ones
  ``convert(precision="fp8")`` converts here: :func:`cutlass_nn.fp8.eligible` shapes, the LM
  head left in bf16. torchao's FP8 path is meant to run under ``torch.compile``.
"""

from __future__ import annotations

import importlib
from typing import Any, Sequence

from torch import nn

from cutlass_nn.bench.fp8 import recipe_of
from cutlass_nn.bench.models_report import paired_step_ratio

PEERS = ("liger", "torchao")
_MODULES = {"liger": "liger_kernel.transformers", "torchao": "torchao.float8"}


def available(peer: str) -> bool:
    """Whether the peer's package imports here."""
    try:
        importlib.import_module(_MODULES[peer])
    except Exception:
        return False
    return True


def skip_reason(peer: str, family: str, fp8: str | None) -> tuple[str, str] | None:
    """``(status, note)`` when the peer cannot run on this row, else None."""
    if peer == "liger" and family != "llama":
        return "skipped", "Liger row: Llama rows only"
    if peer == "torchao" and fp8 is None:
        return "skipped", "torchao row: needs --fp8 SCALING (its float8 recipe of that name)"
    if not available(peer):
        return "unavailable", f"{_MODULES[peer]} is not importable"
    return None


def apply(peer: str, model: nn.Module, fp8: str | None) -> nn.Module:
    if peer == "liger":
        return apply_liger(model)
    # torchao's recipe of that scaling (its tensorwise recipe has fast accumulation in the
    # forward GEMM already)
    return apply_torchao(model, recipe_of(fp8 or "tensorwise").scaling)


def apply_liger(model: nn.Module) -> nn.Module:
    """The stock model with Liger-Kernel's Llama patch on this instance: its RMSNorm, SwiGLU MLP
    and fused linear + cross-entropy. Liger's rope kernel is left out, and the module-level names
    its patch rebinds in transformers' Llama module are restored at once: those are global, and
    the stock side of the same process must keep running stock code."""
    from liger_kernel.transformers import apply_liger_kernel_to_llama
    from transformers.models.llama import modeling_llama

    names = ("apply_rotary_pos_emb", "LlamaRMSNorm", "LlamaMLP")
    saved = {name: getattr(modeling_llama, name) for name in names}
    saved_forward = modeling_llama.LlamaForCausalLM.forward
    try:
        apply_liger_kernel_to_llama(rope=False, cross_entropy=False, fused_linear_cross_entropy=True,
                                    rms_norm=True, swiglu=True, model=model)
    finally:
        for name, value in saved.items():
            setattr(modeling_llama, name, value)
        modeling_llama.LlamaForCausalLM.forward = saved_forward
    return model


def apply_torchao(model: nn.Module, scaling: str) -> nn.Module:
    """torchao's float8 training conversion with its recipe ``scaling``, on the layers this
    project's FP8 conversion takes (eligible shapes, not the LM head)."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    from cutlass_nn import fp8

    def take(module: nn.Module, name: str) -> bool:
        return (isinstance(module, nn.Linear) and not name.endswith("lm_head")
                and fp8.eligible(module.in_features, module.out_features))

    return convert_to_float8_training(model, module_filter_fn=take,
                                      config=Float8LinearConfig.from_recipe_name(scaling))


def finish(side: dict[str, Any], stock: dict[str, Any], ours: dict[str, Any], compare) -> None:
    """The peer side's ratios: to stock (> 1: the peer faster) and ours to it (> 1: cutlass_nn
    faster), each taken as the row's own ratio is (the paired median,
    :func:`cutlass_nn.bench.models_report.paired_step_ratio`; the ratios of median step times
    beside them, ``*_of_medians``), its memory against stock, its loss agreement with stock."""
    side["status"] = "ok"
    side["ratio"] = paired_step_ratio(stock, side)
    side["ours_vs_peer"] = paired_step_ratio(side, ours)
    side["ratio_of_medians"] = stock["step_ms"] / side["step_ms"]
    side["ours_vs_peer_of_medians"] = side["step_ms"] / ours["step_ms"]
    if "peak_bytes" in side and "peak_bytes" in stock:
        side["memory_ratio"] = side["peak_bytes"] / stock["peak_bytes"]
    if side.get("peak_requested_bytes") and stock.get("peak_requested_bytes"):
        side["memory_ratio_requested"] = side["peak_requested_bytes"] / stock["peak_requested_bytes"]
    side["loss"] = compare(stock["losses"], side["losses"])


def format_peers(rows: Sequence[dict]) -> list[str]:
    """One line per peer side of each row: its time, ratio to stock, and ours to it."""
    names = {"liger": "Liger", "torchao": "torchao float8"}
    lines = []
    for r in rows:
        for peer in PEERS:
            side = r.get(peer)
            if not side:
                continue
            if side.get("status") != "ok":
                lines.append(f"{names[peer]}, {r['label']}: {side.get('status')} ({side.get('note', '')})")
                continue
            memory = side.get("memory_ratio")
            requested = side.get("memory_ratio_requested")
            lines.append(
                f"{names[peer]}, {r['label']}: {side['step_ms']:.2f} ms, {side['ratio']:.3f}x stock, "
                f"memory {'-' if memory is None else format(memory, '.3f')}x stock"
                f"{'' if requested is None else f' (tensor bytes {requested:.3f}x)'}; cutlass_nn "
                f"{side['ours_vs_peer']:.3f}x its speed; loss agrees with stock: {side['loss']['agree']}"
            )
    return lines
