"""JIT build of the extension, for development without installing: compiles the sources of
``csrc/`` with ``torch.utils.cpp_extension.load`` and loads the library into this process.

It compiles exactly what ``setup.py`` compiles -- the same flavor decision, sources, defines,
include directories and flags, all from :mod:`cutlass_nn._build_config` -- but into a build
directory of torch's JIT (``$TORCH_EXTENSIONS_DIR``, default ``~/.cache/torch_extensions``)
instead of ``cutlass_nn/_C*.so``, and recompiles only what changed.

Use it by setting ``CUTLASS_NN_JIT=1`` before ``import cutlass_nn`` (``cutlass_nn/_extension.py``
then calls :func:`load` instead of importing ``cutlass_nn._C``), e.g. from a source checkout with
no build step::

    CUTLASS_NN_JIT=1 PYTHONPATH=. python -c "import cutlass_nn; print(cutlass_nn.build_info())"

The library is loaded as a plain shared library (``is_python_module=False``, through
``torch.ops.load_library``): loading it runs its ``TORCH_LIBRARY`` registrations, which is all
``cutlass_nn`` needs. The ``PyInit__C`` that ``csrc/ops_registry.cpp`` exports for the setuptools
build is never called here; it is harmless.

This module imports only :mod:`cutlass_nn._build_config` (no compiled code, no package side
effects), so ``cutlass_nn/_extension.py`` can import it while ``cutlass_nn`` is being imported.
"""

from __future__ import annotations

import os
import shlex
import sys
import time

from cutlass_nn import _build_config

#: The name of the JIT-built library (``<build_directory>/cutlass_nn_jit.so``; torch appends
#: ``_v<N>`` when the sources or flags changed since the last build in that directory).
NAME = "cutlass_nn_jit"

_loaded_path: str | None = None


def _define_flags(defines: list[tuple[str, str]]) -> list[str]:
    # torch writes the JIT's extra flags into build.ninja unquoted, and ninja runs them through
    # the shell: quote them here, or '-DX="cpu"' would reach the compiler as -DX=cpu.
    return [shlex.quote(f"-D{name}={value}") for name, value in defines]


def loaded_path() -> str | None:
    """The path of the library :func:`load` loaded into this process, or None."""
    return _loaded_path


def load(verbose: bool = False, build_directory: str | None = None) -> str:
    """Compile (if needed) and load the extension; return the path of the built library.

    Args:
        verbose: print the ``cutlass_nn build:`` decisions of setup.py (flavor, CUTLASS headers),
            torch's JIT log and the compiler commands.
        build_directory: where to build; default: torch's JIT directory for ``cutlass_nn_jit``
            (under ``$TORCH_EXTENSIONS_DIR`` when set).

    The extension is loaded once per process: a second call returns the path loaded first
    without compiling again (a TORCH_LIBRARY namespace can be registered only once).

    Raises:
        RuntimeError: ``cutlass_nn._C`` is already loaded in this process, or this is not a
            source checkout (no ``csrc/``), or the compilation failed (torch's error, with the
            compiler output); :class:`cutlass_nn._build_config.BuildConfigError` (a
            RuntimeError) when the build cannot be configured (e.g. no CUTLASS headers).
    """
    global _loaded_path
    if _loaded_path is not None:
        return _loaded_path
    if "cutlass_nn._C" in sys.modules:
        raise RuntimeError(
            "cutlass_nn.jit.load: the installed extension cutlass_nn._C is already loaded in this "
            "process, and its operators cannot be registered twice. Set CUTLASS_NN_JIT=1 before "
            "the first `import cutlass_nn` to use the JIT build instead."
        )
    csrc = os.path.join(_build_config.ROOT, "csrc")
    if not os.path.isdir(csrc):
        raise RuntimeError(
            f"cutlass_nn.jit.load: no sources at {csrc}. The JIT build needs a source checkout "
            "of cutlass_nn (an installed wheel holds only the compiled extension)."
        )

    from torch.utils import cpp_extension

    config = _build_config.extension_config(log=_build_config.log if verbose else _quiet)
    defines = _define_flags(config.define_macros)
    if build_directory is not None:
        os.makedirs(build_directory, exist_ok=True)
    start = time.perf_counter()
    path = cpp_extension.load(
        name=NAME,
        sources=config.abs_sources(),
        extra_cflags=[*defines, *config.cxx_flags],
        extra_cuda_cflags=[*defines, *config.nvcc_flags] if config.with_cuda else None,
        extra_include_paths=config.include_dirs,
        build_directory=build_directory,
        verbose=verbose,
        with_cuda=config.with_cuda,
        is_python_module=False,
    )
    if verbose:
        _build_config.log(
            f"JIT {config.flavor} flavor loaded from {path} "
            f"({time.perf_counter() - start:.1f} s, compile included if one was needed)"
        )
    _loaded_path = path
    return path


def _quiet(msg: str) -> None:
    del msg
