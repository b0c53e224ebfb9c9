"""Where a side's persistent memory comes from (``--what models --memory-trace``): the CUDA
allocator's blocks that a side leaves alive after its build and warm-up, grouped by the Python
stack that allocated them.

The model benchmark charges each side the memory it keeps after its warm-up. A block of about
1 MiB has moved between the sides from row to row (NOTES, sessions 24-26: +1048064 bytes on the
converted side of some rows, -1049088 on others), too small to matter and too regular to be
noise; this module names its allocation site. While the sides of a row are built and warmed up
(never while they are timed), the allocator keeps the Python stack of every live block
(:func:`recording`: ``torch.cuda.memory._record_memory_history(enabled="state")``, no event
trace); a snapshot before and after each side gives the blocks it kept (alive after, not before)
and those it freed, summed by the site that allocated them. A block allocated before the
recording began (before the row) has no stack: "(no stack)". CUDA only; the pure helpers
(:func:`live_blocks`, :func:`origin`, :func:`compare`, :func:`format_difference`) work on any
snapshot-shaped dict.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import contextlib
from collections.abc import Iterator

import torch

#: Frames of these files say nothing about who asked for the memory.
_SKIPPED_FILES = ("memory_trace.py", "/torch/utils/", "/torch/_tensor.py", "contextlib.py")
#: Innermost Python frames kept in an origin.
ORIGIN_DEPTH = 4
#: Origins printed per row, largest difference first.
SHOWN = 8


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


def live_blocks(snapshot: dict[str, Any]) -> set[tuple[int, int, int, str]]:
    """Every allocated block of a ``torch.cuda.memory._snapshot()`` as (address, size,
    requested size, origin): a block freed and allocated again at the same place by another site
    counts as two. A block's address is its own where the snapshot gives it, else its segment's
    plus the sizes of the blocks before it. The requested size is what the tensor asked for (the
    snapshot's ``requested_size``; the block's size where it has none): the allocator hands out
    a free block up to 1 MiB larger than asked without splitting it, so equal tensors can sit in
    blocks of different sizes, depending on what was free at the time."""
    out: set[tuple[int, int, int, str]] = set()
    for seg in snapshot.get("segments", []):
        address = int(seg["address"])
        for b in seg.get("blocks", []):
            address = int(b.get("address", address))
            if b.get("state") == "active_allocated":
                size = int(b["size"])
                requested = int(b.get("requested_size", size))
                out.add((address, size, requested, origin(b.get("frames", []))))
            address += int(b["size"])
    return out


def _by_origin(blocks: set[tuple[int, int, int, str]]) -> list[dict[str, Any]]:
    sums: dict[str, list[int]] = {}
    for _, size, requested, where in blocks:
        entry = sums.setdefault(where, [0, 0, 0])
        entry[0] += size
        entry[1] += requested
        entry[2] += 1
    rows = [{"origin": k, "bytes": v[0], "requested_bytes": v[1], "blocks": v[2]}
            for k, v in sums.items()]
    return sorted(rows, key=lambda r: (-r["bytes"], r["origin"]))


def compare(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The blocks alive in ``after`` but not in ``before`` (``kept``) and the reverse
    (``freed``), each summed by origin (every origin, largest first; block sizes and requested
    sizes), with their totals."""
    b, a = live_blocks(before), live_blocks(after)
    kept, freed = a - b, b - a
    return {
        "kept_bytes": sum(size for _, size, _, _ in kept),
        "kept_requested_bytes": sum(req for _, _, req, _ in kept),
        "freed_bytes": sum(size for _, size, _, _ in freed),
        "freed_requested_bytes": sum(req for _, _, req, _ in freed),
        "kept": _by_origin(kept),
        "freed": _by_origin(freed),
    }


@contextlib.contextmanager
def recording(device) -> Iterator[None]:
    """Keeps the Python stack of every live CUDA block while inside (on CUDA; else nothing), and
    turns the recording off on the way out, also when the body raises."""
    if torch.device(device).type != "cuda":
        yield
        return
    torch.cuda.memory._record_memory_history(enabled="state", stacks="python")
    try:
        yield
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)


class SideMemoryTrace:
    """A snapshot at construction and one at :meth:`finish`, which returns their
    :func:`compare` (None off CUDA). Stacks are there only inside :func:`recording`."""

    def __init__(self, device) -> None:
        self.cuda = torch.device(device).type == "cuda"
        self.before = torch.cuda.memory._snapshot() if self.cuda else None

    def finish(self) -> dict[str, Any] | None:
        if not self.cuda:
            return None
        return compare(self.before or {}, torch.cuda.memory._snapshot())


def format_difference(sides: dict[str, dict[str, Any] | None], limit: int = SHOWN) -> list[str]:
    """Lines naming the origins whose kept bytes (block sizes) or kept requested bytes differ
    between the sides' traces (a side's freed bytes count negative), largest difference first,
    ``limit`` of them (the difference is taken over every origin, not only the largest); each
    line gives both: equal requested bytes in blocks of different sizes is the allocator's
    rounding, not a tensor more."""
    traces = {k: v for k, v in sides.items() if v}
    if len(traces) < 2:
        return []
    names = list(traces)
    net: dict[str, dict[str, list[int]]] = {}
    for side, t in traces.items():
        for sign, key in ((1, "kept"), (-1, "freed")):
            for r in t[key]:
                entry = net.setdefault(r["origin"], {n: [0, 0] for n in names})[side]
                entry[0] += sign * r["bytes"]
                entry[1] += sign * r.get("requested_bytes", r["bytes"])

    def spread(v: dict[str, list[int]], i: int) -> int:
        return max(x[i] for x in v.values()) - min(x[i] for x in v.values())

    differing = [(o, v) for o, v in net.items() if spread(v, 0) or spread(v, 1)]
    differing.sort(key=lambda ov: (-spread(ov[1], 0), -spread(ov[1], 1)))
    return [
        "  " + " / ".join(f"{v[n][0]:+d}" for n in names) + " bytes, requested "
        + " / ".join(f"{v[n][1]:+d}" for n in names) + f" ({' / '.join(names)}): {o}"
        for o, v in differing[:limit]
    ]
