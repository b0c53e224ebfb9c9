"""GPU time of the forward of a Linear + bias + activation layer, per way of computing it: the
fused GEMM with the activation and the pre-activation in its epilogue (``linear_act_aux``, what
``CutlassLinear(activation=...)`` runs when it records a backward), at the rule's plan and with
the fused configuration's scheduler swizzle forced; the plain GEMM with the bias (ours and
cuBLAS's) followed by the activation as its own elementwise pass, which is what the layer would
run unfused.

A diagnostic for the fusions issue's item 5 (the fused epilogues must pay): it tells whether a
fused epilogue is slower than the GEMM it extends plus a separate pass, and whether the fused
kernel's tile order is the reason. Needs a CUDA GPU and the CUDA flavor.

    python benchmarks/linact_forward_probe.py [--shapes 4096x3072x768,16384x16384x4096]
        [--activations relu,gelu_tanh,gelu] [--swizzles 1,2,4,8] [--reps 50]
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn.functional as F

import cutlass_nn  # noqa: F401  (registers torch.ops.cutlass_nn)
from cutlass_nn.bench.spec import Settings
from cutlass_nn.bench.timing import CudaTimer

TORCH_ACT = {
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda z: F.gelu(z, approximate="tanh"),
}
FUSED_CONFIG = 3  # the SM90 configuration of the fused-activation kernels (gemm_dispatch.cu)


def median_us(timer: CudaTimer, fn) -> float:
    """Median GPU time of fn() in microseconds: the benchmark's own timer (CUDA events around each
    call, after a warm-up, with a sleep kernel queued ahead so that the times are the kernels'
    own and not the host's launch cost)."""
    return statistics.median(timer({"fn": lambda _set: fn()}, 1)["fn"]) * 1000.0


def make_timer(reps: int) -> CudaTimer:
    """A timer of exactly ``reps`` repetitions per function."""
    return CudaTimer(Settings(budget_ms=0.0, min_reps=reps, max_reps=reps, warmup=3,
                              row_cap_ms=float("inf"), time_limit_s=float("inf")))


def probe(m: int, n: int, k: int, activation: str, swizzles: list[int], timer: CudaTimer) -> list[str]:
    """One line per way of computing act(x @ W.T + b) at [m, k] x [n, k]."""
    ops = torch.ops.cutlass_nn
    gen = torch.Generator(device="cuda").manual_seed(m + n + k)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=gen) / k**0.5
    b = torch.randn(n, device="cuda", dtype=torch.bfloat16, generator=gen)
    act = TORCH_ACT[activation]
    z = F.linear(x, w, b)
    lines = []
    rows = {
        "cuBLAS F.linear (bias)": lambda: F.linear(x, w, b),
        "torch activation pass": lambda: act(z),
        "ours linear (bias), rule": lambda: ops.linear(x, w, b),
        "ours linear_act_aux, rule": lambda: ops.linear_act_aux(x, w, b, activation),
    }
    for name, fn in rows.items():
        lines.append(f"  {name:<34} {median_us(timer, fn):9.1f} us")
    for swizzle in swizzles:
        previous = ops._set_gemm_config(FUSED_CONFIG, swizzle, 0)
        try:
            t = median_us(timer, lambda: ops.linear_act_aux(x, w, b, activation))
        finally:
            ops._set_gemm_config(previous[0], previous[1], previous[2])
        lines.append(f"  {'ours linear_act_aux, swizzle ' + str(swizzle):<34} {t:9.1f} us")
    # the fused result against the unfused one (same GEMM accumulation order is not promised)
    out, pre = ops.linear_act_aux(x, w, b, activation)
    ref = act(z.float())
    err = ((out.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-6)).item()
    lines.append(f"  max |fused - act(cuBLAS z)| / max |act(z)|: {err:.2e}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="4096x3072x768,16384x16384x4096",
                        help="MxNxK,... (tokens x out x in)")
    parser.add_argument("--activations", default="relu,gelu_tanh,gelu")
    parser.add_argument("--swizzles", default="1,2,4,8",
                        help="swizzles forced on the fused configuration")
    parser.add_argument("--reps", type=int, default=50)
    args = parser.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",") if s]
    activations = [a for a in args.activations.split(",") if a]
    for a in activations:
        if a not in TORCH_ACT:
            parser.error(f"--activations: choose from {','.join(TORCH_ACT)}, got {a!r}")
    swizzles = [int(s) for s in args.swizzles.split(",") if s]
    timer = make_timer(args.reps)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, bf16; median GPU time of "
          f"one forward call ({args.reps} calls)")
    for m, n, k in shapes:
        for a in activations:
            print(f"{m}x{n}x{k} {a}")
            for line in probe(m, n, k, a, swizzles, timer):
                print(line)


if __name__ == "__main__":
    main()
