"""The build decisions of cutlass_nn/_build_config.py (shared by setup.py and the JIT build):
flavor choice, architecture flags, CUTLASS header lookup and the C++ standard."""

from __future__ import annotations

import sys

import pytest
import torch
from torch.utils import cpp_extension

from cutlass_nn import _build_config as bc


@pytest.fixture
def logged():
    lines: list[str] = []
    return lines


def test_archs_none_forces_the_cpu_flavor(monkeypatch, logged):
    monkeypatch.setenv("CUTLASS_NN_CUDA_ARCHS", "none")
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    assert bc.choose_flavor(logged.append) == (False, [])
    assert logged == ["building the CPU-only flavor (CUTLASS_NN_CUDA_ARCHS=none)"]


def test_cpu_torch_gives_the_cpu_flavor(monkeypatch, logged):
    monkeypatch.delenv("CUTLASS_NN_CUDA_ARCHS", raising=False)
    monkeypatch.setattr(torch.version, "cuda", None)
    assert bc.choose_flavor(logged.append) == (False, [])
    assert "is a CPU build" in logged[0]


def test_cuda_torch_without_nvcc_gives_the_cpu_flavor(monkeypatch, tmp_path, logged):
    monkeypatch.delenv("CUTLASS_NN_CUDA_ARCHS", raising=False)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", str(tmp_path))  # no bin/nvcc there
    assert bc.choose_flavor(logged.append) == (False, [])
    assert "no nvcc found" in logged[0]


def test_cuda_torch_with_nvcc_gives_the_cuda_flavor(monkeypatch, tmp_path, logged):
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "nvcc").write_text("")
    monkeypatch.delenv("CUTLASS_NN_CUDA_ARCHS", raising=False)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", str(tmp_path))
    assert bc.choose_flavor(logged.append) == (True, ["90a", "80"])
    assert logged[0].startswith("building the CUDA flavor for archs 90a;80")


def test_bad_arch_is_refused():
    with pytest.raises(bc.BuildConfigError, match="entry 'sm_90' is not like '90a' or '80'"):
        bc.parse_archs("sm_90;80")


def test_gencode_flags_embed_ptx_of_the_lowest_plain_arch():
    flags = bc.gencode_flags(["90a", "100", "80"])
    assert "-gencode=arch=compute_90a,code=sm_90a" in flags
    assert "-gencode=arch=compute_100,code=sm_100" in flags
    assert "-gencode=arch=compute_80,code=sm_80" in flags
    assert flags[-1] == "-gencode=arch=compute_80,code=compute_80"


def _fake_cutlass(root, version=("4", "2", "0")):
    include = root / "include" / "cutlass"
    include.mkdir(parents=True)
    (include / "version.h").write_text(
        "".join(f"#define CUTLASS_{k} {v}\n" for k, v in zip(("MAJOR", "MINOR", "PATCH"), version))
    )


def test_cutlass_dir_is_used_and_its_version_read(monkeypatch, tmp_path, logged):
    _fake_cutlass(tmp_path, ("4", "3", "1"))
    monkeypatch.setenv("CUTLASS_DIR", str(tmp_path))
    includes, version = bc.find_cutlass(logged.append)
    assert version == "4.3.1"
    assert includes[0] == str(tmp_path / "include")
    assert f"CUTLASS_DIR={tmp_path}" in logged[0]


def test_cutlass_dir_without_headers_says_what_is_missing(monkeypatch, tmp_path):
    monkeypatch.setenv("CUTLASS_DIR", str(tmp_path))
    with pytest.raises(bc.BuildConfigError, match="no CUTLASS headers at .*missing .*version.h"):
        bc.find_cutlass(lambda msg: None)


def test_missing_cutlass_package_says_how_to_get_it(monkeypatch):
    monkeypatch.delenv("CUTLASS_DIR", raising=False)
    monkeypatch.setitem(sys.modules, "cutlass_library", None)  # makes the import fail
    with pytest.raises(bc.BuildConfigError) as info:
        bc.find_cutlass(lambda msg: None)
    message = str(info.value)
    assert "pip install nvidia-cutlass==4.2.0.0" in message
    assert "CUTLASS_DIR" in message and "CUTLASS_NN_CUDA_ARCHS=none" in message


@pytest.mark.parametrize(
    "version,flag",
    [("2.11.0+cu130", "-std=c++17"), ("2.13.0+cpu", "-std=c++17"), ("2.14.1", "-std=c++20")],
)
def test_cxx_standard_follows_torch(monkeypatch, version, flag):
    monkeypatch.setattr(torch, "__version__", version)
    assert bc.cxx_standard() == flag


def test_kernel_set_defaults_to_full_and_refuses_unknown_sets(monkeypatch, logged):
    monkeypatch.delenv("CUTLASS_NN_KERNEL_SET", raising=False)
    assert bc.choose_kernel_set(logged.append) == "full" and logged == []
    monkeypatch.setenv("CUTLASS_NN_KERNEL_SET", "some")
    with pytest.raises(bc.BuildConfigError, match="CUTLASS_NN_KERNEL_SET must be one of full, ci, got 'some'"):
        bc.choose_kernel_set(logged.append)


def _cuda_config(monkeypatch, tmp_path, kernel_set):
    (tmp_path / "bin").mkdir(exist_ok=True)
    (tmp_path / "bin" / "nvcc").write_text("")
    monkeypatch.delenv("CUTLASS_NN_CUDA_ARCHS", raising=False)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", str(tmp_path))
    monkeypatch.setattr(bc, "find_cutlass", lambda log: ([str(tmp_path)], "4.2.0"))
    monkeypatch.setenv("CUTLASS_NN_KERNEL_SET", kernel_set)
    return bc.extension_config(lambda msg: None)


def test_ci_kernel_set_compiles_one_kernel_per_family(monkeypatch, tmp_path):
    """CUTLASS_NN_KERNEL_SET=ci keeps every hand-written source and, of the generated kernels,
    the subset list (one per family, every family present); the registry leaves out exactly the
    rows of the kernels it does not compile."""
    import pathlib
    import re
    import sys as _sys

    full = _cuda_config(monkeypatch, tmp_path, "full")
    ci = _cuda_config(monkeypatch, tmp_path, "ci")
    gen = "csrc/kernels/generated/"
    full_gen = {s for s in full.sources if s.startswith(gen)}
    ci_gen = {s for s in ci.sources if s.startswith(gen)}
    assert ci_gen < full_gen and f"{gen}fallback_all.cu" in ci_gen
    # every file of the list exists (a listed file the glob does not find would be a silent gap)
    assert {f"{gen}{n}" for n in open(bc.SUBSET_LIST).read().split() if not n.startswith("#")
            and n.endswith(".cu")} == ci_gen
    # hand-written sources: all of them, but for the FP8 GEMM units outside FP8_CI_UNITS
    fp8 = "csrc/kernels/fp8_gemm_sm90_"
    assert {s for s in full.sources if not s.startswith((gen, fp8))} == {
        s for s in ci.sources if not s.startswith((gen, fp8))}
    assert ("CUTLASS_NN_KERNEL_SUBSET", "1") in ci.define_macros
    assert ("CUTLASS_NN_KERNEL_SET", '"ci"') in ci.define_macros
    assert all(name != "CUTLASS_NN_KERNEL_SUBSET" for name, _ in full.define_macros)

    root = pathlib.Path(bc.ROOT)
    _sys.path.insert(0, str(root / "scripts"))
    try:
        import generate_kernels as gk
    finally:
        _sys.path.remove(str(root / "scripts"))
    kernels = gk.kernel_list()
    families = {gk.family_key(k) for k in kernels}
    kept = {k for k in kernels if f"{gen}{k.name}.cu" in ci_gen}
    assert {gk.family_key(k) for k in kept} | {gk.family_key(k) for k in kernels
                                                if k.family == "kFallback"} == families
    assert len({gk.family_key(k) for k in kept}) == len(kept)  # one per family
    # the grouping itself: every SM90 schedule of the configuration table is compiled, and the
    # SM90 kernels kept have both K-major ("tn") and MN-major ("nt") operands
    sm90 = [k for k in kept if k.family == "kSm90TmaWs"]
    assert {gk.sm90_schedule(k.config) for k in sm90} == {
        gk.sm90_schedule(c) for c in gk.SM90_CONFIG_NAMES}
    assert {"coop", "pingpong", "coop_streamk", "pingpong_swapab", "coop_promoted"} <= {
        gk.sm90_schedule(k.config) for k in sm90}
    assert {"tn", "nt"} <= {k.layout for k in sm90}
    assert {k.epilogue for k in sm90} == {k.epilogue for k in kernels if k.family == "kSm90TmaWs"}
    # registry rows compiled in subset mode = the kept kernels + the fallbacks
    registry = (root / gen / "kernel_registry.inc").read_text()
    rows = re.findall(r'(#if ([^\n]*)\n)?CUTLASS_NN_KERNEL\([^\n]*"([^"]+)"\)', registry)
    in_subset = {name for _, cond, name in rows if "!defined(CUTLASS_NN_KERNEL_SUBSET)" not in cond}
    assert in_subset == {k.name for k in kept} | {k.name for k in kernels if k.family == "kFallback"}


def _fp8_instantiations(path) -> set[tuple[str, str, int]]:
    """(A format, output dtype, config) of each ``fp8_gemm_launch`` a unit instantiates."""
    import re

    text = open(path).read()
    return {(a, d, int(c)) for a, d, c in re.findall(
        r"template GemmStatus fp8_gemm_launch<Fp8Format::(\w+), DType::(\w+), (\d+)>", text)}


def _fp8_table_rows(table: str) -> list[tuple[tuple[str, str, int], bool]]:
    """((A format, output dtype, config), guarded) of each row of fp8_gemm_dispatch.cu's kernel
    table; guarded: inside an ``#if !defined(CUTLASS_NN_KERNEL_SUBSET)`` region (up to its
    ``#endif``), so left out of the CI kernel set."""
    import re

    body = table[table.index("constexpr Fp8Kernel kKernels[] = {"):]
    body = body[:body.index("\n};")]
    rows, guarded = [], False
    for line in body.splitlines():
        if line.startswith("#if"):
            assert line == "#if !defined(CUTLASS_NN_KERNEL_SUBSET)", line
            guarded = True
        elif line.startswith("#endif"):
            guarded = False
        elif m := re.match(r"    \{Fp8Format::(\w+), DType::(\w+), (\d+),", line):
            rows.append(((m.group(1), m.group(2), int(m.group(3))), guarded))
    return rows


def test_ci_kernel_set_compiles_one_fp8_unit_per_family(monkeypatch, tmp_path):
    """The CI set keeps the FP8 GEMM units of FP8_CI_UNITS only, every one of which exists, and
    covers each FP8 family: the overlapped-promotion mainloop the rule runs (cooperative,
    ping-pong and stream-K tiles) for both A formats with a bf16 output, fast accumulation, and
    CUTLASS's own mainloop with float32 output. The dispatch table's rows compiled in subset mode
    are exactly the kept units' kernels (a row of a unit left out would not link; a kept kernel
    without a row never runs), and the full set has one row for every kernel of every unit."""
    import pathlib

    full = _cuda_config(monkeypatch, tmp_path, "full")
    ci = _cuda_config(monkeypatch, tmp_path, "ci")
    prefix = "csrc/kernels/fp8_gemm_sm90_"
    full_fp8 = {s for s in full.sources if s.startswith(prefix)}
    ci_fp8 = {s for s in ci.sources if s.startswith(prefix)}
    assert ci_fp8 == {f"csrc/kernels/{name}" for name in bc.FP8_CI_UNITS}
    assert ci_fp8 < full_fp8 and len(full_fp8) == 11

    root = pathlib.Path(bc.ROOT)
    kept = set().union(*(_fp8_instantiations(root / s) for s in ci_fp8))
    every = set().union(*(_fp8_instantiations(root / s) for s in full_fp8))
    # configs (fp8_gemm_dispatch.cu's kConfigNames): 0 CUTLASS's mainloop, cooperative; 2 fast
    # accumulation; 5 / 6 / 7 overlapped promotions, cooperative / ping-pong / stream-K
    for a in ("kE4M3", "kE5M2"):
        assert {(a, "kBFloat16", c) for c in (5, 6, 7)} <= kept
        assert (a, "kFloat32", 0) in kept
    assert ("kE4M3", "kBFloat16", 2) in kept

    rows = _fp8_table_rows((root / "csrc/kernels/fp8_gemm_dispatch.cu").read_text())
    keys = [key for key, _ in rows]
    assert len(keys) == len(set(keys)) == len(every) == 17
    assert set(keys) == every
    assert {key for key, guarded in rows if not guarded} == kept
