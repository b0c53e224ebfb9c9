"""Summarizes a ninja build log (``.ninja_log``): the units that took longest to compile, their
sum, and the sums of the groups of units the CI kernel set chooses between (generated GEMM
kernels, FP8 GEMM units, the other hand-written sources).

``scripts/ci_cuda_build.sh`` prints it after the CUDA-flavor build; the GPU machine's log of the
full build (``benchmarks/results/ninja_log_*.txt``) can be read the same way. Times are wall
times of each compile job, which overlap when ninja runs several at once.

Usage: python3 scripts/ninja_log_summary.py PATH [--top N]
"""

from __future__ import annotations

import argparse
import sys


def read_log(path: str) -> list[tuple[float, str]]:
    """(seconds, output path) of each entry of a ninja log (formats v5-v7: start, end, mtime,
    output, command hash; milliseconds). A unit built more than once keeps its last entry, as
    ninja does. Lines that are not such entries are skipped."""
    latest: dict[str, float] = {}
    with open(path) as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            fields = line.rstrip("\n").split("\t")
            if len(fields) < 4:
                continue
            start, end, _mtime, output = fields[:4]
            if not (start.isdigit() and end.isdigit()):
                continue
            latest[output] = (int(end) - int(start)) / 1000.0
    return sorted(((s, out) for out, s in latest.items()), reverse=True)


def group(output: str) -> str:
    if "/generated/" in output:
        return "generated GEMM kernels"
    if "/fp8_gemm_sm90_" in output:
        return "FP8 GEMM units"
    return "other hand-written sources"


def short(output: str) -> str:
    return output.split("/csrc/", 1)[-1]


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("path")
    p.add_argument("--top", type=int, default=15)
    args = p.parse_args(argv)
    entries = read_log(args.path)
    total = sum(s for s, _ in entries)
    print(f"ninja log {args.path}: {len(entries)} units, {total:.0f} s of compile jobs in sum")
    sums: dict[str, tuple[float, int]] = {}
    for s, out in entries:
        t, n = sums.get(group(out), (0.0, 0))
        sums[group(out)] = (t + s, n + 1)
    for name, (t, n) in sorted(sums.items(), key=lambda kv: -kv[1][0]):
        print(f"  {name}: {n} units, {t:.0f} s ({100 * t / max(total, 1e-9):.0f}%)")
    print(f"  slowest {min(args.top, len(entries))}:")
    for s, out in entries[: args.top]:
        print(f"    {s:7.1f} s  {short(out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
