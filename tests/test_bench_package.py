"""The benchmark package (cutlass_nn/bench/): one job per module, each importable on its own
(no import cycle), every name re-exported by the package, the same command line and the same
JSON format as before the split (a committed results JSON still renders)."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from cutlass_nn import bench

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "cutlass_nn" / "bench"
SUBMODULES = ["spec", "stats", "plan", "correctness", "cases", "timing", "rows", "sweep",
              "report", "cli", "arg_types", "models", "models_report", "block_probe", "memory_readings", "memory_trace", "host", "fused", "fp8", "step_profile", "step_sweep", "peers", "attention_probe"]  # fmt: skip


def test_every_file_is_a_listed_module_with_a_docstring():
    files = sorted(p.stem for p in PACKAGE.glob("*.py") if not p.stem.startswith("__"))
    assert files == sorted(SUBMODULES)
    for name in SUBMODULES:
        module = importlib.import_module(f"cutlass_nn.bench.{name}")
        assert module.__doc__ and module.__doc__.strip(), f"{name} has no docstring"


@pytest.mark.parametrize("name", SUBMODULES)
def test_each_module_imports_first_in_a_fresh_interpreter(name):
    proc = subprocess.run([sys.executable, "-c", f"import cutlass_nn.bench.{name}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_modules_stay_small():
    for path in PACKAGE.glob("*.py"):
        lines = len(path.read_text().splitlines())
        assert lines <= 700, f"{path.name}: {lines} lines; split it by job"


def test_package_re_exports_every_public_name_of_the_ten_core_modules():
    for module in bench.MODULES:
        for name, value in vars(module).items():
            if name.startswith("__") or getattr(value, "__module__", module.__name__) != module.__name__:
                continue
            if callable(value) or isinstance(value, type):
                assert getattr(bench, name) is value, f"bench.{name} is not {module.__name__}.{name}"


def test_a_committed_results_json_still_renders(tmp_path, capsys):
    runs = sorted((ROOT / "benchmarks" / "results").glob("bench_*.json"))
    assert runs, "no committed benchmark run"
    doc = json.loads(runs[-1].read_text())
    for key in ("meta", "settings", "rows", "summary"):
        assert key in doc
    lines = bench.format_tables(doc["rows"]) + bench.format_summary(
        doc["summary"], doc.get("peaks", {}), doc["rows"]
    )
    assert any("geomean" in line for line in lines)
