"""Loads the compiled extension ``cutlass_nn._C``, which registers the ``torch.ops.cutlass_nn``
operators, and reports what it was built with.

A load failure is never swallowed: without the extension no operator exists, so the import of
``cutlass_nn`` fails with a message that says how to build it.
"""

from __future__ import annotations

import functools

import torch


def _load() -> None:
    try:
        from cutlass_nn import _C  # noqa: F401  (loading it runs the TORCH_LIBRARY registrations)
    except ImportError as exc:
        raise ImportError(
            "cutlass_nn: the compiled extension cutlass_nn._C could not be loaded "
            f"({exc}). Build it against the installed torch with "
            "`pip install --no-build-isolation -e .` from the cutlass_nn checkout "
            "(see README.md, 'Troubleshooting')."
        ) from exc


_load()


@functools.lru_cache(maxsize=None)
def build_info() -> dict[str, str]:
    """What the loaded extension was built with.

    Returns:
        A dict with keys ``flavor`` (``"cpu"`` or ``"cuda"``), ``cuda_archs`` (``;``-separated,
        empty for the CPU flavor), ``cutlass_version`` and ``torch_version`` (the torch the
        extension was compiled against).
    """
    info = {}
    for line in torch.ops.cutlass_nn.build_info().splitlines():
        key, _, value = line.partition("=")
        info[key] = value
    return info


def has_cuda_kernels() -> bool:
    """True when the extension was built with its CUDA kernels (the CUDA flavor)."""
    return build_info()["flavor"] == "cuda"
