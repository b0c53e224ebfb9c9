"""benchmarks/gemm_energy.py on the CPU: its shape parsing and its refusal without a GPU."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gemm_energy.py"


@pytest.fixture(scope="module")
def energy():
    spec = importlib.util.spec_from_file_location("gemm_energy", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_shapes_parse_and_bad_ones_are_named(energy):
    assert energy.parse_shapes("4096x1024x256, 512x8x16") == [(4096, 1024, 256), (512, 8, 16)]
    for bad in ("4096x1024", "4096x0x256", "axbxc", "4096x1024x256x2"):
        with pytest.raises(ValueError, match=bad.split(",")[0]):
            energy.parse_shapes(bad)
    assert energy.parse_shapes(energy.DEFAULT_SHAPES)[0] == (4096, 4096, 4096)


def test_forced_configurations_parse(energy):
    assert energy.parse_config(None) is None
    assert energy.parse_config("14") == (14, 0) and energy.parse_config("3:2") == (3, 2)
    for bad in ("x", "3:", "3:9", "-1", "3:2:1"):
        with pytest.raises(ValueError, match="--config"):
            energy.parse_config(bad)


def test_bad_arguments_exit_with_a_message(energy, capsys):
    with pytest.raises(SystemExit):
        energy.main(["--shapes", "12x3"])
    assert "TxNxK" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        energy.main(["--rounds", "0"])
    with pytest.raises(SystemExit):
        energy.main(["--config", "14:x"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal without a GPU")
def test_without_a_gpu_it_refuses(energy, capsys, tmp_path):
    assert energy.main(["--out", str(tmp_path)]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []
