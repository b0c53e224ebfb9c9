"""CPU tests of the benchmark harness (cutlass_nn/bench/, through the package namespace): its pure helpers, the case builders
(which run on the CPU flavor of the operators too), the row runner with a fake timer, the
summary / table / JSON / plot output, and the command line without a GPU."""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import cutlass_nn
from cutlass_nn import bench


def patch_bench(monkeypatch, name: str, value) -> None:
    """Replaces ``name`` in every module of the benchmark package that holds it (each module
    looks names up in its own namespace), and in the package itself."""
    for module in (bench, *bench.MODULES):
        if hasattr(module, name):
            monkeypatch.setattr(module, name, value)

REPO = Path(__file__).resolve().parents[1]


class FakeTimer:
    """Stands in for CudaTimer: runs every function once on every input set (so the timed
    closures are exercised) and returns fixed times."""

    def __init__(self, ours=(1.0, 2.0, 3.0), base=(2.0, 4.0, 6.0)):
        self.times = {"ours": list(ours), "base": list(base)}
        self.calls = 0

    def __call__(self, fns, n_sets):
        self.calls += 1
        assert set(fns) == {"ours", "base"}
        for i in range(n_sets):
            for fn in fns.values():
                fn(i)
        return {name: list(ms) for name, ms in self.times.items()}


def _meta(group="gemm", op="fwd", precision="bf16", shape=(64, 48, 32)):
    return bench.RowSpec(group, op, precision, tuple(shape)).meta()


def _ok_row(op, precision, shape, ratio, group="gemm"):
    row = dict(_meta(group, op, precision, shape), status="ok")
    bench.fill_timing(row, {"ours": [1.0], "base": [ratio]}, peak=100.0)
    return row


# ---------------------------------------------------------------------------------------------
# Pure helpers
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("values", [[3.0], [5.0, 1.0], [4.0, 1.0, 3.0, 2.0, 10.0, 0.5, 7.0]])
@pytest.mark.parametrize("q", [0, 10, 50, 90, 100])
def test_percentile_matches_numpy(values, q):
    assert bench.percentile(values, q) == pytest.approx(np.percentile(values, q))


def test_percentile_empty_is_nan():
    assert math.isnan(bench.percentile([], 50))


def test_time_stats():
    stats = bench.time_stats([float(v) for v in range(1, 12)])  # 1..11
    assert stats == {"median_ms": 6.0, "p10_ms": 2.0, "p90_ms": 10.0, "min_ms": 1.0, "n": 11}


def test_work_counts_and_rates():
    assert bench.gemm_flops("fwd", 2, 3, 5) == 60
    for op in ("sm80", "dgrad", "wgrad"):
        assert bench.gemm_flops(op, 2, 3, 5) == 60
    assert bench.gemm_flops("fwdbwd", 2, 3, 5) == 180  # 3 GEMMs
    assert bench.add2_bytes(1000, 2) == 6000  # 2 reads + 1 write
    assert bench.rate(2e12, 1000.0, "TFLOP/s") == pytest.approx(2.0)
    assert bench.rate(3e9, 1.0, "GB/s") == pytest.approx(3000.0)
    assert math.isnan(bench.rate(1.0, 0.0, "GB/s"))
    meta = _meta("gemm", "fwdbwd", "fp16", (16, 32, 64))
    assert meta["work"] == 6 * 16 * 32 * 64 and meta["unit"] == "TFLOP/s"
    assert meta["label"] == "16x32x64" and meta["dtype"] == "float16"
    meta = _meta("add2", "fwd", "fp32", (1 << 20,))
    assert meta["work"] == 3 * 4 * (1 << 20) and meta["unit"] == "GB/s"


def test_geomean():
    assert bench.geomean([1.0, 4.0]) == pytest.approx(2.0)
    assert bench.geomean([2.0, None, float("nan"), 0.0, 8.0]) == pytest.approx(4.0)
    assert bench.geomean([]) is None and bench.geomean([None]) is None


def test_rotation_sets():
    l2 = 50 * 2**20
    assert bench.rotation_sets(200 * 2**20, l2) == 1  # larger than 2 x L2: one set
    assert bench.rotation_sets(100 * 2**20, l2) == 1
    assert bench.rotation_sets(64 * 2**20, l2) == 2
    assert bench.rotation_sets(2**20, l2) == 64  # capped
    assert bench.rotation_sets(2**20, l2, max_sets=8) == 8
    assert bench.rotation_sets(0, l2) == 1
    # every shape of the plan: one pass over the sets covers at least 2 x L2 (or the cap)
    for m, n, k in bench.GEMM_SHAPES:
        for op in bench.GEMM_OPS:
            size = bench.gemm_input_bytes(op, m, n, k, 2)
            sets = bench.rotation_sets(size, l2)
            assert sets * size >= 2 * l2 or sets == 64


def test_memory_estimate_covers_inputs_and_outputs():
    m, n, k = 16384, 16384, 4096
    need = bench.gemm_memory_bytes("fwdbwd", m, n, k, 2, 1)
    assert need >= 2 * (m * k + n * k + m * n) * 3  # inputs + ours / base outputs and grads
    assert bench.add2_memory_bytes("fwd", 1 << 28, 4, 1) >= 4 * 5 * (1 << 28)


# ---------------------------------------------------------------------------------------------
# Plan and command line
# ---------------------------------------------------------------------------------------------


def test_plan_full_and_quick():
    full = bench.plan_rows(False, ["bf16", "fp16", "fp32"], bench.WHAT_ITEMS)
    gemm16 = [r for r in full if r.group == "gemm" and r.precision in ("bf16", "fp16")]
    assert len(gemm16) == 2 * len(bench.GEMM_SHAPES) * len(bench.GEMM_OPS)
    assert {r.shape for r in gemm16} == set(bench.GEMM_SHAPES)
    assert len(bench.GEMM_SHAPES) == 10
    f32 = [r for r in full if r.group == "gemm" and r.precision in ("tf32", "fp32")]
    assert {r.shape for r in f32} == {
        (4096, 4096, 4096),
        (8192, 8192, 8192),
        (2048, 11008, 4096),
        (16384, 4093, 4091),
    }
    assert {(r.precision, r.op) for r in f32} == {
        (p, op) for p in ("tf32", "fp32") for op in bench.GEMM_OPS
    }
    linact = [r for r in full if r.group == "linact"]
    assert {r.precision for r in linact} == {"bf16"}
    assert {r.op for r in linact} == {"eager", "compile"}
    assert {r.shape for r in linact} == set(bench.GEMM_SHAPES) - {(16384, 4093, 4091)}
    assert len(linact) == 2 * 9
    add2 = [r for r in full if r.group == "add2"]
    assert {(r.precision, r.shape[0], r.op) for r in add2} == {
        (p, s, op) for p in ("bf16", "fp32") for s in bench.ADD2_SIZES for op in bench.ADD2_OPS
    }

    # the most important and predictable rows first: bf16 then fp16 GEMMs, add2, float32
    # "highest", linact (torch.compile), TF32 last
    def kind(r):
        if r.group == "gemm":
            return {"bf16": "bf16", "fp16": "fp16", "fp32": "highest", "tf32": "tf32"}[r.precision]
        return r.group

    order = ["bf16", "fp16", "add2", "highest", "linact", "tf32"]
    kinds = [kind(r) for r in full]
    assert kinds == sorted(kinds, key=order.index) and set(kinds) == set(order)
    assert len({(r.group, r.op, r.precision, r.shape) for r in full}) == len(full)


def test_plan_quick_covers_the_issue_minimum():
    args = bench.parse_args(["--quick"])
    quick = bench.plan_rows(True, args.dtypes, args.what)
    gemm = [r for r in quick if r.group == "gemm" and r.precision == "bf16"]
    assert {r.shape for r in gemm} == set(bench.QUICK_SHAPES)
    for shape in [(16384, 4096, 4096), (2048, 11008, 4096), (128, 8192, 8192), (16, 8192, 8192)]:
        assert {r.op for r in gemm if r.shape == shape} == set(bench.GEMM_OPS)
    assert (16384, 4093, 4091) in bench.QUICK_SHAPES
    linact = {(r.op, r.shape) for r in quick if r.group == "linact"}
    assert linact == {
        (op, s) for op in bench.LINACT_OPS for s in [(16384, 4096, 4096), (2048, 11008, 4096)]
    }
    add2 = {(r.precision, r.shape[0]) for r in quick if r.group == "add2"}
    assert {("bf16", 1 << 24), ("bf16", 1 << 28)} <= add2
    assert {p for p, _ in add2} == {"bf16"}  # float32 add2 only in the full run
    f32 = [r for r in quick if r.precision in ("fp32", "tf32")]
    assert {(r.precision, r.shape) for r in f32} == {("fp32", (4096, 4096, 4096))}
    assert {r.precision for r in quick} == {"bf16", "fp32"}
    # without fp32 in --dtypes: no float32 rows
    assert all(r.precision == "bf16" for r in bench.plan_rows(True, ["bf16"], bench.WHAT_ITEMS))
    # a rough row-count bound for the < 2 min budget (v0.1: 36 quick rows took 35 s)
    assert len(quick) <= 50


def test_plan_what_filter():
    rows = bench.plan_rows(False, ["bf16", "fp32"], ["fwd", "fp32"])
    assert {r.op for r in rows} == {"fwd"}
    assert {r.precision for r in rows} == {"bf16", "tf32", "fp32"}
    rows = bench.plan_rows(False, ["fp32"], ["fp32"])  # no GEMM op named: all of them
    assert {r.op for r in rows} == set(bench.GEMM_OPS)
    assert bench.plan_rows(False, ["bf16"], ["fp32"]) == []
    rows = bench.plan_rows(False, ["bf16", "fp16"], ["linact"])
    assert {(r.group, r.precision) for r in rows} == {("linact", "bf16")}
    assert bench.plan_rows(False, ["fp16"], ["linact"]) == []  # linact runs in bf16


def test_parse_args():
    args = bench.parse_args(["--quick"])
    assert args.dtypes == ["bf16", "fp32"] and args.quick and args.out == Path("benchmarks/results")
    assert not args.sweep and args.budget_ms is None
    args = bench.parse_args(["--quick", "--dtypes", "fp16,fp32", "--out", "/tmp/x"])
    assert args.dtypes == ["fp16", "fp32"] and args.out == Path("/tmp/x")
    args = bench.parse_args([])
    assert args.dtypes == ["bf16", "fp16", "fp32"] and args.what == list(bench.WHAT_ITEMS)
    assert "linact" in args.what
    assert bench.parse_args(["--what", "add2,fwd"]).what == ["add2", "fwd"]
    for bad in (
        ["--dtypes", "int8"],
        ["--what", "conv"],
        ["--dtypes", "bf16", "--what", "fp32"],
        ["--budget-ms", "0"],
        ["--budget-ms", "nan"],
        ["--budget-ms", "x"],
        ["--sweep-shapes", "16x16x16"],  # needs --sweep
        ["--sweep-swizzles", "1"],
        ["--sweep-splits", "0,2"],  # needs --sweep
        ["--sweep", "--quick"],
        ["--sweep", "--dtypes", "fp32"],
        ["--sweep", "--what", "fwdbwd,add2"],
        ["--sweep", "--sweep-shapes", "16x16"],
        ["--sweep", "--sweep-shapes", "0x16x16"],
        ["--sweep", "--sweep-swizzles", "-1"],
        ["--sweep", "--sweep-swizzles", "a"],
        ["--sweep", "--sweep-splits", "-1"],  # -2 and below: batched split-K
        ["--sweep", "--sweep-splits", "2,x"],
        ["--sweep", "--sweep-splits", ","],
    ):
        with pytest.raises(SystemExit) as info:
            bench.parse_args(bad)
        assert info.value.code == 2, bad


def test_parse_args_sweep():
    args = bench.parse_args(["--sweep"])
    assert args.sweep and args.dtypes == ["bf16"]
    assert args.sweep_ops == ["fwd", "dgrad", "wgrad"]
    assert args.sweep_shapes == bench.GEMM_SHAPES and args.sweep_swizzles == [1, 4]
    assert args.sweep_splits == [0]
    args = bench.parse_args(
        [
            "--sweep",
            "--sweep-shapes",
            "128x8192x8192, 16X8192x8192,128x8192x8192",
            "--sweep-swizzles",
            "0,2,2,8",
            "--sweep-splits",
            " 4,0, 1,4",
            "--what",
            "wgrad,fwd,fwdbwd",
            "--budget-ms",
            "12.5",
            "--time-limit",
            "60",
        ]
    )
    assert args.sweep_shapes == [(128, 8192, 8192), (16, 8192, 8192)]
    assert args.sweep_swizzles == [0, 2, 8] and args.sweep_ops == ["fwd", "wgrad"]
    assert args.sweep_splits == [4, 0, 1]
    settings = bench.mode_settings(args)
    assert settings.budget_ms == 12.5 and settings.time_limit_s == 60
    assert settings.min_reps == bench.SWEEP.min_reps


def test_mode_settings():
    assert bench.mode_settings(bench.parse_args(["--quick"])) == bench.QUICK
    assert bench.mode_settings(bench.parse_args([])) == bench.FULL
    s = bench.mode_settings(bench.parse_args(["--budget-ms", "100", "--time-limit", "200"]))
    assert (s.budget_ms, s.time_limit_s, s.max_reps) == (100, 200, bench.FULL.max_reps)
    scaled = bench.scale_settings(bench.SWEEP, 9)
    assert scaled.budget_ms == 9 * bench.SWEEP.budget_ms
    assert scaled.row_cap_ms == 9 * bench.SWEEP.row_cap_ms
    assert scaled.min_reps == bench.SWEEP.min_reps
    assert bench.scale_settings(bench.SWEEP, 0) == bench.SWEEP


def _run_cli(*args, **env):
    return subprocess.run(
        [sys.executable, *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env={**os.environ, **env},
    )


def test_import_on_cpu():
    proc = _run_cli("-c", "import cutlass_nn.bench")
    assert proc.returncode == 0, proc.stderr


def test_cli_without_cuda_exits_2():
    # CUDA_VISIBLE_DEVICES="" hides any GPU, so this holds on GPU machines too
    proc = _run_cli("-m", "cutlass_nn.bench", "--quick", CUDA_VISIBLE_DEVICES="")
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert bench.NO_CUDA_MESSAGE in proc.stderr
    assert "no CUDA device" in proc.stderr


def test_cli_help():
    proc = _run_cli("-m", "cutlass_nn.bench", "--help")
    assert proc.returncode == 0
    for flag in (
        "--quick",
        "--out",
        "--dtypes",
        "--what",
        "--time-limit",
        "--budget-ms",
        "--sweep",
        "--sweep-shapes",
        "--sweep-swizzles",
        "--sweep-splits",
    ):
        assert flag in proc.stdout


# ---------------------------------------------------------------------------------------------
# Correctness helpers and case builders (CPU flavor of the operators)
# ---------------------------------------------------------------------------------------------


def test_rel_err_and_sampling():
    ref = torch.tensor([3.0, 4.0], dtype=torch.float64)
    assert bench.rel_err(ref.float(), ref) == 0.0
    assert bench.rel_err(torch.tensor([3.0, 5.0]), ref) == pytest.approx(0.2)
    assert bench.rel_err(torch.tensor([1.0]), torch.zeros(1, dtype=torch.float64)) == 1.0
    gen = torch.Generator().manual_seed(0)
    idx = bench.sample_index(1000, 10, gen, "cpu")
    assert idx.numel() == 10 and torch.all(idx[1:] > idx[:-1]) and idx.max() < 1000
    assert torch.equal(bench.sample_index(5, 10, gen, "cpu"), torch.arange(5))
    a, b = torch.randn(7, 5), torch.randn(5, 6)
    rows, cols = torch.tensor([1, 4]), torch.tensor([0, 2, 5])
    expected = (a.double() @ b.double())[rows][:, cols]
    torch.testing.assert_close(bench.sampled_mm(a, b, rows, cols), expected)
    torch.testing.assert_close(bench.take(a @ b, rows, cols), (a @ b)[rows][:, cols])


def test_compare_outputs_rule():
    ref = torch.randn(8, 8, dtype=torch.float64)
    rows = cols = torch.arange(8)
    good = ref.float()
    ok = bench.compare_outputs({"out": (good, good, ref, rows, cols)}, floor=1e-5)
    assert ok["ok"] and ok["outputs"]["out"]["nonfinite"] == 0
    wrong = good + 1.0
    bad = bench.compare_outputs({"out": (wrong, good, ref, rows, cols)}, floor=1e-5)
    assert not bad["ok"] and "> bound" in bad["summary"]
    nan = good.clone()
    nan[3, 3] = float("nan")
    bad = bench.compare_outputs({"out": (nan, good, ref, rows, cols)}, floor=1e-5)
    assert not bad["ok"] and "non-finite" in bad["summary"]
    bad = bench.compare_outputs({"out": (good.double(), good, ref, rows, cols)}, floor=1e-5)
    assert not bad["ok"] and not bad["outputs"]["out"]["shape_dtype_ok"]


GEMM_CASE_PARAMS = [
    (op, prec) for op in bench.GEMM_OPS for prec in ("bf16", "fp16", "tf32", "fp32")
]


def _exercise_case(build, op, prec):
    """Builds a 37x29x23 case on the CPU with an L2 small enough for 1 input set and with one
    large enough for several; checks it and runs ours and the baseline on every set. Returns
    the last case and its check."""
    for l2, sets in ((1, 1), (40_000, None)):
        case = build(op, 37, 29, 23, bench.PRECISIONS[prec], l2_bytes=l2, device="cpu")
        assert case.n_sets >= 1 and (sets is None or case.n_sets == sets)
        with case.context():
            check = case.check()
            assert check["ok"], check["summary"]
            for i in range(case.n_sets):
                case.fns["ours"](i)
                case.fns["base"](i)
    return case, check


@pytest.mark.parametrize("op,prec", GEMM_CASE_PARAMS, ids=[f"{o}-{p}" for o, p in GEMM_CASE_PARAMS])
def test_gemm_case_on_cpu(op, prec):
    case, check = _exercise_case(bench.build_gemm_case, op, prec)
    expected = {"fwdbwd": {"y", "dx", "dw", "db"}}.get(op, {"out"})
    assert set(check["outputs"]) == expected


@pytest.mark.parametrize("op", bench.ADD2_OPS)
@pytest.mark.parametrize("prec", ["bf16", "fp32"])
def test_add2_case_on_cpu(op, prec):
    case = bench.build_add2_case(op, 100_003, bench.PRECISIONS[prec], l2_bytes=10**6, device="cpu")
    assert case.n_sets >= 2
    check = case.check()
    assert check["ok"], check["summary"]
    assert set(check["outputs"]) == ({"y"} if op == "fwd" else {"y", "da", "db"})
    for i in range(case.n_sets):
        case.fns["ours"](i)
    assert case.kernel_name() == ""


FAKE_ACTS = {
    "gelu_tanh": lambda y: torch.nn.functional.gelu(y, approximate="tanh"),
    "gelu": torch.nn.functional.gelu,
    "relu": torch.nn.functional.relu,
}


class FakeActLinear(torch.nn.Linear):
    """Stands in for CutlassLinear(activation=...), independent of whether (and how) the package
    has it: the cutlass_nn linear operator, then the activation in torch. With
    ``apply_act = False`` it forgets the activation (a wrong result); ``swap_act`` names another
    activation it applies instead."""

    apply_act = True
    swap_act: str | None = None
    from_linear = staticmethod(cutlass_nn.CutlassLinear.from_linear)  # the fwdbwd rows' module

    def __init__(
        self, in_features, out_features, bias=True, device=None, dtype=None, activation=None
    ):
        super().__init__(in_features, out_features, bias, device, dtype)
        self.activation = activation

    def forward(self, x):
        y = cutlass_nn.ops.linear(x, self.weight, self.bias)
        if self.activation is None or not self.apply_act:
            return y
        return FAKE_ACTS[self.swap_act or self.activation](y)


def _real_linact_supported() -> bool:
    """Whether the installed cutlass_nn runs CutlassLinear(activation="gelu_tanh") here."""
    try:
        layer = cutlass_nn.CutlassLinear(4, 4, activation="gelu_tanh")
        x = torch.randn(2, 4, requires_grad=True)
        layer(x).sum().backward()
    except (TypeError, AttributeError, RuntimeError, NotImplementedError):
        return False
    return True


@pytest.fixture
def fake_act(monkeypatch):
    monkeypatch.setattr(bench.cutlass_nn, "CutlassLinear", FakeActLinear)
    patch_bench(monkeypatch, "compile_baseline", lambda module: module)  # no inductor here


@pytest.mark.parametrize("prec", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("op", bench.LINACT_ALL_OPS)
def test_linact_case_on_cpu(fake_act, op, prec):
    case, check = _exercise_case(bench.build_linact_case, op, prec)
    assert set(check["outputs"]) == {"y", "dx", "dw", "db"}
    assert case.n_sets > 1  # the second L2 size rotates several input sets


def test_linact_wrong_activation_fails(fake_act, monkeypatch):
    monkeypatch.setattr(FakeActLinear, "apply_act", False)  # ours forgets the GELU
    spec = bench.RowSpec("linact", "eager", "bf16", (37, 29, 23))
    timer = FakeTimer()
    row = bench.run_row(spec.meta(), lambda: bench.build_case(spec, device="cpu"), timer)
    assert row["status"] == "FAIL" and timer.calls == 0
    assert not row["check"]["outputs"]["y"]["ok"]


@pytest.mark.parametrize(
    "op,swap,prec",
    # the two GELU forms differ by less than bf16 resolves (at most ~2e-4 of the value): float32
    [("eager-relu", "gelu", "bf16"), ("compile-gelu", "gelu_tanh", "fp32"), ("eager", "relu", "bf16")],
)
def test_linact_other_activation_fails(fake_act, monkeypatch, op, swap, prec):
    """The reference follows the row's activation: a layer computing another one fails."""
    monkeypatch.setattr(FakeActLinear, "swap_act", swap)
    spec = bench.RowSpec("linact", op, prec, (37, 29, 23), "mlp")
    row = bench.run_row(spec.meta(), lambda: bench.build_case(spec, device="cpu"), FakeTimer())
    assert row["status"] == "FAIL" and not row["check"]["outputs"]["y"]["ok"]


def test_linact_op_names():
    assert bench.LINACT_ALL_OPS == (
        "eager", "compile", "eager-gelu", "compile-gelu", "eager-relu", "compile-relu"
    )
    for op in bench.LINACT_ALL_OPS:
        assert bench.linact_op(*bench.split_linact_op(op)) == op
    for bad in ("eager-gelu_tanh", "eager-", "-relu", "fwd", "compile-silu", "eager-relu-x"):
        with pytest.raises(ValueError, match="unknown linact op"):
            bench.split_linact_op(bad)
    with pytest.raises(ValueError, match="linact_op: expected"):
        bench.linact_op("eager", "silu")
    with pytest.raises(ValueError, match="unknown linact op 'eager-silu'"):
        bench.build_linact_case("eager-silu", 8, 8, 8, bench.PRECISIONS["bf16"], device="cpu")
    # three GEMMs of work for every linact row
    assert {bench.gemm_flops(op, 2, 3, 5) for op in bench.LINACT_ALL_OPS} == {3 * 2 * 30}


def test_plan_linact_mlp_set():
    rows = bench.plan_rows(False, ["bf16", "fp16", "fp32"], ["linact"], linact_set="mlp")
    assert {(r.group, r.precision, r.shape_set) for r in rows} == {("linact", "bf16", "mlp")}
    assert {r.shape for r in rows} == set(bench.LINACT_MLP_SHAPES)
    for t, n, k in bench.LINACT_MLP_SHAPES:  # the up projection of an MLP: N = 4 x hidden
        assert n == 4 * k and 768 <= k <= 4096 and 4096 <= t <= 16384
    assert {r.op for r in rows} == set(bench.LINACT_ALL_OPS)
    assert len(rows) == len(bench.LINACT_MLP_SHAPES) * len(bench.LINACT_ALL_OPS)
    assert all(r.group == "gemm" for r in bench.plan_rows(False, ["bf16"], ["fwd"], linact_set="mlp"))
    with pytest.raises(ValueError, match="linact_set must be one of"):
        bench.plan_rows(False, ["bf16"], ["linact"], linact_set="gpt")
    args = bench.parse_args(["--what", "linact", "--linact-set", "mlp"])
    assert bench.cli._planned_rows(args) == bench.plan_rows(
        False, args.dtypes, ["linact"], linact_set="mlp"
    )
    for bad in (
        ["--linact-set", "mlp", "--what", "fwd"],
        ["--linact-set", "mlp", "--what", "linact", "--quick"],
        ["--linact-set", "mlp", "--shapes", "8x8x8"],
        ["--linact-set", "gpt"],
    ):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)


def test_linact_mlp_targets_and_table():
    specs = bench.plan_rows(False, ["bf16"], ["linact"], linact_set="mlp")

    def rows_with(ratio_of):
        return [
            {**s.meta(), "status": "ok", "ratio": ratio_of(s), "ours_rate": 1.0} for s in specs
        ]

    rows = rows_with(lambda s: 1.06)
    targets = bench.evaluate_targets(rows)
    assert targets["linact_mlp_eager_min"]["status"] == "PASS"
    assert targets["linact_mlp_compile_min"]["status"] == "PASS"
    assert targets["linact_mlp_eager_min"]["n_rows"] == len(bench.LINACT_MLP_SHAPES) * 3
    # the default-set linact targets do not count the MLP set's rows
    assert targets["linact_eager_geomean"]["status"] == "n/a"
    # one relu row against eager below 1.05 misses the eager target, not the compile one
    worst = ("eager-relu", bench.LINACT_MLP_SHAPES[0])
    rows = rows_with(lambda s: 1.02 if (s.op, s.shape) == worst else 1.06)
    targets = bench.evaluate_targets(rows)
    assert targets["linact_mlp_eager_min"]["status"] == "MISS"
    assert targets["linact_mlp_eager_min"]["value"] == pytest.approx(1.02)
    assert targets["linact_mlp_compile_min"]["status"] == "PASS"
    lines = bench.format_tables(rows)
    start = next(i for i, line in enumerate(lines) if line.startswith("linact MLP"))
    table = lines[start + 2 :]
    assert len(table) == len(bench.LINACT_MLP_SHAPES)
    first = table[0].split()
    assert first[0] == "x".join(map(str, bench.LINACT_MLP_SHAPES[0]))
    # columns: gelu_tanh eg / cp, gelu eg / cp, relu eg / cp
    assert first[1:] == ["1.060", "1.060", "1.060", "1.060", "1.020", "1.060"]
    assert not any(line.startswith("bf16") for line in lines)  # not in the GEMM table


def test_linact_skipped_without_activation_argument(monkeypatch):
    class OldLinear(torch.nn.Linear):  # the constructor of a cutlass_nn without activation=
        pass

    monkeypatch.setattr(bench.cutlass_nn, "CutlassLinear", OldLinear)
    spec = bench.RowSpec("linact", "compile", "bf16", (16, 8, 8))
    row = bench.run_row(spec.meta(), lambda: bench.build_case(spec, device="cpu"), FakeTimer())
    assert row["status"] == "skipped", row.get("note")
    assert "CutlassLinear(activation=...)" in row["note"] and "activation" in row["note"]


def test_linact_row_meta_and_run(fake_act):
    spec = bench.RowSpec("linact", "compile", "bf16", (33, 17, 9))
    meta = spec.meta()
    assert meta["work"] == 3 * 2 * 33 * 17 * 9 and meta["unit"] == "TFLOP/s"
    peaks = {"mm_tflops": {"bf16": 2.0}, "copy_gbps": 5.0}
    assert bench.peak_for(meta, peaks) == 2.0
    row = bench.run_row(meta, lambda: bench.build_case(spec, device="cpu"), FakeTimer(), 2.0)
    assert row["status"] == "ok" and row["ratio"] == pytest.approx(2.0)


@pytest.mark.slow
def test_linact_with_real_torch_compile(monkeypatch):
    """The compile baseline for real (inductor on the CPU): compiled once, checked, timed."""
    monkeypatch.setattr(bench.cutlass_nn, "CutlassLinear", FakeActLinear)
    case = bench.build_linact_case(
        "compile", 24, 16, 8, bench.PRECISIONS["fp32"], l2_bytes=3000, device="cpu"
    )
    assert case.n_sets > 1
    check = case.check()
    assert check["ok"], check["summary"]
    FakeTimer()(case.fns, case.n_sets)


@pytest.mark.skipif(not _real_linact_supported(), reason="CutlassLinear has no activation= yet")
@pytest.mark.parametrize("prec", ["bf16", "fp32"])
@pytest.mark.parametrize("op", ["eager", "eager-gelu", "eager-relu"])
def test_linact_case_with_the_real_module(monkeypatch, prec, op):
    patch_bench(monkeypatch, "compile_baseline", lambda module: module)
    case = bench.build_linact_case(op, 37, 29, 23, bench.PRECISIONS[prec], device="cpu")
    with case.context():
        check = case.check()
    assert check["ok"], check["summary"]


@pytest.mark.parametrize("activation", ["gelu_tanh", "gelu", "relu"])
@pytest.mark.parametrize("chunk", [1 << 25, 40])
def test_linact_reference_matches_autograd(monkeypatch, chunk, activation):
    patch_bench(monkeypatch, "REF_CHUNK_ELEMENTS", chunk)  # 40: x in chunks of 3 rows
    gen = torch.Generator().manual_seed(3)
    m, n, k = 19, 11, 13
    x = torch.randn(m, k, generator=gen, dtype=torch.float64, requires_grad=True)
    w = torch.randn(n, k, generator=gen, dtype=torch.float64, requires_grad=True)
    b = torch.randn(n, generator=gen, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(m, n, generator=gen, dtype=torch.float64)
    y = FAKE_ACTS[activation](x @ w.t() + b)
    y.backward(dy)
    rm, cn, ck = torch.tensor([0, 5, 18]), torch.tensor([1, 10]), torch.tensor([2, 3, 12])
    refs = bench.linact_reference(x, w, b, dy, rm, cn, ck, activation)
    expected = {
        "y": y.detach()[rm][:, cn],
        "dx": x.grad[rm][:, ck],
        "dw": w.grad[cn][:, ck],
        "db": b.grad[cn],
    }
    for name, (ref, rows, cols) in refs.items():
        torch.testing.assert_close(ref, expected[name])
        assert ref.dtype == torch.float64
        full = {"y": y.detach(), "dx": x.grad, "dw": w.grad, "db": b.grad}[name]
        torch.testing.assert_close(bench.take(full, rows, cols), expected[name])


def test_linact_memory_estimate():
    m, n, k = 16384, 4096, 16384
    need = bench.linact_memory_bytes(m, n, k, 2, 1)
    assert need >= 2 * (m * k + n * k + m * n) * 3
    assert need >= 8 * bench.REF_CHUNK_ELEMENTS
    assert bench.linact_input_bytes(m, n, k, 2) == 2 * (m * k + n * k + n + m * n)


def test_precision_context_restores():
    before = (torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.allow_tf32)
    with bench.precision_context(bench.PRECISIONS["fp32"]):
        assert torch.get_float32_matmul_precision() == "highest"
    with bench.precision_context(bench.PRECISIONS["tf32"]):
        assert torch.get_float32_matmul_precision() == "high"
    assert (torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.allow_tf32) == before


def test_wrong_kernel_is_marked_fail_and_not_timed(monkeypatch):
    real = cutlass_nn.functional.linear
    monkeypatch.setattr(cutlass_nn.functional, "linear", lambda x, w, b=None: real(x, w, b) * 1.01)
    timer = FakeTimer()
    spec = bench.RowSpec("gemm", "fwd", "bf16", (37, 29, 23))
    row = bench.run_row(spec.meta(), lambda: bench.build_case(spec, device="cpu"), timer)
    assert row["status"] == "FAIL" and timer.calls == 0
    assert "not timed" in row["note"] and not row["check"]["ok"]
    assert "ratio" not in row and "ours" not in row


def test_unwritten_output_is_caught(monkeypatch):
    def dgrad_with_hole(dy, w):
        out = torch.ops.cutlass_nn.linear_dgrad.default(dy, w)
        out[-1, -1] = float("nan")  # an element the kernel "did not write"
        return out

    monkeypatch.setattr(bench.ops, "linear_dgrad", dgrad_with_hole)
    case = bench.build_gemm_case("dgrad", 40, 30, 20, bench.PRECISIONS["fp32"], device="cpu")
    check = case.check()
    assert not check["ok"] and check["outputs"]["out"]["nonfinite"] == 1


# ---------------------------------------------------------------------------------------------
# Row runner and plan runner with a fake timer
# ---------------------------------------------------------------------------------------------


def test_run_row_ok_with_fake_timer():
    spec = bench.RowSpec("gemm", "fwd", "bf16", (37, 29, 23))
    timer = FakeTimer(ours=[1.0, 2.0, 3.0], base=[2.0, 4.0, 6.0])
    row = bench.run_row(spec.meta(), lambda: bench.build_case(spec, device="cpu"), timer, peak=1e-6)
    assert row["status"] == "ok", row.get("note")
    assert timer.calls == 1
    assert row["ours"]["median_ms"] == 2.0 and row["base"]["median_ms"] == 4.0
    assert row["ours"]["n"] == 3 and row["ours"]["p10_ms"] == pytest.approx(1.2)
    assert row["ratio"] == pytest.approx(2.0)  # torch time / ours time
    flops = 2 * 37 * 29 * 23
    assert row["ours_rate"] == pytest.approx(flops / 2e-3 / 1e12)
    assert row["ours_frac_peak"] == pytest.approx(row["ours_rate"] / 1e-6)
    assert row["check"]["ok"] and row["input_sets"] >= 1 and "kernel" in row


class FakeEagerTimer(FakeTimer):
    """FakeTimer with CudaTimer's eager-latency measurement (fixed per-call times)."""

    def __init__(self, eager_ours=(0.02, 0.03, 0.04), eager_base=(0.03, 0.06, 0.09)):
        super().__init__()
        self.eager_times = {"ours": list(eager_ours), "base": list(eager_base)}

    def eager(self, fns, n_sets):
        for fn in fns.values():
            fn(0)
        return {name: list(ms) for name, ms in self.eager_times.items()}


def test_run_row_records_eager_latency():
    """A timer that measures eager latency adds each side's median per-call time and their
    ratio; the summary keeps their geomean beside the throughput one and prints both."""
    spec = bench.RowSpec("gemm", "fwd", "bf16", (37, 29, 23))
    row = bench.run_row(
        spec.meta(), lambda: bench.build_case(spec, device="cpu"), FakeEagerTimer(), peak=1e-6
    )
    assert row["status"] == "ok", row.get("note")
    assert row["ours_eager_ms"] == pytest.approx(0.03)
    assert row["base_eager_ms"] == pytest.approx(0.06)
    assert row["eager_ratio"] == pytest.approx(2.0)
    assert row["ratio"] == pytest.approx(2.0)  # the throughput ratio is unchanged
    summary = bench.summarize([row])
    (entry,) = summary["geomeans"]
    assert entry["eager_geomean"] == pytest.approx(2.0)
    lines = bench.format_summary(summary, {}, [row])
    assert any(line.startswith("geomean eager-latency ratio") for line in lines), lines
    assert "eager 30/60 us 2.000" in bench.format_progress(0, 1, row, 1.0)
    # without eager latency (FakeTimer), no eager fields
    plain = bench.run_row(spec.meta(), lambda: bench.build_case(spec, device="cpu"), FakeTimer())
    assert "eager_ratio" not in plain and "eager" not in bench.format_progress(0, 1, plain, 1.0)


def test_run_row_records_errors_and_skips():
    def broken():
        raise RuntimeError("CUDA error: an illegal memory access was encountered\nmore")

    row = bench.run_row(_meta(), broken, FakeTimer())
    assert row["status"] == "error"
    assert row["note"] == "RuntimeError: CUDA error: an illegal memory access was encountered"
    assert "Traceback" in row["traceback"]

    def too_big():
        raise bench.SkipRow("skipped: needs about 99.0 GiB of device memory, 10.0 GiB available")

    row = bench.run_row(_meta(), too_big, FakeTimer())
    assert row["status"] == "skipped" and "99.0 GiB" in row["note"]

    def timer_fails(fns, n_sets):
        raise torch.OutOfMemoryError("CUDA out of memory")

    spec = bench.RowSpec("gemm", "wgrad", "fp32", (8, 8, 8))
    row = bench.run_row(spec.meta(), lambda: bench.build_case(spec, device="cpu"), timer_fails)
    assert row["status"] == "error" and "out of memory" in row["note"]


def test_run_plan_end_to_end_on_cpu():
    specs = [bench.RowSpec("gemm", op, "bf16", (33, 17, 9)) for op in bench.GEMM_OPS]
    specs += [bench.RowSpec("add2", op, "fp32", (1000,)) for op in bench.ADD2_OPS]
    seen = []
    rows, interrupted = bench.run_plan(
        specs,
        lambda s: bench.build_case(s, device="cpu"),
        FakeTimer(),
        {"mm_tflops": {"bf16": 1.0}, "copy_gbps": 1.0},
        time_limit_s=1e9,
        on_row=lambda i, n, row: seen.append((i, n, row["status"])),
    )
    assert not interrupted
    assert [r["status"] for r in rows] == ["ok"] * len(specs), [r.get("note") for r in rows]
    assert seen == [(i, len(specs), "ok") for i in range(len(specs))]
    assert all(r["ours_frac_peak"] is not None for r in rows)


def test_run_plan_time_limit_and_broken_context():
    specs = [bench.RowSpec("gemm", "fwd", "bf16", (8, 8, 8 * i)) for i in range(1, 5)]
    ticks = iter([0.0, 0.0, 5.0, 20.0, 30.0])  # start, then one reading before each row
    rows, _ = bench.run_plan(
        specs,
        lambda s: bench.build_case(s, device="cpu"),
        FakeTimer(),
        {},
        time_limit_s=10.0,
        clock=lambda: next(ticks),
    )
    assert [r["status"] for r in rows] == ["ok", "ok", "skipped", "skipped"]
    assert "time limit" in rows[2]["note"]

    def build(spec):
        raise RuntimeError("CUDA error: device-side assert triggered")

    rows, _ = bench.run_plan(specs, build, FakeTimer(), {}, time_limit_s=1e9, healthy=lambda: False)
    assert [r["status"] for r in rows] == ["error", "skipped", "skipped", "skipped"]
    assert "unusable" in rows[1]["note"]


def test_run_plan_interrupted():
    specs = [bench.RowSpec("gemm", "fwd", "bf16", (8, 8, 8 * i)) for i in range(1, 4)]
    calls = []

    def build(spec):
        calls.append(spec)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return bench.build_case(spec, device="cpu")

    rows, interrupted = bench.run_plan(specs, build, FakeTimer(), {}, time_limit_s=1e9)
    assert interrupted and [r["status"] for r in rows] == ["ok", "skipped", "skipped"]


# ---------------------------------------------------------------------------------------------
# Summary, tables, JSON, plot
# ---------------------------------------------------------------------------------------------


def _synthetic_rows():
    rows = [
        _ok_row("fwd", "bf16", (16384, 4096, 4096), 0.5),
        _ok_row("fwd", "bf16", (128, 8192, 8192), 2.0),
        _ok_row("fwdbwd", "bf16", (128, 8192, 8192), 1.5),
        _ok_row("fwd", "fp16", (16, 8192, 8192), 0.9),
        _ok_row("sm80", "bf16", (16384, 4096, 4096), 0.4),
        _ok_row("fwd", "tf32", (4096, 4096, 4096), 1.1),
        _ok_row("fwd", "bf16", (1 << 20,), 0.8, group="add2"),
        dict(
            _meta("gemm", "dgrad", "bf16", (16384, 4093, 4091)),
            status="FAIL",
            note="wrong result, not timed: out: err 1e-1",
        ),
        dict(
            _meta("gemm", "wgrad", "bf16", (16384, 4093, 4091)),
            status="error",
            note="RuntimeError: boom",
        ),
        dict(
            _meta("gemm", "fwdbwd", "bf16", (16384, 4093, 4091)),
            status="skipped",
            note="skipped: too big",
        ),
    ]
    return rows


def test_summarize():
    summary = bench.summarize(_synthetic_rows())
    assert summary["fwd_geomean"]["bf16"] == pytest.approx(1.0)  # sqrt(0.5 * 2)
    assert summary["fwd_geomean"]["fp16"] == pytest.approx(0.9)
    assert summary["fwdbwd_geomean"] == {"bf16": pytest.approx(1.5)}
    assert summary["min_ratio"]["ratio"] == pytest.approx(0.4)
    assert summary["min_ratio"]["row"] == "gemm bf16 sm80 16384x4096x4096"
    assert {(e["label"], e["op"]) for e in summary["small_m"]} == {
        ("128x8192x8192", "fwd"),
        ("128x8192x8192", "fwdbwd"),
        ("16x8192x8192", "fwd"),
    }
    assert summary["counts"] == {"ok": 7, "FAIL": 1, "error": 1, "skipped": 1}
    add2 = [e for e in summary["geomeans"] if e["group"] == "add2"]
    assert add2 == [
        {
            "group": "add2",
            "op": "fwd",
            "precision": "bf16",
            "geomean": pytest.approx(0.8),
            "eager_geomean": None,  # the synthetic rows have no eager latency
            "n": 1,
        }
    ]


def test_tables_and_summary_lines():
    rows = _synthetic_rows()
    lines = bench.format_tables(rows)
    text = "\n".join(lines)
    assert "16384x4096x4096" in text and "FAIL" in text and "ERR" in text and "skip" in text
    bf16_line = next(line for line in lines if line.startswith("bf16  16384x4096x4096"))
    assert "0.500" in bf16_line and "0.400" in bf16_line
    assert lines.index(bf16_line) < next(
        i for i, line in enumerate(lines) if line.startswith("tf32")
    )
    peaks = {"mm_tflops": {"bf16": 778.4, "fp16": 748.0}, "copy_gbps": 4171.2}
    summary_lines = bench.format_summary(bench.summarize(rows), peaks, rows)
    stext = "\n".join(summary_lines)
    assert "bf16 778" in stext and "copy 4171 GB/s" in stext
    assert "min ratio: 0.400" in stext and "small M bf16 128x8192x8192" in stext
    assert "FAIL gemm bf16 dgrad" in stext and "ERROR gemm bf16 wgrad" in stext
    assert summary_lines[-1] == "rows: 7 ok, 1 FAIL, 1 error, 1 skipped"
    assert all(len(line) <= 200 for line in lines + summary_lines)
    for row in rows:
        assert len(bench.format_progress(0, 10, row, 1.0)) <= 240


def _full_run_rows(ratio=lambda i, spec: 1.0 + i / 1000):
    specs = bench.plan_rows(False, ["bf16", "fp16", "fp32"], bench.WHAT_ITEMS)
    rows = []
    for i, s in enumerate(specs):
        row = dict(s.meta(), status="ok")
        bench.fill_timing(row, {"ours": [1.0], "base": [ratio(i, s)]}, peak=None)
        if s.precision == "fp32" and s.group == "gemm":
            row["check"] = {"outputs": {"out": {"err_ours": 1.5e-7, "err_torch": 1e-7}}}
        rows.append(row)
    return rows


def test_tables_fit_the_visible_tail():
    """A full run's table and summary (targets last) fit in the last 12,000 characters of
    output the lead sees of a device run, with room for the final line."""
    rows = _full_run_rows()
    peaks = {"mm_tflops": {p: 1.0 for p in bench.PRECISION_ORDER}, "copy_gbps": 1.0}
    lines = bench.format_tables(rows) + bench.format_summary(bench.summarize(rows), peaks, rows)
    assert sum(len(line) + 1 for line in lines) <= 10_000, sum(len(line) for line in lines)
    assert all(len(line) <= 200 for line in lines)
    text = "\n".join(lines)
    assert "targets" in text and "linact vs eager" in lines[0] + text
    assert "fp32 highest 4096x4096x4096: ours err 1.50e-07 vs cuBLAS err 1.00e-07" in text


def test_targets_all_pass_and_miss():
    rows = _full_run_rows(ratio=lambda i, s: 3.0)
    targets = bench.summarize(rows)["targets"]
    # the transformer-set targets select only rows of `--shapes transformer`: none in this run
    expected = ["n/a" if t.shape_set else "PASS" for t in bench.TARGETS]
    assert [t["status"] for t in targets.values()] == expected
    assert set(targets) == {t.key for t in bench.TARGETS}
    rows = _full_run_rows(ratio=lambda i, s: 0.5)
    targets = bench.evaluate_targets(rows)
    # the transformer-set and MLP-set targets select only rows of those sets: none in this run
    assert {
        t["status"]
        for k, t in targets.items()
        if not k.startswith(("transformer_", "linact_mlp_"))
    } == {"MISS"}
    assert targets["bf16_fwd_geomean"]["value"] == pytest.approx(2.0 - 1.5)
    assert targets["bf16_fwd_geomean"]["n_ok"] == len(bench.GEMM_SHAPES)
    assert targets["small_m_fwdbwd_min"]["n_rows"] == 4  # 128 and 16 rows, bf16 and fp16
    assert targets["add2_16m_256m_min"]["n_rows"] == 2 * 2 * 2  # 16M, 256M x ops x dtypes
    assert targets["linact_eager_geomean"]["n_rows"] == 9
    assert targets["fp32_highest_geomean"]["n_rows"] == 4 * 4  # 4 shapes, not sm80, not tf32


def test_targets_values_thresholds_and_problems():
    rows = [
        _ok_row("fwd", "bf16", (16384, 4096, 4096), 1.10),
        _ok_row("fwd", "bf16", (128, 8192, 8192), 0.95),
        _ok_row("fwd", "bf16", (16, 8192, 8192), 0.89),
        _ok_row("fwdbwd", "bf16", (128, 8192, 8192), 1.6),
        _ok_row("fwdbwd", "fp16", (16, 8192, 8192), 1.5),
        _ok_row("fwdbwd", "bf16", (1024, 4096, 4096), 0.2),  # not small M
        _ok_row("eager", "bf16", (2048, 11008, 4096), 1.2, group="linact"),
        _ok_row("compile", "bf16", (2048, 11008, 4096), 1.0, group="linact"),
        _ok_row("fwd", "bf16", (1 << 20,), 0.5, group="add2"),  # 1M: not a target
        _ok_row("fwd", "bf16", (1 << 24,), 0.96, group="add2"),
        _ok_row("fwdbwd", "fp32", (1 << 28,), 0.99, group="add2"),
        _ok_row("fwd", "fp32", (4096, 4096, 4096), 2.5),
        _ok_row("sm80", "fp32", (4096, 4096, 4096), 0.1),  # sm80 is not a target
        _ok_row("fwd", "tf32", (4096, 4096, 4096), 0.1),  # neither is TF32
        dict(_meta("gemm", "fwd", "fp16", (4096, 4096, 4096)), status="FAIL", note="wrong"),
        dict(_meta("gemm", "fwd", "fp16", (8192, 8192, 8192)), status="skipped", note="time"),
        dict(_meta("gemm", "fwdbwd", "fp16", (8192, 8192, 8192)), status="skipped", note="t"),
    ]
    t = bench.evaluate_targets(rows)
    assert t["bf16_fwd_geomean"]["value"] == pytest.approx((1.10 * 0.95 * 0.89) ** (1 / 3))
    assert t["bf16_fwd_geomean"]["status"] == "MISS"
    assert t["bf16_fwd_min"]["value"] == pytest.approx(0.89)
    assert t["bf16_fwd_min"]["worst"] == "gemm bf16 fwd 16x8192x8192"
    assert t["bf16_fwd_min"]["status"] == "MISS" and t["bf16_fwd_min"]["threshold"] == 0.90
    assert t["fp16_fwd_geomean"]["status"] == "MISS"  # its only row FAILed: no value
    assert t["fp16_fwd_geomean"]["value"] is None
    assert t["fp16_fwd_geomean"]["not_ok"] == {"FAIL": 1, "skipped": 1}
    assert t["fp16_fwdbwd_geomean"]["status"] == "PASS"  # a skipped row does not count
    assert t["fp16_fwdbwd_geomean"]["not_ok"] == {"skipped": 1}
    only_skipped = bench.evaluate_targets(rows[-1:])
    assert only_skipped["fp16_fwdbwd_geomean"]["status"] == "n/a"
    assert only_skipped["bf16_fwd_geomean"] == {
        "title": "bf16 fwd geomean",
        "reduce": "geomean",
        "threshold": 1.0,
        "value": None,
        "status": "n/a",
        "n_ok": 0,
        "n_rows": 0,
        "not_ok": {},
        "worst": None,
    }
    assert t["bf16_fwdbwd_geomean"]["value"] == pytest.approx((1.6 * 0.2) ** 0.5)
    assert t["small_m_fwdbwd_min"]["value"] == pytest.approx(1.5)
    assert t["small_m_fwdbwd_min"]["status"] == "PASS"  # 1.5 >= 1.5
    assert t["linact_eager_geomean"]["status"] == "PASS"
    assert t["linact_compile_geomean"]["status"] == "MISS"
    assert t["add2_16m_256m_min"]["value"] == pytest.approx(0.96)
    assert t["add2_16m_256m_min"]["status"] == "PASS" and t["add2_16m_256m_min"]["n_rows"] == 2
    assert t["fp32_highest_geomean"]["value"] == pytest.approx(2.5)
    assert t["fp32_highest_geomean"]["status"] == "PASS"
    assert t["fp32_highest_geomean"]["n_rows"] == 1
    lines = bench.format_targets(t)
    assert lines[0].startswith("targets")
    assert len(lines) == 1 + len(bench.TARGETS)
    line = next(x for x in lines if "bf16 fwd min" in x)
    assert line.split()[0] == "MISS" and ">= 0.90: 0.890" in line
    assert "worst gemm bf16 fwd 16x8192x8192" in line
    line = next(x for x in lines if "fp16 fwd+bwd geomean" in x)
    assert line.split()[0] == "PASS" and "1/2 rows" in line and "1 skipped" in line
    line = next(x for x in bench.format_targets(only_skipped) if "fp16 fwd+bwd" in x)
    assert line.split()[0] == "n/a" and ": n/a (0/1 rows, 1 skipped)" in line
    assert any(x.split()[0] == "PASS" and "linact vs eager" in x for x in lines)
    assert bench.format_targets({}) == []


def test_fp32_highest_errors_in_summary():
    def row(op, label_shape, e_ours, e_torch, status="ok"):
        r = _ok_row(op, "fp32", label_shape, 2.0)
        r["status"] = status
        outputs = {"y": {"err_ours": e_ours, "err_torch": e_torch}, "dx": {"err_ours": 1e-9}}
        r["check"] = {"outputs": outputs}
        return r

    rows = [
        row("fwd", (4096, 4096, 4096), 2e-7, 1e-7),
        row("fwdbwd", (4096, 4096, 4096), 3e-7, 0.5e-7, status="FAIL"),
        row("sm80", (4096, 4096, 4096), 9e-3, 1e-7),  # left out of the printed line
        row("fwd", (8192, 8192, 8192), float("nan"), 1e-7),
    ]
    tf32 = _ok_row("fwd", "tf32", (4096, 4096, 4096), 1.0)
    tf32["check"] = {"outputs": {"out": {"err_ours": 1e-3, "err_torch": 1e-3}}}
    summary = bench.summarize([*rows, tf32])
    errs = summary["fp32_highest_errors"]
    assert [(e["label"], e["op"], e["status"]) for e in errs] == [
        ("4096x4096x4096", "fwd", "ok"),
        ("4096x4096x4096", "fwdbwd", "FAIL"),
        ("4096x4096x4096", "sm80", "ok"),
        ("8192x8192x8192", "fwd", "ok"),
    ]
    assert errs[1]["err_ours"] == pytest.approx(3e-7) and errs[1]["err_torch"] == 1e-7 * 0.5
    lines = bench.format_fp32_errors(errs)
    assert lines == [
        "fp32 highest 4096x4096x4096: ours err 3.00e-07 vs cuBLAS err 1.00e-07 "
        "(worst of fwd,fwd+bwd)",
        "fp32 highest 8192x8192x8192: ours err n/a vs cuBLAS err 1.00e-07 (worst of fwd)",
    ]
    text = "\n".join(bench.format_summary(summary, {}, [*rows, tf32]))
    assert lines[0] in text and lines[1] in text
    assert bench.worst_errors({}) == (None, None)


def test_linact_in_tables_and_summary():
    rows = [
        _ok_row("fwd", "bf16", (2048, 11008, 4096), 0.97),
        _ok_row("eager", "bf16", (2048, 11008, 4096), 1.25, group="linact"),
        dict(_meta("linact", "compile", "bf16", (2048, 11008, 4096)), status="error", note="x"),
        _ok_row("eager", "bf16", (16384, 4096, 4096), 1.21, group="linact"),
    ]
    lines = bench.format_tables(rows)
    assert "act/eg" in lines[1] and "act/cp" in lines[1]
    line = next(x for x in lines if x.startswith("bf16  2048x11008x4096"))
    assert line.endswith(" 1.250    ERR")
    line = next(x for x in lines if x.startswith("bf16  16384x4096x4096"))
    assert line.endswith(" 1.210      -")
    summary = bench.summarize(rows)
    text = "\n".join(bench.format_summary(summary, {}, rows))
    assert "linact vs eager   bf16 1.230 (2)" in text
    assert "ERROR linact bf16 compile 2048x11008x4096: x" in text
    assert "act/eg" not in bench.format_tables(rows[:1])[1]  # no linact rows: no columns


def test_write_json_roundtrip(tmp_path):
    rows = _synthetic_rows()
    rows[0]["ours_rate"] = float("nan")
    results = {
        "meta": {"device": "fake"},
        "rows": rows,
        "summary": bench.summarize(rows),
        "t": (1, 2),
    }
    path = tmp_path / "r.json"
    bench.write_json(path, results)
    loaded = json.loads(path.read_text())
    assert loaded["rows"][0]["ours_rate"] is None and loaded["t"] == [1, 2]
    assert loaded["rows"][7]["status"] == "FAIL"
    assert not list(tmp_path.glob("*.tmp"))


def test_replot_from_json(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    path = tmp_path / "bench_x.json"
    bench.write_json(path, {"meta": {"device": "Fake"}, "rows": _synthetic_rows()})
    assert bench.main(["--plot", str(path)]) == 0
    assert path.with_suffix(".png").stat().st_size > 1000
    assert str(path.with_suffix(".png")) in capsys.readouterr().out


def test_plot(tmp_path):
    pytest.importorskip("matplotlib")
    path = bench.plot_results(_synthetic_rows(), tmp_path / "p.png", "test")
    assert path is not None and path.stat().st_size > 1000
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert bench.plot_results([], tmp_path / "q.png", "empty") is None


def _fake_gpu(monkeypatch, specs):
    """main() with the CUDA-only pieces replaced: CPU cases, the fake timer, fixed peaks."""

    class Timer(FakeTimer):
        def __init__(self, settings):
            super().__init__()
            self.cycles_per_ms = None

    monkeypatch.setattr(bench.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(bench.cutlass_nn, "has_cuda_kernels", lambda: True)
    patch_bench(monkeypatch, "plan_rows", lambda quick, dtypes, what, **kw: list(specs))
    patch_bench(monkeypatch, "CudaTimer", Timer)
    patch_bench(monkeypatch, "cuda_healthy", lambda: True)
    patch_bench(monkeypatch,
        "measure_peaks",
        lambda timer, precs: {"mm_tflops": {"bf16": 1e-6}, "copy_gbps": 1e-3},
    )
    patch_bench(monkeypatch,
        "collect_meta",
        lambda argv: {
            "device": "Fake GPU 80GB",
            "capability": "9.0",
            "sm_count": 1,
            "l2_bytes": 1000,
            "torch": torch.__version__,
            "cuda": None,
            "date_utc": "2026-01-01T00:00:00Z",
            "command": "python -m cutlass_nn.bench " + " ".join(argv),
        },
    )
    real_build = bench.build_case
    patch_bench(monkeypatch,
        "build_case",
        lambda spec, l2_bytes: real_build(spec, l2_bytes=l2_bytes, device="cpu"),
    )


def test_main_end_to_end_with_fakes(monkeypatch, tmp_path, capsys):
    specs = [bench.RowSpec("gemm", op, "bf16", (33, 17, 9)) for op in bench.GEMM_OPS]
    specs += [bench.RowSpec("add2", "fwd", "bf16", (1000,))]
    _fake_gpu(monkeypatch, specs)
    assert bench.main(["--quick", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "bf16  33x17x9" in out and "rows: 6 ok, 0 FAIL, 0 error, 0 skipped" in out
    (json_path,) = tmp_path.glob("bench_fake-gpu-80gb_*_quick.json")
    results = json.loads(json_path.read_text())
    assert results["meta"]["device"] == "Fake GPU 80GB"
    assert [r["status"] for r in results["rows"]] == ["ok"] * 6
    assert results["summary"]["fwd_geomean"]["bf16"] == pytest.approx(2.0)
    assert results["settings"]["budget_ms"] == bench.QUICK.budget_ms
    if importlib.util.find_spec("matplotlib"):
        assert json_path.with_suffix(".png").exists()


def test_main_exit_code_3_on_failures(monkeypatch, tmp_path, capsys):
    real = cutlass_nn.functional.linear
    monkeypatch.setattr(cutlass_nn.functional, "linear", lambda x, w, b=None: real(x, w, b) + 1)
    _fake_gpu(monkeypatch, [bench.RowSpec("gemm", "fwd", "bf16", (33, 17, 9))])
    assert bench.main(["--out", str(tmp_path)]) == 3
    out = capsys.readouterr().out
    assert "FAIL gemm bf16 fwd 33x17x9: wrong result, not timed" in out


def test_main_with_linact_fp32_and_targets(monkeypatch, tmp_path, capsys, fake_act):
    specs = [bench.RowSpec("gemm", op, "bf16", (33, 17, 9)) for op in ("fwd", "fwdbwd")]
    specs += [bench.RowSpec("linact", op, "bf16", (33, 17, 9)) for op in bench.LINACT_OPS]
    specs += [bench.RowSpec("gemm", "fwd", "fp32", (33, 17, 9))]
    _fake_gpu(monkeypatch, specs)
    assert bench.main(["--quick", "--out", str(tmp_path), "--budget-ms", "7"]) == 0
    out = capsys.readouterr().out
    assert "act/eg" in out and "linact vs compile bf16 2.000 (1)" in out
    assert "fp32 highest 33x17x9: ours err" in out
    assert "  PASS linact vs eager geomean" in out and "  n/a  fp16 fwd geomean" in out
    (json_path,) = tmp_path.glob("bench_*_quick.json")
    results = json.loads(json_path.read_text())
    assert results["settings"]["budget_ms"] == 7
    targets = results["summary"]["targets"]
    assert targets["linact_compile_geomean"]["status"] == "PASS"
    assert targets["fp32_highest_geomean"]["value"] == pytest.approx(2.0)
    assert results["summary"]["fp32_highest_errors"][0]["err_torch"] is not None
    linact = [r for r in results["rows"] if r["group"] == "linact"]
    assert {r["op"] for r in linact} == {"eager", "compile"}
    assert all(set(r["check"]["outputs"]) == {"y", "dx", "dw", "db"} for r in linact)


# ---------------------------------------------------------------------------------------------
# --sweep
# ---------------------------------------------------------------------------------------------


def test_sweep_pure_helpers():
    assert bench.parse_config_names("") == []
    assert bench.parse_config_names("a_128x256\nb_128x128\n") == ["a_128x256", "b_128x128"]
    assert bench.parse_config_names("a\n\nc") == ["a", "", "c"]  # index = line number
    assert bench.sweep_variants(["a", "b"], [1, 4]) == [
        (-1, 0, 0),
        (0, 1, 0),
        (0, 4, 0),
        (1, 1, 0),
        (1, 4, 0),
    ]
    assert bench.sweep_variants([], [1]) == [(-1, 0, 0)]
    assert bench.sweep_variants([], [1], [0, 2]) == [(-1, 0, 0)]
    # splits only for the stream-K configurations; the others run once, with splits 0
    names = ["x_128x256_coop", "y_128x128x64_1x1x1_coop_streamk", "z_pingpong"]
    assert bench.sweep_variants(names, [1, 4], [1, 0, 1, 8]) == [
        (-1, 0, 0),
        (0, 1, 0),
        (0, 4, 0),
        (1, 1, 1),
        (1, 1, 0),
        (1, 1, 8),
        (1, 4, 1),
        (1, 4, 0),
        (1, 4, 8),
        (2, 1, 0),
        (2, 4, 0),
    ]
    assert bench.sweep_variants(names, [1], [2]) == [(-1, 0, 0), (0, 1, 0), (1, 1, 2), (2, 1, 0)]
    # only the configurations asked for (the rule's choice always first)
    assert bench.sweep_variants(names, [1, 4], [0], [2, 0]) == [
        (-1, 0, 0),
        (0, 1, 0),
        (0, 4, 0),
        (2, 1, 0),
        (2, 4, 0),
    ]
    assert bench.sweep_variants(names, [1], [0], []) == [(-1, 0, 0)]
    variants = bench.sweep_variants(names, [1, 4], [0, 1, 2])
    assert len(variants) == len(set(variants))
    assert [bench.is_stream_k(n) for n in names] == [False, True, False]
    assert bench.variant_key(-1, 0) == "auto" and bench.variant_key(3, 4) == "c3/s4"
    assert bench.variant_key(-1, 0, 0) == "auto" and bench.variant_key(3, 4, 0) == "c3/s4"
    assert bench.variant_key(2, 1, 4) == "c2/s1/k4" and bench.variant_key(2, 1, 1) == "c2/s1/k1"
    assert bench.variant_key(-1, 2) == "auto/s2" and bench.variant_key(-1, 0, 4) == "auto/s0/k4"
    plan = bench.sweep_plan(["bf16"], [(1, 2, 3), (4, 5, 6)], ["fwd", "wgrad"])
    assert plan == [
        ("bf16", (1, 2, 3), "fwd"),
        ("bf16", (1, 2, 3), "wgrad"),
        ("bf16", (4, 5, 6), "fwd"),
        ("bf16", (4, 5, 6), "wgrad"),
    ]
    assert bench.parse_shapes("16x8192x8192") == [(16, 8192, 8192)]
    assert bench.parse_swizzles("4,1") == [4, 1]
    assert bench.parse_splits("0,1,2,4,8,2") == [0, 1, 2, 4, 8]
    assert bench.parse_splits("0,-8,-16") == [0, -8, -16]  # batched split-K
    for bad in ("-1", "-65", "65", "4-", "--2", "x"):
        with pytest.raises(argparse.ArgumentTypeError):
            bench.parse_splits(bad)


def test_config_setter_with_splits():
    current = [5, 7, 3]
    calls = []

    def op(config, swizzle, splits=0):  # the operator of a build with splits
        calls.append((config, swizzle, splits))
        previous = list(current)
        current[:] = [config, swizzle, splits]
        return previous

    set_config = bench.ConfigSetter(op)
    assert set_config.takes_splits is None
    previous = set_config(2, 1, 4)
    assert previous == [5, 7, 3] and set_config.takes_splits is True
    assert set_config(0, 4) == [2, 1, 4]
    assert set_config(*previous) == [0, 4, 0] and current == [5, 7, 3]
    assert calls == [(2, 1, 4), (0, 4, 0), (5, 7, 3)]


def test_config_setter_falls_back_to_two_arguments():
    class Op:
        """An older build's operator: (config, swizzle) only, torch's schema check message."""

        def __init__(self):
            self.current = [5, 7]
            self.calls = []

        def __call__(self, *args):
            if len(args) != 2:
                raise RuntimeError(
                    "cutlass_nn::_set_gemm_config() expected at most 2 argument(s) but received "
                    f"{len(args)} argument(s). Declaration: cutlass_nn::_set_gemm_config(int "
                    "config, int swizzle) -> int[]"
                )
            self.calls.append(args)
            previous, self.current = self.current, list(args)
            return previous

    op = Op()
    set_config = bench.ConfigSetter(op)
    previous = set_config(1, 4, 0)
    assert previous == [5, 7] and set_config.takes_splits is False
    with pytest.raises(RuntimeError, match="takes no splits argument.*splits=2"):
        set_config(1, 4, 2)
    assert set_config(*previous) == [1, 4] and op.current == [5, 7]
    assert op.calls == [(1, 4), (5, 7)]

    def python_op(config, swizzle):  # a stand-in without splits: TypeError
        return [config, swizzle]

    set_config = bench.ConfigSetter(python_op)
    assert set_config(3, 1) == [3, 1] and set_config.takes_splits is False

    # the operator's own argument errors are not mistaken for a missing splits argument
    def strict_op(config, swizzle, splits=0):
        raise RuntimeError("_set_gemm_config: argument 'splits' must be in [0, 64], got 65")

    set_config = bench.ConfigSetter(strict_op)
    with pytest.raises(RuntimeError, match="argument 'splits'"):
        set_config(-1, 0, 65)
    # known from the schema: no splits, so no 3-argument call is tried at all
    op = Op()
    set_config = bench.ConfigSetter(op, takes_splits=False)
    assert set_config(2, 1) == [5, 7] and op.calls == [(2, 1)]
    with pytest.raises(RuntimeError, match="--sweep-splits 0"):
        set_config(2, 1, 8)


def test_gemm_config_api_on_this_build():
    try:
        names, set_config = bench.gemm_config_api()
    except RuntimeError as exc:  # a build from before the configuration override
        assert "_gemm_configs" in str(exc)
        return
    if not cutlass_nn.has_cuda_kernels():
        assert names == []
    schema_args = torch.ops.cutlass_nn._set_gemm_config.default._schema.arguments
    assert set_config.takes_splits is (len(schema_args) >= 3)
    previous = set_config(-1, 0)
    assert len(previous) == len(schema_args) and all(isinstance(v, int) for v in previous)
    set_config(*previous)


class SweepState:
    """A fake configuration override (with splits): ``set_config`` records what is forced; the
    cutlass_nn forward it is used with raises for config 1 (cannot implement) and is wrong for
    config 2."""

    def __init__(self, initial=(5, 7, 3)):
        self.current = list(initial)
        self.calls = []

    def set_config(self, config, swizzle, splits=0):
        previous = self.current
        self.current = [config, swizzle, splits]
        self.calls.append((config, swizzle, splits))
        return list(previous)

    def kernel_name(self):
        config, swizzle, splits = self.current
        return f"kernel_c{config}_s{swizzle}" + (f"_k{splits}" if splits else "")

    def patch_linear(self, monkeypatch):
        real = cutlass_nn.functional.linear

        def linear(x, w, b=None):
            if self.current[0] == 1:
                raise RuntimeError("cutlass_nn: configuration 1 cannot implement 37x29x23\nmore")
            out = real(x, w, b)
            return out * 1.05 if self.current[0] == 2 else out

        monkeypatch.setattr(cutlass_nn.functional, "linear", linear)


class SweepTimer:
    """Runs every function on every set (recording the configuration in force when ours runs)
    and returns fixed times (``times``; default: base 2 ms, auto 2 ms, c0/s1 1 ms, anything else
    4 ms)."""

    times = {"base": 2.0, "auto": 2.0, "c0/s1": 1.0}

    def __init__(self, state):
        self.state = state
        self.seen = {}
        self.n_timed = []

    def __call__(self, fns, n_sets):
        for name, fn in fns.items():
            for i in range(n_sets):
                fn(i)
                self.seen[name] = tuple(self.state.current)
        return {name: [self.times.get(name, 4.0)] * 3 for name in fns}

    def timer_for(self, n_timed):
        self.n_timed.append(n_timed)
        return self


def _sweep_group(monkeypatch, healthy=lambda: True, timer=None):
    state = SweepState()
    state.patch_linear(monkeypatch)
    case = bench.build_gemm_case("fwd", 37, 29, 23, bench.PRECISIONS["bf16"], device="cpu")
    timer = timer or SweepTimer(state)
    variants = bench.sweep_variants(["cfg_a_128x256", "cfg_b_128x128", "cfg_c_64x128"], [1, 4])
    entries, base, ok = bench.run_sweep_group(
        case,
        variants,
        state.set_config,
        timer.timer_for,
        kernel_name=state.kernel_name,
        healthy=healthy,
    )
    return state, timer, entries, base, ok


def test_run_sweep_group(monkeypatch):
    state, timer, entries, base, ok = _sweep_group(monkeypatch)
    assert ok and base["median_ms"] == 2.0
    by_key = {e["key"]: e for e in entries}
    assert list(by_key) == ["auto", "c0/s1", "c0/s4", "c1/s1", "c1/s4", "c2/s1", "c2/s4"]
    assert by_key["auto"]["status"] == "ok" and by_key["auto"]["kernel"] == "kernel_c-1_s0"
    assert by_key["auto"]["ratio"] == pytest.approx(1.0)
    assert by_key["c0/s1"]["ratio"] == pytest.approx(2.0)
    assert by_key["c0/s4"]["ratio"] == pytest.approx(0.5)
    assert by_key["c0/s4"]["kernel"] == "kernel_c0_s4"
    assert by_key["c0/s1"]["err_ours"] is not None and by_key["c0/s1"]["err_torch"] is not None
    for key in ("c1/s1", "c1/s4"):
        assert by_key[key]["status"] == "error"
        assert (
            by_key[key]["note"]
            == "RuntimeError: cutlass_nn: configuration 1 cannot implement 37x29x23"
        )
        assert "ours" not in by_key[key]
    for key in ("c2/s1", "c2/s4"):
        assert by_key[key]["status"] == "FAIL" and "not timed" in by_key[key]["note"]
        assert "ours" not in by_key[key]
    # one interleaved timing of the baseline and the 3 variants that passed
    assert timer.n_timed == [3]
    assert set(timer.seen) == {"base", "auto", "c0/s1", "c0/s4"}
    assert timer.seen["c0/s4"] == (0, 4, 0) and timer.seen["auto"] == (-1, 0, 0)
    assert all(e["splits"] == 0 for e in entries)
    assert state.current == [5, 7, 3]  # the setting from before is restored


def test_run_sweep_group_restores_on_interrupt_and_stops_on_broken_context(monkeypatch):
    class Interrupting(SweepTimer):
        def __call__(self, fns, n_sets):
            raise KeyboardInterrupt

    state = SweepState()
    state.patch_linear(monkeypatch)
    case = bench.build_gemm_case("fwd", 37, 29, 23, bench.PRECISIONS["bf16"], device="cpu")
    with pytest.raises(KeyboardInterrupt):
        bench.run_sweep_group(
            case, bench.sweep_variants(["a"], [1]), state.set_config, Interrupting(state).timer_for
        )
    assert state.current == [5, 7, 3]

    state, timer, entries, base, ok = _sweep_group(monkeypatch, healthy=lambda: False)
    assert not ok and base is None and timer.n_timed == []
    assert [e["status"] for e in entries] == ["ok", "ok", "ok", "error"] + ["skipped"] * 3
    assert "unusable" in entries[-1]["note"]


def _sweep_rows(monkeypatch):
    state, timer, entries, base, ok = _sweep_group(monkeypatch)
    ident = {
        "precision": "bf16",
        "op": "fwd",
        "shape": [37, 29, 23],
        "label": "37x29x23",
        "unit": "TFLOP/s",
        "work": bench.gemm_flops("fwd", 37, 29, 23),
    }
    names = ["cfg_a_128x256", "cfg_b_128x128", "cfg_c_64x128"]
    return bench.finish_sweep_entries(ident, entries, base, names), names


def test_sweep_rows_best_and_table(monkeypatch):
    rows, names = _sweep_rows(monkeypatch)
    assert len(rows) == 7 and all(r["label"] == "37x29x23" for r in rows)
    r = next(r for r in rows if r["key"] == "c0/s1")
    assert r["config_name"] == "cfg_a_128x256" and r["base"]["median_ms"] == 2.0
    assert r["ours_rate"] == pytest.approx(2 * 37 * 29 * 23 / 1e-3 / 1e12)
    assert next(r for r in rows if r["key"] == "auto")["config_name"] == "auto"
    assert "base" not in next(r for r in rows if r["key"] == "c1/s1")

    (best,) = bench.sweep_best(rows)
    assert (best["config"], best["swizzle"], best["splits"]) == (0, 1, 0)
    assert best["config_name"] == "cfg_a_128x256"
    assert best["ratio"] == pytest.approx(2.0) and best["auto_ratio"] == pytest.approx(1.0)
    assert best["auto_kernel"] == "kernel_c-1_s0" and best["n_measured"] == 3

    lines = bench.format_sweep_table(rows, names)
    assert lines[0] == "configs: c0 cfg_a_128x256 | c1 cfg_b_128x128 | c2 cfg_c_64x128"
    header = lines[2].split()
    assert header[-4:] == ["auto", "c0", "c1", "c2"]
    (row_line,) = [x for x in lines if x.startswith("bf16  37x29x23")]
    assert row_line.split()[2:] == ["fwd", "2.0000", "1.000", "2.000", "ERR", "FAIL"]
    best_lines = bench.format_sweep_best([best])
    assert best_lines[1] == (
        "  bf16 37x29x23 fwd: c0/s1 cfg_a_128x256 ratio 2.000 (auto 1.000 kernel_c-1_s0)"
    )
    progress = bench.format_sweep_progress(0, 3, rows, 1.0)
    assert "torch 2.0000 ms" in progress and "best c0/s1 2.000" in progress
    assert "4 ok, 2 error, 2 FAIL" not in progress and "3 ok" in progress


def test_sweep_table_wraps_a_long_legend():
    names = [f"sm90_tma_ws_bf16_config_number_{i:02d}_128x256x64_2x1x1" for i in range(20)]
    lines = bench.format_sweep_table([], names)
    assert all(len(x) <= 200 for x in lines) and len(lines) > 4
    assert sum(x.count(" c") for x in lines[:-2]) >= 20


def _fake_sweep_gpu(monkeypatch, names, state, times=None):
    class Timer(SweepTimer):
        def __init__(self, settings):
            super().__init__(state)
            self.settings = settings
            self.cycles_per_ms = None

        def with_settings(self, settings):
            self.n_timed.append(settings.budget_ms)
            return self

    if times is not None:
        Timer.times = times
    monkeypatch.setattr(bench.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(bench.cutlass_nn, "has_cuda_kernels", lambda: True)
    patch_bench(monkeypatch, "gemm_config_api", lambda: (list(names), state.set_config))
    monkeypatch.setattr(bench.ops, "last_kernel_name", state.kernel_name)
    patch_bench(monkeypatch, "CudaTimer", Timer)
    patch_bench(monkeypatch, "cuda_healthy", lambda: True)
    patch_bench(monkeypatch,
        "collect_meta",
        lambda argv: {"device": "Fake GPU 80GB", "l2_bytes": 1000, "torch": torch.__version__},
    )
    patch_bench(monkeypatch,
        "build_sweep_case",
        lambda op, shape, prec, l2_bytes: bench.build_gemm_case(
            op, *shape, prec, l2_bytes=l2_bytes, device="cpu"
        ),
    )


def test_sweep_main_end_to_end_with_fakes(monkeypatch, tmp_path, capsys):
    state = SweepState()
    state.patch_linear(monkeypatch)
    _fake_sweep_gpu(monkeypatch, ["cfg_a", "cfg_b", "cfg_c"], state)
    argv = ["--sweep", "--sweep-shapes", "37x29x23,16x24x8", "--out", str(tmp_path)]
    assert bench.main(argv + ["--budget-ms", "5"]) == 0
    out = capsys.readouterr().out
    assert "3 configurations x swizzles [1, 4] + auto = 7 variants, 6 (shape, op) groups" in out
    assert "best configuration per shape and op" in out
    assert "bf16 37x29x23 fwd: c0/s1 cfg_a ratio 2.000 (auto 1.000 kernel_c-1_s0)" in out
    (json_path,) = tmp_path.glob("sweep_fake-gpu-80gb_*.json")
    results = json.loads(json_path.read_text())
    assert results["mode"] == "sweep" and results["configs"] == ["cfg_a", "cfg_b", "cfg_c"]
    assert results["settings"]["budget_ms"] == 5
    rows = results["rows"]
    assert len(rows) == 2 * 3 * 7
    assert {(r["label"], r["op"]) for r in rows} == {
        (label, op) for label in ("37x29x23", "16x24x8") for op in ("fwd", "dgrad", "wgrad")
    }
    # only the forward goes through the patched linear: dgrad / wgrad run every config fine
    assert {r["status"] for r in rows if r["op"] != "fwd"} == {"ok"}
    assert len(results["best"]) == 6
    assert {r["splits"] for r in rows} == {0} and results["splits"] == [0]
    assert state.current == [5, 7, 3]
    # the table again from the JSON, without a GPU
    assert bench.main(["--plot", str(json_path)]) == 0
    assert "best configuration per shape and op" in capsys.readouterr().out


def test_sweep_main_errors(monkeypatch, tmp_path, capsys):
    state = SweepState()
    _fake_sweep_gpu(monkeypatch, [], state)
    assert bench.main(["--sweep", "--out", str(tmp_path)]) == 2
    assert "lists no SM90 configuration" in capsys.readouterr().err

    def missing():
        raise RuntimeError("this cutlass_nn build has no configuration override (x)")

    patch_bench(monkeypatch, "gemm_config_api", missing)
    assert bench.main(["--sweep", "--out", str(tmp_path)]) == 2
    assert "no configuration override" in capsys.readouterr().err
    assert not list(tmp_path.glob("*.json"))


def test_sweep_main_auto_failure_exits_3(monkeypatch, tmp_path, capsys):
    state = SweepState()
    real = cutlass_nn.functional.linear
    monkeypatch.setattr(cutlass_nn.functional, "linear", lambda x, w, b=None: real(x, w, b) + 1)
    _fake_sweep_gpu(monkeypatch, ["cfg_a"], state)
    argv = ["--sweep", "--sweep-shapes", "16x24x8", "--what", "fwd", "--out", str(tmp_path)]
    assert bench.main(argv) == 3
    out = capsys.readouterr().out
    assert "bf16 16x24x8 fwd: nothing measured" in out


def test_sweep_main_with_splits(monkeypatch, tmp_path, capsys):
    state = SweepState()  # cutlass_nn.functional.linear not patched: every variant passes
    names = ["cfg_a_coop", "cfg_b_128x128x64_1x1x1_coop_streamk", "cfg_c_pingpong"]
    times = {"base": 2.0, "auto": 2.0, "c0/s1": 1.0, "c1/s1/k2": 0.5, "c1/s1": 0.8}
    _fake_sweep_gpu(monkeypatch, names, state, times)
    argv = ["--sweep", "--sweep-shapes", "16x24x8", "--what", "fwd,wgrad", "--out", str(tmp_path)]
    argv += ["--sweep-swizzles", "1", "--sweep-splits", "0,1,2"]
    assert bench.main(argv) == 0
    out = capsys.readouterr().out
    assert (
        "3 configurations x swizzles [1] (x splits [0, 1, 2] for the 1 stream-K ones) + auto = "
        "6 variants, 2 (shape, op) groups"
    ) in out
    assert f"bf16 16x24x8 fwd: c1/s1/k2 {names[1]} ratio 4.000 (auto 1.000 kernel_c-1_s0)" in out
    assert "best c1/s1/k2 4.000" in out
    (json_path,) = tmp_path.glob("sweep_fake-gpu-80gb_*.json")
    results = json.loads(json_path.read_text())
    assert results["splits"] == [0, 1, 2]
    assert results["variants"] == ["auto", "c0/s1", "c1/s1", "c1/s1/k1", "c1/s1/k2", "c2/s1"]
    rows = results["rows"]
    assert len(rows) == 2 * 6 and {r["status"] for r in rows} == {"ok"}
    by_key = {r["key"]: r for r in rows if r["op"] == "fwd"}
    assert by_key["c1/s1/k2"]["splits"] == 2 and by_key["c1/s1/k2"]["kernel"].endswith("_k2")
    assert by_key["c2/s1"]["splits"] == 0
    assert {(b["config"], b["swizzle"], b["splits"]) for b in results["best"]} == {(1, 1, 2)}
    assert (1, 1, 2) in state.calls and (0, 1, 2) not in state.calls
    assert state.current == [5, 7, 3]
    # the table: c1's cell is the best over its splits
    lines = bench.format_sweep_table(rows, names)
    (row_line,) = [x for x in lines if x.startswith("bf16  16x24x8") and " fwd " in x]
    assert row_line.split()[2:] == ["fwd", "2.0000", "1.000", "2.000", "4.000", "0.500"]


def test_sweep_main_splits_need_a_build_with_splits(monkeypatch, tmp_path, capsys):
    state = SweepState()
    set_config = bench.ConfigSetter(lambda config, swizzle: [0, 0], takes_splits=False)
    _fake_sweep_gpu(monkeypatch, ["cfg_streamk"], state)
    patch_bench(monkeypatch, "gemm_config_api", lambda: (["cfg_streamk"], set_config))
    argv = ["--sweep", "--sweep-splits", "0,2", "--out", str(tmp_path)]
    assert bench.main(argv) == 2
    assert "takes no splits argument" in capsys.readouterr().err
    assert not list(tmp_path.glob("*.json"))
