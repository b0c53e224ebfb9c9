"""Where a side's persistent memory comes from (``--what models --memory-trace``): the CUDA
allocator's blocks that a side leaves alive after its build and warm-up, grouped by the Python
stack that allocated them.

The model benchmark charges each side the memory it keeps after its warm-up. A block of about
1 MiB has moved between the sides from row to row (NOTES, sessions 24-26: +1048064 bytes on the
converted side of some rows, -1049088 on others), too small to matter and too regular to be
noise; this module names its allocation site. It records the allocator's history while a side is
built and warmed up (``torch.cuda.memory._record_memory_history`` with Python stacks), takes a
snapshot before and after, and reports the blocks alive after that were not alive before, and
those freed, summed by origin. CUDA only; pure helpers (:func:`live_blocks`, :func:`origin`,
:func:`compare`) work on any snapshot-shaped dict.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

#: Frames of these files say nothing about who asked for the memory.
_SKIPPED_FILES = ("memory_trace.py", "/torch/utils/", "/torch/_tensor.py", "contextlib.py")
#: Innermost Python frames kept in an origin.
ORIGIN_DEPTH = 4
#: Origins kept per side and kind (kept / freed), largest first.
TOP = 40


def origin(frames: Sequence[dict[str, Any]], depth: int = ORIGIN_DEPTH) -> str:
    """The allocation site: the innermost ``depth`` Python frames (``file:line:function``, the
    file's last two path parts), innermost first, joined by " < "; "(no stack)" when the block
    was allocated while no history was being recorded."""
    kept = []
    for f in frames:
        name = str(f.get("filename", ""))
        if any(s in name for s in _SKIPPED_FILES) or not name.endswith(".py"):
            continue
        short = "/".join(name.split("/")[-2:])
        kept.append(f"{short}:{f.get('line', '?')}:{f.get('name', '?')}")
        if len(kept) == depth:
            break
    return " < ".join(kept) if kept else "(no stack)"


def live_blocks(snapshot: dict[str, Any]) -> dict[tuple[int, int], str]:
    """Every allocated block of a ``torch.cuda.memory._snapshot()``: (address, size) -> origin.
    A block's address is its segment's plus the sizes of the blocks before it."""
    out: dict[tuple[int, int], str] = {}
    for seg in snapshot.get("segments", []):
        address = int(seg["address"])
        for b in seg.get("blocks", []):
            if b.get("state") == "active_allocated":
                out[(address, int(b["size"]))] = origin(b.get("frames", []))
            address += int(b["size"])
    return out


def _by_origin(blocks: dict[tuple[int, int], str], top: int) -> list[dict[str, Any]]:
    sums: dict[str, list[int]] = {}
    for (_, size), where in blocks.items():
        entry = sums.setdefault(where, [0, 0])
        entry[0] += size
        entry[1] += 1
    rows = [{"origin": k, "bytes": v[0], "blocks": v[1]} for k, v in sums.items()]
    return sorted(rows, key=lambda r: (-r["bytes"], r["origin"]))[:top]


def compare(before: dict[str, Any], after: dict[str, Any], top: int = TOP) -> dict[str, Any]:
    """The blocks alive in ``after`` but not in ``before`` (``kept``) and the reverse
    (``freed``), each summed by origin (largest first, ``top`` of them), with their totals."""
    b, a = live_blocks(before), live_blocks(after)
    kept = {k: v for k, v in a.items() if k not in b}
    freed = {k: v for k, v in b.items() if k not in a}
    return {
        "kept_bytes": sum(size for _, size in kept),
        "freed_bytes": sum(size for _, size in freed),
        "kept": _by_origin(kept, top),
        "freed": _by_origin(freed, top),
    }


class SideMemoryTrace:
    """Records the allocator's history from construction until :meth:`finish`, which returns
    :func:`compare` of the snapshots at both ends (None off CUDA)."""

    def __init__(self, device) -> None:
        self.cuda = torch.device(device).type == "cuda"
        self.before: dict[str, Any] | None = None
        if self.cuda:
            torch.cuda.memory._record_memory_history(max_entries=200_000, stacks="python")
            self.before = torch.cuda.memory._snapshot()

    def finish(self) -> dict[str, Any] | None:
        if not self.cuda:
            return None
        after = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        return compare(self.before or {}, after)


def format_difference(sides: dict[str, dict[str, Any] | None], limit: int = 8) -> list[str]:
    """Lines naming the origins whose kept bytes differ between the sides' traces (a side's
    freed bytes count negative), largest difference first."""
    traces = {k: v for k, v in sides.items() if v}
    if len(traces) < 2:
        return []
    names = list(traces)
    net: dict[str, dict[str, int]] = {}
    for side, t in traces.items():
        for sign, key in ((1, "kept"), (-1, "freed")):
            for r in t[key]:
                net.setdefault(r["origin"], {n: 0 for n in names})[side] += sign * r["bytes"]
    differing = [(o, v) for o, v in net.items() if len(set(v.values())) > 1]
    differing.sort(key=lambda ov: -(max(ov[1].values()) - min(ov[1].values())))
    return [
        "  " + " / ".join(f"{v[n]:+d}" for n in names) + f" bytes ({' / '.join(names)}): {o}"
        for o, v in differing[:limit]
    ]
