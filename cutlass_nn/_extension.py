"""Loads the compiled extension ``cutlass_nn._C``, which registers the ``torch.ops.cutlass_nn``
operators, and reports what it was built with.

With ``CUTLASS_NN_JIT=1`` in the environment, the extension is compiled from ``csrc/`` and loaded
by :func:`cutlass_nn.jit.load` (``torch.utils.cpp_extension.load``) instead, and ``cutlass_nn._C``
is never imported: a source checkout then works with no build step.

A load failure is never swallowed: without the extension no operator exists, so the import of
``cutlass_nn`` fails with a message that says how to build it.
"""

from __future__ import annotations

import functools
import os

import torch


def _jit_setting() -> str:
    return os.environ.get("CUTLASS_NN_JIT", "").strip().lower()


def jit_requested() -> bool:
    """True when ``CUTLASS_NN_JIT`` asks for the JIT build: ``1`` (or ``true``, ``yes``, ``on``),
    or ``verbose`` (the same, printing the build)."""
    return _jit_setting() in ("1", "true", "yes", "on", "verbose")


def _load_jit() -> None:
    from cutlass_nn import jit  # imports only cutlass_nn._build_config: no import cycle

    try:
        jit.load(verbose=_jit_setting() == "verbose")
    except Exception as exc:
        raise ImportError(
            "cutlass_nn: CUTLASS_NN_JIT=1 is set, but compiling and loading the extension from "
            f"csrc/ with torch.utils.cpp_extension.load failed ({exc}). Set "
            "CUTLASS_NN_JIT=verbose to see the whole build, or unset CUTLASS_NN_JIT to use the "
            "extension built by `pip install --no-build-isolation -e .`."
        ) from exc


def _load() -> None:
    if jit_requested():
        _load_jit()
        return
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
        empty for the CPU flavor), ``cutlass_version``, ``torch_version`` (the torch the
        extension was compiled against) and ``kernel_set`` (``"full"``, or ``"ci"`` for a build
        of one GEMM kernel per family made with ``CUTLASS_NN_KERNEL_SET=ci``; empty for the CPU
        flavor).
    """
    info = {}
    for line in torch.ops.cutlass_nn.build_info().splitlines():
        key, _, value = line.partition("=")
        info[key] = value
    return info


# Read once at import: has_cuda_kernels() runs on every operator call, and must neither dispatch
# an operator nor go through a cache wrapper there (torch.compile traces it).
_HAS_CUDA_KERNELS = build_info()["flavor"] == "cuda"


def has_cuda_kernels() -> bool:
    """True when the extension was built with its CUDA kernels (the CUDA flavor)."""
    return _HAS_CUDA_KERNELS
