"""Build script of cutlass_nn: one extension, ``cutlass_nn._C``.

What is compiled (flavor, sources, defines, flags) is described once, in
``cutlass_nn/_build_config.py``, which the JIT build (``cutlass_nn/jit.py``) shares. The flavor is
decided at build time from the installed torch and toolkit -- never from
``torch.cuda.is_available()`` (a build machine needs no GPU):

* CPU flavor: torch is a CPU build, or no CUDA toolkit (nvcc) is found, or
  ``CUTLASS_NN_CUDA_ARCHS=none``. Only the CPU implementations are compiled.
* CUDA flavor: torch is a CUDA build and ``CUDA_HOME`` holds nvcc. The CPU implementations plus the
  CUDA bindings and CUTLASS kernels are compiled.

Environment knobs (read in ``cutlass_nn/_build_config.py``, the last one here):

* ``CUTLASS_NN_CUDA_ARCHS``: ``;``-separated GPU architectures, default ``90a;80``; ``none``
  forces the CPU flavor.
* ``MAX_JOBS``: parallel compile jobs (torch's knob; each CUTLASS job needs ~3.5 GB of RAM).
* ``CUTLASS_DIR``: a CUTLASS source tree (holding ``include/cutlass``) to use instead of the
  headers of the pinned ``nvidia-cutlass`` PyPI package.
* ``CUTLASS_NN_OBJECT_CACHE``: an object cache of an earlier build
  (``cutlass_nn/_object_cache.py``): the units whose inputs are unchanged are linked from it
  instead of compiled.

Install with ``pip install --no-build-isolation .``: the extension must be compiled against the
torch that is installed, not a copy pip would fetch into an isolated build environment.
"""

from __future__ import annotations

import importlib.util
import os
import sys

from setuptools import find_packages, setup

try:
    import torch  # noqa: F401  (cutlass_nn/_build_config.py needs it too)
    from torch.utils import cpp_extension
except ImportError:  # pragma: no cover - explained to the user
    sys.exit(
        "cutlass_nn: torch is not importable in the build environment. Install torch first, then "
        "build with `pip install --no-build-isolation .` so the build uses that torch."
    )

ROOT = os.path.dirname(os.path.abspath(__file__))


def load_by_path(filename: str):
    """cutlass_nn/<filename>, loaded by path. The build's modules (_build_config: the one
    description of the build, shared with the JIT build cutlass_nn/jit.py; _object_cache) are
    not imported as ``cutlass_nn.<name>``: that would import the package, which needs the
    extension not yet built."""
    path = os.path.join(ROOT, "cutlass_nn", filename)
    name = "_cutlass_nn_" + os.path.splitext(filename)[0].lstrip("_")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up in sys.modules
    spec.loader.exec_module(module)
    return module


build_config = load_by_path("_build_config.py")
object_cache = load_by_path("_object_cache.py")


def sources_and_cached_objects(config) -> tuple[list[str], list[str]]:
    """The sources to compile and the objects to link: with ``CUTLASS_NN_OBJECT_CACHE`` set, the
    units whose inputs are unchanged come from that cache (cutlass_nn/_object_cache.py). Every
    build writes the cache's run record first, so that its objects can be saved afterwards."""
    debug = "--debug" in sys.argv or "-g" in sys.argv
    print_ = object_cache.begin_build(config, cpp_extension.CUDA_HOME, debug, log=build_config.log)
    archive = os.environ.get("CUTLASS_NN_OBJECT_CACHE")
    if not archive:
        return config.sources, []
    return object_cache.restore(config, archive, print_, log=build_config.log)


def read_version() -> str:
    scope: dict = {}
    with open(os.path.join(ROOT, "cutlass_nn", "_version.py")) as f:
        exec(f.read(), scope)
    return scope["__version__"]


def make_extension():
    try:
        config = build_config.extension_config(log=build_config.log)
    except build_config.BuildConfigError as exc:
        sys.exit(str(exc))
    sources, cached_objects = sources_and_cached_objects(config)
    if not config.with_cuda:
        return cpp_extension.CppExtension(
            "cutlass_nn._C",
            sources,
            extra_objects=cached_objects,
            define_macros=config.define_macros,
            extra_compile_args={"cxx": config.cxx_flags},
            py_limited_api=True,
        )
    return cpp_extension.CUDAExtension(
        "cutlass_nn._C",
        sources,
        extra_objects=cached_objects,
        include_dirs=config.include_dirs,
        define_macros=config.define_macros,
        extra_compile_args={"cxx": config.cxx_flags, "nvcc": config.nvcc_flags},
        py_limited_api=True,
    )


setup(
    name="cutlass_nn",
    version=read_version(),
    packages=find_packages(include=["cutlass_nn", "cutlass_nn.*"]),
    ext_modules=[make_extension()],
    cmdclass={"build_ext": cpp_extension.BuildExtension},
    options={"bdist_wheel": {"py_limited_api": "cp310"}},
)
