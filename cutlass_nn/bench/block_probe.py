"""What else ran inside one timed block of training steps (``--what models``): Python's garbage
collections (automatic ones and any ``gc.collect()`` a step calls: how many, of which
generation, and their wall time) and ``torch._dynamo`` frame compilations. A host-bound block
that takes several times its neighbours' time is then attributable, or not, to a collection or
a recompilation that landed in it, on whichever side (NOTES, twenty-sixth session: single blocks
up to 3x slower than the rest of their row). Also the blocks' schedule the timing harnesses
share (:func:`alternating_blocks`) and the frozen heap they are timed on (:func:`frozen_heap`).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any


def alternating_blocks(names: Sequence[str], steps: int, block: int) -> Iterator[tuple[str, int, int]]:
    """The timed blocks of the sides ``names``, ``steps`` steps each: (side, index of the block's
    first step, steps in it) in the order they run -- rounds of one block per side, the side that
    goes first alternating from round to round, so that the host's drift reaches all alike."""
    done, rounds = 0, 0
    while done < steps:
        n = min(block, steps - done)
        for side in names if rounds % 2 == 0 else list(names)[::-1]:
            yield side, done, n
        done += n
        rounds += 1


@contextmanager
def frozen_heap() -> Iterator[None]:
    """Everything allocated so far (the sides' models, optimizers, Dynamo's and Inductor's
    caches) frozen after one collection, so that collections inside the timed blocks traverse
    only what the steps made since; unfrozen afterwards, so that the sides can be freed."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _dynamo_frames_compiled() -> int:
    """Frames ``torch._dynamo`` has compiled so far in this process (0 where it is absent)."""
    try:
        from torch._dynamo.utils import counters
    except Exception:  # noqa: BLE001 - a torch without dynamo: nothing compiles
        return 0
    return int(counters["frames"]["total"])  # every frame dynamo converted, ok or not


class BlockProbe:
    """Context manager around one block: counts the garbage collections that run inside it (by
    generation, with their total wall time, through ``gc.callbacks``) and the dynamo frames
    compiled during it. Read :meth:`summary` after the block."""

    def __init__(self) -> None:
        self.collections = [0, 0, 0]
        self.gc_ms = 0.0
        self.compiles = 0
        self._gc_start: float | None = None
        self._frames0 = 0

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_start = time.perf_counter()
        elif self._gc_start is not None:
            self.gc_ms += (time.perf_counter() - self._gc_start) * 1e3
            self.collections[min(int(info.get("generation", 0)), 2)] += 1
            self._gc_start = None

    def __enter__(self) -> BlockProbe:
        self._frames0 = _dynamo_frames_compiled()
        gc.callbacks.append(self._on_gc)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._on_gc)
        self.compiles = _dynamo_frames_compiled() - self._frames0

    def summary(self) -> dict[str, Any]:
        """``gc_ms``: wall time in collections; ``gc_collections``: per generation 0 / 1 / 2;
        ``compiles``: dynamo frames compiled inside the block."""
        return {"gc_ms": self.gc_ms, "gc_collections": list(self.collections),
                "compiles": self.compiles}
