#!/usr/bin/env python3
"""Where the SM90 GEMM rule leaves measured speed, from the committed sweeps alone (no GPU).

Every ``benchmarks/results/sweep_*.json`` times the rule's choice ("auto") and forced tile
configurations / swizzles of some GEMM shapes against cuBLAS (ratio = cuBLAS time / ours, > 1:
ours faster). This script compiles the rule harness (``csrc/kernels/tests/rule_harness.cpp``:
the dispatcher with stub kernels, built with the host compiler) from a ``csrc/kernels`` tree,
asks it for today's plan of every measured (op, shape), and reports per sweep:

* default: the plan's measured ratio (a forced row of the same kernel and swizzle; else the
  sweep's "auto" row if that ran the same kernel; else unmeasured) against the best measured
  configuration that is still built, listing the (sweep, op, shape) groups where the best is
  ahead by at least ``--min-gap``, and the groups where nothing measured reaches 0.90;
* ``--compare DIR``: the plans of another ``csrc/kernels`` tree (a branch's worktree, say)
  against this one's on every measured group whose plan differs, with both measured ratios.

A layer (tokens T, out N, in K) in a sweep's ``shape`` runs the forward GEMM T x N x K, the
dgrad GEMM T x K x N and the wgrad GEMM N x K x T (the harness's m, n, k). The swizzle the rule
leaves at 0 is CUTLASS's default, 1. One configuration timed twice in one sweep moves by a few
percent (session 27: median 2.4%, p90 5.4%), so a single sweep's gap under ~5% is a lead, not
evidence. Usage::

    python3 scripts/rule_gaps.py [--min-gap 0.04] [--device h200] [--latest] [--results DIR]
    python3 scripts/rule_gaps.py --compare /path/to/other/csrc/kernels
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parent.parent
KERNELS = ROOT / "csrc" / "kernels"
RESULTS = ROOT / "benchmarks" / "results"
#: Below this, a shape misses issue 13's floor whatever the rule picks.
FLOOR = 0.90

# "noc_": the kernels without a C operand (v0.38) share their configuration's name and measure.
_KERNEL_PREFIX = re.compile(r"^sm90_tma_ws_[a-z0-9]+_[a-z0-9]+_(nn|nt|tn|tt)_(?:noc_)?")


class Plan(NamedTuple):
    kernel: str  # the kernel's configuration part, e.g. "128x192x64_1x1x1_coop"
    swizzle: int  # effective: 0 (CUTLASS's default) counts as 1
    splits: int | None  # stream-K kernels only


def short_kernel(name: str) -> str:
    """A kernel's configuration part: the same tile in either layout compares equal."""
    return _KERNEL_PREFIX.sub("", name)


def gemm_query(op: str, shape: Sequence[int]) -> tuple[str, int, int, int]:
    """The harness's (op, m, n, k) of a sweep row's layer shape (T, N, K)."""
    t, n, k = shape
    if op == "fwd":
        return ("fwd", t, n, k)
    if op == "dgrad":
        return ("dgrad", t, k, n)
    if op == "wgrad":
        return ("wgrad", n, k, t)
    raise ValueError(f"rule_gaps: op must be fwd, dgrad or wgrad, got {op!r}")


def row_plan(row: dict[str, Any]) -> Plan:
    """The kernel, swizzle and split count a sweep row ran."""
    kernel = short_kernel(row.get("kernel", ""))
    splits = int(row.get("splits", 0)) if "streamk" in kernel else None
    return Plan(kernel, max(int(row.get("swizzle", 0)), 1), splits)


def parse_plan(line: str) -> Plan:
    """A harness answer ``rc rs rsp | config swizzle splits transposed name``."""
    _, _, rest = line.partition("|")
    _config, swizzle, splits, _transposed, name = rest.split()
    kernel = short_kernel(name)
    return Plan(kernel, max(int(swizzle), 1), int(splits) if "streamk" in kernel else None)


def host_toolchain() -> tuple[str, Path] | None:
    """The host C++ compiler and the CUDA include folder the rule harness needs, or None."""
    cxx = shutil.which("g++") or shutil.which("c++")
    cuda = next((Path(b) / "include" for b in (os.environ.get("CUDA_HOME"), "/usr/local/cuda")
                 if b and (Path(b) / "include" / "cuda_runtime.h").is_file()), None)
    return (cxx, cuda) if cxx is not None and cuda is not None else None


def build_harness(kernels_dir: Path, out: Path) -> Path:
    """Compiles the rule harness of ``kernels_dir`` (a ``csrc/kernels`` tree) to ``out``; raises
    RuntimeError without a toolchain or when it does not compile (tests/test_gemm_rule.py builds
    its harness here too)."""
    toolchain = host_toolchain()
    if toolchain is None:
        raise RuntimeError("rule_gaps: needs a host C++ compiler and the CUDA runtime header "
                           "(set CUDA_HOME)")
    cxx, cuda = toolchain
    cmd = [cxx, "-std=c++17", "-O1", f"-I{kernels_dir}", f"-I{cuda}",
           str(kernels_dir / "tests" / "rule_harness.cpp"), "-o", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"rule_gaps: the harness of {kernels_dir} did not compile:\n"
                           f"{done.stderr[-3000:]}")
    return out


def harness_planner(exe: Path) -> Callable[[Iterable[tuple], int, int], dict[tuple, Plan]]:
    """A function (queries, sms, memory_gbps) -> {query: Plan} backed by the compiled harness."""

    def plans(queries: Iterable[tuple], sms: int, gbps: int = 0) -> dict[tuple, Plan]:
        qs = sorted(set(queries))
        text = "".join(f"{op} {m} {n} {k} 0 0 -1 0 0 {sms} 0 1 {gbps}\n" for op, m, n, k in qs)
        out = subprocess.run([str(exe)], input=text, capture_output=True, text=True,
                             check=True).stdout.splitlines()
        return {q: parse_plan(line) for q, line in zip(qs, out)}

    return plans


def built_kernels(kernels_dir: Path) -> set[str]:
    """Configuration parts of the SM90 kernels the tree builds (its generated registry)."""
    text = (kernels_dir / "generated" / "kernel_registry.inc").read_text()
    return {short_kernel(n) for n in re.findall(r'"(sm90_tma_ws_[^"]+)"', text)}


# Peak DRAM bandwidth (GB/s) of the GPUs the committed sweeps ran on, by device name, for sweeps
# whose metadata predates the "memory_gbps" field (the rule reads it: GemmParams::memory_gbps).
# Names as torch reports them; a GH200 (96 GB: about 4.0 TB/s) is not an H200.
KNOWN_MEMORY_GBPS = {"NVIDIA H200": 4915, "NVIDIA H100 80GB HBM3": 3352}


def memory_gbps(meta: dict[str, Any]) -> int:
    """The sweep's device bandwidth as the rule saw it: its metadata's, else the known value of
    its device name, else 0 (unknown)."""
    if isinstance(meta.get("memory_gbps"), int):
        return meta["memory_gbps"]
    return KNOWN_MEMORY_GBPS.get(str(meta.get("device", "")).strip(), 0)


def load_groups(results: Path, device: str | None = None) -> dict[tuple, dict[str, Any]]:
    """The 16-bit rows of every sweep, grouped by (sweep file, op, shape): each group's rows,
    device and SM count. Rows that failed, have no finite ratio or ran the fallback are left
    out."""
    groups: dict[tuple, dict[str, Any]] = {}
    for path in sorted(results.glob("sweep_*.json")):
        data = json.loads(path.read_text())
        meta = data.get("meta", {})
        name = str(meta.get("device", ""))
        if device and device.lower() not in name.lower():
            continue
        for row in data.get("rows", []):
            ratio = row.get("ratio")
            if (row.get("status") != "ok" or row.get("precision") not in ("bf16", "fp16")
                    or not isinstance(ratio, (int, float)) or not math.isfinite(ratio)
                    or not str(row.get("kernel", "")).startswith("sm90_")):
                continue
            key = (path.name, row["op"], tuple(row["shape"]))
            g = groups.setdefault(key, {"device": name, "sms": int(meta.get("sm_count") or 132),
                                        "gbps": memory_gbps(meta), "rows": []})
            g["rows"].append(row)
    return groups


def latest_only(groups: dict[tuple, dict[str, Any]]) -> dict[tuple, dict[str, Any]]:
    """Of the groups of one (device, op, shape), only the newest sweep's (the file names sort
    by date and time)."""
    newest: dict[tuple, tuple] = {}
    for key, g in groups.items():
        sweep, op, shape = key
        ident = (g["device"], op, shape)
        if ident not in newest or sweep > newest[ident][0]:
            newest[ident] = key
    return {key: groups[key] for key in newest.values()}


def measured(rows: Sequence[dict[str, Any]], plan: Plan) -> tuple[float | None, str]:
    """The ratio a plan was measured at among a group's rows, and how it was found: a forced
    row of the same kernel and swizzle (and split count, for stream-K), the best if several;
    else the "auto" row if it ran the same kernel (with the swizzle / splits of the rule of the
    sweep's date); else (None, "unmeasured")."""
    forced = [r for r in rows if r.get("key") != "auto" and row_plan(r) == plan]
    if forced:
        return max(r["ratio"] for r in forced), "forced"
    auto = [r for r in rows if r.get("key") == "auto" and row_plan(r).kernel == plan.kernel]
    if auto:
        return auto[0]["ratio"], "auto row"
    return None, "unmeasured"


def best_measured(rows: Sequence[dict[str, Any]], built: set[str]) -> tuple[float, Plan] | None:
    """The best ratio among a group's rows whose kernel is still built, with its plan."""
    live = [r for r in rows if row_plan(r).kernel in built]
    if not live:
        return None
    top = max(live, key=lambda r: r["ratio"])
    return top["ratio"], row_plan(top)


def plan_text(p: Plan) -> str:
    return f"{p.kernel}/s{p.swizzle}" + ("" if p.splits is None else f"/k{p.splits}")


def gaps(groups: dict[tuple, dict[str, Any]], plans: dict[tuple, Plan], built: set[str],
         min_gap: float) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(groups whose best measured ratio beats the plan's by at least ``min_gap``, largest
    first; groups whose best measured ratio is under FLOOR)."""
    ahead, under = [], []
    for (sweep, op, shape), g in sorted(groups.items()):
        plan = plans[device_key(g) + gemm_query(op, shape)]
        ratio, how = measured(g["rows"], plan)
        best = best_measured(g["rows"], built)
        entry = {"sweep": sweep, "device": g["device"], "op": op, "shape": list(shape),
                 "plan": plan_text(plan), "ratio": ratio, "how": how,
                 "best": None if best is None else plan_text(best[1]),
                 "best_ratio": None if best is None else best[0]}
        if best is not None and ratio is not None and best[0] >= ratio * (1 + min_gap):
            ahead.append(dict(entry, gap=best[0] / ratio - 1))
        if best is not None and best[0] < FLOOR:
            under.append(entry)
    ahead.sort(key=lambda e: -e["gap"])
    return ahead, under


def compare(groups: dict[tuple, dict[str, Any]], base: dict[tuple, Plan],
            other: dict[tuple, Plan]) -> list[dict[str, Any]]:
    """Every measured group whose plan differs between two rules, with both plans' measured
    ratios (None where a plan was not measured in that sweep)."""
    out = []
    for (sweep, op, shape), g in sorted(groups.items()):
        q = device_key(g) + gemm_query(op, shape)
        if base[q] == other[q]:
            continue
        old, old_how = measured(g["rows"], base[q])
        new, new_how = measured(g["rows"], other[q])
        out.append({"sweep": sweep, "device": g["device"], "op": op, "shape": list(shape),
                    "base": plan_text(base[q]), "base_ratio": old, "base_how": old_how,
                    "other": plan_text(other[q]), "other_ratio": new, "other_how": new_how})
    return out


def device_key(g: dict[str, Any]) -> tuple[int, int]:
    """What the rule knows of a group's device: (SM count, peak DRAM bandwidth in GB/s)."""
    return (g["sms"], g.get("gbps", 0))


def all_plans(groups: dict[tuple, dict[str, Any]],
              planner: Callable[[Iterable[tuple], int, int], dict[tuple, Plan]]) -> dict[tuple, Plan]:
    """{(sms, gbps, op, m, n, k): Plan} for every group, asked of ``planner`` once per device
    key (device_key)."""
    by_device: dict[tuple[int, int], set[tuple]] = defaultdict(set)
    for (_, op, shape), g in groups.items():
        by_device[device_key(g)].add(gemm_query(op, shape))
    out = {}
    for (sms, gbps), queries in by_device.items():
        out.update({(sms, gbps) + q: p for q, p in planner(queries, sms, gbps).items()})
    return out


def _fmt(x: float | None) -> str:
    return "  -  " if x is None else f"{x:.3f}"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", type=Path, default=RESULTS, help="folder of sweep_*.json")
    ap.add_argument("--kernels", type=Path, default=KERNELS, help="csrc/kernels tree of the rule")
    ap.add_argument("--compare", type=Path, default=None, metavar="DIR",
                    help="another csrc/kernels tree: report the measured groups whose plan differs")
    ap.add_argument("--device", default=None, help="only sweeps whose device name contains this")
    ap.add_argument("--latest", action="store_true",
                    help="of each (device, op, shape), only the newest sweep's measurements")
    ap.add_argument("--min-gap", type=float, default=0.04,
                    help="report groups whose best measured ratio is this much ahead (0.04 = 4%%)")
    args = ap.parse_args(argv)
    groups = load_groups(args.results, args.device)
    if args.latest:
        groups = latest_only(groups)
    if not groups:
        print(f"rule_gaps: no usable sweep rows under {args.results}")
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        try:
            base_exe = build_harness(args.kernels, Path(tmp) / "base")
            other_exe = (None if args.compare is None
                         else build_harness(args.compare, Path(tmp) / "other"))
        except RuntimeError as exc:
            raise SystemExit(str(exc)) from None
        base = all_plans(groups, harness_planner(base_exe))
        if other_exe is not None:
            other = all_plans(groups, harness_planner(other_exe))
            rows = compare(groups, base, other)
            for r in rows:
                delta = ("" if r["base_ratio"] is None or r["other_ratio"] is None
                         else f" {r['other_ratio'] / r['base_ratio'] - 1:+.1%}")
                print(f"{r['sweep']} {r['op']:5} {'x'.join(map(str, r['shape'])):17} "
                      f"{r['base']} {_fmt(r['base_ratio'])} ({r['base_how']}) -> {r['other']} "
                      f"{_fmt(r['other_ratio'])} ({r['other_how']}){delta}")
            print(f"{len(rows)} measured groups change plan")
            return 0
    ahead, under = gaps(groups, base, built_kernels(args.kernels), args.min_gap)
    print(f"{len(groups)} measured (sweep, op, shape) groups; the best measured configuration "
          f"ahead of today's plan by >= {args.min_gap:.0%} in {len(ahead)}:")
    for e in ahead:
        print(f"  {e['sweep']} {e['op']:5} {'x'.join(map(str, e['shape'])):17} plan {e['plan']} "
              f"{_fmt(e['ratio'])} ({e['how']}); best {e['best']} {_fmt(e['best_ratio'])} "
              f"(+{e['gap']:.1%})")
    print(f"groups where no measured configuration reaches {FLOOR:.2f}: {len(under)}")
    for e in under:
        print(f"  {e['sweep']} {e['op']:5} {'x'.join(map(str, e['shape'])):17} best {e['best']} "
              f"{_fmt(e['best_ratio'])}; plan {e['plan']} {_fmt(e['ratio'])} ({e['how']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
