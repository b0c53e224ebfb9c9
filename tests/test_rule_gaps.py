"""scripts/rule_gaps.py: today's rule against the committed sweeps' measurements (no GPU). The
pure parts on hand-made rows; the whole script on a hand-made sweep with the real rule harness
(needs a host C++ compiler and the CUDA runtime header, as tests/test_gemm_rule.py)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("rule_gaps", ROOT / "scripts" / "rule_gaps.py")
rg = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rg)

C1 = "sm90_tma_ws_bf16_bf16_nt_128x192x64_1x1x1_coop"
SK = "sm90_tma_ws_bf16_bf16_nt_128x128x64_1x1x1_coop_streamk"


def _row(kernel, ratio, key="c", swizzle=0, splits=0, op="wgrad", shape=(4096, 3584, 768)):
    return {"precision": "bf16", "op": op, "shape": list(shape), "key": key, "status": "ok",
            "kernel": kernel, "ratio": ratio, "swizzle": swizzle, "splits": splits}


def test_layer_shapes_map_to_the_gemms_of_the_harness():
    assert rg.gemm_query("fwd", (4096, 2816, 1024)) == ("fwd", 4096, 2816, 1024)
    assert rg.gemm_query("dgrad", (4096, 2816, 1024)) == ("dgrad", 4096, 1024, 2816)
    assert rg.gemm_query("wgrad", (4096, 2816, 1024)) == ("wgrad", 2816, 1024, 4096)
    with pytest.raises(ValueError, match="op must be fwd, dgrad or wgrad, got 'bwd'"):
        rg.gemm_query("bwd", (1, 2, 3))


def test_plans_compare_by_tile_swizzle_and_stream_k_splits():
    assert rg.short_kernel(C1) == "128x192x64_1x1x1_coop"
    assert rg.short_kernel(C1.replace("_nt_", "_tn_")) == "128x192x64_1x1x1_coop"  # any layout
    assert rg.row_plan(_row(C1, 1.0, swizzle=0, splits=3)) == rg.Plan("128x192x64_1x1x1_coop", 1, None)
    assert rg.row_plan(_row(SK, 1.0, swizzle=2, splits=3)).splits == 3
    line = "2 0 0 | 2 0 4 0 " + SK
    assert rg.parse_plan(line) == rg.Plan("128x128x64_1x1x1_coop_streamk", 1, 4)


def test_a_kernel_without_c_compares_as_its_configuration():
    # v0.38's kernels without a C operand carry "_noc_" before the configuration; the sweeps
    # measured the configuration by the kernel with C
    name = "sm90_tma_ws_bf16_bf16_tn_noc_128x128x64_1x2x1_pingpong"
    assert rg.short_kernel(name) == "128x128x64_1x2x1_pingpong"
    assert rg.short_kernel(name.replace("_noc_", "_")) == "128x128x64_1x2x1_pingpong"


def test_a_plan_is_measured_by_a_forced_row_else_by_the_auto_row_of_its_kernel():
    plan = rg.Plan("128x192x64_1x1x1_coop", 2, None)
    rows = [_row(C1, 0.90, swizzle=2), _row(C1, 0.95, swizzle=2), _row(C1, 0.99, swizzle=1),
            _row(SK, 0.80, key="auto")]
    assert rg.measured(rows, plan) == (0.95, "forced")  # the best of the same variant only
    auto_only = [_row(C1, 0.93, key="auto", swizzle=1)]
    assert rg.measured(auto_only, plan) == (0.93, "auto row")
    assert rg.measured([_row(SK, 0.8)], plan) == (None, "unmeasured")
    best = rg.best_measured(rows, {"128x192x64_1x1x1_coop"})
    assert best == (0.99, rg.Plan("128x192x64_1x1x1_coop", 1, None))
    assert rg.best_measured(rows, set()) is None  # nothing measured is still built


def test_gaps_and_comparison_on_hand_made_groups():
    q = (132, 0, "wgrad", 3584, 768, 4096)  # (SMs, bandwidth unknown) + the harness query
    groups = {("s.json", "wgrad", (4096, 3584, 768)): {
        "device": "H", "sms": 132,
        "rows": [_row(C1, 0.85, swizzle=2), _row(SK, 0.95), _row(SK, 0.80, key="auto")]}}
    built = {"128x192x64_1x1x1_coop", "128x128x64_1x1x1_coop_streamk"}
    c1 = {q: rg.Plan("128x192x64_1x1x1_coop", 2, None)}
    ahead, under = rg.gaps(groups, c1, built, min_gap=0.1)
    assert [(e["plan"], e["ratio"], e["best_ratio"]) for e in ahead] == [
        ("128x192x64_1x1x1_coop/s2", 0.85, 0.95)]
    assert ahead[0]["gap"] == pytest.approx(0.95 / 0.85 - 1)
    assert rg.gaps(groups, c1, built, min_gap=0.2)[0] == []  # 11.8% < 20%
    assert under == []
    groups[("s.json", "wgrad", (4096, 3584, 768))]["rows"][1]["ratio"] = 0.88
    assert [e["best_ratio"] for e in rg.gaps(groups, c1, built, 0.5)[1]] == [0.88]
    sk = {q: rg.Plan("128x128x64_1x1x1_coop_streamk", 1, 0)}
    (change,) = rg.compare(groups, sk, c1)
    assert (change["base_ratio"], change["other_ratio"]) == (0.88, 0.85)
    assert rg.compare(groups, c1, c1) == []


def test_memory_bandwidth_of_a_sweep_from_its_metadata_or_device_name():
    assert rg.memory_gbps({"device": "NVIDIA H200", "memory_gbps": 4000}) == 4000
    assert rg.memory_gbps({"device": "NVIDIA H200"}) == 4915
    assert rg.memory_gbps({"device": "NVIDIA H100 80GB HBM3"}) == 3352
    assert rg.memory_gbps({"device": "NVIDIA H100 PCIe"}) == 0  # not known: the rule's default
    assert rg.memory_gbps({"device": "NVIDIA GH200 480GB"}) == 0  # not an H200
    assert rg.device_key({"sms": 114}) == (114, 0)


def test_latest_keeps_the_newest_sweep_of_each_device_op_and_shape():
    g = lambda device: {"device": device, "sms": 132, "rows": []}  # noqa: E731
    groups = {("sweep_a_20261126-1.json", "fwd", (1, 2, 3)): g("H100"),
              ("sweep_a_20261127-1.json", "fwd", (1, 2, 3)): g("H100"),
              ("sweep_b_20261122-1.json", "fwd", (1, 2, 3)): g("H200"),
              ("sweep_a_20261126-1.json", "wgrad", (1, 2, 3)): g("H100")}
    assert sorted(rg.latest_only(groups)) == [("sweep_a_20261126-1.json", "wgrad", (1, 2, 3)),
                                              ("sweep_a_20261127-1.json", "fwd", (1, 2, 3)),
                                              ("sweep_b_20261122-1.json", "fwd", (1, 2, 3))]


def _cuda_include_present() -> bool:
    return any(b and (Path(b) / "include" / "cuda_runtime.h").is_file()
               for b in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"))


@pytest.mark.skipif(not (shutil.which("g++") or shutil.which("c++")) or not _cuda_include_present(),
                    reason="needs a host C++ compiler and the CUDA runtime header (CUDA_HOME)")
def test_the_script_reads_a_sweep_with_the_real_rule(tmp_path, capsys):
    """The rule (v0.31) runs 4096 x 3584 x 768's weight gradient on the 128x192 tile with a
    swizzle of 2: the script finds that variant's row, the faster stream-K row and the gap."""
    sweep = {"meta": {"device": "NVIDIA H200", "sm_count": 132},
             "rows": [_row(C1, 0.80, swizzle=2), _row(SK, 0.96, splits=0), _row(C1, 0.5, swizzle=1),
                      dict(_row(SK, 0.99), status="error"),  # left out
                      dict(_row(C1, 0.99), precision="fp32")]}  # left out
    (tmp_path / "sweep_x.json").write_text(json.dumps(sweep))
    assert rg.main(["--results", str(tmp_path), "--min-gap", "0.1"]) == 0
    out = capsys.readouterr().out
    assert "1 measured (sweep, op, shape) groups" in out
    assert ("plan 128x192x64_1x1x1_coop/s2 0.800 (forced); best "
            "128x128x64_1x1x1_coop_streamk/s1/k0 0.960 (+20.0%)") in out
    assert "groups where no measured configuration reaches 0.90: 0" in out
    assert rg.main(["--results", str(tmp_path), "--device", "H100"]) == 1  # no such sweep
    assert rg.main(["--results", str(tmp_path), "--compare", str(ROOT / "csrc" / "kernels")]) == 0
    assert "0 measured groups change plan" in capsys.readouterr().out
