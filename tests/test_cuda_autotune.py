"""Autotune on a Hopper GPU (cutlass_nn/autotune.py, csrc/cuda/gemm_autotune.cpp): tuned problems
give float64-accurate, bitwise-repeatable results and run the kernel the table names; the table
beats the rule and loses to a forced configuration; CUDA-graph capture never tunes; compiled
code and threads see the same table; save / load round-trips; convert(example_inputs=) tunes a
model's GEMMs without changing its state."""

from __future__ import annotations

import copy
import json
import threading

import pytest
import torch
from torch import nn

import cutlass_nn
from cutlass_nn import autotune
from cuda_helpers import (
    CUDA_MARKS,
    assert_unchanged,
    check_close,
    clone_all,
    forced_config,
    gemm_args,
    needs_sm90,
    run_ours,
    run_torch,
    sm90_config_names,
    to64,
)

pytestmark = [*CUDA_MARKS, pytest.mark.usefixtures("empty_autotune_table")]

ops = cutlass_nn.ops
FLOOR_16 = 2e-3


# Problems where the rule is known to be slower than the best configuration (benchmarks/NOTES.md
# v0.8), plus an odd-sized one and one of each GEMM layout. (op, (M, N, K) of gemm_args)
CASES = [
    ("linear", (4096, 256, 1024)),  # grouped-query key/value projection, forward
    ("linear_wgrad", (4096, 768, 768)),  # small weight gradient over many tokens
    ("linear_wgrad", (4096, 256, 4096)),
    ("linear_dgrad", (512, 3072, 768)),  # small-M input gradient (transposed candidates)
    ("linear_nobias", (16384, 128, 8192)),
    ("mm", (1000, 1032, 1000)),  # M and K not multiples of any tile
    ("linear", (2048, 2816, 1024)),
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("op,shape", CASES, ids=[f"{o}-{'x'.join(map(str, s))}" for o, s in CASES])
def test_tuned_problem_is_accurate_repeatable_and_kept(op, shape, dtype, gen):
    needs_sm90()
    args = gemm_args(op, *shape, dtype, "contig", gen)
    before = clone_all(args)
    context = f"{op} {shape} {dtype}"
    with autotune.tuning():
        ours = run_ours(op, args)
    ran = ops.last_kernel_name()
    tuned = autotune.entries()
    assert len(tuned) >= 1, f"{context}: nothing tuned"
    entry = tuned[0]
    assert entry.dtype == str(dtype).removeprefix("torch.")
    assert entry.candidates >= 2, f"{context}: {entry}"
    assert 0 < entry.best_us <= entry.rule_us, f"{context}: {entry}"
    assert entry.kernel and ran.endswith(entry.kernel), f"{context}: ran {ran}, table {entry}"
    check_close(ours, run_torch(op, args), run_torch(op, to64(args)), FLOOR_16, context)
    assert_unchanged(args, before, context)
    # Kept: later calls (first-call mode off or on) run the same kernel and give the same bits.
    again = run_ours(op, args)
    assert ops.last_kernel_name() == ran
    assert torch.equal(ours, again), f"{context}: repeated call differs ({ran})"
    with autotune.tuning():
        third = run_ours(op, args)
    assert torch.equal(ours, third)
    assert autotune.entries() == tuned, f"{context}: the table changed on a later call"


@pytest.mark.parametrize("shape", [(4096, 768, 768), (2048, 2816, 1024)])
def test_tuned_accumulation_into_a_float32_main_gradient(shape, gen):
    needs_sm90()
    tokens, n, k = shape
    dy = torch.randn(tokens, n, device="cuda", generator=gen).bfloat16()
    x = torch.randn(tokens, k, device="cuda", generator=gen).bfloat16()
    main = torch.randn(n, k, device="cuda", generator=gen)
    start = main.clone()
    with autotune.tuning():
        ops.linear_wgrad_accumulate_(main, dy, x)
    (entry,) = autotune.entries()
    assert entry.accumulate and entry.out_dtype == "float32", entry
    assert ops.last_kernel_name().endswith(entry.kernel)
    ref = start.double() + dy.double().t() @ x.double()
    err = (main.double() - ref).norm() / ref.norm()
    assert err < 1e-5, f"accumulated weight gradient off by {err:.2e} ({entry.config_name})"
    again = start.clone()
    ops.linear_wgrad_accumulate_(again, dy, x)
    assert torch.equal(again, main)


def test_table_entry_decides_the_kernel_and_forcing_wins(gen, tmp_path):
    needs_sm90()
    op, shape = "linear_nobias", (4096, 4096, 4096)  # the rule: config 0 (128x256)
    args = gemm_args(op, *shape, torch.bfloat16, "contig", gen)
    names = sm90_config_names()
    run_ours(op, args)
    assert ops.last_kernel_name().endswith(names[0])
    # A table entry naming config 2 with 2 K slices (written as a file, loaded).
    with autotune.tuning():
        run_ours(op, args)
    (entry,) = autotune.entries()
    path = tmp_path / "table.json"
    autotune.save(path)
    doc = json.loads(path.read_text())
    doc["entries"][0].update(config=2, splits=2, transposed=False)
    path.write_text(json.dumps(doc))
    autotune.clear()
    assert autotune.load(path) == 1
    ours = run_ours(op, args)
    assert ops.last_kernel_name().endswith(names[2]), ops.last_kernel_name()
    check_close(ours, run_torch(op, args), run_torch(op, to64(args)), FLOOR_16, "config 2 split 2")
    # A forced configuration (the benchmark sweep's switch) wins over the table.
    with forced_config(3):
        run_ours(op, args)
    assert ops.last_kernel_name().endswith(names[3]), ops.last_kernel_name()


def _allocations_of(size: int, snapshot: dict) -> int:
    """How many blocks of exactly ``size`` bytes the recorded trace allocated."""
    return sum(1 for trace in snapshot["device_traces"] for event in trace
               if event["action"] == "alloc" and event["size"] == size)


def test_tuning_times_on_operand_copies_past_the_l2(gen):
    # The timed runs rotate through copies of A and B that together hold at least twice the L2
    # (at most 32 copies), so that each run reads them from HBM as a training step's GEMMs do.
    # Counted by allocation: B's byte size (1032 x 1024 bf16, a multiple of the allocator's 512
    # bytes) is no other buffer's, so the tuning allocates one such block per copy (its own B and
    # the clones) and exactly one without copies. (That the runs read the copies is not observed.)
    needs_sm90()
    tokens, n, k = 4096, 1032, 1024
    args = gemm_args("linear_nobias", tokens, n, k, torch.bfloat16, "contig", gen)
    b_bytes = n * k * 2
    pair = tokens * k * 2 + b_bytes
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    copies = min(32, -(-2 * l2 // pair))
    assert copies >= 2, f"L2 {l2} bytes: one pair of {pair} bytes already exceeds twice it"
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.memory._record_memory_history(max_entries=100_000)
    try:
        with autotune.tuning():
            run_ours("linear_nobias", args)
        torch.cuda.synchronize()
        snapshot = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    assert len(autotune.entries()) == 1
    made = _allocations_of(b_bytes, snapshot)
    assert made == copies, f"{made} blocks of B's {b_bytes} bytes, {copies} copies wanted (L2 {l2})"
    assert torch.cuda.memory_allocated() - base <= (1 << 20), "the copies outlived the tuning"


def test_persistent_configurations_are_timed_with_both_swizzles(gen):
    # 4096^3 forward (tn) on the full kernel set: configurations 0, 1, 3, 10, 13, 14, 15 with
    # swizzles 1 and 2 (14; the rule's config 0 with swizzle 1 is the rule's own plan, so 13),
    # config 2 with five K decompositions, the five transposed tiles (4, 5, 6, 7 and 16), the
    # v0.49 tiles 17, 18, 19 with swizzle 1; the nt-only configurations 8, 9, 11, 12 resolve to
    # the rule. 27 distinct candidates (20 when each persistent configuration ran with one
    # swizzle; 28 if swizzles 0 and 1 counted as two orders). The same plans, without a GPU:
    # tests/test_gemm_rule.py's harness.
    needs_sm90()
    if cutlass_nn.build_info().get("kernel_set") != "full":
        pytest.skip("counts the candidates of the full kernel set")
    args = gemm_args("linear_nobias", 4096, 4096, 4096, torch.bfloat16, "contig", gen)
    with autotune.tuning():
        run_ours("linear_nobias", args)
    (entry,) = autotune.entries()
    assert (entry.rule_config, entry.rule_swizzle) == (0, 0), entry
    assert entry.candidates == 27, entry


def test_small_problems_are_not_tuned(gen):
    needs_sm90()
    args = gemm_args("linear", 64, 128, 256, torch.bfloat16, "contig", gen)
    with autotune.tuning():
        run_ours("linear", args)
    assert autotune.entries() == []


def test_float32_problems_are_not_tuned(gen):
    needs_sm90()
    with autotune.tuning():
        run_ours("mm", gemm_args("mm", 1024, 1024, 1024, torch.float32, "contig", gen))
    assert autotune.entries() == []


def test_capture_never_tunes_and_replays_correctly(gen):
    needs_sm90()
    x = torch.randn(4096, 1024, device="cuda", dtype=torch.bfloat16, generator=gen)
    w = torch.randn(256, 1024, device="cuda", dtype=torch.bfloat16, generator=gen)
    ops.linear(x[:8], w)  # warm up the kernels and allocator outside the capture
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with autotune.tuning():
        with torch.cuda.stream(stream):
            ops.linear(x, w)  # eager on a side stream first, as torch's capture recipe does
            autotune.clear()
            with torch.cuda.graph(graph, stream=stream):
                y = ops.linear(x, w)
        assert autotune.entries() == [], "tuned during capture"
        graph.replay()
        torch.cuda.synchronize()
        ref = torch.nn.functional.linear(x.double(), w.double())
        check_close(y, torch.nn.functional.linear(x, w), ref, FLOOR_16, "captured")
        ops.linear(x, w)  # an uncaptured call tunes
    assert len(autotune.entries()) == 1


def test_compiled_code_tunes_and_reads_the_table(gen):
    needs_sm90()
    torch._dynamo.reset()
    x = torch.randn(2048, 1024, device="cuda", dtype=torch.bfloat16, generator=gen)
    w = torch.randn(2816, 1024, device="cuda", dtype=torch.bfloat16, generator=gen)
    fn = torch.compile(lambda a, b: cutlass_nn.functional.linear(a, b).relu(), fullgraph=True)
    with autotune.tuning():
        out = fn(x, w)
    (entry,) = autotune.entries()
    assert (entry.m, entry.n, entry.k) == (2048, 2816, 1024)
    assert ops.last_kernel_name().endswith(entry.kernel)
    ref = torch.nn.functional.linear(x.double(), w.double()).relu()
    check_close(out, torch.nn.functional.linear(x, w).relu(), ref, FLOOR_16, "compiled")
    assert torch.equal(fn(x, w), out)


def test_two_threads_tune_one_problem_once(gen):
    needs_sm90()
    x = torch.randn(4096, 1024, device="cuda", dtype=torch.bfloat16, generator=gen)
    w = torch.randn(768, 1024, device="cuda", dtype=torch.bfloat16, generator=gen)
    results: list = [None, None]
    errors: list = []

    def work(i: int) -> None:
        try:
            with torch.cuda.stream(torch.cuda.Stream()):
                out = ops.linear(x, w)
                torch.cuda.current_stream().synchronize()
            results[i] = out
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    with autotune.tuning():
        threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors, errors
    assert len(autotune.entries()) == 1
    assert torch.equal(results[0], results[1])


def test_save_load_round_trip(gen, tmp_path):
    needs_sm90()
    with autotune.tuning():
        for op, shape in CASES[:3]:
            run_ours(op, gemm_args(op, *shape, torch.bfloat16, "contig", gen))
    tuned = autotune.entries()
    assert len(tuned) == 3
    path = tmp_path / "autotune.json"
    assert autotune.save(path) == 3
    autotune.clear()
    assert autotune.load(path) == 3
    loaded = autotune.entries()
    strip = lambda e: {k: v for k, v in e.__dict__.items() if k != "kernel"}  # noqa: E731
    assert [strip(e) for e in loaded] == [strip(e) for e in tuned]
    # A file of another GPU model adds nothing.
    doc = json.loads(path.read_text())
    for row in doc["entries"]:
        row["device_name"] = "some other GPU"
    path.write_text(json.dumps(doc))
    autotune.clear()
    assert autotune.load(path) == 0 and autotune.entries() == []


def test_add_entries_validates_every_field():
    needs_sm90()
    good = [0, 4096, 4096, 4096, 0, 1, 1, 1, 0, 0, 2, 0, 2, 0, 0, 0, 0, 0, 5]
    bad_config = list(good)
    bad_config[10] = 99
    with pytest.raises(RuntimeError, match="field 'config' must be in"):
        torch.ops.cutlass_nn._autotune_add_entries(good + bad_config, [1.0, 2.0] * 2)
    assert autotune.entries() == []  # nothing added, the good row included
    with pytest.raises(RuntimeError, match="'floats' must hold"):
        torch.ops.cutlass_nn._autotune_add_entries(good, [1.0])
    with pytest.raises(RuntimeError, match="both operands column-major"):
        torch.ops.cutlass_nn._autotune_add_entries(good[:4] + [1, 1] + good[6:], [1.0, 2.0])


def test_convert_with_example_inputs_tunes_without_changing_state(gen):
    needs_sm90()
    torch.manual_seed(0)
    stock = nn.Sequential(
        nn.Linear(1024, 2816), nn.GELU(), nn.Dropout(0.1), nn.Linear(2816, 1024),
        nn.BatchNorm1d(1024),
    ).to("cuda", torch.bfloat16)  # fmt: skip
    model = copy.deepcopy(stock)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(4096, 1024, device="cuda", dtype=torch.bfloat16, generator=gen)
    x.requires_grad_(True)
    cuda_rng = torch.cuda.get_rng_state()
    assert cutlass_nn.convert(model, example_inputs=(x,)) is model
    assert isinstance(model[0], cutlass_nn.CutlassLinear)
    tuned = autotune.entries()
    # forward: 2 GEMMs; backward: 2 weight gradients, 1 or 2 input gradients
    assert len(tuned) >= 4, autotune.report()
    assert all(p.grad is None for p in model.parameters()) and x.grad is None
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert torch.equal(torch.cuda.get_rng_state(), cuda_rng)
    # A step of the tuned model matches the stock one.
    model.eval()
    stock.eval()
    xs = x.detach().clone().requires_grad_(True)
    out, ref = model(x), stock(xs)
    out.float().square().mean().backward()
    ref.float().square().mean().backward()

    def rel(a: torch.Tensor, b: torch.Tensor) -> float:
        a, b = a.detach().float(), b.detach().float()
        return float((a - b).norm() / b.norm().clamp_min(1e-12))

    assert rel(out, ref) < 2e-2
    assert rel(x.grad, xs.grad) < 2e-2
    for (name, p), q in zip(model.named_parameters(), stock.parameters()):
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert rel(p.grad, q.grad) < 2e-2, f"{name}: gradient differs from nn.Linear's"
