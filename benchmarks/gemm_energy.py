"""Energy per GEMM, ours against cuBLAS: whether our kernels lose under the GPU's power limit.

Inside a training step our 16-bit GEMMs run 1-4% behind cuBLAS at the same tile shapes, more
than in isolated timings with idle gaps between launches (benchmarks/NOTES.md, sessions 31 and
35), and back-to-back launches of the large shapes hold the H200 at its power limit with the SM
clock at 1350-1500 MHz. Under a power limit a kernel's speed is set by its energy per GEMM: a
kernel that draws more joules per product is clocked down further. This script measures that
directly. For each problem it runs blocks of back-to-back launches, alternating between
``F.linear`` (cuBLAS) and ``cutlass_nn.ops.linear`` (the rule's kernel), while a thread polls the
GPU's energy counter (NVML, ``nvmlDeviceGetTotalEnergyConsumption``) and its SM clock every
2 ms. The counter moves in steps of about 0.1 s (61-71 J at 690 W on an H200), so a block's power
is taken between the counter's first and last change inside it, never from the block's ends
(read at arbitrary moments, a 1 s block is off by up to one step: benchmarks/NOTES.md,
thirty-eighth session), and its energy per GEMM is that power times its time per GEMM. At the
power limit both sides run at the same power and energy follows time; the SM clock then says
which side the cap slows down.

Usage::

    python benchmarks/gemm_energy.py [--shapes 4096x4096x4096,...] [--block-s 3.0]
        [--rounds 3] [--sets 4] [--config C[:SWIZZLE]] [--out DIR]

A shape is ``TxNxK``: ``T`` tokens, an ``N x K`` weight (the forward of a linear layer, "tn").
Operands rotate over copies that together cover at least twice the L2 (``--sets`` is the
least number) so that a launch does not find the previous one's operands in L2. Per problem and
side: the median over rounds of microseconds per GEMM (wall time of the block over its launches),
watts, millijoules per GEMM and the median SM clock; the ratios are ours / cuBLAS (time > 1: ours
slower; energy > 1: ours draws more). A block is flagged ``host_bound`` when the GPU's queue
held fewer than 50 launches at its end (the host, not the GPU, set its pace: its time is host
cost per call and its energy includes idle power), and ``over_limit`` when its power exceeds the
enforced limit by more than 2% (a reading to distrust). ``--config C`` forces tile
configuration C with the scheduler's default order on our side, ``C:S`` with swizzle S
(``torch.ops.cutlass_nn._set_gemm_config``; the rule's choice otherwise). JSON to
``--out`` with the device, versions, date and command. Needs a CUDA GPU and NVML
(``libnvidia-ml.so.1``, part of the driver).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Sequence

import torch
import torch.nn.functional as F

import cutlass_nn
from cutlass_nn.bench import cli as bench_cli

DEFAULT_SHAPES = "4096x4096x4096,4096x11008x4096,4096x4096x11008,4096x32000x4096,4096x2816x1024"
NVML_CLOCK_SM = 1


class Nvml:
    """The few NVML calls this script needs, through ctypes (no Python package required)."""

    def __init__(self, cuda_index: int = 0):
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        self._check(self.lib.nvmlInit_v2(), "nvmlInit_v2")
        self.handle = ctypes.c_void_p()
        props = torch.cuda.get_device_properties(cuda_index)
        bus = getattr(props, "pci_bus_id", None)
        domain = getattr(props, "pci_domain_id", 0)
        device = getattr(props, "pci_device_id", 0)
        if bus is not None:
            pci = f"{domain:08x}:{bus:02x}:{device:02x}.0".encode()
            rc = self.lib.nvmlDeviceGetHandleByPciBusId_v2(pci, ctypes.byref(self.handle))
            if rc == 0:
                return
        if self._handle_by_uuid(props):
            return
        if torch.cuda.device_count() != 1 or os.environ.get("CUDA_VISIBLE_DEVICES"):
            raise RuntimeError("gemm_energy: cannot match the CUDA device to an NVML device "
                               "(no PCI bus id or UUID match; several or masked GPUs)")
        self._check(self.lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(self.handle)),
                    "nvmlDeviceGetHandleByIndex_v2")

    @staticmethod
    def _check(rc: int, what: str) -> None:
        if rc != 0:
            raise RuntimeError(f"gemm_energy: NVML {what} returned {rc}")

    def energy_mj(self) -> int:
        """Energy the GPU used since the driver loaded, in millijoules."""
        value = ctypes.c_ulonglong()
        self._check(self.lib.nvmlDeviceGetTotalEnergyConsumption(self.handle, ctypes.byref(value)),
                    "nvmlDeviceGetTotalEnergyConsumption")
        return int(value.value)

    def _handle_by_uuid(self, props) -> bool:
        uuid = getattr(props, "uuid", None)
        if uuid is None:
            return False
        text = str(uuid)
        text = text if text.startswith("GPU-") else "GPU-" + text
        return self.lib.nvmlDeviceGetHandleByUUID(text.encode(), ctypes.byref(self.handle)) == 0

    def sm_clock_mhz(self) -> int:
        value = ctypes.c_uint()
        self._check(self.lib.nvmlDeviceGetClockInfo(self.handle, NVML_CLOCK_SM, ctypes.byref(value)),
                    "nvmlDeviceGetClockInfo")
        return int(value.value)

    def power_limit_w(self) -> float:
        value = ctypes.c_uint()
        self._check(self.lib.nvmlDeviceGetEnforcedPowerLimit(self.handle, ctypes.byref(value)),
                    "nvmlDeviceGetEnforcedPowerLimit")
        return value.value / 1000.0


def parse_config(text: str | None) -> tuple[int, int] | None:
    """``14`` -> (14, 1) (the scheduler's default order, also where 14 is the rule's own choice
    with another swizzle), ``14:2`` -> (14, 2); None stays None; a ValueError names bad text."""
    if text is None:
        return None
    head, sep, tail = text.partition(":")
    if not head.isdigit() or (sep and not tail.isdigit()) or not 1 <= int(tail or 1) <= 8:
        raise ValueError(f"--config: {text!r} is not C or C:SWIZZLE (swizzle 1..8)")
    return int(head), int(tail or 1)


class CounterPoller:
    """Polls the energy counter and the SM clock every ``period_s`` on a thread while entered;
    keeps each change of the counter (when, mJ) and every clock reading."""

    def __init__(self, nvml: Nvml, period_s: float = 0.002):
        self.nvml, self.period_s = nvml, period_s
        self.changes: list[tuple[float, int]] = []
        self.clocks: list[int] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()

    def _run(self) -> None:
        last = None
        try:
            while not self._stop.is_set():
                mj = self.nvml.energy_mj()
                if mj != last:
                    self.changes.append((time.perf_counter(), mj))
                    last = mj
                self.clocks.append(self.nvml.sm_clock_mhz())
                self._stop.wait(self.period_s)
        except BaseException as exc:  # re-raised by __exit__: a failed read must not pass silently
            self.error = exc

    def __enter__(self) -> CounterPoller:
        # The poll timestamps each reading only when it holds the GIL: a short switch interval
        # keeps its readings near 2 ms apart while the main thread enqueues launches.
        self._switch = sys.getswitchinterval()
        sys.setswitchinterval(1e-4)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        sys.setswitchinterval(self._switch)
        if self.error is not None and exc[0] is None:
            raise RuntimeError(f"gemm_energy: reading NVML failed: {self.error}") from self.error


def power_between_changes(changes: Sequence[tuple[float, int]]) -> float:
    """Watts between the counter's first change after the poll began and its last change: whole
    steps only (the first entry is the value the poll found, not a change). NaN with fewer than
    two such changes."""
    steps = list(changes[1:])
    if len(steps) < 2 or steps[-1][0] <= steps[0][0]:
        return float("nan")
    return (steps[-1][1] - steps[0][1]) / 1e3 / (steps[-1][0] - steps[0][0])


#: A block whose queue held fewer launches than this at its end was paced by the host.
MIN_QUEUED = 50


def run_block(nvml: Nvml, launch: Callable[[int], object], block_s: float,
              limit_w: float = float("inf")) -> dict[str, float]:
    """Back-to-back launches for about ``block_s`` seconds: us per GEMM, watts (between the
    counter's changes), mJ per GEMM (watts times us), median SM clock, and the flags."""
    torch.cuda.synchronize()
    n = 0
    with CounterPoller(nvml) as poll:
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < block_s:
            for _ in range(8):
                launch(n)
                n += 1
        t_enqueued = time.perf_counter()
        torch.cuda.synchronize()
        t1 = time.perf_counter()
    us = (t1 - t0) / n * 1e6
    watts = power_between_changes(poll.changes)
    clocks = [c for c in poll.clocks if c > 0]
    return {"gemms": n, "us_per_gemm": us, "watts": watts, "mj_per_gemm": watts * us / 1e3,
            "sm_mhz": statistics.median(clocks) if clocks else float("nan"),
            "counter_steps": max(len(poll.changes) - 1, 0),
            "queued_at_end": (t1 - t_enqueued) / us * 1e6,
            "host_bound": (t1 - t_enqueued) / us * 1e6 < MIN_QUEUED,
            "over_limit": bool(watts > 1.02 * limit_w)}


def _median(values) -> float:
    """Median of the finite values, NaN when there is none."""
    finite = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    return statistics.median(finite) if finite else float("nan")


def _no_nan(value):
    """``value`` with every NaN / infinity replaced by None (JSON has neither)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _no_nan(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_no_nan(v) for v in value]
    return value


#: At most this many operand copies (tiny problems would otherwise ask for many thousands).
MAX_SETS = 256


def operand_sets(shape: tuple[int, int, int], least: int, l2_bytes: int) -> int:
    """Copies of (x, w) that together cover at least twice the L2, and at least ``least``
    (at most :data:`MAX_SETS`, or ``least`` if that is more)."""
    tokens, n, k = shape
    pair = (tokens * k + n * k) * 2
    return max(least, min(MAX_SETS, math.ceil(2 * l2_bytes / pair)))


def measure_shape(nvml: Nvml, shape: tuple[int, int, int], sets: int, rounds: int,
                  block_s: float, limit_w: float = float("inf")) -> dict:
    tokens, n, k = shape
    sets = operand_sets(shape, sets, torch.cuda.get_device_properties(0).L2_cache_size)
    gen = torch.Generator(device="cuda").manual_seed(0)
    xs = [torch.randn(tokens, k, device="cuda", generator=gen).bfloat16() for _ in range(sets)]
    ws = [torch.randn(n, k, device="cuda", generator=gen).bfloat16() for _ in range(sets)]
    sides = {
        "cublas": lambda i: F.linear(xs[i % sets], ws[i % sets]),
        "cutlass_nn": lambda i: cutlass_nn.ops.linear(xs[i % sets], ws[i % sets]),
    }
    ref = F.linear(xs[0].double(), ws[0].double())
    for name, fn in sides.items():
        err = ((fn(0).double() - ref).norm() / ref.norm()).item()
        if not err < 2e-2:
            raise RuntimeError(f"gemm_energy: {name} at {shape} is off by {err:.2e} (relative)")
    kernel = cutlass_nn.ops.last_kernel_name()  # our side ran last
    for fn in sides.values():  # warm-up: the clock's ramp, the allocator
        run_block(nvml, fn, min(block_s / 2, 1.0), limit_w)
    blocks: dict[str, list[dict]] = {name: [] for name in sides}
    for r in range(rounds):
        order = list(sides) if r % 2 == 0 else list(sides)[::-1]
        for name in order:
            blocks[name].append(run_block(nvml, sides[name], block_s, limit_w))
    numeric = ("us_per_gemm", "watts", "mj_per_gemm", "sm_mhz", "counter_steps", "queued_at_end")
    summary = {name: {key: _median(b[key] for b in bl) for key in numeric}
               | {"host_bound": any(b["host_bound"] for b in bl),
                  "over_limit": any(b["over_limit"] for b in bl),
                  "power_readings": sum(math.isfinite(b["watts"]) for b in bl),
                  "blocks": len(bl)}
               for name, bl in blocks.items()}
    ours, base = summary["cutlass_nn"], summary["cublas"]
    return {"shape": list(shape), "sets": sets, "kernel": kernel, "blocks": blocks,
            "median": summary,
            "time_ours_over_cublas": ours["us_per_gemm"] / base["us_per_gemm"],
            "energy_ours_over_cublas": ours["mj_per_gemm"] / base["mj_per_gemm"]}


def flags(row: dict) -> str:
    """`` host-bound: ...`` / `` over the limit: ...`` for the sides whose blocks were."""
    out = ""
    for flag, text in (("host_bound", "host-bound"), ("over_limit", "over the power limit")):
        sides = [name for name, m in row["median"].items() if m[flag]]
        if sides:
            out += f" {text}: {', '.join(sides)}"
    short = [f"{name} {m['power_readings']}/{m['blocks']}" for name, m in row["median"].items()
             if m["power_readings"] < m["blocks"]]
    if short:
        out += f" blocks with a power reading: {', '.join(short)}"
    return out


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="python benchmarks/gemm_energy.py")
    p.add_argument("--shapes", type=bench_cli.parse_shapes, default=DEFAULT_SHAPES,
                   help="comma-separated TxNxK (tokens x out x in), or a named set as in "
                        "python -m cutlass_nn.bench --shapes")
    p.add_argument("--block-s", type=float, default=3.0,
                   help="seconds per timed block (the energy counter moves every ~0.1 s)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--sets", type=int, default=4,
                   help="least number of operand copies the launches rotate over (more where "
                        "they do not cover twice the L2)")
    p.add_argument("--config", default=None,
                   help="force this tile configuration on our side, C or C:SWIZZLE (default: the rule)")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = p.parse_args(list(argv))
    try:
        forced = parse_config(args.config)
    except ValueError as exc:
        p.error(str(exc))
    if args.rounds < 1 or args.sets < 1 or not 0.5 <= args.block_s <= 60:
        p.error("--rounds and --sets must be >= 1, --block-s in [0.5, 60]")
    meta = bench_cli.gpu_run_meta(argv)
    if meta is None:
        return 2
    nvml = Nvml()
    nvml.energy_mj()  # fails here, before any block, where the counter cannot be read
    if forced is not None:
        names = [n for n in torch.ops.cutlass_nn._gemm_configs().splitlines() if n]
        if forced[0] >= len(names):
            p.error(f"--config: {forced[0]} is not below the build's {len(names)} configurations")
        torch.ops.cutlass_nn._set_gemm_config(forced[0], forced[1], 0)
    meta |= {"command": " ".join(["python benchmarks/gemm_energy.py", *argv]),
             "power_limit_w": nvml.power_limit_w(),
             "forced_config": list(forced) if forced is not None else None}
    print(f"gemm_energy: {meta['device']}, power limit {meta['power_limit_w']:.0f} W, "
          f"torch {meta['torch']}")
    print("| T x N x K | cuBLAS us | ours us | time ours/cuBLAS | cuBLAS mJ | ours mJ | "
          "energy ours/cuBLAS | W cuBLAS / ours | SM MHz cuBLAS / ours | our kernel |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    for shape in args.shapes:
        row = measure_shape(nvml, shape, args.sets, args.rounds, args.block_s,
                            meta["power_limit_w"])
        rows.append(row)
        b, o = row["median"]["cublas"], row["median"]["cutlass_nn"]
        print(f"| {'x'.join(map(str, shape))} | {b['us_per_gemm']:.1f} | {o['us_per_gemm']:.1f} | "
              f"{row['time_ours_over_cublas']:.3f} | {b['mj_per_gemm']:.3f} | "
              f"{o['mj_per_gemm']:.3f} | {row['energy_ours_over_cublas']:.3f} | "
              f"{b['watts']:.0f} / {o['watts']:.0f} | {b['sm_mhz']:.0f} / {o['sm_mhz']:.0f} | "
              f"{row['kernel']} |{flags(row)}", flush=True)
        torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"gemm_energy_{bench_cli._slug(meta)}_{bench_cli._stamp()}.json"
    path.write_text(json.dumps(_no_nan({"meta": meta, "rows": rows}), indent=1) + "\n")
    print(f"json {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
