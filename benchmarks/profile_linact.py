"""Per-kernel CUDA times of one Linear + bias + activation forward+backward step: cutlass_nn's
CutlassLinear(activation=...) next to the eager nn.Sequential(nn.Linear, activation) it replaces.

A diagnostic for the benchmark's linact rows (which only give the total): it shows which kernel
of a step costs what. Needs a CUDA GPU.

    python benchmarks/profile_linact.py [--shape 16384x4096x4096] [--activation gelu_tanh]
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

import cutlass_nn

TORCH_ACT = {
    "relu": lambda: nn.ReLU(),
    "gelu": lambda: nn.GELU(),
    "gelu_tanh": lambda: nn.GELU(approximate="tanh"),
}


def kernel_times(step, reps: int) -> dict[str, tuple[float, int]]:
    """Mean CUDA time (us) per step of every kernel name, and its calls per step."""
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            step()
        torch.cuda.synchronize()
    total: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    for evt in prof.events():
        if evt.device_type == torch.autograd.DeviceType.CUDA:
            total[evt.name] += evt.device_time
            calls[evt.name] += 1
    return {k: (total[k] / reps, calls[k] // reps) for k in total}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="16384x4096x4096", help="MxNxK (tokens x out x in)")
    parser.add_argument("--activation", default="gelu_tanh", choices=sorted(TORCH_ACT))
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args()
    m, n, k = (int(v) for v in args.shape.split("x"))
    dev, dt = "cuda", torch.bfloat16
    eager = nn.Sequential(nn.Linear(k, n), TORCH_ACT[args.activation]()).to(dev, dt)
    ours = cutlass_nn.CutlassLinear(k, n, activation=args.activation).to(dev, dt)
    ours.load_state_dict(eager[0].state_dict())
    x = torch.randn(m, k, device=dev, dtype=dt, requires_grad=True)
    g = torch.randn(m, n, device=dev, dtype=dt)

    def step_of(model):
        def step():
            x.grad = None
            model.zero_grad(set_to_none=True)
            model(x).backward(g)
        return step

    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, bf16 {args.shape}, "
          f"activation {args.activation}; mean CUDA time per fwd+bwd step")
    for name, model in (("cutlass_nn", ours), ("eager", eager)):
        times = kernel_times(step_of(model), args.reps)
        print(f"\n{name}: total {sum(t for t, _ in times.values()):.1f} us")
        for kname, (t, c) in sorted(times.items(), key=lambda kv: -kv[1][0]):
            print(f"  {t:9.1f} us  x{c}  {kname[:110]}")


if __name__ == "__main__":
    main()
