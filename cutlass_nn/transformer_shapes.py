"""The GEMM shapes of real transformer models, for the kernel benchmark and the configuration sweep.

Each model family contributes its linear layers as (name, out_features N, in_features K); a
training step at T tokens runs, per layer, the forward ``T x N x K``, the input gradient (dgrad)
``T x K x N`` and the weight gradient (wgrad) ``N x K x T``. The benchmark takes the layer shapes
``(T, N, K)`` and derives dgrad and wgrad from them (``bench.build_gemm_case``).

The families are the public configurations of the models named (hidden size, intermediate size,
key/value heads x head dim), the two sizes of ``cutlass_nn.bench --what models``, and the
per-rank slices of a 70B model under 8-way tensor parallelism (column-parallel q/kv/gate/up split
N, row-parallel o/down split K).
"""

from __future__ import annotations

from typing import Iterable, Sequence

Layer = tuple[str, int, int]  # (name, out_features N, in_features K)


def _gpt(hidden: int) -> list[Layer]:
    return [
        ("qkv", 3 * hidden, hidden),
        ("attn_out", hidden, hidden),
        ("fc", 4 * hidden, hidden),
        ("proj", hidden, 4 * hidden),
    ]


def _llama(hidden: int, kv: int, intermediate: int, tp: int = 1) -> list[Layer]:
    """A Llama-style decoder block (grouped-query attention, gated MLP). With ``tp`` > 1: one
    rank's slice (column-parallel layers split N, row-parallel ones split K)."""
    return [
        ("q", hidden // tp, hidden),
        ("kv", kv // tp, hidden),
        ("o", hidden, hidden // tp),
        ("gate_up", intermediate // tp, hidden),
        ("down", hidden, intermediate // tp),
    ]


MODEL_LAYERS: dict[str, list[Layer]] = {
    "gpt2-small": _gpt(768),
    "gpt2-medium": _gpt(1024),
    # cutlass_nn.bench --what models: Llama-style at hidden 1024 (4 kv heads of 64) and 4096
    "bench-llama-1k": _llama(1024, 256, 2816),
    "bench-llama-4k": _llama(4096, 1024, 11008),
    "bench-gpt-4k": _gpt(4096),
    "llama-3-8b": _llama(4096, 1024, 14336),  # Mistral-7B has the same linear shapes
    "qwen2-7b": _llama(3584, 512, 18944),
    "llama-3-70b-tp8": _llama(8192, 1024, 28672, tp=8),
}

# Tokens per step (batch x sequence) of the default set, and of the sweep's smaller set.
TOKENS: tuple[int, ...] = (512, 4096, 16384)
SWEEP_TOKENS: tuple[int, ...] = (4096,)


def layer_shapes(families: Iterable[str] | None = None) -> list[tuple[int, int]]:
    """The distinct (N, K) of the families' linear layers (all families by default), in order."""
    names = list(MODEL_LAYERS) if families is None else list(families)
    unknown = [f for f in names if f not in MODEL_LAYERS]
    if unknown:
        raise ValueError(
            f"unknown model family {unknown[0]!r}; known: {', '.join(MODEL_LAYERS)}"
        )
    pairs = [(n, k) for f in names for _, n, k in MODEL_LAYERS[f]]
    return list(dict.fromkeys(pairs))


def transformer_shapes(
    tokens: Sequence[int] = TOKENS, families: Iterable[str] | None = None
) -> list[tuple[int, int, int]]:
    """(M = tokens, N, K) of every distinct layer of the families at every token count, grouped
    by token count."""
    if not tokens or any(int(t) <= 0 for t in tokens):
        raise ValueError(f"token counts must be positive, got {list(tokens)}")
    pairs = layer_shapes(families)
    return [(int(t), n, k) for t in tokens for n, k in pairs]


def parse_shape_set(text: str) -> list[tuple[int, int, int]]:
    """``transformer`` (the default token counts) or ``transformer:T1/T2/...`` (those token
    counts); ValueError otherwise."""
    name, _, rest = text.partition(":")
    if name != "transformer":
        raise ValueError(f"unknown shape set {text!r}; expected 'transformer[:T1/T2/...]'")
    if not rest:
        return transformer_shapes()
    try:
        tokens = [int(t) for t in rest.split("/") if t.strip()]
    except ValueError:
        raise ValueError(
            f"token counts of {text!r} must be integers separated by '/'"
        ) from None
    return transformer_shapes(tokens)
