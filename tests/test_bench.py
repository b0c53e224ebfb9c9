"""CPU tests of the benchmark harness (cutlass_nn/bench.py): its pure helpers, the case builders
(which run on the CPU flavor of the operators too), the row runner with a fake timer, the
summary / table / JSON / plot output, and the command line without a GPU."""

from __future__ import annotations

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
    f32 = [r for r in full if r.group == "gemm" and r.precision in ("tf32", "fp32")]
    assert {r.shape for r in f32} == {(4096, 4096, 4096), (8192, 8192, 8192)}
    assert {r.precision for r in f32} == {"tf32", "fp32"}
    add2 = [r for r in full if r.group == "add2"]
    assert {(r.precision, r.shape[0], r.op) for r in add2} == {
        (p, s, op) for p in ("bf16", "fp32") for s in bench.ADD2_SIZES for op in bench.ADD2_OPS
    }
    # the most important rows first: 16-bit GEMMs, then add2, then float32 GEMMs
    groups = [
        ("gemm16" if r.precision in ("bf16", "fp16") else "gemm32") if r.group == "gemm" else "add2"
        for r in full
    ]
    assert groups == sorted(groups, key=["gemm16", "add2", "gemm32"].index)
    assert len({(r.group, r.op, r.precision, r.shape) for r in full}) == len(full)

    quick = bench.plan_rows(True, ["bf16"], bench.WHAT_ITEMS)
    assert {r.precision for r in quick} == {"bf16"}
    assert {r.shape for r in quick if r.group == "gemm"} == set(bench.QUICK_SHAPES)
    assert (16384, 4093, 4091) in bench.QUICK_SHAPES and (16, 8192, 8192) in bench.QUICK_SHAPES


def test_plan_what_filter():
    rows = bench.plan_rows(False, ["bf16", "fp32"], ["fwd", "fp32"])
    assert {r.op for r in rows} == {"fwd"}
    assert {r.precision for r in rows} == {"bf16", "tf32", "fp32"}
    rows = bench.plan_rows(False, ["fp32"], ["fp32"])  # no GEMM op named: all of them
    assert {r.op for r in rows} == set(bench.GEMM_OPS)
    assert bench.plan_rows(False, ["bf16"], ["fp32"]) == []


def test_parse_args():
    args = bench.parse_args(["--quick"])
    assert args.dtypes == ["bf16"] and args.quick and args.out == Path("benchmarks/results")
    args = bench.parse_args(["--quick", "--dtypes", "fp16,fp32", "--out", "/tmp/x"])
    assert args.dtypes == ["fp16", "fp32"] and args.out == Path("/tmp/x")
    args = bench.parse_args([])
    assert args.dtypes == ["bf16", "fp16", "fp32"] and args.what == list(bench.WHAT_ITEMS)
    assert bench.parse_args(["--what", "add2,fwd"]).what == ["add2", "fwd"]
    for bad in (["--dtypes", "int8"], ["--what", "conv"], ["--dtypes", "bf16", "--what", "fp32"]):
        with pytest.raises(SystemExit) as info:
            bench.parse_args(bad)
        assert info.value.code == 2


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
    for flag in ("--quick", "--out", "--dtypes", "--what", "--time-limit"):
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


@pytest.mark.parametrize("op,prec", GEMM_CASE_PARAMS, ids=[f"{o}-{p}" for o, p in GEMM_CASE_PARAMS])
def test_gemm_case_on_cpu(op, prec):
    # odd sizes, and an L2 small enough for 1 set and large enough for several
    for l2, sets in ((1, 1), (40_000, None)):
        case = bench.build_gemm_case(
            op, 37, 29, 23, bench.PRECISIONS[prec], l2_bytes=l2, device="cpu"
        )
        assert case.n_sets >= 1 and (sets is None or case.n_sets == sets)
        with case.context():
            check = case.check()
            assert check["ok"], check["summary"]
            for i in range(case.n_sets):
                case.fns["ours"](i)
                case.fns["base"](i)
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
        {"group": "add2", "op": "fwd", "precision": "bf16", "geomean": pytest.approx(0.8), "n": 1}
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


def test_tables_fit_the_visible_tail():
    """A full run's table and summary fit in the ~60 lines the lead sees."""
    specs = bench.plan_rows(False, ["bf16", "fp16", "fp32"], bench.WHAT_ITEMS)
    rows = []
    for i, s in enumerate(specs):
        row = dict(s.meta(), status="ok")
        bench.fill_timing(row, {"ours": [1.0], "base": [1.0 + i / 1000]}, peak=None)
        rows.append(row)
    peaks = {"mm_tflops": {p: 1.0 for p in bench.PRECISION_ORDER}, "copy_gbps": 1.0}
    lines = bench.format_tables(rows) + bench.format_summary(bench.summarize(rows), peaks, rows)
    assert len(lines) <= 57, len(lines)


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
    monkeypatch.setattr(bench, "plan_rows", lambda quick, dtypes, what: list(specs))
    monkeypatch.setattr(bench, "CudaTimer", Timer)
    monkeypatch.setattr(bench, "cuda_healthy", lambda: True)
    monkeypatch.setattr(
        bench,
        "measure_peaks",
        lambda timer, precs: {"mm_tflops": {"bf16": 1e-6}, "copy_gbps": 1e-3},
    )
    monkeypatch.setattr(
        bench,
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
    monkeypatch.setattr(
        bench,
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
