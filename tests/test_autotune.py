"""cutlass_nn.autotune without a GPU: the mode switch, the file format and its validation, tune()
and convert(example_inputs=) leaving the model's state alone, and the environment knobs. (The
tuning itself: tests/test_cuda_autotune.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import cutlass_nn
from cutlass_nn import autotune
from autotune_rows import tuned_row

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("empty_autotune_table")


def _write(path: Path, rows: list, fmt: str = autotune.FILE_FORMAT) -> Path:
    path.write_text(json.dumps({"format": fmt, "entries": rows}))
    return path


def test_mode_switch_follows_the_flavor():
    assert autotune.enable(True) is False
    assert autotune.enabled() is cutlass_nn.has_cuda_kernels()
    with autotune.tuning(False):
        assert autotune.enabled() is False
    assert autotune.enabled() is cutlass_nn.has_cuda_kernels()
    autotune.enable(False)
    assert autotune.enabled() is False
    with pytest.raises(TypeError, match="argument 'on' must be a bool"):
        autotune.enable(1)
    with pytest.raises(RuntimeError, match="argument 'mode' must be -1"):
        torch.ops.cutlass_nn._autotune_mode(2)


def test_empty_table_report_and_save(tmp_path):
    assert autotune.entries() == []
    assert autotune.clear() == 0
    assert "no tuned GEMM" in autotune.report()
    path = tmp_path / "t.json"
    assert autotune.save(path) == 0
    doc = json.loads(path.read_text())
    assert doc["format"] == autotune.FILE_FORMAT and doc["entries"] == []
    assert doc["cutlass_nn"] == cutlass_nn.__version__
    assert autotune.load(path) == 0


def test_entries_of_another_gpu_are_skipped(tmp_path):
    path = _write(tmp_path / "t.json", [tuned_row(), tuned_row(m=8192)])
    assert autotune.load(path) == 0
    assert autotune.entries() == []


@pytest.mark.parametrize(
    "rows,fmt,match",
    [
        ([tuned_row()], "other/1", "'format' must be"),
        ("x", autotune.FILE_FORMAT, "'entries' must be a list"),
        ([1], autotune.FILE_FORMAT, "entry 0 must be an object"),
        ([tuned_row(), tuned_row(m="4096")], autotune.FILE_FORMAT, "entry 1 field 'm' must be int"),
        ([tuned_row(bias=1)], autotune.FILE_FORMAT, "field 'bias' must be bool"),
        ([tuned_row(config=True)], autotune.FILE_FORMAT, "field 'config' must be int"),
        ([tuned_row(layout_a="column")], autotune.FILE_FORMAT, "field 'layout_a' must be one of"),
        ([tuned_row(dtype="float32")], autotune.FILE_FORMAT, "field 'dtype' must be one of"),
        ([{k: v for k, v in tuned_row().items() if k != "best_us"}], autotune.FILE_FORMAT,
         "field 'best_us' must be a number"),
    ],  # fmt: skip
)
def test_malformed_files_are_refused_whole(tmp_path, rows, fmt, match):
    path = _write(tmp_path / "bad.json", rows, fmt)
    with pytest.raises(ValueError, match=match) as info:
        autotune.load(path)
    assert "cutlass_nn.autotune.load" in str(info.value) and str(path) in str(info.value)
    assert autotune.entries() == []


def test_invalid_json_and_missing_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="invalid JSON"):
        autotune.load(bad)
    with pytest.raises(FileNotFoundError):
        autotune.load(tmp_path / "missing.json")


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Dropout(0.5), nn.Linear(16, 4))


def test_tune_changes_no_state():
    torch.manual_seed(0)
    model = cutlass_nn.convert(_model())
    state = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(5, 8, requires_grad=True)
    rng = torch.random.get_rng_state()
    added = autotune.tune(model, x)
    assert added == []  # nothing to tune on the CPU
    assert torch.equal(torch.random.get_rng_state(), rng)
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters()) and x.grad is None
    assert autotune.enabled() is False  # the mode is restored
    # every form of example_inputs runs the model
    seen = []
    model.register_forward_hook(lambda m, a, kw_out=None: seen.append(len(a)))
    autotune.tune(model, [x])
    autotune.tune(model, {"input": x})
    autotune.tune(model, x, backward=False)
    assert len(seen) == 3


def test_tune_restores_state_when_the_model_raises():
    model = cutlass_nn.convert(_model())
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(RuntimeError):
        autotune.tune(model, torch.randn(5, 3))  # wrong width: the first linear fails
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert autotune.enabled() is False


def test_tune_rejects_a_non_module():
    with pytest.raises(TypeError, match="cutlass_nn.autotune.tune: argument 'module' must be"):
        autotune.tune(lambda x: x, torch.randn(2))


def test_convert_with_example_inputs_leaves_state_alone():
    torch.manual_seed(0)
    model = _model()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(5, 8)
    rng = torch.random.get_rng_state()
    assert cutlass_nn.convert(model, example_inputs=(x,)) is model
    assert isinstance(model[0], cutlass_nn.CutlassLinear)
    assert torch.equal(torch.random.get_rng_state(), rng)
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())
    # a root linear is tuned too
    root = cutlass_nn.convert(nn.Linear(8, 4), example_inputs=x)
    assert isinstance(root, cutlass_nn.CutlassLinear) and root.weight.grad is None


def _python(code: str, **env) -> subprocess.CompletedProcess:
    full_env = dict(os.environ, **env)
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=full_env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def test_environment_switch_and_a_bad_cache_file(tmp_path):
    bad = tmp_path / "cache.json"
    bad.write_text("[]")
    out = _python(
        "import cutlass_nn; print(cutlass_nn.autotune.enabled(), cutlass_nn.has_cuda_kernels())",
        CUTLASS_NN_AUTOTUNE="1",
        CUTLASS_NN_AUTOTUNE_CACHE=str(bad),
    )
    assert out.returncode == 0, out.stderr
    enabled, has_cuda = out.stdout.split()
    assert enabled == has_cuda
    assert "CUTLASS_NN_AUTOTUNE_CACHE: not loaded" in out.stderr
    assert bad.read_text() == "[]"  # nothing new was tuned: the file is not rewritten


def test_cache_file_written_at_exit_only_when_the_table_changed(tmp_path):
    path = tmp_path / "new.json"
    out = _python("import cutlass_nn", CUTLASS_NN_AUTOTUNE_CACHE=str(path))
    assert out.returncode == 0, out.stderr
    assert not path.exists()


def test_save_keeps_other_entries_of_the_file_and_leaves_no_temporary(tmp_path):
    path = _write(tmp_path / "t.json", [tuned_row(), tuned_row(m=8192)])
    assert autotune.save(path) == 0  # this process's table is empty
    doc = json.loads(path.read_text())
    assert [r["m"] for r in doc["entries"]] == [4096, 8192]  # the other GPU's entries stay
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json"]


@pytest.mark.parametrize("field,value", [("best_us", 1e300), ("m", 2**40), ("splits", -1)])
def test_out_of_range_numbers_are_refused(tmp_path, field, value):
    path = _write(tmp_path / "t.json", [tuned_row(**{field: value})])
    with pytest.raises(ValueError, match=f"field '{field}' must be"):
        autotune.load(path)
