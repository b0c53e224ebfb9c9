"""The gated-MLP CUDA path against a float64 reference: the gated_act / gated_act_backward
kernels (every dtype and activation, odd widths on the scalar path and pack-aligned widths on the
16-byte path, misaligned and strided inputs, empty shapes, more rows than one grid covers), the
gated_mlp operator's forward and seven gradients, the zero-copy gate+up weight, the activation
memory the backward keeps, torch.compile, autocast, and a converted transformers Llama."""

from __future__ import annotations

import pytest
import torch

import cutlass_nn
from cuda_helpers import CUDA_MARKS

pytestmark = CUDA_MARKS
ops = torch.ops.cutlass_nn

DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.float64]
ACTIVATIONS = ["silu", "gelu", "gelu_tanh"]
# max |error| / max |reference| of one elementwise result: a rounding or two of the output dtype.
ELEMENT_BOUND = {torch.bfloat16: 2 ** -7, torch.float16: 2 ** -10, torch.float32: 1e-6,
                 torch.float64: 1e-13}
# ... and of a whole gated MLP (three GEMMs with float32 accumulation; TF32 is off by default).
MLP_BOUND = {torch.bfloat16: 2e-2, torch.float16: 4e-3, torch.float32: 1e-5, torch.float64: 1e-12}

# (rows, n): odd n (scalar path), pack-aligned n for every dtype (16-byte path), one row, and
# more rows than the grid's row dimension holds (the row loop).
SHAPES = [(1, 1), (3, 7), (5, 100), (64, 1000), (33, 4096), (7, 11008), (70000, 8)]


def act64(name, x):
    if name == "silu":
        return torch.nn.functional.silu(x)
    return torch.nn.functional.gelu(x, approximate="tanh" if name == "gelu_tanh" else "none")


def rand(shape, dtype, gen, scale=1.0):
    return (torch.randn(shape, generator=gen, device="cuda") * scale).to(dtype)


def rel_err(got, ref):
    scale = max(ref.double().abs().max().item(), 1e-30) if ref.numel() else 1.0
    return (got.double() - ref.double()).abs().max().item() / scale if ref.numel() else 0.0


def gated_reference(gate_up, activation, grad_out=None):
    """float64 act(g) * u and, with grad_out, its gradient in gate_up."""
    x = gate_up.double().requires_grad_(grad_out is not None)
    n = x.shape[-1] // 2
    out = act64(activation, x[..., :n]) * x[..., n:]
    if grad_out is None:
        return out.detach()
    (grad,) = torch.autograd.grad(out, x, grad_out.double())
    return out.detach(), grad


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_gated_act_kernels_match_float64(shape, dtype, activation, gen):
    rows, n = shape
    gate_up = rand((rows, 2 * n), dtype, gen, 2.0)
    grad = rand((rows, n), dtype, gen)
    ref_out, ref_grad = gated_reference(gate_up, activation, grad)
    out = ops.gated_act(gate_up, activation)
    assert out.dtype == dtype and out.shape == (rows, n) and out.is_contiguous()
    assert rel_err(out, ref_out) <= ELEMENT_BOUND[dtype]
    grad_gate_up, out2 = ops.gated_act_backward(grad, gate_up, activation)
    assert torch.equal(out2, out)  # the recomputed forward is the forward, bit for bit
    # each half against its own scale: the up half's gradient can be much larger than the gate's
    assert rel_err(grad_gate_up[:, :n], ref_grad[:, :n]) <= 2 * ELEMENT_BOUND[dtype]
    assert rel_err(grad_gate_up[:, n:], ref_grad[:, n:]) <= 2 * ELEMENT_BOUND[dtype]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_misaligned_strided_and_batched_inputs(dtype, gen):
    rows, n = 37, 264
    # misaligned: contiguous rows starting one element into a buffer (the scalar path)
    buf = rand((rows * 2 * n + 1,), dtype, gen)
    gate_up = buf[1:].view(rows, 2 * n)
    grad_buf = rand((rows * n + 1,), dtype, gen)
    grad = grad_buf[1:].view(rows, n)
    ref_out, ref_grad = gated_reference(gate_up, "silu", grad)
    assert rel_err(ops.gated_act(gate_up, "silu"), ref_out) <= ELEMENT_BOUND[dtype]
    got_grad, _ = ops.gated_act_backward(grad, gate_up, "silu")
    assert rel_err(got_grad, ref_grad) <= 2 * ELEMENT_BOUND[dtype]
    # strided (a transposed view) and 3-D: copied to rows first, same values
    t = rand((2 * n, rows), dtype, gen).t()
    assert torch.equal(ops.gated_act(t, "gelu"), ops.gated_act(t.contiguous(), "gelu"))
    x3 = rand((3, 5, 2 * n), dtype, gen)
    assert torch.equal(ops.gated_act(x3, "gelu_tanh"),
                       ops.gated_act(x3.reshape(15, 2 * n), "gelu_tanh").view(3, 5, n))
    before = buf.clone()
    ops.gated_act_backward(grad, gate_up, "silu")
    assert torch.equal(buf, before)  # inputs untouched


@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_gated_kernels_at_special_values(dtype, activation):
    # at infinities, NaN, huge and tiny gates the CUDA kernels give what the CPU kernels give
    # (NaN where it is NaN, values within one rounding of the output, underflowing tails within
    # 1e-30): both run activation_math.h's float math.
    gates = [float("-inf"), -1000.0, -100.0, -88.0, -87.0, -20.0, -10.0, -3.0, -1e-30, -0.0, 0.0,
             1e-30, 0.5, 3.0, 10.0, 20.0, 100.0, 1000.0, float("inf"), float("nan")]
    n = len(gates)
    gate = torch.tensor(gates * 8, dtype=torch.float32).view(8, n)
    up = torch.linspace(-2, 2, 8 * n).view(8, n)
    gate_up = torch.cat((gate, up), dim=1).to(dtype)
    grad = torch.linspace(-1, 1, 8 * n).view(8, n).to(dtype)
    tol = {torch.bfloat16: 2 ** -7, torch.float16: 2 ** -10}[dtype]
    want_out = ops.gated_act(gate_up, activation)
    want_grad, want_out2 = ops.gated_act_backward(grad, gate_up, activation)
    got_out = ops.gated_act(gate_up.cuda(), activation).cpu()
    got_grad, got_out2 = (t.cpu() for t in ops.gated_act_backward(grad.cuda(), gate_up.cuda(), activation))
    for got, want in ((got_out, want_out), (got_out2, want_out2), (got_grad, want_grad)):
        torch.testing.assert_close(got, want, rtol=tol, atol=1e-30, equal_nan=True)


def test_empty_shapes():
    for shape in [(0, 8), (4, 0), (0, 0)]:
        gu = torch.empty(shape, device="cuda", dtype=torch.bfloat16)
        out = ops.gated_act(gu, "silu")
        assert out.shape == (shape[0], shape[1] // 2)
        g, o = ops.gated_act_backward(out, gu, "silu")
        assert g.shape == gu.shape and o.shape == out.shape


def test_bad_input_names_the_argument():
    gu = torch.randn(4, 7, device="cuda")
    with pytest.raises(RuntimeError, match="cutlass_nn.gated_act: argument 'gate_up' must have an even"):
        ops.gated_act(gu, "silu")
    with pytest.raises(RuntimeError, match="cutlass_nn.gated_act: argument 'activation'"):
        ops.gated_act(torch.randn(4, 8, device="cuda"), "relu")
    with pytest.raises(RuntimeError, match="cutlass_nn.gated_act_backward: argument 'grad_output'"):
        ops.gated_act_backward(torch.randn(4, 3, device="cuda"), torch.randn(4, 8, device="cuda"), "silu")


def mlp_reference(x, wg, wu, wd, bg, bu, bd, activation, grad_out):
    """float64 output and gradients of every input of the gated MLP."""
    leaves = [t.double().requires_grad_() if t is not None else None
              for t in (x, wg, wu, wd, bg, bu, bd)]
    x64, wg64, wu64, wd64, bg64, bu64, bd64 = leaves
    lin = torch.nn.functional.linear
    out = lin(act64(activation, lin(x64, wg64, bg64)) * lin(x64, wu64, bu64), wd64, bd64)
    present = [t for t in leaves if t is not None]
    grads = torch.autograd.grad(out, present, grad_out.double())
    it = iter(grads)
    return out.detach(), [next(it) if t is not None else None for t in leaves]


@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 8, 16, 8), (37, 65, 43, 31), (256, 512, 1376, 512)],
                         ids=lambda s: "x".join(map(str, s)))
def test_gated_mlp_forward_and_gradients_match_float64(shape, dtype, activation, bias, gen):
    tokens, hidden, inter, out_features = shape
    x = rand((tokens, hidden), dtype, gen)
    wg = rand((inter, hidden), dtype, gen, hidden ** -0.5)
    wu = rand((inter, hidden), dtype, gen, hidden ** -0.5)
    wd = rand((out_features, inter), dtype, gen, inter ** -0.5)
    bg, bu, bd = ((rand((inter,), dtype, gen, 0.1), rand((inter,), dtype, gen, 0.1),
                   rand((out_features,), dtype, gen, 0.1)) if bias else (None, None, None))
    grad_out = rand((tokens, out_features), dtype, gen)
    inputs = [t.clone().requires_grad_() if t is not None else None
              for t in (x, wg, wu, wd, bg, bu, bd)]
    out = cutlass_nn.functional.gated_mlp(*inputs, activation=activation)
    out.backward(grad_out)
    ref_out, ref_grads = mlp_reference(x, wg, wu, wd, bg, bu, bd, activation, grad_out)
    assert out.dtype == dtype and out.shape == ref_out.shape
    assert rel_err(out, ref_out) <= MLP_BOUND[dtype]
    names = ["input", "gate_weight", "up_weight", "down_weight", "gate_bias", "up_bias", "down_bias"]
    for name, t, ref in zip(names, inputs, ref_grads):
        if t is None:
            continue
        assert t.grad is not None and t.grad.dtype == dtype, name
        assert rel_err(t.grad, ref) <= 2 * MLP_BOUND[dtype], name


def test_packed_weights_run_without_a_copy_and_match_separate_ones(gen):
    inter, hidden, tokens = 2048, 1024, 64
    packed = rand((2 * inter, hidden), torch.bfloat16, gen, 0.03)
    wg, wu = packed[:inter], packed[inter:]
    wg2, wu2 = wg.clone(), wu.clone()  # same values, two allocations: the concatenating path
    wd = rand((hidden, inter), torch.bfloat16, gen, 0.02)
    x = rand((tokens, hidden), torch.bfloat16, gen)
    with torch.no_grad():
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        a = ops.gated_mlp(x, wg, wu, wd)
        packed_peak = torch.cuda.max_memory_allocated() - base
        del a
        torch.cuda.reset_peak_memory_stats()
        b = ops.gated_mlp(x, wg2, wu2, wd)
        copy_peak = torch.cuda.max_memory_allocated() - base
    weight_bytes = packed.numel() * packed.element_size()
    # the concatenating path holds a [2n, in] copy of the weights; the packed one does not
    assert copy_peak - packed_peak >= 0.9 * weight_bytes
    assert torch.equal(ops.gated_mlp(x, wg, wu, wd), b)  # same GEMM, same bits


def test_module_keeps_half_the_activations_of_the_stock_mlp():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(hidden_size=1024, intermediate_size=2816)
    torch.manual_seed(0)
    stock = transformers.models.llama.modeling_llama.LlamaMLP(cfg).cuda().bfloat16()
    ours = cutlass_nn.GatedMLP(1024, 2816, device="cuda", dtype=torch.bfloat16)
    ours.load_state_dict(stock.state_dict())
    x = torch.randn(4096, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)

    def saved_bytes(module):
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        y = module(x)
        kept = torch.cuda.memory_allocated() - before - y.numel() * y.element_size()
        return y, kept

    ys, stock_kept = saved_bytes(stock)
    yo, our_kept = saved_bytes(ours)
    # stock keeps gate, up, act(gate) and the product (4 x [tokens, n]); ours the gate+up output
    # (2 x [tokens, n]) and nothing else
    assert our_kept <= 0.55 * stock_kept
    assert rel_err(yo, ys.double()) <= 2e-2
    g = torch.randn_like(ys)
    (gs,) = torch.autograd.grad(ys, x, g)
    (go,) = torch.autograd.grad(yo, x, g)
    assert rel_err(go, gs.double()) <= 3e-2


def test_step_peak_memory_is_below_the_stock_mlp():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(hidden_size=1024, intermediate_size=2816)
    torch.manual_seed(0)
    stock = transformers.models.llama.modeling_llama.LlamaMLP(cfg).cuda().bfloat16()
    ours = cutlass_nn.GatedMLP(1024, 2816, device="cuda", dtype=torch.bfloat16)
    ours.load_state_dict(stock.state_dict())
    x = torch.randn(4096, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(4096, 1024, device="cuda", dtype=torch.bfloat16)

    def step_peak(module):
        for p in module.parameters():
            p.grad = None
        x.grad = None
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        module(x).backward(g)
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base

    step_peak(ours), step_peak(stock)  # warm-up (workspaces, cuBLAS handles)
    ours_peak, stock_peak = step_peak(ours), step_peak(stock)
    # stock peaks in its backward at ~6 [tokens, n] buffers; ours at ~4 (its backward writes the
    # gate+up gradient over the saved gate+up output and frees the recomputed product early)
    assert ours_peak <= 0.85 * stock_peak, (ours_peak, stock_peak)


def test_double_backward_on_the_gpu(gen):
    dtype = torch.float64
    x = rand((5, 6), dtype, gen).requires_grad_()
    wg = rand((4, 6), dtype, gen).requires_grad_()
    wu = rand((4, 6), dtype, gen).requires_grad_()
    wd = rand((3, 4), dtype, gen).requires_grad_()
    for act in ACTIVATIONS:
        f = lambda *a: ops.gated_mlp(*a, None, None, None, act)  # noqa: E731
        assert torch.autograd.gradgradcheck(f, (x, wg, wu, wd))


def test_compile_matches_eager():
    torch.manual_seed(0)
    mlp = cutlass_nn.GatedMLP(256, 688, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(2, 64, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    compiled = torch.compile(mlp, fullgraph=True)
    ye = mlp(x)
    (ge,) = torch.autograd.grad(ye.float().square().sum(), x)
    yc = compiled(x)
    (gc,) = torch.autograd.grad(yc.float().square().sum(), x)
    assert rel_err(yc, ye) <= 1e-2 and rel_err(gc, ge) <= 2e-2


@pytest.mark.parametrize("amp", [False, True], ids=["bf16-weights", "autocast-fp32-weights"])
def test_compiled_step_copies_no_weight_and_matches_eager(amp):
    # Inductor's graph of a compiled GatedMLP step calls the gate+up operators, which read the
    # packed weights in place: no kernel of the step copies or concatenates them (until v0.33 a
    # cat of both weights ran per layer, kept for the backward), and the step is eager's, bit
    # for bit (same GEMMs, same gated kernels). Under autocast with float32 weights the traced
    # graph casts both into one buffer (_pack_gate_up) whose halves the operators read in place.
    torch.manual_seed(0)
    dtype = torch.float32 if amp else torch.bfloat16
    mlp = cutlass_nn.GatedMLP(512, 1376, device="cuda", dtype=dtype)
    x = torch.randn(4, 128, 512, device="cuda", dtype=dtype)
    compiled = torch.compile(mlp, fullgraph=True)

    def step(fn):
        xx = x.clone().requires_grad_()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
            y = fn(xx)
        y.backward(torch.ones_like(y))
        grads = [xx.grad] + [p.grad for p in mlp.parameters()]
        mlp.zero_grad(set_to_none=True)
        return [y.detach()] + grads

    step(compiled)  # compiles
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        got = step(compiled)
        torch.cuda.synchronize()
    kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert kernels, "the profiler recorded no kernel"
    # Inductor names a concatenation's kernel triton_..._cat_...; ATen's is CatArrayBatchedCopy
    copies = [k for k in kernels if (k.startswith("triton_") and "cat" in k) or "CatArray" in k]
    assert not copies, copies
    ops_run = {e.name for e in prof.events()}
    assert "cutlass_nn::_gate_up_linear" in ops_run and "cutlass_nn::_gate_up_dgrad" in ops_run
    assert ("cutlass_nn::_pack_gate_up" in ops_run) == amp
    want = step(mlp)
    for a, b in zip(got, want):
        assert torch.equal(a, b)


@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
def test_gate_up_operators_on_packed_and_separate_weights(bias, gen):
    inter, hidden = 1376, 512
    packed = rand((2 * inter, hidden), torch.bfloat16, gen, 0.05)
    wg, wu = packed[:inter], packed[inter:]
    wg2, wu2 = wg.clone(), wu.clone()
    b = rand((2 * inter,), torch.bfloat16, gen) if bias else None
    biases = (b[:inter], b[inter:]) if bias else (None, None)
    x = rand((3, 40, hidden), torch.bfloat16, gen)
    want = ops.linear(x, packed, b)
    assert torch.equal(ops._gate_up_linear(x, wg, wu, *biases), want)
    assert torch.equal(ops._gate_up_linear(x, wg2, wu2, *biases), want)
    g = rand((3, 40, 2 * inter), torch.bfloat16, gen)
    want_d = ops.linear_dgrad(g, packed)
    assert torch.equal(ops._gate_up_dgrad(g, wg, wu), want_d)
    assert torch.equal(ops._gate_up_dgrad(g, wg2, wu2), want_d)
    ref = g.double() @ packed.double()
    assert rel_err(want_d, ref) <= MLP_BOUND[torch.bfloat16]


def test_autocast_runs_in_bfloat16_with_float32_gradients():
    mlp = cutlass_nn.GatedMLP(128, 344, device="cuda")
    x = torch.randn(16, 128, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = mlp(x)
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in mlp.parameters())
    # the packed weights are cast into one buffer; separate weights take cached casts and a
    # concatenation: the same numbers either way
    sep = [p.detach().clone().requires_grad_() for p in
           (mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight)]
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y_sep = ops.gated_mlp(x, *sep)
    y_sep.float().sum().backward()
    assert torch.equal(y, y_sep)
    assert torch.equal(mlp.gate_proj.weight.grad, sep[0].grad)


def test_converted_llama_trains_like_stock_in_bfloat16():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=1000)
    torch.manual_seed(0)
    stock = transformers.LlamaForCausalLM(cfg).cuda().bfloat16()
    ours = transformers.LlamaForCausalLM(cfg).cuda().bfloat16()
    ours.load_state_dict(stock.state_dict())
    cutlass_nn.convert(ours, fuse_norm=True, fuse_mlp=True)
    assert sum(isinstance(m, cutlass_nn.GatedMLP) for m in ours.modules()) == 2
    assert ours.state_dict().keys() == stock.state_dict().keys()
    ids = torch.randint(0, 1000, (2, 128), device="cuda",
                        generator=torch.Generator("cuda").manual_seed(1))
    opt_s = torch.optim.AdamW(stock.parameters(), lr=1e-3)
    opt_o = torch.optim.AdamW(ours.parameters(), lr=1e-3)
    for _ in range(5):
        ls = stock(input_ids=ids, labels=ids).loss
        lo = ours(input_ids=ids, labels=ids).loss
        # a few bf16 roundings apart (ours rounds the gated product once, transformers twice)
        assert abs(ls.item() - lo.item()) <= 0.02 * abs(ls.item())
        ls.backward()
        lo.backward()
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in ours.parameters())
        for opt in (opt_s, opt_o):
            opt.step()
            opt.zero_grad()
