"""training_examples/train_lm.py end to end on the CPU: the converted model (fused norms, fused
gated MLPs, linear_cross_entropy head) trains like the stock one from the same weights and data
(--compare), its loss falls well below ln(vocab), and the log is written."""

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


def test_compare_run_agrees_and_learns(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--compare", "--steps", "30", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    finals = [line for line in proc.stdout.splitlines() if line.startswith("final:")]
    assert [f.split()[1] for f in finals] == ["impl=torch", "impl=cutlass"]
    log = json.loads((tmp_path / "lm_cutlass.json").read_text())
    losses = log["losses"]
    assert len(losses) == 30
    assert losses[0] > 0.9 * math.log(512)  # random init: about ln(vocab)
    assert losses[-1] < losses[0] - 2.0  # and it learns the chain
    assert log["floor"] < losses[-1]
    stock = json.loads((tmp_path / "lm_torch.json").read_text())["losses"]
    assert max(abs(a - b) / abs(a) for a, b in zip(stock, losses)) < 1e-4  # float32: same math
