"""The correctness gate: float64 reference of a sampled output submatrix."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor


def rel_err(x: Tensor, ref64: Tensor) -> float:
    """``||x - ref|| / ||ref||`` in float64 (the absolute error when ``ref`` is zero)."""
    if ref64.numel() == 0:
        return 0.0
    diff = torch.linalg.vector_norm(x.detach().double() - ref64).item()
    denom = torch.linalg.vector_norm(ref64).item()
    return diff / denom if denom > 0 else diff


def sample_index(n: int, count: int, gen: torch.Generator, device) -> Tensor:
    """``count`` sorted distinct random indices in [0, n) (all of them when n <= count)."""
    if n <= count:
        return torch.arange(n, device=device)
    return torch.randperm(n, generator=gen)[:count].sort().values.to(device)


def take(t: Tensor, rows: Tensor | None, cols: Tensor) -> Tensor:
    """The sampled part of an output: ``t[rows][:, cols]`` (``t[cols]`` for a 1-D ``t``)."""
    if t.dim() == 1:
        return t.index_select(0, cols)
    return t.index_select(0, rows).index_select(1, cols)


def sampled_mm(a: Tensor, b: Tensor, rows: Tensor, cols: Tensor) -> Tensor:
    """``(a @ b)[rows][:, cols]`` computed in float64 from the (already rounded) inputs."""
    return a.detach().index_select(0, rows).double() @ b.detach().index_select(1, cols).double()


def compare_outputs(items: dict[str, tuple], floor: float) -> dict[str, Any]:
    """The accuracy rule for each named output ``(ours, base, ref64, rows, cols)``: ours is
    finite everywhere, has base's shape and dtype, and ``err(ours) <= 2 * err(base) + floor``
    on the sampled elements, errors being relative to the float64 reference ``ref64``."""
    outputs, parts, ok_all = {}, [], True
    for name, (ours, base, ref64, rows, cols) in items.items():
        ours, base = ours.detach(), base.detach()
        meta_ok = ours.shape == base.shape and ours.dtype == base.dtype
        nonfinite = int((~torch.isfinite(ours)).sum()) if meta_ok else -1
        ours_s, base_s = (
            (take(ours, rows, cols), take(base, rows, cols)) if meta_ok else (None, None)
        )
        e_ours = rel_err(ours_s, ref64) if meta_ok else math.nan
        e_base = rel_err(base_s, ref64) if meta_ok else math.nan
        bound = 2 * e_base + floor
        ok = meta_ok and nonfinite == 0 and e_ours <= bound  # False for NaN errors too
        ok_all &= ok
        outputs[name] = {
            "ok": ok,
            "err_ours": e_ours,
            "err_torch": e_base,
            "err_ours_vs_torch": rel_err(ours_s, base_s.double()) if meta_ok else math.nan,
            "bound": bound,
            "nonfinite": nonfinite,
            "shape_dtype_ok": meta_ok,
        }
        if not meta_ok:
            parts.append(
                f"{name}: got {tuple(ours.shape)} {ours.dtype}, "
                f"torch {tuple(base.shape)} {base.dtype}"
            )
        elif nonfinite:
            parts.append(f"{name}: {nonfinite} non-finite element(s)")
        else:
            parts.append(f"{name}: err {e_ours:.2e} ({'<=' if ok else '>'} bound {bound:.2e})")
    return {"ok": ok_all, "floor": floor, "outputs": outputs, "summary": "; ".join(parts)}


def poison(numels: Sequence[int], dtype: torch.dtype, device) -> None:
    """Frees NaN-filled blocks of these sizes so that the caching allocator likely hands them to
    the next outputs: an element the kernel never writes then reads as NaN. CUDA only."""
    if torch.device(device).type != "cuda":
        return
    blocks = [torch.full((max(n, 1),), math.nan, dtype=dtype, device=device) for n in numels]
    del blocks
