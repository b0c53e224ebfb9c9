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
``activation`` of a ``GatedMLP`` and the ``activation`` / ``precision`` / ``fp8_recipe`` of a
``CutlassLinear`` set after construction (and such layers pickled before these were properties);
a ``convert`` filter answering something other than a bool; the kernel switches
(``programmatic_launch``, ``force_sm80_kernels``) given a non-bool; and the small helpers
(``fp8.eligible``, ``fused_rotary.is_fused``, ``autotune.load`` / ``save`` / ``report``).
"""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

import cutlass_nn
from cutlass_nn import fp8
from autotune_rows import tuned_row

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
    # precision="none" turns the FP8 source into a plain layer (None keeps its precision)
    bf = cutlass_nn.CutlassLinear.from_linear(src, precision="none")
    assert (bf.activation, bf.precision, bf.fp8_recipe) == ("relu", None, None)
    torch.testing.assert_close(bf(x), torch.relu(F.linear(x, src.weight, src.bias)))
    assert cutlass_nn.CutlassLinear(4, 4, precision="none").precision is None
    with pytest.raises(ValueError, match=E("needs precision=\"fp8\"")):
        cutlass_nn.CutlassLinear.from_linear(src, precision="none", fp8_recipe=ROWWISE)


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
    plain = cutlass_nn.GatedMLP.from_module(src, precision="none")
    assert all(p.precision is None for p in (plain.gate_proj, plain.up_proj, plain.down_proj))


# ---- 3. autotune files: a malformed entry loses nothing else -----------------------------------


def test_save_keeps_the_good_entries_of_a_file_with_a_malformed_one(tmp_path, empty_autotune_table):
    """Before: one malformed entry made save() drop every entry of the file."""
    import json

    path = tmp_path / "t.json"
    good = [tuned_row(), tuned_row(m=8192)]
    bad = tuned_row(m="many")
    path.write_text(json.dumps({"format": cutlass_nn.autotune.FILE_FORMAT,
                                "entries": [good[0], bad, good[1]]}))
    with pytest.warns(UserWarning, match=E("cutlass_nn.autotune.save: ") + ".*1 malformed entry "
                      "left out.*entry 1 .*\"many\".*field 'm' must be int"):
        cutlass_nn.autotune.save(path)
    assert json.loads(path.read_text())["entries"] == good
    assert cutlass_nn.autotune.load(path) == 0  # loadable again (no GPU: nothing added)


def test_save_writes_into_an_empty_file(tmp_path, empty_autotune_table):
    """An empty file (a fresh temporary file, a touched path) holds nothing to lose."""
    import json

    path = tmp_path / "empty.json"
    path.touch()
    assert cutlass_nn.autotune.save(path) == 0
    assert json.loads(path.read_text())["entries"] == []


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


# ---- 4, 5, 8, 11. wrong-typed or out-of-range options ------------------------------------------

ops = cutlass_nn.ops
lce = cutlass_nn.functional.linear_cross_entropy
BOOL = "must be a bool (True or False), got "
INT64 = "must be an int in [-2^63, 2^63), got "


def _lce(**kwargs):
    return lce(r(3, 8), r(10, 8), torch.tensor([1, 4, 9]), **kwargs)


OPTION_CASES = [
    # bools that truthiness would have taken ("no" and "False" are true)
    ("fp8_quantize transpose", lambda: ops.fp8_quantize(r(4, 16), "e4m3", "tensor", "no"),
     TypeError, "cutlass_nn.fp8_quantize: argument 'transpose' " + BOOL + "'no' (str)"),
    ("fp8_cast transpose", lambda: ops.fp8_cast(r(4, 16), torch.tensor(1.0), "e4m3", "False"),
     TypeError, "cutlass_nn.fp8_cast: argument 'transpose' " + BOOL + "'False' (str)"),
    ("fp8_scaled_mm use_fast_accum",
     lambda: ops.fp8_scaled_mm(*ops.fp8_quantize(r(4, 16)), *ops.fp8_quantize(r(16, 8)), None,
                               torch.float32, 1),
     TypeError, "cutlass_nn.fp8_scaled_mm: argument 'use_fast_accum' " + BOOL + "1 (int)"),
    ("cross_entropy_rows_ write_grad",
     lambda: ops.cross_entropy_rows_(r(3, 10), torch.tensor([1, 2, 3]), write_grad="no"),
     TypeError, "cutlass_nn.cross_entropy_rows_: argument 'write_grad' " + BOOL + "'no' (str)"),
    ("cross_entropy_rows_ ignore_index",
     lambda: ops.cross_entropy_rows_(r(3, 10), torch.tensor([1, 2, 3]), ignore_index=1.5),
     TypeError, "cutlass_nn.cross_entropy_rows_: argument 'ignore_index' " + INT64 + "1.5 (float)"),
    ("convert fuse_norm", lambda: cutlass_nn.convert(nn.Linear(4, 4), fuse_norm="no"),
     TypeError, "cutlass_nn.convert: argument 'fuse_norm' " + BOOL + "'no' (str)"),
    ("convert fuse_rope", lambda: cutlass_nn.convert(nn.Linear(4, 4), fuse_rope=None),
     TypeError, "cutlass_nn.convert: argument 'fuse_rope' " + BOOL + "None (NoneType)"),
    ("tune backward", lambda: cutlass_nn.autotune.tune(nn.Linear(4, 4), r(2, 4), backward="no"),
     TypeError, "cutlass_nn.autotune.tune: argument 'backward' " + BOOL + "'no' (str)"),
    # eps strings that float() would have parsed
    ("AddRMSNorm eps str", lambda: cutlass_nn.AddRMSNorm(4, eps="3.0"), TypeError,
     "cutlass_nn.AddRMSNorm: argument 'eps' must be a real number, got '3.0' (str)"),
    ("AddRMSNorm eps negative", lambda: cutlass_nn.AddRMSNorm(4, eps=-1), ValueError,
     "cutlass_nn.AddRMSNorm: argument 'eps' must be None or a finite number >= 0, got -1.0"),
    # sizes: no floats truncated by int(), no bools
    ("GatedMLP float size", lambda: cutlass_nn.GatedMLP(4.9, 6), TypeError,
     "cutlass_nn.GatedMLP: argument 'hidden_size' must be an int >= 0, got 4.9 (float)"),
    ("GatedMLP bool size", lambda: cutlass_nn.GatedMLP(4, True), TypeError,
     "cutlass_nn.GatedMLP: argument 'intermediate_size' must be an int >= 0 (not a bool), got True (bool)"),
    ("AddRMSNorm float size", lambda: cutlass_nn.AddRMSNorm(4.9), TypeError,
     "cutlass_nn.AddRMSNorm: argument 'hidden_size' must be an int >= 0, got 4.9 (float)"),
    ("CutlassLinear bool size", lambda: cutlass_nn.CutlassLinear(True, 4), TypeError,
     "cutlass_nn.CutlassLinear: argument 'in_features' must be an int >= 0 (not a bool), got True (bool)"),
    ("CutlassLinear negative size", lambda: cutlass_nn.CutlassLinear(4, -2), ValueError,
     "cutlass_nn.CutlassLinear: argument 'out_features' must be an int >= 0, got -2"),
    # linear_cross_entropy / LinearCrossEntropyLoss
    ("lce ignore_index float", lambda: _lce(ignore_index=1.5), TypeError,
     "cutlass_nn.linear_cross_entropy: argument 'ignore_index' " + INT64 + "1.5 (float)"),
    ("lce ignore_index None", lambda: _lce(ignore_index=None), TypeError,
     "cutlass_nn.linear_cross_entropy: argument 'ignore_index' " + INT64 + "None (NoneType)"),
    ("lce ignore_index 2**70", lambda: _lce(ignore_index=2**70), ValueError,
     "cutlass_nn.linear_cross_entropy: argument 'ignore_index' " + INT64 + str(2**70)),
    ("lce label_smoothing str", lambda: _lce(label_smoothing="0.1x"), TypeError,
     "cutlass_nn.linear_cross_entropy: argument 'label_smoothing' must be a real number, got '0.1x' (str)"),
    ("lce label_smoothing None", lambda: _lce(label_smoothing=None), TypeError,
     "cutlass_nn.linear_cross_entropy: argument 'label_smoothing' must be a real number, got None (NoneType)"),
    ("lce chunk_size bool", lambda: _lce(chunk_size=True), TypeError,
     "cutlass_nn.linear_cross_entropy: argument 'chunk_size' must be None or a positive int (not a bool), got True (bool)"),
    ("lce vocab 0", lambda: lce(r(3, 8), r(0, 8), torch.tensor([0, 0, 0])), ValueError,
     "cutlass_nn.linear_cross_entropy: argument 'weight' must have at least one row (vocab >= 1), got shape [0, 8]"),
    ("loss label_smoothing 2.0", lambda: cutlass_nn.LinearCrossEntropyLoss(label_smoothing=2.0),
     ValueError, "cutlass_nn.LinearCrossEntropyLoss: argument 'label_smoothing' must be in [0, 1], got 2.0"),
    ("loss label_smoothing str", lambda: cutlass_nn.LinearCrossEntropyLoss(label_smoothing="0.1"),
     TypeError, "cutlass_nn.LinearCrossEntropyLoss: argument 'label_smoothing' must be a real number, got '0.1' (str)"),
    ("loss chunk_size -1", lambda: cutlass_nn.LinearCrossEntropyLoss(chunk_size=-1), ValueError,
     "cutlass_nn.LinearCrossEntropyLoss: argument 'chunk_size' must be None or a positive int, got -1"),
    ("loss ignore_index float", lambda: cutlass_nn.LinearCrossEntropyLoss(ignore_index=1.5),
     TypeError, "cutlass_nn.LinearCrossEntropyLoss: argument 'ignore_index' " + INT64 + "1.5 (float)"),
    ("loss reduction", lambda: cutlass_nn.LinearCrossEntropyLoss(reduction="avg"), ValueError,
     "cutlass_nn.LinearCrossEntropyLoss: argument 'reduction' must be one of 'mean', 'sum', 'none', got 'avg'"),
    # before: the bias messages did not say what was given
    ("lce bias shape", lambda: lce(r(3, 8), r(10, 8), torch.tensor([0, 1, 2]), bias=r(8)), ValueError,
     "cutlass_nn.linear_cross_entropy: argument 'bias' must be None or a tensor of shape [10], got [8]"),
    ("lce bias not a tensor", lambda: lce(r(3, 8), r(10, 8), torch.tensor([0, 1, 2]), bias=[0.0] * 10),
     TypeError, "cutlass_nn.linear_cross_entropy: argument 'bias' must be None or a Tensor, got list"),
    ("lce bias dtype", lambda: lce(r(3, 8), r(10, 8), torch.tensor([0, 1, 2]), bias=r(10).double()),
     ValueError, "cutlass_nn.linear_cross_entropy: argument 'bias' must have the dtype and device of "
     "'hidden' (torch.float32, cpu), got torch.float64, cpu"),
    ("lce target device", lambda: lce(r(3, 8), r(10, 8), torch.empty(3, dtype=torch.long, device="meta")),
     ValueError, "cutlass_nn.linear_cross_entropy: argument 'target' must be on the device of 'hidden' "
     "(cpu), got meta"),
    # the kernel switches: truthiness would turn PDL on for "no" (before: accepted)
    ("programmatic_launch str", lambda: cutlass_nn.ops.programmatic_launch("no"), TypeError,
     "cutlass_nn.programmatic_launch: argument 'enable' " + BOOL + "'no' (str)"),
    ("force_sm80_kernels int", lambda: cutlass_nn.ops.force_sm80_kernels(0), TypeError,
     "cutlass_nn.force_sm80_kernels: argument 'enable' " + BOOL + "0 (int)"),
    # CutlassLinear's attributes, set after construction (before: stored unchecked, "bogus"
    # included, and a recipe on a layer without FP8)
    ("CutlassLinear.precision", lambda: setattr(cutlass_nn.CutlassLinear(4, 4), "precision", "bf16"),
     ValueError, "cutlass_nn.CutlassLinear.precision: argument 'precision' must be None, \"none\" or "
     "\"fp8\", got 'bf16'"),
    ("CutlassLinear.fp8_recipe", lambda: setattr(cutlass_nn.CutlassLinear(4, 4), "fp8_recipe",
                                                 fp8.Fp8Recipe()),
     ValueError, "cutlass_nn.CutlassLinear.fp8_recipe: argument 'fp8_recipe' needs precision=\"fp8\", "
     "got precision=None"),
    ("CutlassLinear.fp8_recipe type", lambda: setattr(cutlass_nn.CutlassLinear(4, 4, precision="fp8"),
                                                      "fp8_recipe", "rowwise"),
     TypeError, "cutlass_nn.CutlassLinear.fp8_recipe: argument 'fp8_recipe' must be None or a "
     "cutlass_nn.fp8.Fp8Recipe, got str"),
    ("CutlassLinear.activation", lambda: setattr(cutlass_nn.CutlassLinear(4, 4), "activation", "tanh"),
     ValueError, "cutlass_nn.CutlassLinear.activation: argument 'activation' must be None or one of"),
    # 5. fp8 biases of a non-float dtype
    ("fp8.linear bool bias", lambda: fp8.linear(r(4, 16), r(8, 16), torch.ones(8, dtype=torch.bool)),
     TypeError, "cutlass_nn.fp8.linear: argument 'bias' must be None or a floating tensor (float16, "
     "bfloat16, float32 or float64), got a torch.bool tensor"),
    ("fp8.linear int bias", lambda: fp8.linear(r(4, 16), r(8, 16), torch.ones(8, dtype=torch.int64)),
     TypeError, "cutlass_nn.fp8.linear: argument 'bias' must be None or a floating tensor (float16, "
     "bfloat16, float32 or float64), got a torch.int64 tensor"),
    ("fp8.linear complex bias", lambda: fp8.linear(r(4, 16), r(8, 16), r(8, dtype=torch.complex64)),
     TypeError, "cutlass_nn.fp8.linear: argument 'bias' must be None or a floating tensor (float16, "
     "bfloat16, float32 or float64), got a torch.complex64 tensor"),
    ("fp8.gated_mlp int down_bias",
     lambda: fp8.gated_mlp(r(4, 16), r(32, 16), r(32, 16), r(16, 32),
                           down_bias=torch.ones(16, dtype=torch.int32)),
     TypeError, "cutlass_nn.fp8.gated_mlp: argument 'down_bias' must be None or a floating tensor"),
    # 11. the small helpers
    ("fp8.eligible str", lambda: fp8.eligible("1024", 1024), TypeError,
     "cutlass_nn.fp8.eligible: argument 'in_features' must be an int, got '1024' (str)"),
    ("fp8.eligible float", lambda: fp8.eligible(1024, 1024.0), TypeError,
     "cutlass_nn.fp8.eligible: argument 'out_features' must be an int, got 1024.0 (float)"),
    ("fused_rotary.is_fused None", lambda: cutlass_nn.fused_rotary.is_fused(None), TypeError,
     "cutlass_nn.fused_rotary.is_fused: argument 'attention' must be an nn.Module, got None (NoneType)"),
    ("fused_decoder.is_fused None", lambda: cutlass_nn.fused_decoder.is_fused(None), TypeError,
     "cutlass_nn.fused_decoder.is_fused: argument 'layer' must be an nn.Module, got None (NoneType)"),
    ("autotune.load None", lambda: cutlass_nn.autotune.load(None), TypeError,
     "cutlass_nn.autotune.load: argument 'path' must be a str or os.PathLike, got None (NoneType)"),
    ("autotune.save None", lambda: cutlass_nn.autotune.save(None), TypeError,
     "cutlass_nn.autotune.save: argument 'path' must be a str or os.PathLike, got None (NoneType)"),
    ("autotune.report int", lambda: cutlass_nn.autotune.report(3), TypeError,
     "cutlass_nn.autotune.report: argument 'items' must be None or a sequence of "
     "cutlass_nn.autotune.TunedGemm, got 3 (int)"),
    ("autotune.report element", lambda: cutlass_nn.autotune.report([3]), TypeError,
     "cutlass_nn.autotune.report: argument 'items' must be None or a sequence of "
     "cutlass_nn.autotune.TunedGemm, got a int at index 0"),
]


@pytest.mark.parametrize("fn,exc,match", [pytest.param(*c[1:], id=c[0]) for c in OPTION_CASES])
def test_option_error(fn, exc, match):
    with pytest.raises(exc, match="^" + E(match)):
        fn()


def test_refused_options_change_nothing():
    """The process-wide switches keep their setting, and convert leaves the model alone."""
    previous = fp8.reuse_quantized_inputs(True)
    try:
        with pytest.raises(TypeError, match=E("cutlass_nn.fp8.reuse_quantized_inputs: argument "
                                              "'enabled' " + BOOL + "'no' (str)")):
            fp8.reuse_quantized_inputs("no")
        assert fp8.reuse_quantized_inputs(False) is True  # still on
    finally:
        fp8.reuse_quantized_inputs(previous)
    model = nn.Sequential(nn.Linear(4, 4))
    with pytest.raises(TypeError, match="argument 'fuse_mlp'"):
        cutlass_nn.convert(model, fuse_mlp="False")
    assert type(model[0]) is nn.Linear


def test_linear_cross_entropy_on_meta_tensors():
    """Before: the autocast query raised a RuntimeError naming neither the function nor the
    device (meta has no autocast), even with autocast off."""
    h, w = torch.empty(4, 8, device="meta"), torch.empty(10, 8, device="meta")
    t = torch.empty(4, dtype=torch.long, device="meta")
    assert lce(h, w, t).device.type == "meta"
    with torch.autocast("cpu"):
        out = lce(h, w, t)
    assert out.device.type == "meta" and out.shape == ()


# ---- 6, 7. None for a tensor; rms_norm of an integer tensor ------------------------------------

F = cutlass_nn.functional
TENSOR = "must be a torch.Tensor, got "

TENSOR_CASES = [
    ("linear input", lambda: F.linear(None, r(5, 4)), "cutlass_nn.linear: argument 'input' " + TENSOR + "NoneType"),
    ("linear weight", lambda: F.linear(r(3, 4), None), "cutlass_nn.linear: argument 'weight' " + TENSOR + "NoneType"),
    ("linear act weight", lambda: F.linear(r(3, 4), None, activation="relu"),
     "cutlass_nn.linear: argument 'weight' " + TENSOR + "NoneType"),
    ("linear bias", lambda: F.linear(r(3, 4), r(5, 4), 1.0),
     "cutlass_nn.linear: argument 'bias' must be None or a torch.Tensor, got float"),
    ("mm a", lambda: cutlass_nn.mm(None, r(4, 2)), "cutlass_nn.mm: argument 'a' " + TENSOR + "NoneType"),
    ("mm b", lambda: cutlass_nn.mm(r(3, 4), None), "cutlass_nn.mm: argument 'b' " + TENSOR + "NoneType"),
    ("mm out", lambda: cutlass_nn.mm(r(3, 4), r(4, 2), out=3.0),
     "cutlass_nn.mm: argument 'out' must be None or a torch.Tensor, got float"),
    ("mm out b", lambda: cutlass_nn.mm(r(3, 4), None, out=r(3, 2)),
     "cutlass_nn.mm: argument 'b' " + TENSOR + "NoneType"),
    ("CutlassLinear", lambda: cutlass_nn.CutlassLinear(4, 5)(None),
     "cutlass_nn.CutlassLinear.forward: argument 'input' " + TENSOR + "NoneType"),
    ("CutlassLinear act", lambda: cutlass_nn.CutlassLinear(4, 5, activation="gelu")([1.0] * 4),
     "cutlass_nn.CutlassLinear.forward: argument 'input' " + TENSOR + "list"),
    ("add2", lambda: cutlass_nn.add2(None, r(3)), "cutlass_nn.add2: argument 'a' " + TENSOR + "NoneType"),
    ("Add2", lambda: cutlass_nn.Add2()(r(3), 2.0), "cutlass_nn.Add2.forward: argument 'b' " + TENSOR + "float"),
    ("rms_norm input", lambda: cutlass_nn.rms_norm(None, torch.ones(4)),
     "cutlass_nn.rms_norm: argument 'input' " + TENSOR + "NoneType"),
    ("rms_norm weight", lambda: cutlass_nn.rms_norm(r(3, 4), None),
     "cutlass_nn.rms_norm: argument 'weight' " + TENSOR + "NoneType"),
    ("add_rms_norm x", lambda: cutlass_nn.add_rms_norm(None, r(3, 4), torch.ones(4)),
     "cutlass_nn.add_rms_norm: argument 'x' " + TENSOR + "NoneType"),
    ("add_rms_norm weight", lambda: cutlass_nn.add_rms_norm(r(3, 4), r(3, 4), None, 1e-6),
     "cutlass_nn.add_rms_norm: argument 'weight' " + TENSOR + "NoneType"),
    ("gated_act", lambda: F.gated_act(None), "cutlass_nn.gated_act: argument 'gate_up' " + TENSOR + "NoneType"),
    ("bias_grad", lambda: cutlass_nn.ops.bias_grad(None),
     "cutlass_nn.bias_grad: argument 'grad_output' " + TENSOR + "NoneType"),
    # before: an AttributeError ('NoneType' object has no attribute 'dtype')
    ("RMSNorm", lambda: cutlass_nn.RMSNorm(4)(None),
     "cutlass_nn.RMSNorm.forward: argument 'input' " + TENSOR + "NoneType"),
    # before: "must have a floating dtype ..., got UNKNOWN_SCALAR"
    ("GatedMLP", lambda: cutlass_nn.GatedMLP(8, 16)(None),
     "cutlass_nn.GatedMLP.forward: argument 'input' " + TENSOR + "NoneType"),
]


@pytest.mark.parametrize("fn,match", [pytest.param(*c[1:], id=c[0]) for c in TENSOR_CASES])
def test_not_a_tensor(fn, match):
    with pytest.raises(TypeError, match="^" + E(match)):
        fn()


def test_mm_out_is_left_alone_when_an_input_is_not_a_tensor():
    out = torch.full((3, 2), 7.0)
    with pytest.raises(TypeError, match=E("cutlass_nn.mm: argument 'a' " + TENSOR + "NoneType")):
        cutlass_nn.mm(None, r(4, 2), out=out)
    assert torch.equal(out, torch.full((3, 2), 7.0))


RMS_DTYPE = ("argument '{}' must have a floating dtype (float16, bfloat16, float32 or float64), "
             "got int32")


@pytest.mark.parametrize(
    "fn,match",
    [
        (lambda x: cutlass_nn.rms_norm(x, torch.ones(4)), "cutlass_nn.rms_norm: " + RMS_DTYPE.format("input")),
        (lambda x: cutlass_nn.add_rms_norm(x, x, torch.ones(4)),
         "cutlass_nn.add_rms_norm: " + RMS_DTYPE.format("x")),
    ],
    ids=["rms_norm", "add_rms_norm"],
)
def test_integer_input_with_the_default_eps(fn, match):
    """Before: torch.finfo's TypeError, which names neither the function nor the argument (and
    an InternalTorchDynamoError under torch.compile)."""
    x = torch.ones(3, 4, dtype=torch.int32)
    with pytest.raises(RuntimeError, match="^" + E(match)):
        fn(x)
    with pytest.raises(Exception, match=E(match)):
        torch.compile(fn, backend="eager", fullgraph=True)(x)


@pytest.mark.parametrize(
    "fn,name,got",
    [
        (lambda: cutlass_nn.rms_norm(r(3, 4), torch.ones(4), eps="3.0"), "rms_norm", "'3.0' (str)"),
        (lambda: cutlass_nn.add_rms_norm(r(3, 4), r(3, 4), torch.ones(4), eps="1e-6"),
         "add_rms_norm", "'1e-6' (str)"),
        (lambda: cutlass_nn.rms_norm(r(3, 4), torch.ones(4), eps=True), "rms_norm", "True (bool)"),
        (lambda: cutlass_nn.rms_norm(r(3, 4), torch.ones(4), eps=[1e-6]), "rms_norm", "list"),
    ],
    ids=["str", "add str", "bool", "list"],
)
def test_rms_norm_eps_is_a_number(fn, name, got):
    """Before: float() parsed a string eps and took True as 1.0."""
    with pytest.raises(TypeError, match="^" + E(f"cutlass_nn.{name}: argument 'eps' must be a real "
                                               f"number, got {got}")):
        fn()


# ---- 9. a convert that fails leaves the model as it was ----------------------------------------


def _modules_and_forwards(model):
    return [(name, m, type(m), m.__dict__.get("forward")) for name, m in model.named_modules()]


def _small_model():
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 4)))


def test_convert_with_bad_example_inputs_leaves_the_model_unchanged(empty_autotune_table):
    """Before: the layers were converted in place, then the tuning run on example_inputs raised,
    leaving a converted model behind."""
    model = _small_model()
    before = _modules_and_forwards(model)
    with pytest.raises(RuntimeError, match=E("cutlass_nn.linear: argument 'input' must have size 4")):
        cutlass_nn.convert(model, example_inputs=r(2, 5))
    assert _modules_and_forwards(model) == before


def test_convert_with_a_raising_filter_leaves_the_model_unchanged():
    model = _small_model()
    before = _modules_and_forwards(model)

    def filter_fn(name, module):
        if name == "2.1":
            raise KeyError("no rule for 2.1")
        return True

    with pytest.raises(KeyError, match="no rule for 2.1"):
        cutlass_nn.convert(model, filter_fn=filter_fn)
    assert _modules_and_forwards(model) == before
    assert all(type(m) is not cutlass_nn.CutlassLinear for m in model.modules())


@pytest.mark.parametrize("answer", ["no", 1, None, torch.tensor(True)], ids=repr)
def test_convert_with_a_filter_answering_no_bool_leaves_the_model_unchanged(answer):
    """Before: the answer was read by truthiness ("no" converted the layer)."""
    model = _small_model()
    before = _modules_and_forwards(model)
    with pytest.raises(TypeError, match="^" + E("cutlass_nn.convert: argument 'filter_fn' must "
                                                 "return a bool (True or False), got ")):
        cutlass_nn.convert(model, filter_fn=lambda name, module: answer)
    assert _modules_and_forwards(model) == before


def test_convert_accepts_numpy_bools_from_the_filter():
    np = pytest.importorskip("numpy")
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    cutlass_nn.convert(model, filter_fn=lambda name, module: np.bool_(name == "1"))
    assert type(model[0]) is nn.Linear and type(model[1]) is cutlass_nn.CutlassLinear


def test_numpy_bools_are_named_as_such():
    np = pytest.importorskip("numpy")
    with pytest.raises(TypeError, match=E("argument 'enable' " + BOOL) + r".*\(numpy\.bool_?\)$"):
        cutlass_nn.ops.programmatic_launch(np.bool_(True))


def test_refused_kernel_switches_change_nothing():
    before = (cutlass_nn.ops.programmatic_launch_enabled(),)
    with pytest.raises(TypeError):
        with cutlass_nn.ops.programmatic_launch("no"):
            pytest.fail("the block ran")
    with pytest.raises(TypeError):
        with cutlass_nn.ops.force_sm80_kernels("yes"):
            pytest.fail("the block ran")
    assert (cutlass_nn.ops.programmatic_launch_enabled(),) == before
    with cutlass_nn.ops.programmatic_launch(False), cutlass_nn.ops.force_sm80_kernels(True):
        pass


def test_cutlass_linear_attributes_set_after_construction_take_effect():
    """Before: precision was a plain attribute, and a value set after construction was stored
    unchecked; now it is checked, and a refused value leaves the layer as it was."""
    layer = cutlass_nn.CutlassLinear(16, 8)
    with pytest.raises(ValueError):
        layer.precision = "bogus"
    assert layer.precision is None and layer.fp8_recipe is None
    x = r(4, 16)
    layer.precision = "fp8"
    assert layer.fp8_recipe == fp8.Fp8Recipe()
    torch.testing.assert_close(layer(x), fp8.linear(x, layer.weight, layer.bias))
    rowwise = fp8.Fp8Recipe(scaling="rowwise")
    layer.fp8_recipe = rowwise
    layer.precision = "fp8"  # again: keeps the recipe
    assert layer.fp8_recipe == rowwise
    torch.testing.assert_close(layer(x), fp8.linear(x, layer.weight, layer.bias, rowwise))
    with pytest.raises(ValueError):
        layer.precision = "fp16"
    assert layer.precision == "fp8" and layer.fp8_recipe == rowwise  # a refusal keeps the recipe
    layer.precision = "none"
    assert layer.precision is None and layer.fp8_recipe is None
    torch.testing.assert_close(layer(x), nn.functional.linear(x, layer.weight, layer.bias))
    layer.activation = "relu"
    torch.testing.assert_close(layer(x), torch.relu(nn.functional.linear(x, layer.weight, layer.bias)))
    assert "activation='relu'" in repr(layer)
    layer.activation = "none"
    assert layer.activation is None


def test_cutlass_linear_compiled_follows_an_assigned_activation():
    layer = cutlass_nn.CutlassLinear(16, 8)
    compiled = torch.compile(layer, fullgraph=True, backend="eager")
    x = r(4, 16)
    torch.testing.assert_close(compiled(x), nn.functional.linear(x, layer.weight, layer.bias))
    layer.activation = "relu"
    torch.testing.assert_close(compiled(x), torch.relu(nn.functional.linear(x, layer.weight, layer.bias)))


def test_an_nn_linear_retyped_as_cutlass_linear_reads_the_defaults():
    layer = nn.Linear(4, 4)
    layer.__class__ = cutlass_nn.CutlassLinear
    assert (layer.activation, layer.precision, layer.fp8_recipe) == (None, None, None)


@pytest.mark.parametrize("had_attributes", [True, False], ids=["plain attributes", "before them"])
def test_cutlass_linear_pickled_before_the_properties_loads(had_attributes):
    layer = cutlass_nn.CutlassLinear(8, 8, activation="gelu", precision="fp8")
    state = dict(layer.__dict__)
    for name in ("activation", "precision", "fp8_recipe"):
        value = state.pop("_" + name)
        if had_attributes:
            state[name] = value  # as pickled when these were plain attributes
    old = cutlass_nn.CutlassLinear.__new__(cutlass_nn.CutlassLinear)
    old.__setstate__(state)
    if had_attributes:
        assert (old.activation, old.precision, old.fp8_recipe) == ("gelu", "fp8", fp8.Fp8Recipe())
    else:
        assert (old.activation, old.precision, old.fp8_recipe) == (None, None, None)
    assert old(r(2, 8)).shape == (2, 8)


def test_convert_of_a_transformers_model_undoes_its_fusions(empty_autotune_table):
    """The fusions (residual norm, rotary embedding, head) that patch a layer's forward are undone
    as well as the module replacements."""
    pytest.importorskip("transformers")
    from tiny_transformers import IDS, tiny

    model = tiny("llama")
    before = _modules_and_forwards(model)
    ids = IDS.clone()
    want = model(input_ids=ids, labels=ids).loss
    with pytest.raises(RuntimeError, match="'indices'"):
        # a batch of the wrong type: the tuning run fails after every fusion was applied
        cutlass_nn.convert(model, fuse_norm=True, fuse_mlp=True, fuse_rope=True, fuse_head=True,
                           example_inputs={"input_ids": ids.float()})
    assert _modules_and_forwards(model) == before
    assert "_cutlass_nn_original_forward" not in model.__dict__
    torch.testing.assert_close(model(input_ids=ids, labels=ids).loss, want, rtol=0, atol=0)


# ---- 10. GatedMLP.activation is checked when set -----------------------------------------------


def test_gated_mlp_activation_is_checked_when_set():
    """Before: any value was taken, and then the fused path raised a RuntimeError, the
    one-by-one path a KeyError and the FP8 path a ValueError (or silently ran the old one)."""
    mlp = cutlass_nn.GatedMLP(8, 16)
    with pytest.raises(ValueError, match="^" + E(
            "cutlass_nn.GatedMLP.activation: argument 'activation' must be one of \"silu\", "
            "\"gelu\", \"gelu_tanh\", got 'relu'")):
        mlp.activation = "relu"
    with pytest.raises(TypeError, match="^" + E(
            "cutlass_nn.GatedMLP.activation: argument 'activation' must be a string")):
        mlp.activation = None
    assert mlp.activation == "silu"  # unchanged
    mlp.activation = "gelu"
    x = r(3, 8)
    want = mlp.down_proj(nn.functional.gelu(mlp.gate_proj(x)) * mlp.up_proj(x))
    torch.testing.assert_close(mlp(x), want)
    assert "activation='gelu'" in repr(mlp)


def test_gated_mlp_pickled_with_a_plain_activation_attribute_loads():
    mlp = cutlass_nn.GatedMLP(8, 16, activation="gelu_tanh")
    state = dict(mlp.__dict__)
    state["activation"] = state.pop("_activation")  # as pickled before it was a property
    old = cutlass_nn.GatedMLP.__new__(cutlass_nn.GatedMLP)
    old.__setstate__(state)
    assert old.activation == "gelu_tanh"


def test_device_memory_bandwidth_query_names_what_it_needs():
    """The private query behind the rule's bandwidth-dependent choices: in the CPU flavor it says
    it needs the CUDA flavor; in the CUDA flavor a device index out of range is named (the GPU
    side is tests/test_cuda_kernel_selection.py's)."""
    query = torch.ops.cutlass_nn._device_memory_gbps
    if cutlass_nn.build_info()["flavor"] == "cpu":
        with pytest.raises(RuntimeError, match=r"_device_memory_gbps: needs the CUDA flavor .* got device 0"):
            query(0)
    else:
        with pytest.raises(RuntimeError, match=r"_device_memory_gbps: argument 'device' must be a CUDA device index"):
            query(1 << 20)
