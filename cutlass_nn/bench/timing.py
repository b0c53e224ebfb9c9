"""Timing: interleaved CUDA-event repetitions, eager latency, device peaks."""

from __future__ import annotations

import copy
import gc
import itertools
import time
from collections.abc import Callable
from typing import Any

import torch

from cutlass_nn.bench.spec import EAGER_CALLS, Settings


Timer = Callable[[dict[str, Callable[[int], Any]], int], dict[str, list[float]]]


class CudaTimer:
    """Times functions against each other with CUDA events, interleaved (see the module doc).

    ``timer(fns, n_sets)`` returns ``{name: [milliseconds of each repetition]}``.
    """

    def __init__(self, settings: Settings):
        self.settings = settings
        self.cycles_per_ms = self._calibrate_sleep()

    def with_settings(self, settings: Settings) -> CudaTimer:
        """The same timer (sleep calibration included) with other settings."""
        other = copy.copy(self)
        other.settings = settings
        return other

    @staticmethod
    def _calibrate_sleep() -> float | None:
        """GPU clock cycles per millisecond of ``torch.cuda._sleep`` (None: not available; the
        repetitions then run without the head start, and small kernels include launch latency)."""
        try:
            torch.cuda._sleep(1000)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.cuda._sleep(2_000_000)
            end.record()
            end.synchronize()
            ms = start.elapsed_time(end)
            return 2_000_000 / ms if ms > 0 else None
        except Exception:  # a private API: never let it stop the benchmark
            return None

    def _sleep_cycles(self, host_ms: float) -> int:
        """A head start of 1.5x the host time of one repetition (+ 20 us), at most 50 ms."""
        if not self.cycles_per_ms:
            return 0
        return int(min(1.5 * host_ms + 0.02, 50.0) * self.cycles_per_ms)

    @staticmethod
    def _repetition(order, call, sleep_cycles: int) -> dict[str, float]:
        torch.cuda.synchronize()  # barrier: nothing of the previous repetition is still running
        if sleep_cycles:
            torch.cuda._sleep(sleep_cycles)  # keeps the GPU busy while the host queues the rest
        events = []
        for name in order:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            call(name)
            end.record()
            events.append((name, start, end))
        events[-1][2].synchronize()
        return {name: start.elapsed_time(end) for name, start, end in events}

    def __call__(self, fns: dict[str, Callable[[int], Any]], n_sets: int) -> dict[str, list[float]]:
        s = self.settings
        names = list(fns)
        counter = itertools.count()  # one counter for all sides: consecutive calls use other sets

        def call(name: str) -> None:
            fns[name](next(counter) % n_sets)

        host_ms = dict.fromkeys(names, 0.0)
        for _ in range(max(s.warmup, 1)):
            for name in names:
                t0 = time.perf_counter()
                call(name)
                host_ms[name] = (time.perf_counter() - t0) * 1e3  # the last (warm) pass counts
        sleep = self._sleep_cycles(sum(host_ms.values()))
        probe = self._repetition(names, call, sleep)  # one repetition sizes the rest
        per_rep = max(sum(probe.values()), 1e-3)
        reps = int(min(max(s.budget_ms / per_rep, s.min_reps), s.max_reps))
        if per_rep * reps > s.row_cap_ms:  # a very slow row: fewer repetitions, never below 3
            reps = max(3, int(s.row_cap_ms / per_rep))
        times: dict[str, list[float]] = {name: [] for name in names}
        for r in range(reps):
            order = names if r % 2 == 0 else names[::-1]  # alternate which side goes first
            for name, ms in self._repetition(order, call, sleep).items():
                times[name].append(ms)
        return times

    def eager(
        self, fns: dict[str, Callable[[int], Any]], n_sets: int, calls: int = EAGER_CALLS
    ) -> dict[str, list[float]]:
        """What an eager user waits for: per side, ``calls`` times ``synchronize, event, one
        call, event`` (the GPU idles while the host enqueues the call, so host cost shows),
        sides alternating; ``{name: [milliseconds of each call]}``."""
        names = list(fns)
        counter = itertools.count()
        out: dict[str, list[float]] = {name: [] for name in names}
        for r in range(calls):
            for name in names if r % 2 == 0 else names[::-1]:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize()
                start.record()
                fns[name](next(counter) % n_sets)
                end.record()
                end.synchronize()
                out[name].append(start.elapsed_time(end))
        return out


def release_memory() -> None:
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
