"""training_examples/train_lm.py end to end on the CPU: the fused model (fused norms, fused gated
MLPs, linear_cross_entropy head) trains like the stock one from the same weights and batches
(--compare), its loss falls well below ln(256), a sample is written; the plain cutlass impl and
autocast run too."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "training_examples" / "train_lm.py"


def run(tmp_path, *args):
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path), *args],
        capture_output=True, text=True, timeout=600, cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_compare_run_agrees_and_learns(tmp_path):
    out = run(tmp_path, "--compare", "--steps", "60")
    finals = [line for line in out.splitlines() if line.startswith("final:")]
    assert [f.split()[1] for f in finals] == ["impl=torch", "impl=cutlass-fused"]
    assert "compare: loss curves" in out
    fused = json.loads((tmp_path / "lm_cutlass-fused.json").read_text())
    stock = json.loads((tmp_path / "lm_torch.json").read_text())
    losses = fused["losses"]
    assert len(losses) == 60
    assert losses[0] > 0.9 * math.log(256)  # random init: about ln(256)
    assert losses[-1] < losses[0] - 2.0  # and it learns the bytes
    assert fused["sample"].startswith("The assert statement") and fused["tokens_per_s"] > 0
    # the first steps differ only by rounding (float32)
    assert max(abs(a - b) / a for a, b in zip(stock["losses"][:10], losses[:10])) < 1e-4


def test_plain_cutlass_impl_with_autocast(tmp_path):
    out = run(tmp_path, "--impl", "cutlass", "--amp", "--steps", "5", "--sample-bytes", "8")
    assert "final: impl=cutlass device=cpu amp=True" in out


def test_fp8_impl_trains_close_to_stock(tmp_path):
    out = run(tmp_path, "--impl", "cutlass-fp8", "--fp8-scaling", "rowwise", "--compare",
              "--steps", "40", "--tolerance", "0.05", "--sample-bytes", "8")
    finals = [line for line in out.splitlines() if line.startswith("final:")]
    assert [f.split()[1] for f in finals] == ["impl=torch", "impl=cutlass-fp8"]
    fp8 = json.loads((tmp_path / "lm_cutlass-fp8.json").read_text())
    assert fp8["losses"][-1] < fp8["losses"][0] - 1.0  # it learns
