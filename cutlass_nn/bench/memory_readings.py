"""The allocator readings of the model benchmark (:mod:`cutlass_nn.bench.models`): a side's
memory now (after a garbage collection, with torch's cuBLAS workspaces present), the peaks since
the last reset, and the largest rise of a block's peaks over its start. On a CPU device the
readings are zero (CUDA's allocator counts only CUDA memory)."""

from __future__ import annotations

import gc
from typing import Any

import torch


def memory_now(device) -> tuple[int, int]:
    """(allocated, requested) memory, read after freeing cyclic garbage (else a later side is
    credited it): the allocator's blocks, and the bytes their tensors asked for. The two differ
    by the allocator's rounding (a free block up to 1 MiB larger than asked is handed out whole),
    which depends on what happened to be free, not on what a side keeps; every block is also
    rounded up to a multiple of 512 bytes."""
    gc.collect()
    return memory_with_workspaces(device)


def memory_with_workspaces(device) -> tuple[int, int]:
    """(allocated, requested) memory with torch's per-thread cuBLAS workspaces present (charged
    to no side)."""
    if torch.device(device).type != "cuda":
        return 0, 0
    a = torch.ones(16, 16, device=device, dtype=torch.bfloat16, requires_grad=True)
    torch.addmm(a[0], a, a).sum().backward(), torch.cuda.synchronize(device)
    stats = torch.cuda.memory_stats(device)
    return stats.get("allocated_bytes.all.current", 0), stats.get("requested_bytes.all.current", 0)


def peak_since_reset(device) -> tuple[int, int]:
    """(allocated, requested) peaks since the last ``reset_peak_memory_stats``."""
    stats = torch.cuda.memory_stats(device)
    return stats.get("allocated_bytes.all.peak", 0), stats.get("requested_bytes.all.peak", 0)


def raise_transient(rec: dict[str, Any], peak: tuple[int, int], start: tuple[int, int]) -> None:
    """Keeps in ``rec`` the largest rise of the (allocated, requested) peaks of a block over
    their readings at its start."""
    rec["transient_bytes"] = max(rec["transient_bytes"], peak[0] - start[0])
    rec["transient_requested_bytes"] = max(rec["transient_requested_bytes"], peak[1] - start[1])
