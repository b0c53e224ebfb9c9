"""How cutlass_nn's extension is built: the one source of truth for every way to build it.

``setup.py`` (setuptools, the primary build) and :mod:`cutlass_nn.jit` (``torch.utils.cpp_extension.load``)
both describe the extension with :func:`extension_config`: the flavor (CPU or CUDA), the source
files, the preprocessor defines, the include directories and the compiler flags. Change the build
here, and every way to build it follows.

This module needs torch but never the compiled extension, and it does not import the
``cutlass_nn`` package: ``setup.py`` loads it by file path (before anything is built), and
:mod:`cutlass_nn.jit` imports it while ``cutlass_nn`` itself is still being imported.

The flavor is decided from the installed torch and toolkit -- never from
``torch.cuda.is_available()`` (a build machine needs no GPU):

* CPU flavor: torch is a CPU build, or no CUDA toolkit (nvcc) is found, or
  ``CUTLASS_NN_CUDA_ARCHS=none``. Only the CPU implementations are compiled.
* CUDA flavor: torch is a CUDA build and ``CUDA_HOME`` holds nvcc. The CPU implementations plus the
  CUDA bindings and CUTLASS kernels are compiled.

Build knobs (environment variables): ``CUTLASS_NN_CUDA_ARCHS``, ``CUTLASS_NN_KERNEL_SET``,
``CUTLASS_DIR`` (read here) and ``MAX_JOBS`` (read by torch). See README.md, 'Build knobs'.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch.utils import cpp_extension

#: The source checkout: the folder holding ``setup.py``, ``csrc/`` and ``cutlass_nn/``.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CUTLASS_PIN = "nvidia-cutlass==4.2.0.0"
DEFAULT_ARCHS = "90a;80"

Log = Callable[[str], None]


class BuildConfigError(RuntimeError):
    """The build cannot be configured (bad knob, missing CUTLASS headers); the message says why
    and what to do. ``setup.py`` exits with it; :mod:`cutlass_nn.jit` raises it."""


def log(msg: str) -> None:
    """The build log line of setup.py: ``cutlass_nn build: <msg>``."""
    print(f"cutlass_nn build: {msg}", flush=True)


@dataclass
class ExtensionConfig:
    """Everything needed to compile the extension, independent of the build tool.

    Source paths are relative to :data:`ROOT` (setuptools wants them so); :meth:`abs_sources`
    gives absolute ones.
    """

    with_cuda: bool
    archs: list[str]
    sources: list[str]
    define_macros: list[tuple[str, str]]
    cxx_flags: list[str]
    nvcc_flags: list[str] = field(default_factory=list)
    include_dirs: list[str] = field(default_factory=list)

    @property
    def flavor(self) -> str:
        return "cuda" if self.with_cuda else "cpu"

    def abs_sources(self) -> list[str]:
        return [os.path.join(ROOT, s) for s in self.sources]


def parse_archs(spec: str) -> list[str]:
    archs = [a.strip() for a in spec.replace(",", ";").split(";") if a.strip()]
    for arch in archs:
        if not arch.rstrip("a").isdigit():
            raise BuildConfigError(
                f"cutlass_nn: CUTLASS_NN_CUDA_ARCHS entry {arch!r} is not like '90a' or '80'"
            )
    return archs


def gencode_flags(archs: list[str]) -> list[str]:
    """SASS for each arch; PTX of the lowest plain arch too, so newer GPUs can JIT it."""
    flags = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
    plain = sorted((a for a in archs if not a.endswith("a")), key=int)
    if plain:
        flags.append(f"-gencode=arch=compute_{plain[0]},code=compute_{plain[0]}")
    return flags


def find_cutlass(log: Log = log) -> tuple[list[str], str]:
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
            raise BuildConfigError(
                "cutlass_nn: the CUDA build needs the CUTLASS headers, and neither CUTLASS_DIR is "
                f"set nor the '{CUTLASS_PIN}' package installed. Run `pip install {CUTLASS_PIN}` "
                "(or set CUTLASS_DIR to a CUTLASS checkout), or build the CPU flavor with "
                "CUTLASS_NN_CUDA_ARCHS=none."
            ) from None
        base = os.path.join(os.path.dirname(cutlass_library.__file__), "source")
        include = os.path.join(base, "include")
        util = os.path.join(base, "tools", "util", "include")
        source = f"{CUTLASS_PIN} at {base}"
    version_h = os.path.join(include, "cutlass", "version.h")
    if not os.path.isfile(version_h):
        raise BuildConfigError(
            f"cutlass_nn: no CUTLASS headers at {include} (from {source}): missing {version_h}"
        )
    parts = {}
    with open(version_h) as f:
        for line in f:
            for key in ("MAJOR", "MINOR", "PATCH"):
                if line.startswith(f"#define CUTLASS_{key} "):
                    parts[key] = line.split()[2]
    version = ".".join(parts.get(k, "?") for k in ("MAJOR", "MINOR", "PATCH"))
    log(f"CUTLASS {version} headers from {source}")
    return [include, util], version


def choose_flavor(log: Log = log) -> tuple[bool, list[str]]:
    """(with_cuda, archs): the CUDA flavor when torch is a CUDA build and nvcc is found."""
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
    """The C++ standard of torch's own build: C++20 from torch 2.14 on (its headers require
    it), C++17 before. The torch-free CUDA kernels are compiled by nvcc as C++17 either way.
    """
    major, minor = (int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
    return "-std=c++20" if (major, minor) >= (2, 14) else "-std=c++17"


KERNEL_SETS = ("full", "ci")
SUBSET_LIST = os.path.join(ROOT, "csrc", "kernels", "generated", "kernel_subset.txt")


def choose_kernel_set(log: Log = log) -> str:
    """``CUTLASS_NN_KERNEL_SET``: ``full`` (default) compiles every generated GEMM kernel;
    ``ci`` only the representative set of ``csrc/kernels/generated/kernel_subset.txt`` (one
    kernel per family; the other dtypes / layouts then run on other, slower kernels) and of the
    FP8 GEMM units, :data:`FP8_CI_UNITS` (the FP8 problems of the units left out then find no
    kernel): a proof that
    each kernel family compiles and links, for a CI machine, not a build to run models with."""
    kernel_set = os.environ.get("CUTLASS_NN_KERNEL_SET", "full").strip() or "full"
    if kernel_set not in KERNEL_SETS:
        raise BuildConfigError(
            f"CUTLASS_NN_KERNEL_SET must be one of {', '.join(KERNEL_SETS)}, got {kernel_set!r}"
        )
    if kernel_set == "ci":
        log("CUTLASS_NN_KERNEL_SET=ci: compiling the representative GEMM kernels only (one per "
            "family; not a build for real work)")
    return kernel_set


#: The FP8 GEMM units (hand-written, ``csrc/kernels/fp8_gemm_sm90_*.cu``) that
#: ``CUTLASS_NN_KERNEL_SET=ci`` compiles: one per FP8 kernel family -- the mainloop whose
#: promotions overlap the tensor cores, which the per-shape rule runs (cooperative, ping-pong and
#: stream-K tiles), for an e4m3 A (forward) and an e5m2 A (the gradients' mixed-format
#: tensor-core instruction); CUTLASS's fast-accumulation mainloop; CUTLASS's own mainloop, with
#: the float32 output (both A formats). The units left out repeat these code paths with another
#: tile, scheduler or output (CUTLASS's mainloop on ping-pong, stream-K and 128x192 tiles with a
#: bf16 output); the full set compiles them, and ``fp8_gemm_dispatch.cu`` leaves their rows out
#: under ``CUTLASS_NN_KERNEL_SUBSET``. Each unit is a CUTLASS SM90 kernel to compile, the
#: slowest units of the build: keeping all eleven took the CI build past its time bound.
FP8_CI_UNITS = (
    "fp8_gemm_sm90_e4m3_bf16_overlapped.cu",
    "fp8_gemm_sm90_e5m2_bf16_overlapped.cu",
    "fp8_gemm_sm90_e4m3_bf16_fastaccum.cu",
    "fp8_gemm_sm90_e4m3_f32.cu",
    "fp8_gemm_sm90_e5m2_f32.cu",
)
FP8_UNIT_GLOB = os.path.join("kernels", "fp8_gemm_sm90_*.cu")


def subset_sources() -> set[str]:
    with open(SUBSET_LIST) as f:
        names = [line.strip() for line in f if line.strip() and not line.startswith("#")]
    return {os.path.join("csrc", "kernels", "generated", n) for n in names}


def relative(paths: list[str]) -> list[str]:
    return sorted(os.path.relpath(p, ROOT) for p in paths)


def _sources(*patterns: str) -> list[str]:
    out: list[str] = []
    for pattern in patterns:
        out += relative(glob.glob(os.path.join(ROOT, "csrc", pattern)))
    return out


def extension_config(log: Log = log) -> ExtensionConfig:
    """The flavor, sources, defines, include dirs and flags of ``cutlass_nn._C``.

    Logs its decisions through ``log`` (setup.py's ``cutlass_nn build: ...`` lines by default).
    Raises :class:`BuildConfigError` when the build cannot be configured.
    """
    with_cuda, archs = choose_flavor(log)
    sources = _sources(
        "*.cpp",
        os.path.join("cpu", "*.cpp"),
        os.path.join("autograd", "*.cpp"),
        os.path.join("autocast", "*.cpp"),
    )
    defines = [
        # Python's limited API at CPython 3.10: the value torch's BuildExtension also adds (its
        # minimum), so the two definitions agree; the JIT build gets it from here alone.
        ("Py_LIMITED_API", "0x030A0000"),
        ("CUTLASS_NN_TORCH_VERSION", f'"{torch.__version__}"'),
    ]
    cxx_flags = ["-O3", cxx_standard()]
    if not with_cuda:
        defines.append(("CUTLASS_NN_FLAVOR", '"cpu"'))
        return ExtensionConfig(False, [], sources, defines, cxx_flags)

    include_dirs, cutlass_version = find_cutlass(log)
    kernel_set = choose_kernel_set(log)
    generated = _sources(os.path.join("kernels", "generated", "*.cu"))
    hand_written = _sources(
        os.path.join("cuda", "*.cpp"),
        os.path.join("cuda", "*.cu"),
        os.path.join("kernels", "*.cu"),
    )
    if kernel_set == "ci":
        keep = subset_sources()
        generated = [s for s in generated if s in keep]
        fp8_units = set(_sources(FP8_UNIT_GLOB))
        fp8_kept = {os.path.join("csrc", "kernels", name) for name in FP8_CI_UNITS}
        hand_written = [s for s in hand_written if s not in fp8_units or s in fp8_kept]
    sources += hand_written + generated
    defines += [
        ("CUTLASS_NN_FLAVOR", '"cuda"'),
        ("CUTLASS_NN_WITH_CUDA", "1"),
        ("CUTLASS_NN_CUDA_ARCHS", f'"{";".join(archs)}"'),
        ("CUTLASS_NN_CUTLASS_VERSION", f'"{cutlass_version}"'),
        ("CUTLASS_NN_KERNEL_SET", f'"{kernel_set}"'),
    ]
    if kernel_set == "ci":
        defines.append(("CUTLASS_NN_KERNEL_SUBSET", "1"))
    if "90a" in archs:
        defines.append(("CUTLASS_NN_HAS_SM90", "1"))
    nvcc_flags = [
        "-O3",
        "-std=c++17",
        "-DNDEBUG",  # CUTLASS kernels lose most of their speed with assertions compiled in
        # CUTLASS's SM90 kernels then wait (griddepcontrol.wait) before their first global-memory
        # access and signal their dependents early: required by the PDL launches
        # (csrc/kernels/launch_settings.h), and the same in every unit (one kernel, one body).
        "-DCUTLASS_ENABLE_GDC_FOR_SM90",
        "--expt-relaxed-constexpr",
        "--expt-extended-lambda",
        "-U__CUDA_NO_HALF_OPERATORS__",
        "-U__CUDA_NO_HALF_CONVERSIONS__",
        "-U__CUDA_NO_BFLOAT16_OPERATORS__",
        "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
        *gencode_flags(archs),
    ]
    return ExtensionConfig(
        True,
        archs,
        sources,
        defines,
        cxx_flags,
        nvcc_flags,
        include_dirs=[os.path.join(ROOT, "csrc", "kernels"), *include_dirs],
    )
