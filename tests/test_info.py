"""`python -m cutlass_nn.info`, build_info() and the version."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import torch

import cutlass_nn

REPO = Path(__file__).resolve().parents[1]


def test_info_cli():
    proc = subprocess.run(
        [sys.executable, "-m", "cutlass_nn.info"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    info = cutlass_nn.build_info()
    assert re.search(rf"^cutlass_nn {re.escape(cutlass_nn.__version__)}$", out, re.M), out
    assert re.search(rf"^build flavor: {info['flavor']}$", out, re.M), out
    assert re.search(r"^compiled GPU architectures: .+$", out, re.M), out
    assert re.search(r"^CUTLASS version: .+$", out, re.M), out
    assert re.search(r"^GEMM kernel set: .+$", out, re.M), out
    assert re.search(
        rf"^torch: {re.escape(torch.__version__)} \(extension built against "
        rf"{re.escape(info['torch_version'])}\)$",
        out,
        re.M,
    ), out
    assert re.search(r"^torch CUDA: .+$", out, re.M), out
    if info["flavor"] == "cpu":
        assert "compiled GPU architectures: (none: CPU-only build)" in out
        assert "CUTLASS version: (not used by the CPU flavor)" in out


def test_build_info():
    info = cutlass_nn.build_info()
    assert set(info) >= {"flavor", "cuda_archs", "cutlass_version", "torch_version", "kernel_set"}
    assert info["flavor"] in ("cpu", "cuda")
    assert cutlass_nn.has_cuda_kernels() == (info["flavor"] == "cuda")
    if info["flavor"] == "cpu":
        assert info["cuda_archs"] == "" and info["kernel_set"] == ""
    else:
        assert info["cuda_archs"] and info["cutlass_version"]
        assert info["kernel_set"] in ("full", "ci")
    # the extension must have been built against the running torch (same ABI)
    assert info["torch_version"].split("+")[0] == torch.__version__.split("+")[0]


def test_programmatic_launch_switch():
    """The PDL switch of the SM90 GEMMs: on by default in the CUDA flavor (unless
    CUTLASS_NN_PDL=0), never in the CPU flavor; the context manager restores the setting."""
    import os

    ops = cutlass_nn.ops
    before = ops.programmatic_launch_enabled()
    if cutlass_nn.build_info()["flavor"] == "cpu":
        assert before is False
    else:
        assert before is (os.environ.get("CUTLASS_NN_PDL") != "0")
    with ops.programmatic_launch(False):
        assert ops.programmatic_launch_enabled() is False
    assert ops.programmatic_launch_enabled() is before
    with ops.programmatic_launch(True):
        assert ops.programmatic_launch_enabled() is (cutlass_nn.build_info()["flavor"] == "cuda")
    assert ops.programmatic_launch_enabled() is before


def test_programmatic_launch_enabled_only_reads(monkeypatch):
    """Reading the PDL setting never writes it: a set-and-restore would let a launch on
    another thread (autograd's backward thread) run with the wrong setting in between."""
    ops = cutlass_nn.ops
    writes = []
    real_set = ops._ops._set_programmatic_launch

    def recording_set(enable):
        writes.append(enable)
        return real_set(enable)

    monkeypatch.setattr(ops._ops, "_set_programmatic_launch", recording_set)
    with ops.programmatic_launch(False):
        assert ops.programmatic_launch_enabled() is False
    assert len(writes) == 2  # the context manager's set and restore, nothing from the reads
    assert ops.programmatic_launch_enabled() is (writes[-1] and cutlass_nn.build_info()["flavor"] == "cuda")
    assert len(writes) == 2


def test_version():
    ns: dict = {}
    exec((REPO / "cutlass_nn" / "_version.py").read_text(), ns)
    assert cutlass_nn.__version__ == ns["__version__"]
    assert re.fullmatch(r"\d+\.\d+\.\d+([.+-]?[0-9A-Za-z.]+)?", cutlass_nn.__version__)
    try:
        from importlib.metadata import version

        assert version("cutlass_nn") == cutlass_nn.__version__
    except ImportError:  # pragma: no cover
        pass
    pyproject = (REPO / "pyproject.toml").read_text()
    # the version is dynamic (read from cutlass_nn/_version.py by setup.py), never duplicated
    assert re.search(r'dynamic\s*=\s*\[[^\]]*"version"', pyproject)
    assert not re.search(r'^version\s*=', pyproject, re.M)


def test_every_operator_with_a_cpu_kernel_has_a_cuda_kernel():
    """Each operator the CPU runs has a CUDA kernel too: the real one (CUDA flavor) or, in the CPU
    flavor, the one that says the build has no CUDA kernels (csrc/cuda_unavailable.cpp) instead
    of the dispatcher's list of registered keys. A new operator left out of either fails here."""
    names = [n for n in torch._C._dispatch_get_all_op_names() if n.startswith("cutlass_nn::")]
    assert names
    missing = [n for n in names if torch._C._dispatch_has_kernel_for_dispatch_key(n, "CPU")
               and not torch._C._dispatch_has_kernel_for_dispatch_key(n, "CUDA")]
    assert not missing, missing
