"""Argument types of the benchmark's command line (``cli``): each parses one option's text and
raises ``argparse.ArgumentTypeError`` naming what it expected and what it got."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence

from cutlass_nn import transformer_shapes


def csv_choices(choices: Sequence[str]) -> Callable[[str], list[str]]:
    """An argument type for comma-separated items, each one of ``choices`` (at least one)."""

    def parse(text: str) -> list[str]:
        items = [t.strip() for t in text.split(",") if t.strip()]
        bad = [t for t in items if t not in choices]
        if bad or not items:
            raise argparse.ArgumentTypeError(f"choose from {','.join(choices)} (got {text!r})")
        return items

    return parse


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    """``--sweep-shapes`` / ``--shapes``: comma-separated MxNxK labels, e.g.
    "128x8192x8192,16x8192x8192", or a named set: "transformer" (every layer of the model families
    of cutlass_nn/transformer_shapes.py at its default token counts) or "transformer:T1/T2/..."
    (at those token counts)."""
    if text.strip().startswith("transformer"):
        try:
            return transformer_shapes.parse_shape_set(text.strip())
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    shapes = []
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        parts = item.lower().split("x")
        if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise argparse.ArgumentTypeError(f"expected MxNxK with positive sizes, got {item!r}")
        shapes.append((int(parts[0]), int(parts[1]), int(parts[2])))
    if not shapes:
        raise argparse.ArgumentTypeError(f"no shape in {text!r}")
    return list(dict.fromkeys(shapes))


def parse_swizzles(text: str) -> list[int]:
    """``--sweep-swizzles``: comma-separated non-negative integers (0 = the rule's choice)."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items or not all(t.isdigit() for t in items):
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 0, got {text!r}")
    return list(dict.fromkeys(int(t) for t in items))


def parse_splits(text: str) -> list[int]:
    """``--sweep-splits``: comma-separated integers (0 = the rule's choice, 1 = no split, s > 1 =
    the stream-K scheduler's split-K into s pieces, s <= -2 = batched split-K into -s slices)."""
    items = [t.strip() for t in text.split(",")]
    if not items or not all(t.lstrip("-").isdigit() and t.count("-") <= 1 for t in items):
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")
    values = list(dict.fromkeys(int(t) for t in items))
    if any(v == -1 or v < -64 or v > 64 for v in values):
        raise argparse.ArgumentTypeError(
            f"expected splits 0..64 or -64..-2 (batched split-K), got {text!r}")
    return values


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value
