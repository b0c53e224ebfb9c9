"""scripts/ninja_log_summary.py: a ninja log read into per-unit compile times (a unit built twice
keeps its last entry), grouped as the CI kernel set chooses between them, slowest first; and the
GPU machine's committed log of the full build reads as such."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "ninja_log_summary.py"
spec = importlib.util.spec_from_file_location("ninja_log_summary", SCRIPT)
nls = importlib.util.module_from_spec(spec)
spec.loader.exec_module(nls)

LOG = """# ninja log v5
0\t40000\t0\t/b/csrc/kernels/generated/sm90_a.o\t1a
0\t75500\t0\t/b/csrc/kernels/fp8_gemm_sm90_e4m3_bf16.o\t2b
100\t12100\t0\t/b/csrc/ops_registry.o\t3c
50000\t60000\t0\t/b/csrc/kernels/generated/sm90_a.o\t4d
not an entry
x\ty\t0\t/b/csrc/broken.o\t5e
"""


def test_read_log_keeps_the_last_build_of_a_unit_and_sorts_slowest_first(tmp_path):
    path = tmp_path / ".ninja_log"
    path.write_text(LOG)
    entries = nls.read_log(str(path))
    assert entries == [
        (75.5, "/b/csrc/kernels/fp8_gemm_sm90_e4m3_bf16.o"),
        (12.0, "/b/csrc/ops_registry.o"),
        (10.0, "/b/csrc/kernels/generated/sm90_a.o"),
    ]
    assert [nls.group(out) for _, out in entries] == [
        "FP8 GEMM units", "other hand-written sources", "generated GEMM kernels"]


def test_summary_prints_groups_and_the_slowest_units(tmp_path):
    path = tmp_path / ".ninja_log"
    path.write_text(LOG)
    out = subprocess.run([sys.executable, str(SCRIPT), str(path), "--top", "2"],
                         capture_output=True, text=True, check=True).stdout
    assert "3 units, 98 s of compile jobs in sum" in out
    assert "FP8 GEMM units: 1 units, 76 s (77%)" in out
    assert "slowest 2:" in out and "kernels/fp8_gemm_sm90_e4m3_bf16.o" in out
    assert "ops_registry.o" in out and "sm90_a.o" not in out


def test_the_committed_full_build_log_has_every_group():
    logs = sorted((ROOT / "benchmarks" / "results").glob("ninja_log_*.txt"))
    assert logs
    entries = nls.read_log(str(logs[-1]))
    groups = {nls.group(out) for _, out in entries}
    assert groups == {"generated GEMM kernels", "FP8 GEMM units", "other hand-written sources"}
    assert sum(1 for _, out in entries if nls.group(out) == "FP8 GEMM units") == 11
