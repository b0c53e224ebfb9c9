"""The whole-model and host-cost benchmarks' machinery on the CPU: tiny transformers models,
stock vs converted training steps, loss agreement, targets, tables, JSON combine, host loops.
(The real runs need a GPU: python -m cutlass_nn.bench --what models / --what host.)"""

from __future__ import annotations

import gc
import json
import math

import pytest
import torch

from cutlass_nn import bench
from cutlass_nn.bench import host as bench_host, memory_readings, models as bench_models, peers

transformers = pytest.importorskip("transformers")

TINY = {"host": bench_models.ModelSize(hidden=64, layers=1, heads=4, batch=2, seq=16, vocab=128)}


@pytest.mark.parametrize("family", bench_models.FAMILIES)
def test_model_row_on_cpu(family):
    """A tiny model of each family: both sides train, the converted model really runs
    CutlassLinear layers, the losses agree, and the row has every reported field."""
    model = bench_models.build_model(family, TINY["host"])
    n_linear = bench_models.count_linears(model)
    assert n_linear >= 4
    row = bench_models.run_row(
        bench_models.RowSpec(family, "host", "eager"),
        steps=4,
        block=2,
        warmup=1,
        device="cpu",
        dtype=torch.float32,
        sizes=TINY,
    )
    assert row["status"] == "ok", row.get("traceback")
    assert row["linears"] == n_linear
    for side in ("stock", "cutlass_nn"):
        assert len(row[side]["losses"]) == 4 and len(row[side]["block_step_ms"]) == 2
        assert row[side]["step_ms"] > 0 and row[side]["tokens_per_s"] > 0
    assert row["cutlass_nn"]["ran_cutlass_ops"] and not row["stock"]["ran_cutlass_ops"]
    assert row["loss"]["agree"], row["loss"]
    assert row["loss"]["max_abs_diff"] < 1e-3  # float32 on CPU: the same arithmetic
    # the row's ratio is the median of the paired per-round ratios; the ratio of the sides'
    # median step times is kept beside it
    paired = [s / o for s, o in zip(row["stock"]["block_step_ms"], row["cutlass_nn"]["block_step_ms"])]
    assert row["ratio"] == pytest.approx(sorted(paired)[0] / 2 + sorted(paired)[1] / 2)
    assert row["ratio"] == pytest.approx(row["block_ratio"]["median"])
    assert row["ratio_of_medians"] == pytest.approx(row["stock"]["step_ms"] / row["cutlass_nn"]["step_ms"])


def test_fused_llama_row_on_cpu():
    """--fuse-norm --fuse-mlp: the Llama row trains with the fused modules and agrees with stock."""
    row = bench_models.run_row(
        bench_models.RowSpec("llama", "host", "eager"),
        steps=2,
        block=1,
        warmup=1,
        device="cpu",
        dtype=torch.float32,
        sizes=TINY,
        fuse_norm=True,
        fuse_mlp=True,
        fuse_head=True,
    )
    assert row["status"] == "ok", row.get("traceback")
    assert row["loss"]["max_abs_diff"] < 1e-3
    args = bench_models.parse_args(["--fuse-mlp", "--fuse-norm", "--fuse-head"])
    assert args.fuse_mlp and args.fuse_norm and args.fuse_head


def test_liger_side_plumbing_with_a_stand_in(monkeypatch):
    """--liger: a third side on the Llama rows, built by Liger's patch on the instance, with the
    module-level names the patch rebinds restored (a stand-in liger_kernel here: the real one
    needs triton and a GPU)."""
    import sys
    import types

    from transformers.models.llama import modeling_llama

    calls = []

    def apply_liger_kernel_to_llama(model=None, **kwargs):
        calls.append(kwargs)
        modeling_llama.LlamaRMSNorm = object  # global rebinding, as the real patch does
        modeling_llama.LlamaForCausalLM.forward = lambda *a, **k: None

    pkg = types.ModuleType("liger_kernel")
    sub = types.ModuleType("liger_kernel.transformers")
    sub.apply_liger_kernel_to_llama = apply_liger_kernel_to_llama
    monkeypatch.setitem(sys.modules, "liger_kernel", pkg)
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers", sub)
    norm_cls, forward = modeling_llama.LlamaRMSNorm, modeling_llama.LlamaForCausalLM.forward
    row = bench_models.run_row(
        bench_models.RowSpec("llama", "host", "eager"),
        steps=2, block=1, warmup=1, device="cpu", dtype=torch.float32, sizes=TINY, liger=True,
    )
    assert row["status"] == "ok", row.get("traceback")
    assert modeling_llama.LlamaRMSNorm is norm_cls
    assert modeling_llama.LlamaForCausalLM.forward is forward
    assert calls and calls[0]["rope"] is False
    assert row["liger"]["status"] == "ok" and row["liger"]["loss"]["agree"]
    assert any("Liger, llama-host" in line for line in peers.format_peers([row]))


def test_torchao_side_plumbing_with_a_stand_in(monkeypatch):
    """--torchao with --fp8: a third side converted by torchao's float8 training with its recipe of
    the row's scaling, on the layers cutlass_nn's FP8 conversion takes (a stand-in torchao.float8
    here, swapping nothing: the real one runs float8 GEMMs on a GPU); without --fp8 the side is
    skipped with a note, and a missing torchao is reported, not fatal."""
    import sys
    import types

    taken, recipes = [], []

    class Config:
        @staticmethod
        def from_recipe_name(name):
            recipes.append(name)
            return name

    def convert_to_float8_training(model, module_filter_fn=None, config=None):
        taken.extend(n for n, m in model.named_modules() if module_filter_fn(m, n))
        return model

    # transformers asks importlib whether torchao is installed on its first model build; let it
    # see the real answer before the stand-in (which has no import spec) is in sys.modules
    bench_models.build_model("llama", TINY["host"])
    fake = types.ModuleType("torchao.float8")
    fake.Float8LinearConfig = Config
    fake.convert_to_float8_training = convert_to_float8_training
    monkeypatch.setitem(sys.modules, "torchao", types.ModuleType("torchao"))
    monkeypatch.setitem(sys.modules, "torchao.float8", fake)
    monkeypatch.setattr(bench_models.cutlass_nn.fp8, "MIN_FEATURES", 64)  # TINY's layers convert
    kw = dict(steps=2, block=1, warmup=1, device="cpu", dtype=torch.float32, sizes=TINY, torchao=True)
    row = bench_models.run_row(bench_models.RowSpec("llama", "host", "eager"), fp8="rowwise", **kw)
    assert row["status"] == "ok", row.get("traceback")
    assert recipes == ["rowwise"] and taken and not any(n.endswith("lm_head") for n in taken)
    assert row["torchao"]["status"] == "ok" and row["torchao"]["loss"]["agree"]
    assert any(line.startswith("torchao float8, llama-host") for line in peers.format_peers([row]))
    row = bench_models.run_row(bench_models.RowSpec("gpt", "host", "eager"), **kw)
    assert row["torchao"]["status"] == "skipped" and "--fp8" in row["torchao"]["note"]
    monkeypatch.setitem(sys.modules, "torchao.float8", None)  # import fails
    assert peers.skip_reason("torchao", "llama", "tensorwise") == (
        "unavailable", "torchao.float8 is not importable")


def test_fused_bench_arguments():
    from cutlass_nn.bench import fused

    assert fused.parse_args([]).cases == ["norm"]
    assert fused.parse_args(["--cases", "norm,mlp"]).cases == ["norm", "mlp"]
    assert fused.parse_args(["--cases", "head", "--vocab", "1000"]).vocab == 1000
    row = {"case": "linear_cross_entropy fwd+bwd", "tokens": 8, "hidden": 4, "intermediate": 10,
           "ms": {"ours": 1.0, "unfused": 2.0}, "memory_ratio": {"unfused": 0.2}, "loss_rel_diff": 0.0}
    assert "| 0.50 | 0.20 |" in fused.format_head_rows([row])[-1]
    assert fused.llama_intermediate(4096) == 11008 and fused.llama_intermediate(1024) == 2816


def test_converted_model_runs_cutlass_ops():
    """The converted side runs the cutlass_nn operators (a profiler sees them)."""
    model = bench_models.build_model("llama", TINY["host"])
    model = bench_models.cutlass_nn.convert(model)
    batch = bench_models.make_batches(TINY["host"], 1, "cpu")[0]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        bench_models.Trainer(model, "eager", "cpu").step(batch)
    names = {e.name for e in prof.events()}
    assert {"cutlass_nn::linear", "cutlass_nn::linear_dgrad", "cutlass_nn::linear_wgrad"} <= names


def test_pdl_ab_side_runs_its_steps_with_pdl_off(monkeypatch):
    """--pdl-ab: a third side, the converted model again, whose warm-up and timed steps all run
    inside programmatic_launch(False) (recorded here by a stand-in switch); the row reports its
    ratio and the PDL speed-up."""
    import contextlib

    states = []

    @contextlib.contextmanager
    def switch(enable=True):
        states.append(enable)
        yield

    monkeypatch.setattr(bench_models.cutlass_nn.ops, "programmatic_launch", switch)
    row = bench_models.run_row(
        bench_models.RowSpec("gpt", "host", "eager"),
        steps=4, block=2, warmup=2, device="cpu", dtype=torch.float32, sizes=TINY, pdl_ab=True,
    )
    assert row["status"] == "ok", row.get("traceback")
    no_pdl = row[bench_models.NO_PDL_SIDE]
    assert no_pdl["ran_cutlass_ops"] and len(no_pdl["losses"]) == 4
    assert no_pdl["loss"]["agree"]
    # 2 warm-up steps + 4 timed + the profiled step after them, each inside the switch set to False
    assert states == [False] * 7
    # paired per round, as the row's own ratio (two rounds: the mean of their two ratios)
    rounds = [n / o for n, o in zip(no_pdl["block_step_ms"], row["cutlass_nn"]["block_step_ms"])]
    assert row["pdl_speedup"] == pytest.approx(sum(rounds) / 2)
    rounds = [s / n for s, n in zip(row["stock"]["block_step_ms"], no_pdl["block_step_ms"])]
    assert row["ratio_no_pdl"] == pytest.approx(sum(rounds) / 2)
    assert bench_models.parse_args(["--pdl-ab"]).pdl_ab


class _StandIn(torch.nn.Module):
    """A model for run_sides: one parameter, a loss, and ``on_forward(name, input_ids)``."""

    def __init__(self, name, on_forward):
        super().__init__()
        self.name, self.on_forward = name, on_forward
        self.w = torch.nn.Parameter(torch.ones(()))

    def forward(self, input_ids, labels):
        self.on_forward(self.name, input_ids)
        return type("Out", (), {"loss": (self.w * input_ids.float()).mean()})()


def test_sides_alternate_blocks():
    """run_sides times the sides in alternating blocks (who goes first alternates each round)
    and gives each side the same batch sequence; the step that checks which operators ran runs
    under the profiler after the timed blocks, and no other step does."""
    order = []

    def record(name, input_ids):
        profiled = torch.autograd.profiler._is_profiler_enabled
        order.append((name, int(input_ids[0, 0]), profiled))

    batches = [{"input_ids": torch.full((1, 2), i), "labels": torch.zeros(1, 2)} for i in range(4)]
    out = bench_models.run_sides(
        {"stock": lambda: _StandIn("s", record), "cutlass_nn": lambda: _StandIn("c", record)},
        "eager", batches, warmup=1, steps=4, block=2, device="cpu",
    )
    timed = order[2:-2]  # after one warm-up step per side, before each side's profiled step
    assert [name for name, _, _ in timed] == ["s", "s", "c", "c", "c", "c", "s", "s"]
    assert [b for n, b, _ in timed if n == "s"] == [b for n, b, _ in timed if n == "c"] == [0, 1, 2, 3]
    assert len(out["stock"]["block_step_ms"]) == 2 and len(out["stock"]["losses"]) == 4
    # only the two steps after the timed blocks ran under the profiler, one per side
    assert [p for _, _, p in order] == [False] * 10 + [True, True]
    assert [name for name, _, _ in order[-2:]] == ["s", "c"]
    assert out["stock"]["ran_cutlass_ops"] is False and out["cutlass_nn"]["ran_cutlass_ops"] is False


def test_cuda_graph_rows_check_their_first_step(monkeypatch):
    """For reduce-overhead rows (CUDA-graph replays, whose operators run only in the first
    steps) the profiled step is each side's first one, and no step follows the timed blocks."""
    order = []

    def record(name, input_ids):
        order.append((name, torch.autograd.profiler._is_profiler_enabled))

    monkeypatch.setattr(bench_models.torch, "compile", lambda model, **kw: model)
    monkeypatch.setattr(bench_models.torch.compiler, "cudagraph_mark_step_begin", lambda: None)
    batches = [{"input_ids": torch.full((1, 2), i), "labels": torch.zeros(1, 2)} for i in range(4)]
    out = bench_models.run_sides(
        {"stock": lambda: _StandIn("s", record), "cutlass_nn": lambda: _StandIn("c", record)},
        "reduce-overhead", batches, warmup=2, steps=4, block=2, device="cpu",
    )
    # per side 2 warm-up steps (the first profiled), then 4 timed per side, nothing after
    assert [p for _, p in order] == [True, False, True, False] + [False] * 8
    assert [name for name, _ in order[:4]] == ["s", "s", "c", "c"]
    assert out["stock"]["ran_cutlass_ops"] is False and out["cutlass_nn"]["ran_cutlass_ops"] is False


def test_block_probes_attribute_collections_and_compiles_to_their_block():
    """A side whose step collects garbage in its second timed block, and one whose step compiles
    a new dynamo frame there: each block's probe says which, and nothing else."""
    import gc

    from cutlass_nn.bench.block_probe import BlockProbe

    calls = {"s": 0, "c": 0}

    def disturb(name, input_ids):
        calls[name] += 1
        if calls[name] == 4:  # the second timed block (one warm-up step, blocks of 2)
            if name == "s":
                gc.collect()
            else:
                torch.compile(lambda t: t * 3, backend="eager")(torch.ones(calls["c"]))

    batches = [{"input_ids": torch.full((1, 2), i), "labels": torch.zeros(1, 2)} for i in range(4)]
    out = bench_models.run_sides(
        {"stock": lambda: _StandIn("s", disturb), "cutlass_nn": lambda: _StandIn("c", disturb)},
        "eager", batches, warmup=1, steps=4, block=2, device="cpu",
    )
    s, c = out["stock"]["block_probes"], out["cutlass_nn"]["block_probes"]
    assert len(s) == len(c) == 2
    assert s[0]["gc_collections"][2] == 0 and s[1]["gc_collections"][2] >= 1 and s[1]["gc_ms"] > 0
    assert [b["compiles"] for b in c] == [0, 1] and [b["compiles"] for b in s] == [0, 0]
    assert out["stock"]["timed_gc_ms"] == pytest.approx(sum(b["gc_ms"] for b in s))
    assert out["cutlass_nn"]["timed_compiles"] == 1
    assert all(b["max_enqueue_ms"] > 0 for b in s + c)
    assert all(b["memory_read_ms"] >= 0 for b in s + c)
    assert gc.get_freeze_count() == 0  # the timed part's freeze is undone
    with BlockProbe() as probe:  # the callback is removed on exit
        pass
    assert probe._on_gc not in gc.callbacks


def test_loss_comparison_and_targets():
    agree = bench_models.compare_losses([10.0, 9.0], [10.05, 9.0])
    assert agree["agree"] and agree["max_abs_diff"] == pytest.approx(0.05)
    assert not bench_models.compare_losses([10.0], [10.2])["agree"]
    assert not bench_models.compare_losses([10.0], [float("nan")])["agree"]

    def row(size, ratio, mem, agree=True):
        return {"status": "ok", "size": size, "ratio": ratio, "memory_ratio": mem,
                "loss": {"agree": agree}}

    t = bench_models.targets([row("host", 1.02, 0.99), row("host", 1.01, 1.0), row("gpu", 0.9, 0.98)])
    assert t["host_bound_pass"] and t["memory_pass"] and t["losses_agree"]
    assert t["host_bound_min_ratio"] == pytest.approx(1.01)
    assert t["gpu_bound_median_ratio"] == pytest.approx(0.9)
    # the host size's CUDA-graph rows time the GPU: reported apart, not host-bound
    graphs = dict(row("host", 0.97, 0.99), mode="reduce-overhead")
    t = bench_models.targets([dict(row("host", 1.01, 0.99), mode="compile"), graphs])
    assert t["host_bound_pass"] and t["host_bound_min_ratio"] == pytest.approx(1.01)
    assert t["cuda_graph_host_min_ratio"] == pytest.approx(0.97)
    assert "CUDA graphs" in bench_models.format_targets(t)[-1]
    t = bench_models.targets([row("host", 0.98, 1.01, agree=False)])
    assert t["cuda_graph_host_min_ratio"] is None
    assert not t["host_bound_pass"] and not t["memory_pass"] and t["losses_agree"] is False
    lines = bench_models.format_targets(t)
    assert "MISS" in lines[0] and "MISS" in lines[1]
    assert t["memory_judged_on"] == "allocator blocks"  # no row read tensor bytes


def test_gpu_bound_target_and_rows_not_run():
    """The GPU size's rows pass only with every row >= 1.00 and their median >= 1.02; a run
    without rows of one size says so instead of reporting a miss."""
    def row(size, ratio):
        return {"status": "ok", "size": size, "ratio": ratio, "memory_ratio": 1.0,
                "loss": {"agree": True}}

    t = bench_models.targets([row("gpu", 1.03), row("gpu", 1.01), row("gpu", 1.05)])
    assert t["gpu_bound_pass"] and t["gpu_bound_min_ratio"] == pytest.approx(1.01)
    lines = bench_models.format_targets(t)
    assert lines[0].startswith("host-bound rows: none in this run") and "MISS" not in lines[0]
    assert "median ratio 1.030, min 1.010" in lines[3] and lines[3].endswith("PASS)")
    # a row below 1.00 misses even with a high median; a median under 1.02 misses too
    assert not bench_models.targets([row("gpu", 1.10), row("gpu", 0.99), row("gpu", 1.08)])[
        "gpu_bound_pass"]
    assert not bench_models.targets([row("gpu", 1.01), row("gpu", 1.015)])["gpu_bound_pass"]
    t = bench_models.targets([row("host", 1.01)])
    assert not t["gpu_bound_pass"] and t["gpu_bound_min_ratio"] is None
    lines = bench_models.format_targets(t)
    assert "PASS" in lines[0] and lines[3].startswith("GPU-bound rows: none in this run")


def test_memory_target_is_judged_on_tensor_bytes_where_every_row_read_them():
    """A block of allocator rounding more on the converted side (blocks 1.0005) with the same
    tensor bytes passes; a tensor more (requested 1.0001) fails; a row without the reading
    falls back to the blocks."""
    def row(mem, requested):
        r = {"status": "ok", "size": "gpu", "ratio": 1.0, "memory_ratio": mem, "loss": {"agree": True}}
        if requested is not None:
            r["memory_ratio_requested"] = requested
        return r

    t = bench_models.targets([row(1.0005, 1.0), row(0.99, 0.98)])
    assert t["memory_pass"] and t["memory_judged_on"] == "tensor bytes"
    assert t["max_memory_ratio"] == pytest.approx(1.0005)
    assert t["max_memory_ratio_requested"] == pytest.approx(1.0)
    line = bench_models.format_targets(t)[1]
    assert "1.0005 in allocator blocks, 1.0000 in tensor bytes" in line and "PASS" in line
    assert not bench_models.targets([row(1.0, 1.0001)])["memory_pass"]
    t = bench_models.targets([row(1.0005, 1.0), row(0.99, None)])
    assert t["memory_judged_on"] == "allocator blocks" and not t["memory_pass"]


def test_paired_ratio_spread_pairs_the_blocks_of_a_round():
    """Per-round ratios stock / ours: drift that reaches both sides of a round cancels, and one
    disturbed block widens the interquartile range without moving the median much."""
    from cutlass_nn.bench.stats import paired_ratio_spread

    stock = [8.0, 8.0, 6.0, 6.0, 6.0, 6.0, 6.0, 6.0]  # the host slows early in the run
    ours = [8.0, 8.0, 6.0, 18.0, 6.0, 6.0, 6.0, 6.0]  # and one of our blocks is disturbed
    s = paired_ratio_spread(stock, ours)
    assert s["n"] == 8 and s["median"] == pytest.approx(1.0)
    assert s["p25"] == pytest.approx(1.0) and s["p75"] == pytest.approx(1.0)
    s = paired_ratio_spread([6.0, 6.0, 6.0, 6.0], [5.0, 6.0, 12.0, 4.0])
    assert s["median"] == pytest.approx((1.0 + 1.2) / 2)
    assert s["p25"] == pytest.approx(0.875) and s["p75"] == pytest.approx(1.275)
    assert paired_ratio_spread([], [])["n"] == 0


def test_table_combine_and_plot(tmp_path):
    rows = []
    for mode in ("eager", "compile"):
        r = bench_models.run_row(bench_models.RowSpec("gpt", "host", mode), steps=2, block=1,
                                 warmup=1, device="cpu", dtype=torch.float32, sizes=TINY,
                                 memory_trace=mode == "eager")
        assert r["status"] == "ok", r.get("traceback")
        # the memory trace is CUDA's: on the CPU each side's is None and nothing differs
        assert ("memory_trace_difference" in r) == (mode == "eager")
        assert r.get("memory_trace_difference", []) == []
        assert r["stock"].get("memory_trace") is None
        rows.append(r)
    err = {"family": "bert", "size": "gpu", "mode": "eager", "label": "x", "status": "error",
           "note": "OutOfMemoryError: ..."}
    for r in rows:  # one ratio per round, both sides' blocks of that round
        assert r["block_ratio"]["n"] == 2
        assert r["block_ratio"]["p25"] <= r["block_ratio"]["median"] <= r["block_ratio"]["p75"]
    table = bench_models.format_table(rows + [err])
    assert len(table) == 2 + 3 and "| gpt-host (h64) | compile |" in table[3] and "ERROR" in table[4]
    b = rows[0]["block_ratio"]
    assert f"| {b['p25']:.2f}-{b['p75']:.2f} |" in table[2]
    r0 = rows[0]
    assert (f"| **{r0['ratio']:.3f}** | {b['p25']:.2f}-{b['p75']:.2f} | "
            f"{r0['stock']['step_ms'] / r0['cutlass_nn']['step_ms']:.3f} |") in table[2]
    assert all(line.count("|") == table[0].count("|") for line in table)
    old_run = dict(rows[0])
    del old_run["block_ratio"]  # a run recorded before the spread was kept
    assert "| - |" in bench_models.format_table([old_run])[2]
    paths = []
    for i, part in enumerate((rows[:1], rows[1:] + [err])):
        p = tmp_path / f"models_part{i}.json"
        p.write_text(json.dumps({"mode": "models", "meta": {"device": "cpu", "command": f"c{i}"},
                                 "rows": part}))
        paths.append(p)
    assert bench_models.main(["--what", "models", "--combine", *map(str, paths), "--out", str(tmp_path)]) == 0
    combined = json.loads((tmp_path / "models_part1_combined.json").read_text())
    assert [r["mode"] for r in combined["rows"]] == ["eager", "compile", "eager"]
    assert combined["meta"]["commands"] == ["c0", "c1"]
    assert (tmp_path / "models_part1_combined.png").stat().st_size > 1000


def test_bench_main_delegates(monkeypatch):
    seen = []
    monkeypatch.setattr(bench_models, "main", lambda argv: seen.append(("models", argv)) or 0)
    monkeypatch.setattr(bench_host, "main", lambda argv: seen.append(("host", argv)) or 0)
    assert bench.main(["--what", "models", "--sizes", "host"]) == 0
    assert bench.main(["--what=host"]) == 0
    assert seen == [("models", ["--what", "models", "--sizes", "host"]), ("host", ["--what=host"])]
    assert bench._delegated_what(["--what", "fwd"]) is None


def test_host_cost_loop_on_cpu():
    """The host-cost cases run on CPU tensors too, both sides compute the same values, and the
    measurement reports a ratio per case."""
    cases = bench_host.make_cases(device="cpu", dtype=torch.float32)
    assert set(cases) == {"linear", "mm", "add", "module_fwd_bwd"}
    for name in ("linear", "mm", "add"):
        torch.testing.assert_close(cases[name]["ours"](), cases[name]["torch"]())
    rows = bench_host.measure(cases, calls=20, repeats=3, sync=lambda: None)
    assert [r["case"] for r in rows] == list(cases)
    for r in rows:
        assert r["torch_us"] > 0 and r["ours_us"] > 0
        assert r["ratio"] == pytest.approx(r["ours_us"] / r["torch_us"])
        assert r["pass"] == (r["ratio"] <= bench_host.TARGET_RATIO)
    assert len(bench_host.format_rows(rows)) == 2 + 4


def test_host_compiled_cases_on_cpu():
    """The compiled-step cases run on CPU too: Inductor compiles both stacks (two graphs), the
    converted one calls cutlass_nn's operators and the stock one none, each case gets a ratio,
    and the operator call the Inductor-line cases time (bias as a keyword) computes the GEMM."""
    from torch._dynamo.utils import counters

    cases = bench_host.make_compiled_cases(device="cpu", dtype=torch.float32)
    assert set(cases) == {"compiled_fwd_bwd", "inductor_linear_call", "inductor_linear_positional"}
    graphs = counters["stats"]["unique_graphs"]
    ran = {}
    for side, fn in cases["compiled_fwd_bwd"].items():
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            fn()
        ran[side] = any(e.name.startswith("cutlass_nn::") for e in prof.events())
    assert counters["stats"]["unique_graphs"] - graphs == 2
    assert ran == {"torch": False, "ours": True}
    rows = bench_host.measure(cases, calls=10, repeats=3, sync=lambda: None)
    assert [r["case"] for r in rows] == list(cases)
    for r in rows:
        assert r["torch_us"] > 0 and r["ours_us"] > 0
        assert r["ratio"] == pytest.approx(r["ours_us"] / r["torch_us"])
    x, w = torch.randn(8, 64), torch.randn(64, 64)
    torch.testing.assert_close(torch.ops.cutlass_nn.linear.default(x, w, bias=None), x @ w.t())


@pytest.mark.parametrize("kind", ["cpu", "legacy"])
def test_host_measure_after_profiler_on_cpu(kind):
    """--profile-between: a control pass, one profiler session, a pass after it; the rows say
    which pass they are."""
    cases = {k: v for k, v in bench_host.make_cases(device="cpu", dtype=torch.float32).items()
             if k in ("mm", "add")}
    rows = bench_host.measure_after_profiler(cases, kind, calls=5, repeats=3, sync=lambda: None)
    assert [r["case"] for r in rows] == [
        "mm (again, before a profiler)", "add (again, before a profiler)",
        f"mm (after a {kind} profiler session)", f"add (after a {kind} profiler session)"]
    assert all(r["torch_us"] > 0 and r["ours_us"] > 0 for r in rows)
    assert not torch.autograd.profiler._is_profiler_enabled
    assert bench_host.parse_args(["--profile-between", kind, "--no-compiled"]).no_compiled


def test_vocab_option_reaches_every_row(monkeypatch, tmp_path):
    """--vocab N builds every model with that vocabulary (the families' own sizes: GPT-2
    50257, BERT 30522, whose logits' rows are not 16-byte multiples); without it, 32000."""
    from cutlass_nn.bench import cli as bench

    seen = []

    def fake_row(spec, *, sizes, **kwargs):
        seen.append((spec.size, sizes[spec.size].vocab, sizes[spec.size].hidden))
        return {"family": spec.family, "size": spec.size, "mode": spec.mode,
                "label": spec.label, "status": "skipped", "note": "stand-in"}

    monkeypatch.setattr(bench, "gpu_run_meta", lambda argv: {"device": "stand-in", "torch": "x"})
    monkeypatch.setattr(bench_models, "run_row", fake_row)
    monkeypatch.setattr(bench_models, "plot", lambda *a, **k: None)
    common = ["--what", "models", "--families", "gpt", "--modes", "eager", "--out", str(tmp_path)]
    assert bench_models.main(common + ["--vocab", "50257"]) == 0
    assert seen == [("host", 50257, 1024), ("gpu", 50257, 4096)]
    seen.clear()
    assert bench_models.main(common) == 0
    assert seen == [("host", 32000, 1024), ("gpu", 32000, 4096)]
    assert bench_models.MODEL_SIZES["host"].vocab == 32000  # the defaults are not mutated


def test_memory_reading_collects_garbage_first(monkeypatch):
    """A block held only by a reference cycle (garbage a side left behind) is freed before memory
    is read, not by whichever later collection happens to run inside the next side's window."""
    live = {"bytes": 0}

    class Block:
        def __init__(self, size):
            self.size = size
            live["bytes"] += size

        def __del__(self):
            live["bytes"] -= self.size

    monkeypatch.setattr(memory_readings, "memory_with_workspaces",
                        lambda device: (live["bytes"], live["bytes"]))
    kept = Block(4096)
    was_enabled = gc.isenabled()
    gc.disable()  # no automatic collection between making the garbage and the reading
    try:
        cycle = [Block(1 << 20)]
        cycle.append(cycle)
        del cycle
        assert live["bytes"] == 4096 + (1 << 20)  # the cycle's block is still allocated
        assert memory_readings.memory_now("cpu") == (4096, 4096)
        # frozen objects (the sides' heap while they are timed) are skipped, a cycle made since
        # the freeze is still freed
        gc.freeze()
        try:
            cycle = [Block(1 << 20)]
            cycle.append(cycle)
            del cycle
            assert memory_readings.memory_now("cpu") == (4096, 4096)
        finally:
            gc.unfreeze()
    finally:
        if was_enabled:
            gc.enable()
    del kept


def test_transient_memory_keeps_the_largest_rise_of_each_reading():
    """A block's rise is its peak over its start, per reading (allocated blocks, requested
    bytes), and a side keeps the largest over its blocks, each reading on its own."""
    rec = {"transient_bytes": 0, "transient_requested_bytes": 0}
    memory_readings.raise_transient(rec, peak=(5 << 20, 3 << 20), start=(1 << 20, 1 << 20))
    assert rec == {"transient_bytes": 4 << 20, "transient_requested_bytes": 2 << 20}
    # a later block rises more in requested bytes only: each reading keeps its own maximum
    memory_readings.raise_transient(rec, peak=(4 << 20, 4 << 20), start=(1 << 20, 1 << 20))
    assert rec == {"transient_bytes": 4 << 20, "transient_requested_bytes": 3 << 20}


def test_old_rows_are_read_with_the_paired_ratio():
    """A row recorded before the ratio became the paired median keeps that ratio as
    ratio_of_medians and takes its per-round median; a current row and a failed one are left
    alone; peers and the PDL A/B are paired the same way."""
    from cutlass_nn.bench.models_report import normalize_row, paired_step_ratio

    old = {"status": "ok", "ratio": 0.976, "block_ratio": {"median": 1.078, "p25": 1.0, "p75": 1.1, "n": 8}}
    new = normalize_row(old)
    assert new["ratio"] == 1.078 and new["ratio_of_medians"] == 0.976 and old["ratio"] == 0.976
    assert normalize_row(new) == new
    older = {"status": "ok", "ratio": 0.98}  # no per-round spread kept
    assert normalize_row(older) == dict(older, ratio_of_medians=0.98)
    failed = {"status": "error", "note": "x"}
    assert normalize_row(failed) is failed
    a = {"step_ms": 10.0, "block_step_ms": [10.0, 14.0, 10.0]}
    b = {"step_ms": 11.0, "block_step_ms": [9.0, 14.0, 12.0]}
    assert paired_step_ratio(a, b) == pytest.approx(1.0)  # rounds: 1.11, 1.0, 0.83
    assert paired_step_ratio({"step_ms": 10.0}, {"step_ms": 8.0}) == pytest.approx(1.25)
    stock = dict(b, losses=[5.0, 4.0, 3.0])
    peer = dict(a, losses=[5.0, 4.0, 3.0])
    ours = {"step_ms": 10.0, "block_step_ms": [5.0, 14.0, 20.0]}
    peers.finish(peer, stock, ours, bench_models.compare_losses)
    assert peer["ratio"] == pytest.approx(1.0) and peer["ratio_of_medians"] == pytest.approx(1.1)
    assert peer["ours_vs_peer"] == pytest.approx(1.0)  # rounds: 2.0, 1.0, 0.5
    assert peer["ours_vs_peer_of_medians"] == pytest.approx(1.0)
    assert peer["loss"]["agree"]



def test_median_ci95_is_the_binomial_interval_and_covers_the_median():
    """The interval of the paired median: the order statistics of the sign test's 95% interval
    (ranks 1 and 6 of 6 values, 7 and 18 of 24), none below 6 values, and, drawn again and
    again from a skewed distribution, it holds the true median at least 95% of the time."""
    import random

    from cutlass_nn.bench.stats import median_ci95

    assert median_ci95([6.0, 1.0, 5.0, 2.0, 4.0, 3.0]) == (1.0, 6.0)
    assert median_ci95([float(i) for i in range(24, 0, -1)]) == (7.0, 18.0)
    assert median_ci95([1.0] * 5) == (None, None)
    rng = random.Random(3)
    trials, hits = 2000, 0
    for _ in range(trials):
        lo, hi = median_ci95([rng.expovariate(1.0) for _ in range(40)])
        hits += lo <= math.log(2) <= hi
    assert 0.95 <= hits / trials < 0.995


def test_host_rows_below_parity_say_whether_the_run_resolves_them():
    """A host-bound row under 1.00 is a miss either way; the targets say with its 95% interval
    whether the run could tell it from parity (a wide interval holding 1.00) or not."""
    from cutlass_nn.bench.stats import paired_ratio_spread

    def row(label, stock, ours):
        b = paired_ratio_spread(stock, ours)
        return {"status": "ok", "size": "host", "label": label, "ratio": b["median"],
                "block_ratio": b, "memory_ratio": 1.0, "loss": {"agree": True}}

    noisy = row("noisy", [5.0, 6.0, 5.5, 4.5, 6.5, 5.0, 6.0, 5.2],
                [5.6, 5.4, 5.9, 5.0, 6.0, 5.6, 5.5, 5.8])
    clear = row("clear", [5.0] * 8, [5.3, 5.25, 5.35, 5.3, 5.28, 5.32, 5.3, 5.31])
    fast = row("fast", [5.5] * 8, [5.0] * 8)
    t = bench_models.targets([noisy, clear, fast])
    assert not t["host_bound_pass"]
    assert [b["label"] for b in t["host_bound_below"]] == ["noisy", "clear"]
    line = bench_models.format_targets(t)[0]
    assert "noisy" in line and "holds 1.00: not resolved by this run" in line.split("; clear")[0]
    assert "clear" in line and "not resolved" not in line.split("; clear")[1]
    assert "excludes 1.00: slower than stock" in line.split("; clear")[1]
    assert "fast" not in line
    assert bench_models.ci95_text(fast) == "[1.100, 1.100]"
    old = dict(noisy, block_ratio={"median": 0.98, "p25": 0.9, "p75": 1.1, "n": 8})
    assert bench_models.ci95_text(old) == "-"
    assert "95% CI -" in bench_models.format_targets(bench_models.targets([old]))[0]


def test_alternating_blocks_and_frozen_heap():
    """The timing harnesses' shared schedule: one block per side a round, the first side
    alternating, a short last block; the heap frozen only inside ``frozen_heap``."""
    import gc

    from cutlass_nn.bench.block_probe import alternating_blocks, frozen_heap

    assert list(alternating_blocks(["a", "b"], 5, 2)) == [
        ("a", 0, 2), ("b", 0, 2), ("b", 2, 2), ("a", 2, 2), ("a", 4, 1), ("b", 4, 1)]
    assert list(alternating_blocks(("a",), 0, 5)) == []
    before = gc.get_freeze_count()
    with frozen_heap():
        assert gc.get_freeze_count() > before
    assert gc.get_freeze_count() == before
