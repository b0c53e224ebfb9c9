"""Bad options and arguments of the Python entry points: each error names the function or class
(``cutlass_nn.<name>``), the argument, what was expected and what was given, and a call that
fails changes nothing.

Covers: a second derivative through the first-order-only paths (``linear_cross_entropy``,
``fp8.linear``, ``fp8.gated_mlp``); what ``CutlassLinear.from_linear`` and
``GatedMLP.from_module`` keep of a cutlass_nn source (activation, FP8 precision); the
``autotune`` file functions (a malformed entry loses no other entry); wrong-typed options that
truthiness or ``int()`` / ``float()`` would otherwise accept (``"no"``, ``"3.0"``, ``1.5``,
``4.9``, ``True`` as a size); non-float biases of ``fp8.linear``; None (or another non-tensor)
for a required tensor; integer input to ``rms_norm``; the options of ``linear_cross_entropy`` /
``LinearCrossEntropyLoss``; ``convert`` failing midway (the model is left as it was); the
``activation`` of a ``GatedMLP`` set after construction; and the small helpers (``fp8.eligible``,
``fused_rotary.is_fused``, ``autotune.load`` / ``save`` / ``report``).
"""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

import cutlass_nn
from cutlass_nn import fp8

E = re.escape


def r(*n, **kw):
    return torch.randn(n, **kw)


# ---- 1. second derivatives through the first-order-only paths ----------------------------------


def _lce_loss(reduction):
    h, w = r(3, 8, requires_grad=True), r(10, 8, requires_grad=True)
    t = torch.tensor([1, 4, 9])
    loss = cutlass_nn.functional.linear_cross_entropy(h, w, t, reduction=reduction)
    return (loss if reduction != "none" else loss.sum()), h, w


def _fp8_linear_loss(reduction=None):
    x, w, b = r(4, 16, requires_grad=True), r(16, 16, requires_grad=True), r(16, requires_grad=True)
    return fp8.linear(x, w, b).pow(2).sum(), x, w


def _fp8_gated_mlp_loss(reduction=None):
    x = r(4, 16, requires_grad=True)
    gate, up, down = (r(32, 16, requires_grad=True), r(32, 16, requires_grad=True),
                      r(16, 32, requires_grad=True))
    return fp8.gated_mlp(x, gate, up, down).sum(), x, gate


@pytest.mark.parametrize(
    "make,where",
    [
        (lambda: _lce_loss("mean"), "linear_cross_entropy"),
        (lambda: _lce_loss("sum"), "linear_cross_entropy"),
        (lambda: _lce_loss("none"), "linear_cross_entropy"),
        (_fp8_linear_loss, "fp8.linear"),
        (_fp8_gated_mlp_loss, "fp8.gated_mlp"),
    ],
    ids=["lce-mean", "lce-sum", "lce-none", "fp8.linear", "fp8.gated_mlp"],
)
def test_second_derivative_raises(make, where):
    """Before: the first-order gradients came back as constants (requires_grad False), so a
    second derivative through them was silently dropped."""
    loss, x, w = make()
    with pytest.raises(RuntimeError, match=E(f"cutlass_nn.{where}: has first derivatives only")
                       + ".*create_graph=True"):
        (gx,) = torch.autograd.grad(loss, x, create_graph=True)
        torch.autograd.grad(gx.sum(), w)
    # the first derivative itself still works, and without create_graph nothing changed
    loss, x, w = make()
    gx, gw = torch.autograd.grad(loss, (x, w))
    assert gx.shape == x.shape and gw.shape == w.shape


# ---- 2. conversions of cutlass_nn modules keep what they compute --------------------------------

ROWWISE = fp8.Fp8Recipe(scaling="rowwise")


def test_from_linear_of_a_cutlass_linear_keeps_activation_and_precision():
    """Before: the activation and the FP8 precision were dropped (another function, silently)."""
    torch.manual_seed(0)
    src = cutlass_nn.CutlassLinear(16, 16, activation="relu", precision="fp8", fp8_recipe=ROWWISE)
    x = r(4, 16)
    layer = cutlass_nn.CutlassLinear.from_linear(src)
    assert (layer.activation, layer.precision, layer.fp8_recipe) == ("relu", "fp8", ROWWISE)
    assert layer.weight is src.weight and torch.equal(layer(x), src(x))
    # what is given still wins: "none" removes the activation, a recipe replaces the recipe
    plain = cutlass_nn.CutlassLinear.from_linear(src, activation="none", fp8_recipe=fp8.Fp8Recipe())
    assert (plain.activation, plain.precision, plain.fp8_recipe) == (None, "fp8", fp8.Fp8Recipe())
    gelu = cutlass_nn.CutlassLinear.from_linear(cutlass_nn.CutlassLinear(4, 4), activation="gelu",
                                                 precision="fp8")
    assert (gelu.activation, gelu.precision, gelu.fp8_recipe) == ("gelu", "fp8", fp8.Fp8Recipe())
    # an nn.Linear source: as before
    assert cutlass_nn.CutlassLinear.from_linear(nn.Linear(4, 4)).precision is None


class _LlamaLikeMLP(nn.Module):
    def __init__(self, proj):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = proj(16, 32), proj(16, 32), proj(32, 16)
        self.act_fn = nn.SiLU()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


@pytest.mark.parametrize(
    "make",
    [
        lambda: cutlass_nn.GatedMLP(16, 32, precision="fp8", fp8_recipe=ROWWISE),
        lambda: _LlamaLikeMLP(lambda i, o: cutlass_nn.CutlassLinear(i, o, precision="fp8",
                                                                    fp8_recipe=ROWWISE)),
    ],
    ids=["GatedMLP", "fp8-projections"],
)
def test_gated_mlp_from_module_keeps_fp8(make):
    """Before: the projections of the result were not FP8 any more (and a GatedMLP source
    needed its activation spelled out)."""
    torch.manual_seed(0)
    src = make()
    x = r(4, 16)
    want = src(x)
    mlp = cutlass_nn.GatedMLP.from_module(src)
    for proj in (mlp.gate_proj, mlp.up_proj, mlp.down_proj):
        assert (proj.precision, proj.fp8_recipe) == ("fp8", ROWWISE)
    assert mlp.activation == "silu"
    torch.testing.assert_close(mlp(x), want)
    # a recipe given still wins
    tensorwise = cutlass_nn.GatedMLP.from_module(src, precision="fp8", fp8_recipe=fp8.Fp8Recipe())
    assert tensorwise.down_proj.fp8_recipe == fp8.Fp8Recipe()


# ---- 3. autotune files: a malformed entry loses nothing else -----------------------------------


def _tuned_row(**overrides) -> dict:
    row = {
        "device_name": "no such GPU", "multiprocessors": 7, "m": 4096, "n": 256, "k": 1024,
        "layout_a": "row", "layout_b": "col", "dtype": "bfloat16", "out_dtype": "bfloat16",
        "bias": True, "accumulate": False, "config": 6, "swizzle": 0, "splits": 0,
        "transposed": True, "rule_config": 7, "rule_swizzle": 0, "rule_splits": 0,
        "rule_transposed": True, "candidates": 12, "best_us": 10.5, "rule_us": 12.0,
    }  # fmt: skip
    row.update(overrides)
    return row


def test_save_keeps_the_good_entries_of_a_file_with_a_malformed_one(tmp_path, empty_autotune_table):
    """Before: one malformed entry made save() drop every entry of the file."""
    import json

    path = tmp_path / "t.json"
    good = [_tuned_row(), _tuned_row(m=8192)]
    bad = _tuned_row(m="many")
    path.write_text(json.dumps({"format": cutlass_nn.autotune.FILE_FORMAT,
                                "entries": [good[0], bad, good[1]]}))
    with pytest.warns(UserWarning, match=E("cutlass_nn.autotune.save: ") + ".*1 malformed entry "
                      "left out.*entry 1 .*\"many\".*field 'm' must be int"):
        cutlass_nn.autotune.save(path)
    assert json.loads(path.read_text())["entries"] == good
    assert cutlass_nn.autotune.load(path) == 0  # loadable again (no GPU: nothing added)


@pytest.mark.parametrize("text", ['{"not": "an autotune file"}', "not JSON", "[1, 2]",
                                  '{"format": "cutlass_nn.autotune/1", "entries": 3}'])
def test_save_does_not_overwrite_another_file(tmp_path, empty_autotune_table, text):
    """Before: a file that was not an autotune file was silently replaced."""
    path = tmp_path / "other.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=E(f"cutlass_nn.autotune.save: {path} is not a cutlass_nn "
                                           "autotune file") + ".*it is not overwritten"):
        cutlass_nn.autotune.save(path)
    assert path.read_text() == text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.json"]  # no temporary left
