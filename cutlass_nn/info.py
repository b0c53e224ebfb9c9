"""``python -m cutlass_nn.info``: what this cutlass_nn installation was built with and can run."""

from __future__ import annotations

import torch

import cutlass_nn
from cutlass_nn._extension import build_info


def _kernel_set_line(kernel_set: str) -> str:
    if kernel_set == "ci":
        return ("ci (one kernel per family, built with CUTLASS_NN_KERNEL_SET=ci to prove the build; "
                "rebuild without it for real work)")
    return kernel_set or "(none: CPU-only build)"


def describe() -> str:
    """A multi-line report: versions, build flavor, compiled GPU archs and visible GPUs."""
    info = build_info()
    lines = [
        f"cutlass_nn {cutlass_nn.__version__}",
        f"build flavor: {info['flavor']}",
        f"compiled GPU architectures: {info['cuda_archs'] or '(none: CPU-only build)'}",
        f"CUTLASS version: {info['cutlass_version'] or '(not used by the CPU flavor)'}",
        f"GEMM kernel set: {_kernel_set_line(info.get('kernel_set', ''))}",
        f"torch: {torch.__version__} (extension built against {info['torch_version']})",
        f"torch CUDA: {torch.version.cuda or '(CPU build)'}",
    ]
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            lines.append(
                f"cuda:{index}: {props.name}, compute capability {props.major}.{props.minor}, "
                f"{props.multi_processor_count} SMs"
            )
    else:
        lines.append("CUDA devices: none visible")
    return "\n".join(lines)


if __name__ == "__main__":
    print(describe())
