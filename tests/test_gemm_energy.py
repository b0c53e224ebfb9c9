"""benchmarks/gemm_energy.py on the CPU: its shape parsing and its refusal without a GPU."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gemm_energy.py"


@pytest.fixture(scope="module")
def energy():
    spec = importlib.util.spec_from_file_location("gemm_energy", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_shapes_parse_and_bad_ones_are_named(energy, capsys, tmp_path):
    # --shapes is the benchmark's own parser (cutlass_nn.bench.cli.parse_shapes)
    parse = energy.bench_cli.parse_shapes
    assert parse("4096x1024x256, 512x8x16") == [(4096, 1024, 256), (512, 8, 16)]
    assert parse(energy.DEFAULT_SHAPES)[0] == (4096, 4096, 4096)
    for bad in ("4096x1024", "4096x0x256", "axbxc", "4096x1024x256x2"):
        with pytest.raises(SystemExit):
            energy.main(["--shapes", bad, "--out", str(tmp_path)])
        assert bad in capsys.readouterr().err


def test_forced_configurations_parse(energy):
    assert energy.parse_config(None) is None
    # C alone: the scheduler's default order (swizzle 1), also where C is the rule's own choice
    assert energy.parse_config("14") == (14, 1) and energy.parse_config("3:2") == (3, 2)
    for bad in ("x", "3:", "3:9", "3:0", "-1", "3:2:1"):
        with pytest.raises(ValueError, match="--config"):
            energy.parse_config(bad)


def test_power_is_taken_between_the_counters_changes(energy):
    # the first entry is the value the poll found when it began, not a step of the counter
    changes = [(0.00, 5_000), (0.07, 74_000), (0.17, 143_000), (0.27, 212_000)]
    assert energy.power_between_changes(changes) == pytest.approx(690.0)
    assert energy.power_between_changes(changes[:2]) != energy.power_between_changes(changes[:2])
    assert energy.power_between_changes([]) != energy.power_between_changes([])  # NaN


class _SteppedCounter:
    """An energy counter that moves in 0.1 s steps at ``watts``, like NVML's."""

    def __init__(self, watts: float):
        import time

        self.watts, self.t0, self.time = watts, time.perf_counter(), time

    def energy_mj(self) -> int:
        steps = int((self.time.perf_counter() - self.t0) / 0.1)
        return 1_000_000 + int(steps * 0.1 * self.watts * 1000)

    def sm_clock_mhz(self) -> int:
        return 1500


def test_a_block_reads_the_stepped_counters_power_and_flags_host_pacing(energy, monkeypatch):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    import time

    calls = []

    def launch(i):  # a host-paced launch of about 0.5 ms, nothing left queued behind it
        calls.append(i)
        time.sleep(0.0005)

    row = energy.run_block(_SteppedCounter(690.0), launch, 0.45, limit_w=700.0)
    assert row["gemms"] == len(calls) > 0
    assert row["watts"] == pytest.approx(690.0, rel=0.05), row
    assert row["mj_per_gemm"] == pytest.approx(row["watts"] * row["us_per_gemm"] / 1e3)
    assert row["counter_steps"] >= 3 and row["sm_mhz"] == 1500
    assert row["host_bound"] and not row["over_limit"]  # nothing queued: the host set the pace
    over = energy.run_block(_SteppedCounter(760.0), lambda i: None, 0.45, limit_w=700.0)
    assert over["over_limit"], over


class _FailingCounter(_SteppedCounter):
    def energy_mj(self) -> int:
        raise RuntimeError("NVML nvmlDeviceGetTotalEnergyConsumption returned 999")


def test_a_failed_counter_read_fails_the_block(energy, monkeypatch):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    with pytest.raises(RuntimeError, match="reading NVML failed"):
        energy.run_block(_FailingCounter(690.0), lambda i: None, 0.1)


def test_operand_copies_cover_twice_the_l2(energy):
    pair = (4096 * 1024 + 1024 * 1024) * 2
    assert energy.operand_sets((4096, 1024, 1024), 4, 60 << 20) == -(-2 * (60 << 20) // pair)
    assert energy.operand_sets((16384, 32000, 4096), 4, 60 << 20) == 4
    assert energy.operand_sets((16, 16, 16), 4, 60 << 20) == energy.MAX_SETS
    assert energy._no_nan({"a": [1.0, float("nan")], "b": float("inf")}) == {"a": [1.0, None],
                                                                             "b": None}


def test_bad_arguments_exit_with_a_message(energy, capsys):
    with pytest.raises(SystemExit):
        energy.main(["--shapes", "12x3"])
    assert "MxNxK" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        energy.main(["--rounds", "0"])
    with pytest.raises(SystemExit):
        energy.main(["--block-s", "0.1"])
    with pytest.raises(SystemExit):
        energy.main(["--config", "14:x"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal without a GPU")
def test_without_a_gpu_it_refuses(energy, capsys, tmp_path):
    assert energy.main(["--out", str(tmp_path)]) == 2
    assert "no CUDA device is available" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
