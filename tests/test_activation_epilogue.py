"""activation_forward_epilogue (csrc/kernels/activation_math.h), the activation math of the SM90
GEMM epilogue, checked on the host: csrc/kernels/tests/activation_epilogue_check.cpp compiled
with the host C++ compiler and run over a sweep of z against a double-precision reference
written without cancellation."""

from __future__ import annotations

import math
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "csrc" / "kernels" / "tests" / "activation_epilogue_check.cpp"


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("needs a host C++ compiler")
    exe = tmp_path_factory.mktemp("act") / "activation_epilogue_check"
    subprocess.run([cxx, "-std=c++17", "-O2", str(SOURCE), "-o", str(exe)], check=True,
                   capture_output=True, text=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    sweep, special = {}, {}
    for line in out.splitlines():
        parts = line.split()
        if parts[0] == "special":
            special.setdefault(parts[1], []).append((float(parts[2]), float(parts[3])))
        else:
            sweep[parts[0]] = {"max_rel": float(parts[1]), "max_abs": float(parts[2]),
                               "worst_z": float(parts[3]), "differs": int(parts[4])}
    return sweep, special


def test_epilogue_forms_match_the_formulas(results):
    sweep, _ = results
    assert set(sweep) == {"relu", "gelu", "gelu_tanh"}
    # ReLU and the erf GELU are activation_forward itself
    for act in ("relu", "gelu"):
        assert sweep[act]["differs"] == 0, sweep[act]
        assert sweep[act]["max_abs"] < 1e-6, sweep[act]
    # GELU(tanh) as z * sigmoid(2u): another float rounding of the same function (it differs
    # from activation_forward's 0.5 z (1 + tanh u) at many z), within 1e-5 relative of the
    # accurate value over [-12, 12], the small negative tail included, where the tanh form
    # cancels; far below the bf16 / fp16 rounding of the kernels' outputs (3.9e-3 / 4.9e-4)
    assert sweep["gelu_tanh"]["differs"] > 0
    assert sweep["gelu_tanh"]["max_rel"] < 1e-5, sweep["gelu_tanh"]
    assert sweep["gelu_tanh"]["max_abs"] < 1e-6, sweep["gelu_tanh"]


def test_epilogue_special_values(results):
    _, special = results
    for act in ("relu", "gelu", "gelu_tanh"):
        got = dict((z, y) for z, y in special[act] if not math.isnan(z))
        assert got[math.inf] == math.inf
        assert got[30.0] == pytest.approx(30.0)
        assert got[0.0] == 0.0
        assert got[-30.0] == 0.0  # -0.0 compares equal
        assert all(math.isnan(y) for z, y in special[act] if math.isnan(z))
    # GELU(tanh) of -inf is NaN, as torch's (-inf times 0)
    assert math.isnan(dict(special["gelu_tanh"])[-math.inf])
