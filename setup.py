"""Build script of cutlass_nn: one extension, ``cutlass_nn._C``.

The flavor is decided here, at build time, from the installed torch and toolkit -- never from
``torch.cuda.is_available()`` (a build machine needs no GPU):

* CPU flavor: torch is a CPU build, or no CUDA toolkit (nvcc) is found, or
  ``CUTLASS_NN_CUDA_ARCHS=none``. Only the CPU implementations are compiled.
* CUDA flavor: torch is a CUDA build and ``CUDA_HOME`` holds nvcc. The CPU implementations plus the
  CUDA bindings and CUTLASS kernels are compiled.

Environment knobs (the only three):

* ``CUTLASS_NN_CUDA_ARCHS``: ``;``-separated GPU architectures, default ``90a;80``; ``none``
  forces the CPU flavor.
* ``MAX_JOBS``: parallel compile jobs (torch's knob; each CUTLASS job needs ~3.5 GB of RAM).
* ``CUTLASS_DIR``: a CUTLASS source tree (holding ``include/cutlass``) to use instead of the
  headers of the pinned ``nvidia-cutlass`` PyPI package.

Install with ``pip install --no-build-isolation .``: the extension must be compiled against the
torch that is installed, not a copy pip would fetch into an isolated build environment.
"""

from __future__ import annotations

import glob
import os
import sys

from setuptools import find_packages, setup

try:
    import torch
    from torch.utils import cpp_extension
except ImportError:  # pragma: no cover - explained to the user
    sys.exit(
        "cutlass_nn: torch is not importable in the build environment. Install torch first, then "
        "build with `pip install --no-build-isolation .` so the build uses that torch."
    )

ROOT = os.path.dirname(os.path.abspath(__file__))
CUTLASS_PIN = "nvidia-cutlass==4.2.0.0"
DEFAULT_ARCHS = "90a;80"


def log(msg: str) -> None:
    print(f"cutlass_nn build: {msg}", flush=True)


def read_version() -> str:
    scope: dict = {}
    with open(os.path.join(ROOT, "cutlass_nn", "_version.py")) as f:
        exec(f.read(), scope)
    return scope["__version__"]


def parse_archs(spec: str) -> list[str]:
    archs = [a.strip() for a in spec.replace(",", ";").split(";") if a.strip()]
    for arch in archs:
        if not arch.rstrip("a").isdigit():
            sys.exit(f"cutlass_nn: CUTLASS_NN_CUDA_ARCHS entry {arch!r} is not like '90a' or '80'")
    return archs


def gencode_flags(archs: list[str]) -> list[str]:
    """SASS for each arch; PTX of the lowest plain arch too, so newer GPUs can JIT it."""
    flags = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
    plain = sorted(a for a in archs if not a.endswith("a"))
    if plain:
        flags.append(f"-gencode=arch=compute_{plain[0]},code=compute_{plain[0]}")
    return flags


def find_cutlass() -> tuple[list[str], str]:
    """Include dirs and version of CUTLASS: $CUTLASS_DIR, else the nvidia-cutlass package."""
    cutlass_dir = os.environ.get("CUTLASS_DIR")
    if cutlass_dir:
        include = os.path.join(cutlass_dir, "include")
        util = os.path.join(cutlass_dir, "tools", "util", "include")
        source = f"CUTLASS_DIR={cutlass_dir}"
    else:
        try:
            import cutlass_library
        except ImportError:
            sys.exit(
                "cutlass_nn: the CUDA build needs the CUTLASS headers, and neither CUTLASS_DIR is "
                f"set nor the '{CUTLASS_PIN}' package installed. Run `pip install {CUTLASS_PIN}` "
                "(or set CUTLASS_DIR to a CUTLASS checkout), or build the CPU flavor with "
                "CUTLASS_NN_CUDA_ARCHS=none."
            )
        base = os.path.join(os.path.dirname(cutlass_library.__file__), "source")
        include = os.path.join(base, "include")
        util = os.path.join(base, "tools", "util", "include")
        source = f"{CUTLASS_PIN} at {base}"
    version_h = os.path.join(include, "cutlass", "version.h")
    if not os.path.isfile(version_h):
        sys.exit(f"cutlass_nn: no CUTLASS headers at {include} (from {source}): missing {version_h}")
    parts = {}
    with open(version_h) as f:
        for line in f:
            for key in ("MAJOR", "MINOR", "PATCH"):
                if line.startswith(f"#define CUTLASS_{key} "):
                    parts[key] = line.split()[2]
    version = ".".join(parts.get(k, "?") for k in ("MAJOR", "MINOR", "PATCH"))
    log(f"CUTLASS {version} headers from {source}")
    return [include, util], version


def choose_flavor() -> tuple[bool, list[str]]:
    spec = os.environ.get("CUTLASS_NN_CUDA_ARCHS", DEFAULT_ARCHS)
    if spec.strip().lower() == "none":
        log("building the CPU-only flavor (CUTLASS_NN_CUDA_ARCHS=none)")
        return False, []
    if torch.version.cuda is None:
        log(f"building the CPU-only flavor (torch {torch.__version__} is a CPU build)")
        return False, []
    if cpp_extension.CUDA_HOME is None or not os.path.exists(
        os.path.join(cpp_extension.CUDA_HOME, "bin", "nvcc")
    ):
        log("building the CPU-only flavor (no nvcc found: set CUDA_HOME to a CUDA toolkit)")
        return False, []
    archs = parse_archs(spec)
    log(
        f"building the CUDA flavor for archs {';'.join(archs)} "
        f"(torch {torch.__version__}, CUDA_HOME={cpp_extension.CUDA_HOME})"
    )
    return True, archs


def cxx_standard() -> str:
    """The C++ standard torch's own headers expect: C++20 from torch 2.14 on, C++17 before.

    Compiling the bindings under another standard than torch was built with changes the layout
    of c10 types that cross the library boundary: a c10::ValueError built under C++20 and
    raised through a torch 2.11 library crashed the process. (The torch-free CUDA kernels are
    compiled by nvcc as C++17 either way.)
    """
    major, minor = (int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
    return "-std=c++20" if (major, minor) >= (2, 14) else "-std=c++17"


def relative(paths: list[str]) -> list[str]:
    return sorted(os.path.relpath(p, ROOT) for p in paths)


def make_extension():
    with_cuda, archs = choose_flavor()
    cpp_sources = relative(glob.glob(os.path.join(ROOT, "csrc", "*.cpp")))
    cpp_sources += relative(glob.glob(os.path.join(ROOT, "csrc", "cpu", "*.cpp")))
    defines = [
        ("Py_LIMITED_API", "0x03090000"),
        ("CUTLASS_NN_TORCH_VERSION", f'"{torch.__version__}"'),
    ]
    cxx_flags = ["-O3", cxx_standard()]
    if not with_cuda:
        defines.append(("CUTLASS_NN_FLAVOR", '"cpu"'))
        return cpp_extension.CppExtension(
            "cutlass_nn._C",
            cpp_sources,
            define_macros=defines,
            extra_compile_args={"cxx": cxx_flags},
            py_limited_api=True,
        )

    include_dirs, cutlass_version = find_cutlass()
    cuda_sources = relative(glob.glob(os.path.join(ROOT, "csrc", "cuda", "*.cpp")))
    cuda_sources += relative(glob.glob(os.path.join(ROOT, "csrc", "cuda", "*.cu")))
    cuda_sources += relative(glob.glob(os.path.join(ROOT, "csrc", "kernels", "*.cu")))
    cuda_sources += relative(glob.glob(os.path.join(ROOT, "csrc", "kernels", "generated", "*.cu")))
    defines += [
        ("CUTLASS_NN_FLAVOR", '"cuda"'),
        ("CUTLASS_NN_WITH_CUDA", "1"),
        ("CUTLASS_NN_CUDA_ARCHS", f'"{";".join(archs)}"'),
        ("CUTLASS_NN_CUTLASS_VERSION", f'"{cutlass_version}"'),
    ]
    if "90a" in archs:
        defines.append(("CUTLASS_NN_HAS_SM90", "1"))
    nvcc_flags = [
        "-O3",
        "-std=c++17",
        "-DNDEBUG",  # CUTLASS kernels lose most of their speed with assertions compiled in
        "--expt-relaxed-constexpr",
        "--expt-extended-lambda",
        "-U__CUDA_NO_HALF_OPERATORS__",
        "-U__CUDA_NO_HALF_CONVERSIONS__",
        "-U__CUDA_NO_BFLOAT16_OPERATORS__",
        "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
        *gencode_flags(archs),
    ]
    return cpp_extension.CUDAExtension(
        "cutlass_nn._C",
        cpp_sources + cuda_sources,
        include_dirs=[os.path.join(ROOT, "csrc", "kernels"), *include_dirs],
        define_macros=defines,
        extra_compile_args={"cxx": cxx_flags, "nvcc": nvcc_flags},
        py_limited_api=True,
    )


setup(
    name="cutlass_nn",
    version=read_version(),
    packages=find_packages(include=["cutlass_nn", "cutlass_nn.*"]),
    ext_modules=[make_extension()],
    cmdclass={"build_ext": cpp_extension.BuildExtension},
    options={"bdist_wheel": {"py_limited_api": "cp39"}},
)
