"""bench --what step-sweep: candidates, (m, n, k) of each operator, round medians, the best choice,
arguments (CPU; the sweep itself needs a GPU)."""

from __future__ import annotations

import pytest

from cutlass_nn.bench import cli, step_sweep as ss


def test_candidates_parse_with_the_rule_first_and_no_duplicates():
    got = ss.parse_candidates("0,2/1,14:1,rule,2/1,3/2:4")
    assert [c.label for c in got] == ["rule", "0", "2/1", "14:1", "3/2:4"]
    assert got[0].config == -1
    assert (got[4].config, got[4].splits, got[4].swizzle) == (3, 2, 4)
    assert [c.label for c in ss.parse_candidates("")] == ["rule"]


def test_candidates_with_c_operand():
    got = ss.parse_candidates("rule+c,15+c,3/2:4+c,15,15+c")
    assert [c.label for c in got] == ["rule", "rule+c", "15+c", "3/2:4+c", "15"]
    assert got[1].config == -1 and got[1].with_c and not got[0].with_c and not got[4].with_c
    assert (got[3].config, got[3].splits, got[3].swizzle, got[3].with_c) == (3, 2, 4, True)


@pytest.mark.parametrize("text", ["x", "2/", "14:", "-1", "2/1/3", "99", "15c", "15+", "+c",
                                  "rule+", "15+c+c"])
def test_bad_candidates_are_named(text):
    with pytest.raises(ValueError, match="--candidates") as info:
        ss.parse_candidates(text, config_count=15)
    assert repr(text) in str(info.value) or "99" in str(info.value)


def test_swizzle_and_splits_limits():
    with pytest.raises(ValueError, match="swizzle"):
        ss.parse_candidates("3:9")
    with pytest.raises(ValueError, match="splits"):
        ss.parse_candidates("2/65")


def test_gemm_mnk_of_each_operator():
    # A linear layer of 1024 inputs and 2816 outputs over 4 x 1024 tokens.
    assert ss.gemm_mnk("cutlass_nn::linear", [[4, 1024, 1024], [2816, 1024], []]) == (4096, 2816, 1024)
    assert ss.gemm_mnk("cutlass_nn::linear_dgrad", [[4, 1024, 2816], [2816, 1024]]) == (4096, 1024, 2816)
    assert ss.gemm_mnk("cutlass_nn::linear_wgrad", [[4, 1024, 2816], [4, 1024, 1024]]) == (2816, 1024, 4096)
    assert ss.gemm_mnk("aten::mm", [[2816, 4096], [4096, 1024]]) == (2816, 1024, 4096)
    assert ss.gemm_mnk("aten::addmm", [[2816], [4096, 1024], [1024, 2816]]) == (4096, 2816, 1024)
    # 2-D inputs (as Inductor may pass them) give the same problem.
    assert ss.gemm_mnk("cutlass_nn::linear", [[4096, 1024], [2816, 1024], []]) == (4096, 2816, 1024)
    with pytest.raises(ValueError, match="aten::bmm"):
        ss.gemm_mnk("aten::bmm", [[2, 3, 4], [2, 4, 5]])


def test_shapes_text_parses():
    assert ss.parse_shapes("[[4, 1024, 1024], [32000, 1024], []]") == [[4, 1024, 1024], [32000, 1024], []]


def test_round_medians_skip_missing_keys():
    a, b = ("linear", "s1"), ("linear", "s2")
    got = ss.summarize_rounds([{a: 10.0, b: 5.0}, {a: 12.0}, {a: 11.0, b: 7.0}])
    assert got == {a: 11.0, b: 6.0}


def test_best_keeps_the_rule_within_the_margin():
    a, b, c = ("op", "a"), ("op", "b"), ("op", "c")
    times = {
        "rule": {a: 100.0, b: 100.0, c: 100.0},
        "3": {a: 90.0, b: 99.0, c: 120.0},
        "14": {a: 95.0, b: 98.5},  # b: 1.5% faster, inside the 2% margin
    }
    best = ss.best_per_problem(times)
    assert best[a]["best"] == "3" and best[a]["best_us"] == 90.0
    assert best[a]["rule_over_best"] == pytest.approx(100 / 90)
    assert best[b]["best"] == "rule" and best[b]["rule_over_best"] == 1.0
    assert best[c]["best"] == "rule"
    # With no margin the 1.5% is taken.
    assert ss.best_per_problem(times, margin=0.0)[b]["best"] == "14"


def test_arguments():
    args = ss.parse_args(["--what", "step-sweep", "--candidates", "3,14", "--rounds", "2"])
    assert [c.label for c in args.candidate_list] == ["rule", "3", "14"]
    assert args.mode == "compile" and args.size == "host" and args.rounds == 2
    assert cli._delegated_what(["--what", "step-sweep"]) == "step-sweep"
    for bad in (["--rounds", "0"], ["--steps", "0"], ["--candidates", "x"], ["--mode", "reduce-overhead"],
                ["--warmup", "1"]):
        with pytest.raises(SystemExit):
            ss.parse_args(["--what", "step-sweep", *bad])


def test_without_a_gpu_it_says_so(monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli.main(["--what", "step-sweep"]) == 2
    assert cli.NO_CUDA_MESSAGE in capsys.readouterr().err


def test_pdl_is_off_unless_asked():
    assert ss.parse_args(["--what", "step-sweep"]).pdl is False
    assert ss.parse_args(["--what", "step-sweep", "--pdl"]).pdl is True


def test_round_order_rotates_and_reverses():
    cands = ss.parse_candidates("0,3,14")  # rule, 0, 3, 14
    labels = [[c.label for c in ss.round_order(cands, r)] for r in range(4)]
    assert labels[0] == ["rule", "0", "3", "14"]
    assert labels[1] == ["14", "3", "0", "rule"]  # reversed
    assert labels[2] == ["0", "3", "14", "rule"]  # rotated by one
    assert labels[3] == ["3", "0", "rule", "14"]  # reversed, rotated by one
    assert all(sorted(x) == sorted(labels[0]) for x in labels)
    # over as many rounds as candidates, every candidate runs first once
    assert sorted(order[0] for order in labels) == sorted(labels[0])
    # no candidate has the same predecessor in every round
    def before(order, label):
        return order[order.index(label) - 1] if order.index(label) else None
    for label in labels[0]:
        assert len({before(order, label) for order in labels}) > 1


def test_rule_is_not_first_in_both_of_two_rounds():
    # the sweeps run 2-3 rounds: the rule (the candidate every other is compared with) must not
    # take the first slot, right after the warm-up, in both of the first two
    cands = ss.parse_candidates("0,14,14:1,3,1,10")
    firsts = [ss.round_order(cands, r)[0].label for r in range(2)]
    assert firsts.count("rule") == 1


def test_settle_runs_steps_for_the_time_asked():
    class Trainer:
        steps = 0

        def step(self, batch):
            self.steps += 1

    t = Trainer()
    assert ss.settle(t, [None], 0.0) == 1 == t.steps  # at least one step
    t2 = Trainer()
    n = ss.settle(t2, [None, None], 0.05)
    assert n == t2.steps and n >= 2


def test_settle_must_be_a_sane_number_of_seconds():
    for bad in ("-1", "nan", "1e9"):
        with pytest.raises(SystemExit):
            ss.parse_args(["--what", "step-sweep", "--settle", bad])
    assert ss.parse_args(["--what", "step-sweep", "--settle", "0"]).settle == 0.0


def test_forced_setting_is_restored_when_a_step_raises(monkeypatch):
    import types

    import torch

    state = [3, 2, 0]  # a configuration forced before the sweep
    without_c = [False]  # kernels without C switched off before the sweep

    def set_without_c(enabled):
        previous = without_c[0]
        without_c[0] = enabled
        return previous

    monkeypatch.setattr(torch.ops.cutlass_nn, "_set_epilogue_without_c", set_without_c)

    def setter(config, swizzle, splits=0):
        previous = list(state)
        state[:] = [config, swizzle, splits]
        return previous

    class FailingTrainer:
        calls = 0

        def step(self, batch):
            FailingTrainer.calls += 1
            raise RuntimeError("a step failed")

    args = types.SimpleNamespace(rounds=2, steps=1)
    previous = setter(-1, 0, 0)
    with pytest.raises(RuntimeError, match="a step failed"):
        ss._sweep_rounds(args, ss.parse_candidates("0,14"), FailingTrainer(), [None], setter,
                         {}, {}, {}, previous)
    assert FailingTrainer.calls == 1
    assert state == [3, 2, 0]
    assert without_c == [False]


def test_a_failing_probe_is_recorded(monkeypatch):
    def boom(op, shapes, candidate):
        raise RuntimeError("CUDA out of memory\nmore")

    monkeypatch.setattr(ss, "_probe_kernel", boom)
    assert ss._probe_or_error("cutlass_nn::linear", [[1, 8], [8, 8], []], ss.Candidate(0)) == \
        "error: CUDA out of memory"


def test_profiled_gemm_times_per_operator_and_shapes(monkeypatch):
    """_profiled_gemm_times over a fake profiler: time per call and calls per step of each swept
    (operator, shapes); other GEMM operators are left out; the step's GPU time sums every kernel."""
    import contextlib
    import types

    import torch

    cuda = torch.autograd.DeviceType.CUDA
    cpu = torch.autograd.DeviceType.CPU

    def op(name, shapes, *kernel_us):
        kernels = [types.SimpleNamespace(name=f"k{i}", duration=us) for i, us in enumerate(kernel_us)]
        return types.SimpleNamespace(name=name, input_shapes=shapes, kernels=kernels, device_type=cpu,
                                     device_time=0.0)

    def kernel(us):
        return types.SimpleNamespace(name="k", device_type=cuda, device_time=us, is_user_annotation=False)

    events = [
        op("cutlass_nn::linear_wgrad", [[4, 8], [4, 8]], 20.0),
        op("cutlass_nn::linear_wgrad", [[4, 8], [4, 8]], 22.0),
        op("cutlass_nn::linear", [[4, 8], [8, 8], []], 10.0, 2.0),  # two kernels: 12 us
        op("cutlass_nn::mm", [[4, 8], [8, 8]], 50.0),  # a GEMM operator outside the sweep
        kernel(20.0), kernel(22.0), kernel(10.0), kernel(2.0), kernel(50.0), kernel(6.0),
    ]

    @contextlib.contextmanager
    def fake_profile(**kwargs):
        yield types.SimpleNamespace(events=lambda: events)

    monkeypatch.setattr(torch.profiler, "profile", fake_profile)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    steps = []
    trainer = types.SimpleNamespace(step=steps.append)
    times, ms, calls = ss._profiled_gemm_times(trainer, ["b0", "b1"], 2, ss.SWEPT_OPS)
    assert steps == ["b0", "b1"]
    wgrad = ("cutlass_nn::linear_wgrad", "[[4, 8], [4, 8]]")
    fwd = ("cutlass_nn::linear", "[[4, 8], [8, 8], []]")
    assert times == {wgrad: 21.0, fwd: 12.0}
    assert calls == {wgrad: 1.0, fwd: 0.5}
    assert ms == pytest.approx(110.0 / 2 / 1e3)
