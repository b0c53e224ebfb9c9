"""The FP8 GEMM benchmark (``python -m cutlass_nn.bench --what fp8``) on the CPU: its operands
are the layer's three GEMMs in the layouts both implementations take (A row-major, B
column-major) with the recipe's scale shapes, arguments are checked, and the summary's geometric
means and floor count are computed from the rows."""

from __future__ import annotations

import math

import pytest
import torch

from cutlass_nn import fp8_reference as R
from cutlass_nn.bench import cli, fp8


@pytest.mark.parametrize("scaling", ["tensorwise", "rowwise"])
@pytest.mark.parametrize("op", fp8.OPS)
def test_gemm_operands_are_the_layer_gemms(op, scaling):
    t, n, k = 32, 48, 16
    a, sa, b, sb = fp8.gemm_operands(op, t, n, k, scaling, "e5m2", device="cpu")
    m, nn_, kk = {"fwd": (t, n, k), "dgrad": (t, k, n), "wgrad": (n, k, t)}[op]
    assert a.shape == (m, kk) and b.shape == (kk, nn_)
    assert a.stride(1) == 1 and b.stride(0) == 1  # A row-major, B column-major
    assert a.dtype == (torch.float8_e4m3fn if op == "fwd" else torch.float8_e5m2)
    assert b.dtype == torch.float8_e4m3fn
    if scaling == "rowwise":
        assert sa.shape == (m, 1) and sb.shape == (1, nn_)
    else:
        assert sa.dim() == 0 and sb.dim() == 0
    R.scaled_mm(a, sa, b, sb)  # the reference takes them as they are


def test_summary():
    rows = [
        {"op": "fwd", "scaling": "rowwise", "ratio": 2.0, "bf16_ratio": 1.5},
        {"op": "fwd", "scaling": "rowwise", "ratio": 0.5, "bf16_ratio": 1.5},
        {"op": "dgrad", "scaling": "rowwise", "bf16_ratio": 1.2},  # torch could not run it
    ]
    s = fp8.summarize(rows)
    assert list(s) == ["rowwise/fwd"]
    assert math.isclose(s["rowwise/fwd"]["geomean_ratio"], 1.0)
    assert s["rowwise/fwd"]["below_floor"] == 1 and s["rowwise/fwd"]["worst"] == 0.5
    assert s["rowwise/fwd"]["configs"] == {}


def test_summary_of_forced_configurations():
    """With ``--configs``, each forced configuration's geomean of torch's time over its own."""
    rows = [
        {"op": "dgrad", "scaling": "tensorwise", "ratio": 1.0, "bf16_ratio": 1.0, "torch_ms": 1.0,
         "config5_ms": 0.5, "config7s2_ms": 2.0},
        {"op": "dgrad", "scaling": "tensorwise", "ratio": 1.0, "bf16_ratio": 1.0, "torch_ms": 4.0,
         "config5_ms": 8.0, "config7s2_ms": 2.0},
    ]
    configs = fp8.summarize(rows)["tensorwise/dgrad"]["configs"]
    assert math.isclose(configs["5"], 1.0) and math.isclose(configs["7s2"], 1.0)
    rows[1]["config5_ms"] = 1.0
    assert math.isclose(fp8.summarize(rows)["tensorwise/dgrad"]["configs"]["5"], 2.0 * 2.0 ** 0.5)


def test_arguments():
    args = fp8.parse_args(["--what", "fp8", "--tokens", "512", "--scalings", "rowwise"])
    assert args.tokens == "512" and args.scalings == "rowwise"
    with pytest.raises(SystemExit):
        fp8.parse_args(["--scalings", "blockwise"])
    assert cli._delegated_what(["--what", "fp8"]) == "fp8"


def test_configs_argument_takes_swizzles():
    assert fp8.parse_args(["--configs", "0,4s2,3s8"]).configs == "0,4s2,3s8"
    for bad in ("0,s2", "4s3", "x"):
        with pytest.raises(SystemExit):
            fp8.parse_args(["--configs", bad])


def test_fp8_choices_name_their_recipes():
    from cutlass_nn.bench import fp8 as bench_fp8
    from cutlass_nn.fp8_reference import Fp8Recipe

    assert bench_fp8.recipe_of("rowwise") == Fp8Recipe("rowwise")
    assert bench_fp8.recipe_of("tensorwise-fast-accum") == Fp8Recipe(
        "tensorwise", fast_accum_forward=True)
    assert set(bench_fp8.FP8_CHOICES) == {"tensorwise", "rowwise", "tensorwise-fast-accum",
                                          "rowwise-fast-accum"}
    args = bench_fp8.convert_args("rowwise-fast-accum")
    assert args["fp8_recipe"] == Fp8Recipe("rowwise", fast_accum_forward=True)
    assert not args["filter_fn"]("model.lm_head", None) and args["filter_fn"]("q_proj", None)
