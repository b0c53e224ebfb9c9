"""Energy per GEMM, ours against cuBLAS: whether our kernels lose under the GPU's power limit.

Inside a training step our 16-bit GEMMs run 1-4% behind cuBLAS at the same tile shapes, more
than in isolated timings with idle gaps between launches (benchmarks/NOTES.md, sessions 31 and
35), and back-to-back launches of the large shapes hold the H200 at its power limit with the SM
clock at 1350-1500 MHz. Under a power limit a kernel's speed is set by its energy per GEMM: a
kernel that draws more joules per product is clocked down further. This script measures that
directly. For each problem it runs blocks of back-to-back launches, alternating between
``F.linear`` (cuBLAS) and ``cutlass_nn.ops.linear`` (the rule's kernel), and reads the GPU's
energy counter (NVML, ``nvmlDeviceGetTotalEnergyConsumption``) and its SM clock (sampled every
20 ms by a thread) around each block.

Usage::

    python benchmarks/gemm_energy.py [--shapes 4096x4096x4096,...] [--block-s 1.0]
        [--rounds 3] [--sets 4] [--config C[:SWIZZLE]] [--out DIR]

A shape is ``TxNxK``: ``T`` tokens, an ``N x K`` weight (the forward of a linear layer, "tn").
Operands rotate over ``--sets`` copies so that a launch does not find the previous one's operands
in L2. Per problem and side: the median over rounds of microseconds per GEMM (wall time of the
block over its launches, the GPU kept busy), millijoules per GEMM, mean watts and the median SM
clock; the ratios are ours / cuBLAS (time > 1: ours slower; energy > 1: ours draws more).
``--config`` forces one tile configuration (and swizzle) on our side
(``torch.ops.cutlass_nn._set_gemm_config``; the rule's choice otherwise). JSON to
``--out`` with the device, versions, date and command. Needs a CUDA GPU and NVML
(``libnvidia-ml.so.1``, part of the driver).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Sequence

import torch
import torch.nn.functional as F

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
        if torch.cuda.device_count() != 1:
            raise RuntimeError("gemm_energy: cannot match the CUDA device to an NVML device "
                               "(no PCI bus id, several GPUs)")
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
    """``14`` or ``14:2`` -> (config, swizzle); None stays None; a ValueError names bad text."""
    if text is None:
        return None
    head, sep, tail = text.partition(":")
    if not head.isdigit() or (sep and not tail.isdigit()) or int(tail or 0) > 8:
        raise ValueError(f"--config: {text!r} is not C or C:SWIZZLE (swizzle <= 8)")
    return int(head), int(tail or 0)


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    """``4096x4096x4096,...`` -> [(T, N, K), ...]; a ValueError names a malformed entry."""
    out = []
    for item in text.split(","):
        parts = item.strip().split("x")
        if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise ValueError(f"--shapes: {item!r} is not TxNxK with positive integers")
        out.append((int(parts[0]), int(parts[1]), int(parts[2])))
    return out


class ClockSampler:
    """Samples the SM clock every ``period_s`` on a thread while it is entered."""

    def __init__(self, nvml: Nvml, period_s: float = 0.02):
        self.nvml, self.period_s = nvml, period_s
        self.samples: list[int] = []
        self._stop = threading.Event()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(self.nvml.sm_clock_mhz())
            self._stop.wait(self.period_s)

    def __enter__(self) -> ClockSampler:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def run_block(nvml: Nvml, launch: Callable[[int], object], block_s: float) -> dict[str, float]:
    """Back-to-back launches for about ``block_s`` seconds: us and mJ per GEMM, watts, clock."""
    torch.cuda.synchronize()
    n = 0
    with ClockSampler(nvml) as clocks:
        e0, t0 = nvml.energy_mj(), time.perf_counter()
        while time.perf_counter() - t0 < block_s:
            for _ in range(8):
                launch(n)
                n += 1
        torch.cuda.synchronize()
        t1, e1 = time.perf_counter(), nvml.energy_mj()
    seconds, millijoules = t1 - t0, e1 - e0
    return {"gemms": n, "us_per_gemm": seconds / n * 1e6, "mj_per_gemm": millijoules / n,
            "watts": millijoules / 1e3 / seconds,
            "sm_mhz": statistics.median(clocks.samples) if clocks.samples else float("nan")}


def measure_shape(nvml: Nvml, shape: tuple[int, int, int], sets: int, rounds: int,
                  block_s: float) -> dict:
    import cutlass_nn

    tokens, n, k = shape
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
    kernel = (cutlass_nn.ops.last_kernel_name() if hasattr(cutlass_nn.ops, "last_kernel_name")
              else "")
    for fn in sides.values():  # warm-up: the clock's ramp, the allocator
        run_block(nvml, fn, block_s / 2)
    blocks: dict[str, list[dict]] = {name: [] for name in sides}
    for r in range(rounds):
        order = list(sides) if r % 2 == 0 else list(sides)[::-1]
        for name in order:
            blocks[name].append(run_block(nvml, sides[name], block_s))
    summary = {name: {key: statistics.median(b[key] for b in bl) for key in bl[0]}
               for name, bl in blocks.items()}
    ours, base = summary["cutlass_nn"], summary["cublas"]
    return {"shape": list(shape), "kernel": kernel, "blocks": blocks, "median": summary,
            "time_ours_over_cublas": ours["us_per_gemm"] / base["us_per_gemm"],
            "energy_ours_over_cublas": ours["mj_per_gemm"] / base["mj_per_gemm"]}


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="python benchmarks/gemm_energy.py")
    p.add_argument("--shapes", default=DEFAULT_SHAPES)
    p.add_argument("--block-s", type=float, default=1.0, help="seconds per timed block")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--sets", type=int, default=4, help="operand copies the launches rotate over")
    p.add_argument("--config", default=None,
                   help="force this tile configuration on our side, C or C:SWIZZLE (default: the rule)")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = p.parse_args(list(argv))
    try:
        shapes = parse_shapes(args.shapes)
        forced = parse_config(args.config)
    except ValueError as exc:
        p.error(str(exc))
    if args.rounds < 1 or args.sets < 1 or not 0.05 <= args.block_s <= 30:
        p.error("--rounds and --sets must be >= 1, --block-s in [0.05, 30]")
    if not torch.cuda.is_available():
        print("gemm_energy: needs a CUDA GPU")
        return 2
    nvml = Nvml()
    if forced is not None:
        names = [n for n in torch.ops.cutlass_nn._gemm_configs().splitlines() if n]
        if forced[0] >= len(names):
            p.error(f"--config: {forced[0]} is not below the build's {len(names)} configurations")
        torch.ops.cutlass_nn._set_gemm_config(forced[0], forced[1], 0)
    props = torch.cuda.get_device_properties(0)
    meta = {"device": props.name, "torch": torch.__version__, "cuda": torch.version.cuda,
            "python": sys.version.split()[0], "power_limit_w": nvml.power_limit_w(),
            "forced_config": list(forced) if forced is not None else None,
            "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "command": " ".join(["python benchmarks/gemm_energy.py", *argv])}
    print(f"gemm_energy: {props.name}, power limit {meta['power_limit_w']:.0f} W, "
          f"torch {torch.__version__}")
    print("| T x N x K | cuBLAS us | ours us | time ours/cuBLAS | cuBLAS mJ | ours mJ | "
          "energy ours/cuBLAS | W cuBLAS / ours | SM MHz cuBLAS / ours | our kernel |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    for shape in shapes:
        row = measure_shape(nvml, shape, args.sets, args.rounds, args.block_s)
        rows.append(row)
        b, o = row["median"]["cublas"], row["median"]["cutlass_nn"]
        print(f"| {'x'.join(map(str, shape))} | {b['us_per_gemm']:.1f} | {o['us_per_gemm']:.1f} | "
              f"{row['time_ours_over_cublas']:.3f} | {b['mj_per_gemm']:.3f} | "
              f"{o['mj_per_gemm']:.3f} | {row['energy_ours_over_cublas']:.3f} | "
              f"{b['watts']:.0f} / {o['watts']:.0f} | {b['sm_mhz']:.0f} / {o['sm_mhz']:.0f} | "
              f"{row['kernel']} |", flush=True)
        torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    slug = props.name.lower().replace(" ", "-")
    path = args.out / f"gemm_energy_{slug}_{stamp}.json"
    path.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    print(f"json {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
