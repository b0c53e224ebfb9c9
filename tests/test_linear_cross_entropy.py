"""linear_cross_entropy / LinearCrossEntropyLoss on the CPU backend: against
F.cross_entropy(F.linear(...)) in float64 (every reduction, label smoothing, ignore_index,
biases, chunkings that do and do not divide the token count), gradients of each argument,
the edge cases torch defines (every token ignored, no tokens), out-of-range targets (NaN, no
fault), argument errors, lower-precision dtypes, autocast, torch.compile, and a transformers
causal LM's loss. The GPU side runs in tests/test_cuda_linear_cross_entropy.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as TF

import cutlass_nn
from cutlass_nn import functional as F


def reference(h, w, t, b=None, **kw):
    logits = TF.linear(h, w, b)
    out = TF.cross_entropy(logits.reshape(-1, w.shape[0]), t.reshape(-1), **kw)
    return out.reshape(t.shape) if kw.get("reduction") == "none" else out


def make(gen, shape=(2, 7), hidden=16, vocab=50, dtype=torch.float64, bias=True):
    h = torch.randn(*shape, hidden, generator=gen, dtype=dtype).requires_grad_()
    w = (torch.randn(vocab, hidden, generator=gen, dtype=dtype) * hidden ** -0.5).requires_grad_()
    b = torch.randn(vocab, generator=gen, dtype=dtype).requires_grad_() if bias else None
    t = torch.randint(0, vocab, shape, generator=gen)
    return h, w, b, t


@pytest.mark.parametrize("chunk", [None, 1, 3, 14, 100])
@pytest.mark.parametrize("smoothing", [0.0, 0.2])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
def test_matches_unfused_in_float64(reduction, smoothing, chunk, bias):
    gen = torch.Generator().manual_seed(7)
    h, w, b, t = make(gen, bias=bias)
    t[0, 2] = t[1, 5] = -100
    kw = dict(reduction=reduction, label_smoothing=smoothing)
    ref = reference(h, w, t, b, **kw)
    got = F.linear_cross_entropy(h, w, t, b, chunk_size=chunk, **kw)
    assert got.shape == ref.shape and got.dtype == ref.dtype
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)
    g = torch.randn(ref.shape, generator=gen, dtype=ref.dtype)
    args = (h, w) + ((b,) if bias else ())
    for got_grad, ref_grad in zip(torch.autograd.grad(got, args, g), torch.autograd.grad(ref, args, g)):
        torch.testing.assert_close(got_grad, ref_grad, rtol=1e-10, atol=1e-12)


def test_gradients_only_where_asked():
    gen = torch.Generator().manual_seed(1)
    h, w, b, t = make(gen)
    w.requires_grad_(False)
    loss = F.linear_cross_entropy(h, w, t, b)
    loss.backward()
    assert h.grad is not None and b.grad is not None and w.grad is None
    with torch.no_grad():
        torch.testing.assert_close(F.linear_cross_entropy(h, w, t, b), reference(h, w, t, b))


def test_gradcheck():
    gen = torch.Generator().manual_seed(2)
    h, w, b, t = make(gen, shape=(5,), hidden=4, vocab=6)
    t[1] = -100
    for red in ("mean", "sum", "none"):
        assert torch.autograd.gradcheck(
            lambda h, w, b: F.linear_cross_entropy(h, w, t, b, reduction=red, label_smoothing=0.1,
                                                   chunk_size=2),
            (h, w, b),
        )


def test_torch_edge_cases():
    gen = torch.Generator().manual_seed(3)
    h, w, b, t = make(gen)
    t.fill_(-100)  # every token ignored: mean is NaN (0 / 0), the gradients are 0
    loss = F.linear_cross_entropy(h, w, t, b)
    assert torch.isnan(loss) and torch.isnan(reference(h, w, t, b))
    loss.backward()
    assert h.grad.abs().max() == 0 and w.grad.abs().max() == 0
    assert F.linear_cross_entropy(h, w, t, b, reduction="sum") == 0
    empty_h = torch.randn(0, 16, dtype=torch.float64, requires_grad=True)
    empty_t = torch.zeros(0, dtype=torch.long)
    assert F.linear_cross_entropy(empty_h, w, empty_t, reduction="none").shape == (0,)
    assert torch.isnan(F.linear_cross_entropy(empty_h, w, empty_t))
    # an ignore_index inside the vocabulary is ignored all the same
    h2, w2, _, t2 = make(gen, bias=False)
    t2[0, 0] = 3
    torch.testing.assert_close(F.linear_cross_entropy(h2, w2, t2, ignore_index=3),
                               reference(h2, w2, t2, ignore_index=3))


def test_out_of_range_target_gives_nan_for_its_token_only():
    gen = torch.Generator().manual_seed(4)
    h, w, b, t = make(gen)
    t[0, 1] = 50  # == vocab
    t[1, 0] = -5
    per_token = F.linear_cross_entropy(h, w, t, b, reduction="none")
    assert torch.isnan(per_token[0, 1]) and torch.isnan(per_token[1, 0])
    assert torch.isfinite(per_token[0, 0]) and torch.isnan(F.linear_cross_entropy(h, w, t, b))


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)], ids=str)
def test_lower_precision_dtypes(dtype, tol):
    gen = torch.Generator().manual_seed(5)
    h, w, b, t = make(gen, shape=(64,), hidden=32, vocab=300, dtype=dtype, bias=False)
    got = F.linear_cross_entropy(h, w, t, chunk_size=10)
    assert got.dtype == dtype
    h64, w64 = h.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    ref = reference(h64, w64, t)
    assert abs(got.item() - ref.item()) <= tol * abs(ref.item())
    gh, gw = torch.autograd.grad(got, (h, w))
    rh, rw = torch.autograd.grad(ref, (h64, w64))
    assert gh.dtype == dtype and gw.dtype == dtype
    for got_g, ref_g in ((gh, rh), (gw, rw)):
        assert (got_g.double() - ref_g).abs().max() <= 2 * tol * ref_g.abs().max()


def test_autocast_follows_torch():
    gen = torch.Generator().manual_seed(6)
    h, w, b, t = make(gen, dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = F.linear_cross_entropy(h, w, t, b)
        ref = reference(h, w, t, b)
        # mixed dtypes (bf16 activations beside a float32 head) are cast like F.linear's
        mixed = F.linear_cross_entropy(h.bfloat16(), w, t, b)
    # the loss in float32, as autocast runs cross_entropy, from bf16 logits
    assert loss.dtype == ref.dtype == mixed.dtype == torch.float32
    assert abs(loss.item() - ref.item()) <= 1e-2 * abs(ref.item())
    loss.backward()
    assert h.grad.dtype == torch.float32 and w.grad.dtype == torch.float32


def test_float16_gradients_survive_with_a_loss_scale():
    """The reduction's 1 / n and the incoming gradient (a loss scale) are applied in float after
    the 16-bit chunk GEMMs: small gradients are not flushed to zero before the scale lifts them."""
    gen = torch.Generator().manual_seed(12)
    tokens, hidden, vocab = 16384, 16, 4000
    h = torch.randn(tokens, hidden, generator=gen).half().requires_grad_()
    w = (torch.randn(vocab, hidden, generator=gen) * 0.25).half().requires_grad_()
    t = torch.randint(0, vocab, (tokens,), generator=gen)
    F.linear_cross_entropy(h, w, t, chunk_size=512).backward(torch.tensor(32768.0, dtype=torch.half))
    h64, w64 = h.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    reference(h64, w64, t).backward(torch.tensor(32768.0, dtype=torch.float64))
    assert (w.grad.double() - w64.grad).abs().max() <= 1e-2 * w64.grad.abs().max()
    assert (h.grad.double() - h64.grad).abs().max() <= 1e-2 * h64.grad.abs().max()
    assert (w.grad == 0).float().mean() <= (w64.grad == 0).double().mean() + 0.01


def test_out_of_range_target_poisons_its_gradients_too():
    gen = torch.Generator().manual_seed(13)
    h, w, b, t = make(gen)
    t[0, 2] = 999
    F.linear_cross_entropy(h, w, t, b).backward()
    assert torch.isnan(h.grad[0, 2]).all() and torch.isnan(w.grad).any()
    for red in ("none",):
        h.grad = None
        F.linear_cross_entropy(h, w, t, b, reduction=red).sum().backward()
        assert torch.isnan(h.grad[0, 2]).all()


def test_no_double_backward():
    gen = torch.Generator().manual_seed(14)
    h, w, b, t = make(gen)
    # the backward refuses to build a graph of the gradient (it would be a constant)
    with pytest.raises(RuntimeError, match="linear_cross_entropy: has first derivatives only"):
        (gh,) = torch.autograd.grad(F.linear_cross_entropy(h, w, t, b), h, create_graph=True)
        gh.sum().backward()


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(reduction="avg"), "argument 'reduction' must be one of"),
        (dict(label_smoothing=1.5), "argument 'label_smoothing' must be in"),
        (dict(chunk_size=0), "argument 'chunk_size' must be None or a positive int"),
    ],
)
def test_bad_options(kwargs, match):
    gen = torch.Generator().manual_seed(8)
    h, w, b, t = make(gen)
    with pytest.raises(ValueError, match="cutlass_nn.linear_cross_entropy: " + match):
        F.linear_cross_entropy(h, w, t, b, **kwargs)


def test_bad_tensors_name_the_argument():
    gen = torch.Generator().manual_seed(9)
    h, w, b, t = make(gen)
    cases = [
        ((h, w[:, :5], t), "argument 'weight' must have shape"),
        ((h, w.float(), t), "argument 'weight' must have the dtype"),
        ((h, w, t.int()), "argument 'target' must be an int64"),
        ((h, w, t[:1]), "argument 'target' must have the leading shape"),
        ((h.long(), w, t), "argument 'hidden' must have a floating dtype"),
        ((h, w, t, b[:3]), "argument 'bias' must be None or a tensor of shape"),
    ]
    for args, match in cases:
        with pytest.raises(ValueError, match=match):
            F.linear_cross_entropy(*args)


def test_module_form():
    gen = torch.Generator().manual_seed(10)
    h, w, b, t = make(gen)
    loss_fn = cutlass_nn.LinearCrossEntropyLoss(reduction="sum", label_smoothing=0.1, chunk_size=4)
    assert "reduction='sum'" in repr(loss_fn) and not list(loss_fn.parameters())
    torch.testing.assert_close(loss_fn(h, w, t, b),
                               reference(h, w, t, b, reduction="sum", label_smoothing=0.1))
    with pytest.raises(ValueError, match="LinearCrossEntropyLoss: argument 'reduction'"):
        cutlass_nn.LinearCrossEntropyLoss(reduction="avg")


@pytest.mark.parametrize("reduction", ["mean", "none"])
@pytest.mark.parametrize("options", [dict(backend="aot_eager"), dict(fullgraph=True, dynamic=True)],
                         ids=["aot_eager", "inductor-fullgraph-dynamic"])
def test_compile_matches_eager(options, reduction):
    gen = torch.Generator().manual_seed(11)
    h, w, b, t = make(gen, dtype=torch.float32)

    def f(h, w, b):
        out = F.linear_cross_entropy(h, w, t, b, chunk_size=5, reduction=reduction)
        return out if reduction == "mean" else out.sum()

    eager = f(h, w, b)
    ge = torch.autograd.grad(eager, (h, w, b))
    torch._dynamo.reset()
    compiled = torch.compile(f, **options)(h, w, b)
    gc = torch.autograd.grad(compiled, (h, w, b))
    torch.testing.assert_close(compiled, eager)
    for a, c in zip(ge, gc):
        torch.testing.assert_close(a, c)


def test_with_a_transformers_causal_lm():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=300)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg)
    ids = torch.randint(0, 300, (2, 24), generator=torch.Generator().manual_seed(1))
    stock = model(input_ids=ids, labels=ids).loss
    hidden = model.model(input_ids=ids).last_hidden_state
    ours = F.linear_cross_entropy(hidden[:, :-1], model.lm_head.weight, ids[:, 1:], chunk_size=7)
    torch.testing.assert_close(ours, stock, rtol=1e-5, atol=1e-6)
    (g_stock,) = torch.autograd.grad(stock, model.lm_head.weight)
    (g_ours,) = torch.autograd.grad(ours, model.lm_head.weight)
    torch.testing.assert_close(g_ours, g_stock, rtol=1e-4, atol=1e-6)


def test_no_gradient_work_under_no_grad():
    """Under torch.no_grad() the forward forms no gradients: only the logits GEMM runs."""
    from torch.profiler import ProfilerActivity, profile

    gen = torch.Generator().manual_seed(15)
    h, w, b, t = make(gen)
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
        loss = F.linear_cross_entropy(h, w, t, b, chunk_size=4)
    names = {e.name for e in prof.events()}
    assert "cutlass_nn::linear" in names
    assert not names & {"cutlass_nn::linear_dgrad", "cutlass_nn::linear_wgrad_accumulate_"}
    torch.testing.assert_close(loss, reference(h, w, t, b).detach())


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16], ids=str)
def test_second_backward_through_a_kept_graph_accumulates_the_same_gradients(dtype):
    # the weight gradient is scaled in place only when no later backward can read it
    gen = torch.Generator().manual_seed(21)
    h, w, b, t = make(gen, dtype=dtype, bias=False)
    loss = F.linear_cross_entropy(h, w, t, chunk_size=4)
    loss.backward(retain_graph=True)
    first = (h.grad.clone(), w.grad.clone())
    loss.backward()
    torch.testing.assert_close(h.grad, 2 * first[0])
    torch.testing.assert_close(w.grad, 2 * first[1])
    h.grad = w.grad = None
    F.linear_cross_entropy(h, w, t, chunk_size=4).backward()
    torch.testing.assert_close(w.grad, first[1], rtol=0, atol=0)


def _bf16_weight_grad_error(chunk_size, tokens=2048, hidden=32, vocab=256):
    """max |w.grad - float64 reference| / max |reference| of a bfloat16 head."""
    gen = torch.Generator().manual_seed(22)
    h = torch.randn(tokens, hidden, generator=gen).to(torch.bfloat16).requires_grad_()
    w = (torch.randn(vocab, hidden, generator=gen) * hidden ** -0.5).to(torch.bfloat16).requires_grad_()
    t = torch.randint(0, vocab, (tokens,), generator=gen)
    F.linear_cross_entropy(h, w, t, reduction="sum", chunk_size=chunk_size).backward()
    w64 = w.detach().double().requires_grad_()
    reference(h.detach().double(), w64, t, reduction="sum").backward()
    assert w.grad.dtype == torch.bfloat16
    return ((w.grad.double() - w64.grad).abs().max() / w64.grad.abs().max()).item()


def test_bfloat16_weight_gradient_keeps_its_accuracy_over_many_chunks():
    from cutlass_nn.linear_cross_entropy import MAX_LOW_PRECISION_CHUNKS

    one = _bf16_weight_grad_error(chunk_size=2048)  # one chunk: one rounding, like the unfused head
    at_limit = _bf16_weight_grad_error(chunk_size=2048 // MAX_LOW_PRECISION_CHUNKS)
    many = _bf16_weight_grad_error(chunk_size=8)  # 256 chunks: a float32 accumulator
    assert at_limit <= 3 * one + 1e-3, (one, at_limit)
    assert many <= 1.5 * one + 1e-3, (one, many)


def test_weight_gradient_accumulator_dtype_rule():
    from cutlass_nn.linear_cross_entropy import MAX_LOW_PRECISION_CHUNKS, _wgrad_dtype

    assert _wgrad_dtype(torch.bfloat16, MAX_LOW_PRECISION_CHUNKS) == torch.bfloat16
    assert _wgrad_dtype(torch.bfloat16, MAX_LOW_PRECISION_CHUNKS + 1) == torch.float32
    assert _wgrad_dtype(torch.float16, 1) == torch.float32
    assert _wgrad_dtype(torch.float32, 1000) == torch.float32
    assert _wgrad_dtype(torch.float64, 1000) == torch.float64


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_opcheck_of_the_loss_operators(reduction):
    gen = torch.Generator().manual_seed(23)
    h, w, b, t = make(gen, dtype=torch.float32)
    t[0, 1] = -100
    # schema, fake and autograd registration; torch.compile of the whole function is tested by
    # test_compile_matches_eager (opcheck's own AOT test differentiates the saved-gradient
    # outputs too, which the loss's callers never do, and torch 2.13's partitioner rejects
    # that joint graph)
    torch.library.opcheck(
        torch.ops.cutlass_nn._linear_cross_entropy.default,
        (h, w, b, t, -100, reduction, 0.1, 4, True, True, True),
        test_utils=("test_schema", "test_autograd_registration", "test_faketensor"),
    )
    g = torch.rand(t.numel(), generator=gen)
    torch.library.opcheck(
        torch.ops.cutlass_nn._linear_cross_entropy_backward.default,
        (h.detach(), w.detach(), b.detach(), t, g, -100, 0.1, 4, True, True, True),
    )


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_transposed_hidden_gets_its_gradient(reduction):
    """A non-contiguous hidden (a transposed 2-D view): the hidden gradient is made contiguous
    (it is written by rows and scaled in place)."""
    gen = torch.Generator().manual_seed(21)
    base = torch.randn(16, 9, generator=gen, dtype=torch.float64)
    h = base.t().requires_grad_()  # [9, 16], column-major
    w = torch.randn(30, 16, generator=gen, dtype=torch.float64).requires_grad_()
    t = torch.randint(0, 30, (9,), generator=gen)
    got = F.linear_cross_entropy(h, w, t, reduction=reduction, chunk_size=4)
    ref = reference(h, w, t, reduction=reduction)
    torch.testing.assert_close(got, ref)
    for a, b in zip(torch.autograd.grad(got, (h, w)), torch.autograd.grad(ref, (h, w))):
        torch.testing.assert_close(a, b)
