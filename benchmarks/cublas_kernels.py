"""Which kernel torch (cuBLAS / cuBLASLt) runs for each GEMM of the transformer shape set, and how
long it takes: the tile shapes, clusters and split-K choices that our rules compete with.

    python benchmarks/cublas_kernels.py [--tokens 4096] [--out results/cublas_kernels_X.json]

For every layer shape (T, N, K) of cutlass_nn/transformer_shapes.py it profiles torch's forward
(F.linear without bias), dgrad (dY @ W) and wgrad (dY^T @ X) in bf16 and records each kernel's
name and mean CUDA time over the profiled calls. Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.nn.functional as F
from profile_linact import kernel_times  # benchmarks/ is the script's own folder on sys.path

from cutlass_nn import transformer_shapes


def profile_call(fn, reps: int = 20) -> list[tuple[str, float]]:
    """(kernel name, mean CUDA microseconds per call) of the GPU kernels ``fn`` launches on every
    call, slowest first (the profiler harness of profile_linact.py)."""
    times = kernel_times(fn, reps)
    return sorted(((name, us) for name, (us, calls) in times.items() if calls >= 1),
                  key=lambda kv: -kv[1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[4096])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("cublas_kernels.py: needs a CUDA GPU", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    rows = []
    for t, n, k in transformer_shapes.transformer_shapes(args.tokens):
        x = torch.randn(t, k, device=dev, dtype=torch.bfloat16)
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
        dy = torch.randn(t, n, device=dev, dtype=torch.bfloat16)
        calls = {
            "fwd": lambda: F.linear(x, w),
            "dgrad": lambda: dy @ w,
            "wgrad": lambda: dy.t() @ x,
        }
        for op, fn in calls.items():
            kernels = profile_call(fn)
            row = {"op": op, "shape": [t, n, k], "kernels": kernels}
            rows.append(row)
            names = "; ".join(f"{name} {us:.1f}us" for name, us in kernels)
            print(f"{op:5s} {t}x{n}x{k}: {names}", flush=True)
    record = {
        "meta": {
            "device": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "python": platform.python_version(),
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join(["python", "benchmarks/cublas_kernels.py", *(argv or sys.argv[1:])]),
        },
        "rows": rows,
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
