"""The model benchmark's attention probe: whether eager and compiled models hand their attention
a mask (cutlass_nn/bench/attention_probe.py) and how the benchmark records it."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from cutlass_nn.bench import attention_probe
from cutlass_nn.bench import models as bench_models

transformers = pytest.importorskip("transformers")


def _attend(q, k, v, mask):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask) + F.scaled_dot_product_attention(
        q, k, v, is_causal=True)


def test_compiled_graph_inspection_tells_masked_calls_from_causal_ones():
    q = k = v = torch.randn(1, 2, 4, 8)
    mask = torch.ones(4, 4, dtype=torch.bool).tril()
    seen = []

    def inspect(gm, example_inputs):
        seen.extend(attention_probe._masks_in_graph(gm))
        return gm.forward

    torch._dynamo.reset()
    try:
        torch.compile(_attend, backend=inspect)(q, k, v, mask)
        # the mask passed positionally is found too
        torch.compile(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, m),
                      backend=inspect)(q, k, v, mask)
    finally:
        torch._dynamo.reset()
    assert seen == [True, False, True]


def test_eager_recorder_tells_masked_calls_from_causal_ones():
    q = k = v = torch.randn(1, 2, 4, 8)
    mask = torch.ones(4, 4, dtype=torch.bool).tril()
    with attention_probe._EagerAttentionCalls() as calls:
        out = _attend(q, k, v, mask)
        F.scaled_dot_product_attention(q, k, v, mask)
    assert calls.masks == [True, False, True]
    # the recorder only watches: results are the plain calls'
    torch.testing.assert_close(out, _attend(q, k, v, mask))


@pytest.mark.parametrize("family", bench_models.FAMILIES)
def test_probe_of_each_family_sees_its_attention_and_leaves_the_generator_alone(family):
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    found = attention_probe.attention_masks(family)
    assert torch.equal(torch.random.get_rng_state(), before)
    assert set(found) == {"eager", "compile"}
    # every family's eager attention on unpadded batches runs with is_causal or no mask; under
    # compile the installed transformers decides (5.17 passes a mask, 5.24 does not)
    assert found["eager"] is False
    assert isinstance(found["compile"], bool)


@pytest.mark.parametrize("family", bench_models.FAMILIES)
def test_probe_finds_the_mask_of_a_padded_batch_eager_and_compiled(family):
    # a real model's attention given a padding mask: every version passes it on, in both modes
    assert attention_probe.attention_masks(family, padded=True) == {"eager": True, "compile": True}


def test_probe_agrees_with_the_compiled_graphs_own_attention_calls():
    # an independent reading of the same fact: compile the tiny llama with a backend that keeps
    # the graphs, and look at the attention nodes' arguments directly
    tiny = bench_models.ModelSize(hidden=64, layers=1, heads=4, batch=2, seq=16, vocab=128)
    model = bench_models.build_model("llama", tiny)
    model.config._attn_implementation = "sdpa"
    graphs = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    try:
        with torch.no_grad():
            torch.compile(model, backend=keep)(input_ids=torch.randint(0, 128, (2, 16)))
    finally:
        torch._dynamo.reset()
    kwargs = [n.kwargs for gm in graphs for n in gm.graph.nodes
              if n.op == "call_function" and n.target is F.scaled_dot_product_attention]
    assert kwargs, "the tiny llama calls scaled_dot_product_attention"
    has_mask = any(isinstance(kw.get("attn_mask"), torch.fx.Node) for kw in kwargs)
    assert attention_probe.attention_masks("llama")["compile"] is has_mask


def test_format_names_masked_compiles_and_failed_probes_only():
    lines = attention_probe.format_attention_masks({
        "llama": {"eager": False, "compile": True},
        "gpt": {"eager": False, "compile": False},
        "bert": {"error": "RuntimeError: boom"},
    })
    assert len(lines) == 2
    assert lines[0].startswith("attention, llama: compiled with a materialized mask")
    assert lines[1] == "attention probe, bert: failed (RuntimeError: boom)"


def test_a_failing_probe_is_recorded_not_raised(monkeypatch):
    def boom(family):
        raise RuntimeError(f"no {family}")

    monkeypatch.setattr(attention_probe, "attention_masks", boom)
    assert attention_probe.probe_attention_masks(["gpt"]) == {"gpt": {"error": "RuntimeError: no gpt"}}


@pytest.mark.parametrize("modes, probed", [("eager", False), ("eager,compile", True)])
def test_main_records_the_probe_when_a_compiled_mode_runs(monkeypatch, tmp_path, modes, probed):
    from cutlass_nn.bench import cli as bench

    def fake_row(spec, **kwargs):
        return {"family": spec.family, "size": spec.size, "mode": spec.mode,
                "label": spec.label, "status": "skipped", "note": "stand-in"}

    asked = []
    monkeypatch.setattr(bench, "gpu_run_meta", lambda argv: {"device": "stand-in", "torch": "x"})
    monkeypatch.setattr(bench_models, "run_row", fake_row)
    monkeypatch.setattr(bench_models, "plot", lambda *a, **k: None)
    monkeypatch.setattr(bench_models, "probe_attention_masks",
                        lambda families: asked.append(list(families)) or
                        {f: {"eager": False, "compile": True} for f in families})
    argv = ["--what", "models", "--families", "llama,gpt", "--sizes", "host", "--modes", modes,
            "--out", str(tmp_path)]
    assert bench_models.main(argv) == 0
    meta = json.loads(next(tmp_path.glob("models_*.json")).read_text())["meta"]
    if probed:
        assert asked == [["gpt", "llama"]]
        assert meta["attention_masks"] == {"gpt": {"eager": False, "compile": True},
                                           "llama": {"eager": False, "compile": True}}
    else:
        assert asked == [] and "attention_masks" not in meta
