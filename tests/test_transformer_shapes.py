"""The transformer shape set of the kernel benchmark (cutlass_nn/transformer_shapes.py) and its
command-line options (no GPU needed)."""

from __future__ import annotations

import argparse

import pytest

from cutlass_nn import bench, transformer_shapes as ts


def test_layer_shapes_are_distinct_and_cover_the_families():
    pairs = ts.layer_shapes()
    assert len(pairs) == len(set(pairs))
    assert (256, 1024) in pairs  # the key/value projection of the host-bound Llama benchmark
    assert (1024, 4096) in pairs and (14336, 4096) in pairs and (4096, 14336) in pairs  # Llama-3-8B
    assert (512, 3584) in pairs and (18944, 3584) in pairs  # Qwen2-7B
    assert (128, 8192) in pairs and (8192, 3584) in pairs  # a 70B model's 8-way slices
    assert ts.layer_shapes(["gpt2-small"]) == [(2304, 768), (768, 768), (3072, 768), (768, 3072)]


def test_transformer_shapes_grouped_by_tokens():
    shapes = ts.transformer_shapes((512, 4096))
    n = len(ts.layer_shapes())
    assert len(shapes) == 2 * n
    assert {s[0] for s in shapes[:n]} == {512} and {s[0] for s in shapes[n:]} == {4096}
    assert min(ts.TOKENS) == 512 and max(ts.TOKENS) == 16384


@pytest.mark.parametrize("bad", [(), (0,), (-4, 512)])
def test_transformer_shapes_rejects_bad_tokens(bad):
    with pytest.raises(ValueError, match="token counts must be positive"):
        ts.transformer_shapes(bad)


def test_unknown_family_is_named():
    with pytest.raises(ValueError, match="unknown model family 'gpt5'"):
        ts.layer_shapes(["gpt5"])


def test_parse_shape_set():
    assert ts.parse_shape_set("transformer") == ts.transformer_shapes()
    assert ts.parse_shape_set("transformer:4096") == ts.transformer_shapes((4096,))
    assert ts.parse_shape_set("transformer:512/16384") == ts.transformer_shapes((512, 16384))
    for bad in ("transformers", "transformer:4k", "llama"):
        with pytest.raises(ValueError):
            ts.parse_shape_set(bad)


def test_bench_shapes_option_plans_tagged_gemm_rows():
    args = bench.parse_args(["--shapes", "transformer:4096", "--what", "fwd,dgrad,wgrad"])
    assert args.shape_set == "transformer" and args.dtypes == ["bf16"]
    rows = bench.plan_rows(args.quick, args.dtypes, args.what, args.shapes, args.shape_set)
    assert len(rows) == 3 * len(ts.layer_shapes())
    assert {r.op for r in rows} == {"fwd", "dgrad", "wgrad"}
    assert all(r.meta()["shape_set"] == "transformer" for r in rows)
    custom = bench.parse_args(["--shapes", "4096x256x1024", "--what", "fwd"])
    assert custom.shape_set == "custom" and custom.shapes == [(4096, 256, 1024)]
    # rows of the default shapes carry no shape_set field: the JSON format is unchanged
    assert "shape_set" not in bench.RowSpec("gemm", "fwd", "bf16", (8, 8, 8)).meta()


@pytest.mark.parametrize(
    "argv",
    [
        ["--shapes", "transformer", "--quick"],
        ["--shapes", "transformer", "--what", "add2"],
        ["--shapes", "transformer:x", "--what", "fwd"],
        ["--sweep", "--shapes", "transformer"],
    ],
)
def test_bench_shapes_option_errors(argv, capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(argv)
    assert "error" in capsys.readouterr().err


def test_sweep_shapes_accepts_the_transformer_set():
    args = bench.parse_args(["--sweep", "--sweep-shapes", "transformer:4096"])
    assert args.sweep_shapes == ts.transformer_shapes((4096,))


def test_transformer_targets_select_only_their_rows():
    def row(op, ratio, shape_set):
        r = {"group": "gemm", "op": op, "precision": "bf16", "shape": [4096, 256, 1024],
             "status": "ok", "ratio": ratio, "label": "4096x256x1024"}
        if shape_set:
            r["shape_set"] = shape_set
        return r

    rows = [row("fwd", 1.2, "transformer"), row("fwd", 0.8, "transformer"), row("fwd", 0.5, None)]
    targets = bench.evaluate_targets(rows)
    assert targets["transformer_fwd_geomean"]["value"] == pytest.approx((1.2 * 0.8) ** 0.5)
    assert targets["transformer_fwd_min"]["value"] == pytest.approx(0.8)
    assert targets["transformer_fwd_min"]["status"] == "MISS"
    assert targets["bf16_fwd_min"]["value"] == pytest.approx(0.5)  # the default-shape row only
    assert targets["transformer_wgrad_geomean"]["status"] == "n/a"
