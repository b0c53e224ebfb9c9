"""Fused weight-gradient accumulation (cutlass_nn.fused_wgrad_accumulation) on the CPU backend:
off by default; with it on, micro-batches without zero_grad give the gradients of the unfused
run, the later micro-batches' weight gradients are formed by linear_wgrad_accumulate_ (the first
one, a hook on the weight, create_graph, a dispatch mode and tied uses take or keep the usual
path correctly), post-accumulate-grad hooks still fire, the setting is process-wide and restored by
the context manager, and DDP with no_sync micro-batches matches a single-process run (gloo,
tests/distributed_workers.py), and so does FSDP2 with micro-batches without gradient sync; the
gated MLP's down weight and its shared gate + up weight-gradient GEMM accumulate too."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import cutlass_nn


def model(seed=0, dtype=torch.float64, bias=True):
    torch.manual_seed(seed)
    return cutlass_nn.convert(nn.Sequential(
        nn.Linear(6, 8, bias=bias, dtype=dtype), nn.GELU(), nn.Linear(8, 3, bias=bias, dtype=dtype)
    ))


def micro_batches(n=3, dtype=torch.float64):
    gen = torch.Generator().manual_seed(7)
    return [(torch.randn(4, 6, generator=gen, dtype=dtype), torch.randn(4, 3, generator=gen, dtype=dtype))
            for _ in range(n)]


def accumulate(m, batches):
    for x, y in batches:
        F.mse_loss(m(x), y).backward()
    return {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}


def fused_matches_unfused(plain, fused, batches):
    """The micro-batches through ``plain`` (fused accumulation off) and ``fused`` (on): the
    gradients agree; returns (new, in place) weight-gradient counts of the fused run."""
    want = accumulate(plain, batches)
    with cutlass_nn.fused_wgrad_accumulation():
        got = {}
        counts = op_counts(lambda: got.update(accumulate(fused, batches)))
    assert set(got) == set(want)
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-12, atol=1e-12, msg=name)
    return counts


def op_counts(fn):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    names = [e.name for e in prof.events()]
    return names.count("cutlass_nn::linear_wgrad"), names.count("cutlass_nn::linear_wgrad_accumulate_")


def test_off_by_default_and_the_context_manager_restores():
    assert cutlass_nn.fused_wgrad_accumulation_enabled() is False
    with cutlass_nn.fused_wgrad_accumulation():
        assert cutlass_nn.fused_wgrad_accumulation_enabled() is True
        with cutlass_nn.fused_wgrad_accumulation(False):
            assert cutlass_nn.fused_wgrad_accumulation_enabled() is False
        assert cutlass_nn.fused_wgrad_accumulation_enabled() is True
    assert cutlass_nn.fused_wgrad_accumulation_enabled() is False
    assert cutlass_nn.set_fused_wgrad_accumulation(True) is False
    assert cutlass_nn.set_fused_wgrad_accumulation(False) is True


def test_arguments_are_checked():
    with pytest.raises(TypeError, match=r"cutlass_nn\.set_fused_wgrad_accumulation: argument 'enabled' must be a bool, got int"):
        cutlass_nn.set_fused_wgrad_accumulation(1)
    with pytest.raises(TypeError, match=r"cutlass_nn\.fused_wgrad_accumulation: argument 'enabled' must be a bool"):
        with cutlass_nn.fused_wgrad_accumulation("yes"):
            pass
    with pytest.raises(RuntimeError, match=r"argument 'mode' must be -1 \(query\), 0 \(off\) or 1 \(on\), got 2"):
        torch.ops.cutlass_nn._fused_wgrad_accumulation(2)


@pytest.mark.parametrize("bias", [True, False])
def test_micro_batches_match_the_unfused_gradients(bias):
    batches = micro_batches()
    plain = model(bias=bias)
    counts = fused_matches_unfused(plain, copy.deepcopy(plain), batches)
    # 2 layers: the first micro-batch forms new gradients, the next two accumulate in place
    assert counts == (2, 4)
    assert op_counts(lambda: accumulate(plain, batches)) == (6, 0)


def test_accumulates_into_the_same_gradient_tensor_and_post_hooks_fire():
    m = model()
    (x, y), *rest = micro_batches()
    F.mse_loss(m(x), y).backward()
    weight = m[0].weight
    grad = weight.grad
    ptr = grad.data_ptr()
    fired = []
    weight.register_post_accumulate_grad_hook(lambda p: fired.append(p.grad.clone()))
    with cutlass_nn.fused_wgrad_accumulation():
        F.mse_loss(m(rest[0][0]), rest[0][1]).backward()
    assert weight.grad is grad and grad.data_ptr() == ptr
    assert len(fired) == 1 and torch.equal(fired[0], weight.grad)


def test_zeroed_gradients_accumulate_from_zero():
    batches = micro_batches(1)
    plain, fused = model(), model()
    for m in (plain, fused):
        for p in m.parameters():
            p.grad = torch.zeros_like(p)
    want = accumulate(plain, batches)
    with cutlass_nn.fused_wgrad_accumulation():
        got = accumulate(fused, batches)
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-12, atol=1e-12)


def test_a_tensor_hook_on_the_weight_keeps_the_usual_path():
    """A hook registered on the weight sees each micro-batch's own gradient, as without fusion."""
    batches = micro_batches()
    want = accumulate(model(), batches)
    fused = model()
    seen = []
    fused[0].weight.register_hook(lambda g: seen.append(g.clone()))
    with cutlass_nn.fused_wgrad_accumulation():
        got = {}
        counts = op_counts(lambda: got.update(accumulate(fused, batches)))
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-12, atol=1e-12)
    assert len(seen) == 3
    torch.testing.assert_close(sum(seen), got["0.weight"], rtol=1e-12, atol=1e-12)
    assert counts == (4, 2)  # the hooked layer always forms new gradients; the other accumulates


def test_create_graph_keeps_the_usual_path():
    m = model()
    (x, y), (x2, y2) = micro_batches(2)
    F.mse_loss(m(x), y).backward()
    with cutlass_nn.fused_wgrad_accumulation():
        wgrad, acc = op_counts(lambda: F.mse_loss(m(x2), y2).backward(create_graph=True))
    assert acc == 0 and wgrad >= 2
    assert m[0].weight.grad.requires_grad  # a graph of the gradient was built


def test_a_weight_used_twice_in_one_step():
    """Tied uses: each use's backward adds its own product; the sum is the unfused one."""
    torch.manual_seed(3)
    layer = cutlass_nn.CutlassLinear(5, 5, dtype=torch.float64)
    x = torch.randn(4, 5, dtype=torch.float64)

    def run(fused):
        layer.zero_grad(set_to_none=True)
        with cutlass_nn.fused_wgrad_accumulation(fused):
            for _ in range(2):
                layer(layer(x)).square().sum().backward()
        return layer.weight.grad.clone()

    torch.testing.assert_close(run(True), run(False), rtol=1e-12, atol=1e-12)


def test_low_precision_weights():
    batches = micro_batches(dtype=torch.float32)
    plain = model(dtype=torch.bfloat16)
    fused = copy.deepcopy(plain)
    bf = [(x.bfloat16(), y.bfloat16()) for x, y in batches]
    want = accumulate(plain, bf)
    with cutlass_nn.fused_wgrad_accumulation():
        got = accumulate(fused, bf)
    for name in want:
        # the in-GEMM sum rounds once per micro-batch, like the unfused add
        torch.testing.assert_close(got[name].float(), want[name].float(), rtol=2e-2, atol=2e-2)


def test_ddp_no_sync_micro_batches_match_single_process(tmp_path):
    import distributed_workers as W
    from test_distributed import spawn_job

    results = spawn_job(W.ddp_accumulate_worker, tmp_path, "cpu", 3)
    for rank, r in enumerate(results):
        # 3 layers: the first micro-batch forms new gradients, the other two (one under no_sync,
        # one synchronized) accumulate in place
        assert (r["new_wgrads"], r["accumulated_in_place"]) == (3, 6), rank
        for name, g in r["reference"].items():
            torch.testing.assert_close(r["grads"][name], g, rtol=1e-6, atol=1e-6, msg=f"rank {rank} {name}")


def test_fsdp2_micro_batches_without_sync_match_single_process(tmp_path):
    pytest.importorskip("torch.distributed.fsdp", reason="needs FSDP2 (fully_shard)")
    import distributed_workers as W
    from test_distributed import spawn_job

    results = spawn_job(W.fsdp2_accumulate_worker, tmp_path, "cpu", 3)
    for rank, r in enumerate(results):
        # FSDP2 runs each layer on its all-gathered (plain) parameter, whose unsharded gradient
        # the micro-batches without sync keep: 3 layers form it in the first micro-batch and
        # add into it in the other two (the last one reduce-scatters the sum)
        assert (r["new_wgrads"], r["accumulated_in_place"]) == (3, 6), rank
        for name, g in r["reference"].items():
            torch.testing.assert_close(r["grads"][name], g, rtol=1e-6, atol=1e-6, msg=f"rank {rank} {name}")


def test_a_dispatch_mode_keeps_the_usual_path():
    """Under a TorchDispatchMode (fake tensors, tracing, op counting) nothing is written behind
    the mode's back: the weight gradient is returned to autograd as usual."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Names(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(func._opname)
            return func(*args, **(kwargs or {}))

    batches = micro_batches(2)
    plain, fused = model(), model()
    want = accumulate(plain, batches)
    mode = Names()
    with cutlass_nn.fused_wgrad_accumulation(), mode:
        got = accumulate(fused, batches)
    assert "linear_wgrad_accumulate_" not in mode.names
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-12, atol=1e-12)


# ---- gated_mlp: down_proj's gradient and the shared gate + up weight-gradient GEMM ----------


def gated(bias=False, seed=0):
    torch.manual_seed(seed)
    return cutlass_nn.GatedMLP(6, 10, activation="silu", bias=bias, dtype=torch.float64)


def gated_batches(n=3):
    gen = torch.Generator().manual_seed(11)
    return [(torch.randn(5, 6, generator=gen, dtype=torch.float64),
             torch.randn(5, 6, generator=gen, dtype=torch.float64)) for _ in range(n)]


@pytest.mark.parametrize("bias", [True, False])
def test_gated_mlp_micro_batches_match_the_unfused_gradients(bias):
    batches = gated_batches()
    plain = gated(bias)
    fused = copy.deepcopy(plain)
    counts = fused_matches_unfused(plain, fused, batches)
    # first micro-batch: down and gate+up form new gradients (gate's and up's are the halves of
    # one buffer); the next two add into them: one GEMM for down, one for gate+up together
    assert counts == (2, 4)
    assert fused.up_proj.weight.grad.data_ptr() == (
        fused.gate_proj.weight.grad.data_ptr() + fused.gate_proj.weight.grad.nbytes)


def test_gated_mlp_separate_gradient_tensors_accumulate_per_weight():
    batches = gated_batches(2)
    plain, fused = gated(seed=1), gated(seed=1)
    for m in (plain, fused):
        gen = torch.Generator().manual_seed(4)
        for p in m.parameters():
            p.grad = torch.randn(p.shape, dtype=p.dtype, generator=gen)
    counts = fused_matches_unfused(plain, fused, batches)
    assert counts == (0, 6)  # down, gate, up: three accumulating GEMMs per micro-batch


def test_gated_mlp_gate_without_up_gradient_keeps_the_usual_path_for_both():
    batches = gated_batches(1)
    plain, fused = gated(seed=2), gated(seed=2)
    for m in (plain, fused):
        m.gate_proj.weight.grad = torch.ones_like(m.gate_proj.weight)
        m.down_proj.weight.grad = torch.ones_like(m.down_proj.weight)
    counts = fused_matches_unfused(plain, fused, batches)
    assert counts == (1, 1)  # gate+up: a new [2n, in] gradient; down: accumulated


def test_gated_mlp_down_gradient_sharing_the_block_input_keeps_the_usual_path():
    # The block input is a view of down_proj's .grad: accumulating the down projection's gradient
    # into it in place would change the input before the gate+up weight gradient reads it.
    plain = gated(seed=5)
    fused = copy.deepcopy(plain)
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(5, 6, dtype=torch.float64, generator=gen)
    for m in (plain, fused):
        for p in m.parameters():
            p.grad = torch.zeros_like(p)
    storage = fused.down_proj.weight.grad
    x_view = storage.view(-1)[: x.numel()].view_as(x)
    x_view.copy_(x)
    plain(x.clone()).sum().backward()
    with cutlass_nn.fused_wgrad_accumulation():
        fused(x_view).sum().backward()
    for (name, want), got in zip(plain.named_parameters(), fused.parameters()):
        if name.startswith("down_proj"):
            continue  # its gradient is the input's storage: what it holds now is not comparable
        torch.testing.assert_close(got.grad, want.grad, rtol=1e-12, atol=1e-12, msg=name)


def test_gated_mlp_frozen_up_weight_keeps_the_usual_path():
    batches = gated_batches(2)
    plain, fused = gated(seed=3), gated(seed=3)
    for m in (plain, fused):
        m.up_proj.weight.requires_grad_(False)
    want = accumulate(plain, batches)
    with cutlass_nn.fused_wgrad_accumulation():
        got = accumulate(fused, batches)
    assert fused.up_proj.weight.grad is None
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-12, atol=1e-12, msg=name)


# ---- main-gradient buffers (cutlass_nn.attach_main_grads) -----------------------------------


def mixed_model(dtype=torch.bfloat16, seed=0):
    """CutlassLinear (fused main-gradient GEMMs), a GatedMLP (one GEMM for gate + up) and a
    LayerNorm (its gradients go through the fold hook)."""
    torch.manual_seed(seed)
    return nn.Sequential(
        cutlass_nn.CutlassLinear(6, 8, dtype=dtype), nn.LayerNorm(8, dtype=dtype),
        cutlass_nn.GatedMLP(8, 12, dtype=dtype), cutlass_nn.CutlassLinear(8, 3, bias=False, dtype=dtype),
    )


def reference_grads(m, batches):
    """float64 copy, torch's formulas, summed over the micro-batches."""
    ref = copy.deepcopy(m).double()
    for x, y in batches:
        F.mse_loss(ref(x.double()), y.double()).backward()
    return {n: p.grad for n, p in ref.named_parameters()}


def test_main_grads_collect_every_gradient_with_fused_gemms():
    batches = [(x.bfloat16(), y.bfloat16()) for x, y in micro_batches(3)]
    m = mixed_model()
    want = reference_grads(m, batches)
    plain = copy.deepcopy(m)
    unfused = accumulate(plain, batches)
    buffers = cutlass_nn.attach_main_grads(m)
    assert set(buffers) == set(want) and all(b.dtype == torch.float32 for b in buffers.values())
    gate, up = m[2].gate_proj.weight.main_grad, m[2].up_proj.weight.main_grad
    assert up.data_ptr() == gate.data_ptr() + gate.nbytes  # one [2n, in] buffer
    counts = op_counts(lambda: accumulate_main(m, batches))
    # every micro-batch: first and last linear, GatedMLP down and gate+up -> 4 fused GEMMs
    assert counts == (0, 12)
    for name, p in m.named_parameters():
        assert p.grad is None, name
        err = (p.main_grad.double() - want[name]).abs().max()
        err_unfused = (unfused[name].double() - want[name]).abs().max()
        assert err <= 2 * err_unfused + 1e-3 * want[name].abs().max(), (name, err, err_unfused)
        torch.testing.assert_close(p.main_grad.double(), want[name], rtol=1e-2, atol=1e-3, msg=name)


def accumulate_main(m, batches):
    for x, y in batches:
        F.mse_loss(m(x), y).backward()


def test_main_grads_in_float64_match_the_unfused_gradients():
    batches = micro_batches(2)
    m = mixed_model(torch.float64, seed=1)
    plain = copy.deepcopy(m)
    want = accumulate(plain, batches)
    cutlass_nn.attach_main_grads(m)
    accumulate_main(m, batches)
    for name, p in m.named_parameters():
        assert p.main_grad.dtype == torch.float64 and p.grad is None
        torch.testing.assert_close(p.main_grad, want[name], rtol=1e-12, atol=1e-12, msg=name)


def test_main_grads_usual_path_cases_are_folded():
    """create_graph, a tensor hook on a weight and a frozen parameter: the usual path forms the
    gradient and the hook folds it into the buffer."""
    batches = micro_batches(2)
    m = mixed_model(torch.float64, seed=2)
    m[0].bias.requires_grad_(False)
    plain = copy.deepcopy(m)
    want = accumulate(plain, batches)
    buffers = cutlass_nn.attach_main_grads(m)
    assert "0.bias" not in buffers and not hasattr(m[0].bias, "main_grad")
    seen = []
    m[3].weight.register_hook(lambda g: seen.append(g))
    (x, y), (x2, y2) = batches
    new, in_place = op_counts(lambda: F.mse_loss(m(x), y).backward(create_graph=True))
    assert in_place == 0 and new == 4  # create_graph: every weight gradient formed as usual
    F.mse_loss(m(x2), y2).backward()
    assert len(seen) == 2
    for name, p in m.named_parameters():
        if name == "0.bias":
            continue
        assert p.grad is None
        torch.testing.assert_close(p.main_grad, want[name], rtol=1e-12, atol=1e-12, msg=name)


def test_main_grads_under_torch_compile_are_folded():
    batches = micro_batches(2)
    m = mixed_model(torch.float64, seed=3)
    want = accumulate(copy.deepcopy(m), batches)
    cutlass_nn.attach_main_grads(m)
    compiled = torch.compile(m, backend="aot_eager", fullgraph=True)
    for x, y in batches:
        F.mse_loss(compiled(x), y).backward()
    for name, p in m.named_parameters():
        torch.testing.assert_close(p.main_grad, want[name], rtol=1e-12, atol=1e-12, msg=name)


def test_detach_main_grads_restores_grad():
    m = mixed_model(torch.float64, seed=4)
    first = cutlass_nn.attach_main_grads(m)
    assert cutlass_nn.attach_main_grads(m)["0.weight"] is first["0.weight"]  # idempotent
    cutlass_nn.detach_main_grads(m)
    for p in m.parameters():
        assert not hasattr(p, "main_grad") and torch.ops.cutlass_nn._main_grad(p) is None
    batches = micro_batches(1)
    want = accumulate(copy.deepcopy(m), batches)
    got = accumulate(m, batches)
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-12, atol=1e-12)


def test_a_replaced_main_grad_is_an_error():
    m = mixed_model(torch.float64, seed=5)
    cutlass_nn.attach_main_grads(m)
    m[1].weight.main_grad = torch.zeros(8, dtype=torch.float64)
    (x, y), = micro_batches(1)
    with pytest.raises(RuntimeError, match=r"cutlass_nn\.attach_main_grads: a parameter's 'main_grad' was replaced"):
        F.mse_loss(m(x), y).backward()


def test_main_grad_arguments_are_checked():
    with pytest.raises(TypeError, match=r"cutlass_nn\.attach_main_grads: argument 'module' must be a torch\.nn\.Module, got Tensor"):
        cutlass_nn.attach_main_grads(torch.zeros(2))
    with pytest.raises(TypeError, match=r"cutlass_nn\.detach_main_grads: argument 'module'"):
        cutlass_nn.detach_main_grads([])
    with pytest.raises(RuntimeError, match=r"cutlass_nn\._set_main_grad: argument 'buffer' must have the shape of 'weight' \[2, 3\], got \[3, 2\]"):
        torch.ops.cutlass_nn._set_main_grad(torch.zeros(2, 3), torch.zeros(3, 2))


def test_autograd_grad_returns_weight_gradients_and_leaves_buffers_alone():
    """torch.autograd.grad (and backward(inputs=...)) never take the in-place path: the caller
    gets the weight gradients, and .grad / main_grad are not written behind its back."""
    (x, y), = micro_batches(1)
    m = mixed_model(torch.float64, seed=6)
    want = accumulate(copy.deepcopy(m), [(x, y)])
    buffers = cutlass_nn.attach_main_grads(m)
    names = [n for n, _ in m.named_parameters()]
    got = torch.autograd.grad(F.mse_loss(m(x), y), list(m.parameters()))
    for name, g in zip(names, got):
        torch.testing.assert_close(g, want[name], rtol=1e-12, atol=1e-12, msg=name)
        assert not buffers[name].any(), name
    # the fused switch with an existing .grad: the same
    cutlass_nn.detach_main_grads(m)
    F.mse_loss(m(x), y).backward()
    before = {n: p.grad.clone() for n, p in m.named_parameters()}
    with cutlass_nn.fused_wgrad_accumulation():
        new, in_place = op_counts(lambda: torch.autograd.grad(F.mse_loss(m(x), y), [m[0].weight]))
        assert in_place == 0
        F.mse_loss(m(x), y).backward(inputs=[m[3].weight])
    for name, p in m.named_parameters():
        expect = before[name] + (want[name] if name == "3.weight" else 0)
        torch.testing.assert_close(p.grad, expect, rtol=1e-12, atol=1e-12, msg=name)


def test_attach_moves_an_existing_gradient_into_the_buffer():
    (x, y), (x2, y2) = micro_batches(2)
    m = mixed_model(torch.float64, seed=7)
    want = accumulate(copy.deepcopy(m), [(x, y), (x2, y2)])
    F.mse_loss(m(x), y).backward()
    cutlass_nn.attach_main_grads(m)
    assert all(p.grad is None for p in m.parameters())
    new, in_place = op_counts(lambda: F.mse_loss(m(x2), y2).backward())
    assert (new, in_place) == (0, 4)
    for name, p in m.named_parameters():
        torch.testing.assert_close(p.main_grad, want[name], rtol=1e-12, atol=1e-12, msg=name)


def test_main_grads_with_the_optimizer_recipe():
    """p.grad = main_grad.to(dtype), step, zero_grad (set_to_none), zero the buffers: each step's
    buffers hold that step's gradient only; a .grad aliasing the buffer at backward is an error."""
    batches = micro_batches(3, dtype=torch.float32)
    m = mixed_model(torch.float32, seed=8)
    ref = copy.deepcopy(m)
    cutlass_nn.attach_main_grads(m)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for x, y in batches:
        F.mse_loss(ref(x), y).backward()
        ref_opt.step()
        ref_opt.zero_grad(set_to_none=True)
        F.mse_loss(m(x), y).backward()
        for p in m.parameters():
            p.grad = p.main_grad.to(p.dtype)  # float32: the buffer itself
        opt.step()
        opt.zero_grad(set_to_none=True)
        for p in m.parameters():
            p.main_grad.zero_()
    for (name, p), q in zip(m.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)
    x, y = batches[0]
    for p in m.parameters():
        p.grad = p.main_grad.to(p.dtype)
    with pytest.raises(RuntimeError, match=r"\.grad shares memory with its main_grad"):
        F.mse_loss(m(x), y).backward()


def test_main_grads_with_tied_gate_and_up_weights():
    mlp = gated(seed=9)
    mlp.up_proj.weight = mlp.gate_proj.weight
    (x, y), = gated_batches(1)
    want = accumulate(copy.deepcopy(mlp), [(x, y)])
    cutlass_nn.attach_main_grads(mlp)
    F.mse_loss(mlp(x), y).backward()
    for name, p in mlp.named_parameters():
        torch.testing.assert_close(p.main_grad, want[name], rtol=1e-12, atol=1e-12, msg=name)
    cutlass_nn.detach_main_grads(mlp)
    F.mse_loss(mlp(x), y).backward()  # no hook left behind
    assert mlp.gate_proj.weight.grad is not None


def test_a_dropped_model_frees_its_buffers():
    import gc
    import weakref

    m = mixed_model(torch.float64, seed=10)
    ref = weakref.ref(cutlass_nn.attach_main_grads(m)["0.weight"])
    del m
    gc.collect()
    assert ref() is None


def test_main_grads_refuse_distributed_wrappers(tmp_path):
    import torch.distributed as dist

    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        m = mixed_model(torch.float64, seed=11)
        with pytest.raises(TypeError, match=r"must not be DistributedDataParallel"):
            cutlass_nn.attach_main_grads(DDP(m))
        mesh = init_device_mesh("cpu", (1,))
        m.register_parameter("sharded", nn.Parameter(distribute_tensor(torch.zeros(4), mesh, [Shard(0)])))
        with pytest.raises(TypeError, match=r"parameter 'sharded' is a sharded DTensor"):
            cutlass_nn.attach_main_grads(m)
        assert not any(hasattr(p, "main_grad") for p in m.parameters())
    finally:
        dist.destroy_process_group()


def test_main_grads_of_a_complex_parameter_are_folded_by_the_hook():
    """No weight-gradient GEMM takes a complex parameter: its buffer is the fold-in hook's alone
    (the operators refuse to register it), and the model's other parameters attach as usual."""
    model = nn.Sequential(cutlass_nn.CutlassLinear(4, 3))
    model.register_parameter("phase", nn.Parameter(torch.randn(3, dtype=torch.complex64)))
    buffers = cutlass_nn.attach_main_grads(model)
    assert set(buffers) == {"0.weight", "0.bias", "phase"}
    x = torch.randn(5, 4)
    for _ in range(2):
        (model(x) * model.phase.abs()).sum().backward()
    ref = model.phase.detach().clone().requires_grad_()
    (model(x).detach() * ref.abs()).sum().backward()
    torch.testing.assert_close(buffers["phase"], 2 * ref.grad)
    assert model.phase.grad is None
    cutlass_nn.detach_main_grads(model)
    assert not hasattr(model.phase, "main_grad")
    (model(x) * model.phase.abs()).sum().backward()
    assert model.phase.grad is not None

