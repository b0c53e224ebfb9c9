"""ops.rotary_embedding / rotary_embedding_backward and functional.apply_rotary_pos_emb on the
CPU backend: the formula of transformers' apply_rotary_pos_emb (bitwise in float64, rounded
once otherwise), the output layouts (a projection's transposed view keeps its strides), cos of
batch 1, cos / sin whose halves differ (the backward is the exact transposed rotation), gradients
of all four inputs (gradcheck, gradgradcheck), an unused output, argument errors that name the
argument (fake implementations alike, via opcheck), the drop-in's fallbacks and torch.compile.
The CUDA kernel is checked bitwise against this backend in tests/test_cuda_rotary.py."""

from __future__ import annotations

import pytest
import torch

from cutlass_nn import functional as F
from cutlass_nn import ops

_ops = torch.ops.cutlass_nn

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def formula(q, k, cos, sin, unsqueeze_dim=1):
    """transformers' apply_rotary_pos_emb, spelled out."""
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def tables(batch, seq, dim, dtype=torch.float64, seed=0, repeat=True):
    """cos, sin [batch, seq, dim] as Llama's rotary embedding makes them (halves repeated), or
    with independent halves (repeat=False)."""
    gen = torch.Generator().manual_seed(seed)
    pos = torch.randint(0, 4096, (batch, seq), generator=gen).to(torch.float64)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    freqs = pos[..., None] * inv_freq
    if repeat:
        emb = torch.cat((freqs, freqs), dim=-1)
    else:
        emb = torch.cat((freqs, freqs * 0.7 + 0.3), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def projection_view(batch, seq, heads, dim, dtype, seed):
    """[batch, heads, seq, dim] as a transposed view of a [batch, seq, heads * dim] projection
    output, the layout a transformers attention hands to apply_rotary_pos_emb."""
    gen = torch.Generator().manual_seed(seed)
    flat = torch.randn(batch, seq, heads * dim, generator=gen, dtype=torch.float64).to(dtype)
    return flat.view(batch, seq, heads, dim).transpose(1, 2)


@pytest.mark.parametrize("repeat", [True, False], ids=["llama_tables", "distinct_halves"])
def test_float64_is_the_formula_bitwise(repeat):
    q = projection_view(2, 5, 4, 8, torch.float64, 1)
    k = projection_view(2, 5, 2, 8, torch.float64, 2)
    cos, sin = tables(2, 5, 8, repeat=repeat)
    q_out, k_out = ops.rotary_embedding(q, k, cos, sin)
    q_ref, k_ref = formula(q, k, cos, sin)
    assert torch.equal(q_out, q_ref) and torch.equal(k_out, k_ref)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_rounded_once_from_float(dtype):
    q = projection_view(3, 7, 4, 16, dtype, 3)
    k = projection_view(3, 7, 1, 16, dtype, 4)
    cos, sin = tables(3, 7, 16, dtype)
    q_out, k_out = ops.rotary_embedding(q, k, cos, sin)
    f = lambda t: t.to(torch.float32)  # noqa: E731
    q_ref, k_ref = formula(f(q), f(k), f(cos), f(sin))
    assert torch.equal(q_out, q_ref.to(dtype)) and torch.equal(k_out, k_ref.to(dtype))
    if dtype != torch.float32:
        # ... which is at least as close to the exact result as the 16-bit formula
        exact = formula(q.double(), k.double(), cos.double(), sin.double())[0]
        ours = (q_out.double() - exact).abs().sum()
        theirs = (formula(q, k, cos, sin)[0].double() - exact).abs().sum()
        assert ours < theirs


def test_output_layouts():
    cos, sin = tables(2, 5, 8, torch.float32)
    q = projection_view(2, 5, 4, 8, torch.float32, 5)  # dense, transposed: kept
    k = torch.randn(2, 2, 5, 8)  # contiguous: kept
    q_out, k_out = ops.rotary_embedding(q, k, cos, sin)
    assert q_out.stride() == q.stride() and k_out.stride() == k.stride()
    # not dense (every other head) / last dim not unit-stride: contiguous outputs
    wide = torch.randn(2, 8, 5, 8)
    strided_last = torch.randn(2, 2, 5, 16)[..., ::2]
    q_out, k_out = ops.rotary_embedding(wide[:, ::2], strided_last, cos, sin)
    assert q_out.is_contiguous() and k_out.is_contiguous()
    q_ref, k_ref = formula(wide[:, ::2], strided_last, cos, sin)
    assert torch.equal(q_out, q_ref) and torch.equal(k_out, k_ref)
    # the backward follows its own inputs' layouts the same way
    g_q, g_k = ops.rotary_embedding_backward(q, k, cos, sin)
    assert g_q.stride() == q.stride() and g_k.stride() == k.stride()


def test_cos_of_batch_one_broadcasts():
    q = projection_view(3, 6, 2, 8, torch.float64, 6)
    k = projection_view(3, 6, 2, 8, torch.float64, 7)
    cos, sin = tables(1, 6, 8)
    q_out, k_out = ops.rotary_embedding(q, k, cos, sin)
    q_ref, k_ref = formula(q, k, cos, sin)
    assert torch.equal(q_out, q_ref) and torch.equal(k_out, k_ref)


@pytest.mark.parametrize("repeat", [True, False], ids=["llama_tables", "distinct_halves"])
def test_backward_operator_is_the_vector_jacobian_product(repeat):
    q = projection_view(2, 5, 4, 8, torch.float64, 8).requires_grad_()
    k = projection_view(2, 5, 2, 8, torch.float64, 9).requires_grad_()
    cos, sin = tables(2, 5, 8, repeat=repeat)
    g_q, g_k = torch.randn(2, 4, 5, 8, dtype=torch.float64), torch.randn(2, 2, 5, 8, dtype=torch.float64)
    q_ref, k_ref = formula(q, k, cos, sin)
    want_q, want_k = torch.autograd.grad((q_ref, k_ref), (q, k), (g_q, g_k))
    got_q, got_k = ops.rotary_embedding_backward(g_q, g_k, cos, sin)
    torch.testing.assert_close(got_q, want_q, rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(got_k, want_k, rtol=1e-14, atol=1e-14)


@pytest.mark.parametrize("table_grads", [False, True], ids=["qk", "qk_cos_sin"])
@pytest.mark.parametrize("cos_batch", [1, 2])
def test_gradcheck_and_gradgradcheck(table_grads, cos_batch):
    q = torch.randn(2, 3, 4, 6, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 1, 4, 6, dtype=torch.float64, requires_grad=True)
    cos, sin = tables(cos_batch, 4, 6, repeat=False)
    cos.requires_grad_(table_grads)
    sin.requires_grad_(table_grads)
    args = (q, k, cos, sin)
    assert torch.autograd.gradcheck(ops.rotary_embedding, args)
    assert torch.autograd.gradgradcheck(ops.rotary_embedding, args)


def test_gradients_match_the_formula_through_autograd():
    q = projection_view(2, 5, 4, 8, torch.float64, 10).detach().requires_grad_()
    k = projection_view(2, 5, 2, 8, torch.float64, 11).detach().requires_grad_()
    cos, sin = tables(1, 5, 8, repeat=False)
    cos.requires_grad_()
    sin.requires_grad_()
    weights = [torch.randn(2, 4, 5, 8, dtype=torch.float64), torch.randn(2, 2, 5, 8, dtype=torch.float64)]

    def grads(fn):
        q_out, k_out = fn(q, k, cos, sin)
        loss = (q_out * weights[0]).sum() + (k_out * weights[1]).sum()
        return torch.autograd.grad(loss, (q, k, cos, sin))

    for got, want, name in zip(grads(ops.rotary_embedding), grads(formula), ("q", "k", "cos", "sin")):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12, msg=name)


def test_an_unused_output_gets_no_gradient_and_the_other_is_right():
    q = torch.randn(2, 3, 4, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 1, 4, 8, dtype=torch.float64, requires_grad=True)
    cos, sin = tables(2, 4, 8)
    q_out, _ = ops.rotary_embedding(q, k, cos, sin)
    (q_out * 3).sum().backward()
    want = torch.autograd.grad((formula(q, k, cos, sin)[0] * 3).sum(), q)[0]
    torch.testing.assert_close(q.grad, want, rtol=1e-14, atol=1e-14)
    assert k.grad is None or not k.grad.any()


def test_no_node_without_grad():
    q, k = torch.randn(1, 2, 3, 4, requires_grad=True), torch.randn(1, 2, 3, 4)
    cos, sin = tables(1, 3, 4, torch.float32)
    with torch.no_grad():
        q_out, k_out = ops.rotary_embedding(q, k, cos, sin)
    assert q_out.grad_fn is None and k_out.grad_fn is None


def test_zero_sizes():
    cos, sin = tables(2, 0, 8)
    q_out, k_out = ops.rotary_embedding(torch.randn(2, 3, 0, 8, dtype=torch.float64),
                                        torch.randn(2, 0, 0, 8, dtype=torch.float64), cos, sin)
    assert q_out.shape == (2, 3, 0, 8) and k_out.shape == (2, 0, 0, 8)


def _ok():
    cos, sin = tables(2, 5, 8, torch.float32)
    return [torch.randn(2, 4, 5, 8), torch.randn(2, 2, 5, 8), cos, sin]


def _with(index, value):
    args = _ok()
    args[index] = value(args[index]) if callable(value) else value
    return args


BAD = [
    (_with(0, lambda t: t.to(torch.int32)), r"argument 'q' must have a floating dtype"),
    (_with(0, lambda t: t[0]), r"argument 'q' must be a 4-D tensor \[batch, heads, seq, head_dim\], got a 3-D"),
    (_with(1, lambda t: t.double()), r"argument 'k' must have dtype float32 \(the dtype of 'q'\), got float64"),
    (_with(2, lambda t: t.half()), r"argument 'cos' must have dtype float32"),
    (_with(2, lambda t: t[0]), r"argument 'cos' must be a 3-D tensor \[batch or 1, seq, head_dim\]"),
    (_with(3, lambda t: t[:1]), r"argument 'sin' must have the shape of 'cos' \[2, 5, 8\], got \[1, 5, 8\]"),
    ([torch.randn(2, 4, 5, 7), torch.randn(2, 2, 5, 7), torch.randn(2, 5, 7), torch.randn(2, 5, 7)],
     r"argument 'q' must have an even head_dim"),
    (_with(1, lambda t: t[:1]), r"argument 'k' must have size 2 in dimension 0 \(batch the same as 'q'\)"),
    (_with(1, lambda t: t[:, :, :4]), r"argument 'k' must have size 5 in dimension 2 \(seq the same as 'q'\)"),
    (_with(1, lambda t: t[..., :6]), r"argument 'k' must have size 8 in dimension 3 \(head_dim"),
    ([torch.randn(3, 4, 5, 8), torch.randn(3, 2, 5, 8), *tables(2, 5, 8, torch.float32)],
     r"argument 'cos' must have a batch dimension of 1 or 3 \(the batch of 'q'\), got shape \[2, 5, 8\]"),
    ([torch.randn(2, 4, 5, 8), torch.randn(2, 2, 5, 8), *tables(2, 6, 8, torch.float32)],
     r"argument 'cos' must have size 5 in dimension 1 \(seq the same as 'q'\)"),
]


@pytest.mark.parametrize("args,match", BAD)
@pytest.mark.parametrize("mode", ["eager", "fake"])
def test_errors_name_the_argument(args, match, mode):
    if mode == "fake":
        from torch._subclasses.fake_tensor import FakeTensorMode

        with FakeTensorMode() as fake_mode:
            args = [fake_mode.from_tensor(a) for a in args]
            with pytest.raises(RuntimeError, match=r"cutlass_nn\.rotary_embedding: " + match):
                ops.rotary_embedding(*args)
        return
    with pytest.raises(RuntimeError, match=r"cutlass_nn\.rotary_embedding: " + match):
        ops.rotary_embedding(*args)


def test_backward_errors_name_its_arguments():
    cos, sin = tables(2, 5, 8, torch.float32)
    with pytest.raises(RuntimeError, match=r"cutlass_nn\.rotary_embedding_backward: argument 'grad_k' must have dtype"):
        ops.rotary_embedding_backward(torch.randn(2, 4, 5, 8), torch.randn(2, 2, 5, 8).double(), cos, sin)


def _opcheck_samples():
    samples = []
    for name, (q, k, cos, sin) in {
        "projection_view": (projection_view(2, 5, 4, 8, torch.float32, 12), projection_view(2, 5, 2, 8, torch.float32, 13),
                            *tables(2, 5, 8, torch.float32)),
        "contiguous_cos_batch_1": (torch.randn(3, 2, 4, 6), torch.randn(3, 1, 4, 6), *tables(1, 4, 6, torch.float32)),
        "not_dense": (torch.randn(2, 6, 3, 4)[:, ::3], torch.randn(2, 2, 3, 8)[..., ::2], *tables(2, 3, 4, torch.float32)),
        "empty": (torch.randn(2, 3, 0, 4), torch.randn(2, 1, 0, 4), *tables(2, 0, 4, torch.float32)),
    }.items():
        samples.append(pytest.param("rotary_embedding", (q.requires_grad_(), k.requires_grad_(), cos, sin), id=f"fwd-{name}"))
        samples.append(pytest.param("rotary_embedding_backward", (q.detach(), k.detach(), cos, sin), id=f"bwd-{name}"))
    q, k = torch.randn(1, 2, 3, 4, requires_grad=True), torch.randn(1, 2, 3, 4, requires_grad=True)
    cos, sin = tables(1, 3, 4, torch.float32)
    samples.append(pytest.param("rotary_embedding", (q, k, cos.requires_grad_(), sin.requires_grad_()), id="fwd-table-grads"))
    return samples


@pytest.mark.parametrize("op, args", _opcheck_samples())
def test_opcheck(op, args):
    torch.library.opcheck(getattr(_ops, op).default, args)


# ---- functional.apply_rotary_pos_emb: the drop-in ---------------------------------------------


@pytest.mark.parametrize("unsqueeze_dim", [1, 2])
def test_drop_in_matches_the_formula(unsqueeze_dim):
    q = projection_view(2, 5, 4, 8, torch.float64, 14)
    k = projection_view(2, 5, 2, 8, torch.float64, 15)
    if unsqueeze_dim == 2:  # [batch, seq, heads, dim]
        q, k = q.transpose(1, 2), k.transpose(1, 2)
    cos, sin = tables(2, 5, 8)
    got = F.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
    want = formula(q, k, cos, sin, unsqueeze_dim)
    for g, w in zip(got, want):
        assert g.shape == w.shape and torch.equal(g, w)


def test_drop_in_matches_transformers():
    modeling_llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    q = projection_view(2, 5, 4, 8, torch.float64, 16)
    k = projection_view(2, 5, 2, 8, torch.float64, 17)
    cos, sin = tables(2, 5, 8)
    for g, w in zip(F.apply_rotary_pos_emb(q, k, cos, sin), modeling_llama.apply_rotary_pos_emb(q, k, cos, sin)):
        assert torch.equal(g, w)


def test_drop_in_falls_back_to_the_formula_with_its_promotion():
    calls = []
    real = F._rotary_embedding
    q = projection_view(2, 5, 4, 8, torch.bfloat16, 18)
    k = projection_view(2, 5, 2, 8, torch.bfloat16, 19)
    cos, sin = tables(2, 5, 8, torch.float32)
    try:
        F._rotary_embedding = lambda *a: calls.append(a) or real(*a)
        # q and k of another dtype than cos and sin in each pair: the formula (promoting)
        got = F.apply_rotary_pos_emb(q, k.float(), cos, sin.double())
        assert not calls
        for g, w in zip(got, formula(q, k.float(), cos, sin.double())):
            assert g.dtype == w.dtype and torch.equal(g, w)
        # 2-D tables (positions only) and a broadcast seq also run the formula
        got = F.apply_rotary_pos_emb(q.float(), k.float(), cos[0], sin[0], unsqueeze_dim=0)
        assert not calls
        for g, w in zip(got, formula(q.float(), k.float(), cos[0], sin[0], 0)):
            assert torch.equal(g, w)
        got = F.apply_rotary_pos_emb(q.float(), k.float(), cos[:, :1], sin[:, :1])
        assert not calls
        for g, w in zip(got, formula(q.float(), k.float(), cos[:, :1], sin[:, :1])):
            assert torch.equal(g, w)
        # the operator's case
        F.apply_rotary_pos_emb(q.float(), k.float(), cos, sin)
        assert len(calls) == 1
    finally:
        F._rotary_embedding = real


@pytest.mark.parametrize("dynamic", [False, True])
def test_compile_fullgraph(dynamic):
    import torch._dynamo

    torch._dynamo.reset()

    def step(q, k, cos, sin):
        q_out, k_out = F.apply_rotary_pos_emb(q, k, cos, sin)
        return (q_out * q_out).sum() + (k_out * 2).sum()

    compiled = torch.compile(step, fullgraph=True, dynamic=dynamic)
    for seq in (5, 7):
        q = projection_view(2, seq, 4, 8, torch.float32, seq).detach().requires_grad_()
        k = projection_view(2, seq, 2, 8, torch.float32, seq + 1).detach().requires_grad_()
        cos, sin = tables(2, seq, 8, torch.float32)
        want = step(q, k, cos, sin)
        want_grads = torch.autograd.grad(want, (q, k))
        got = compiled(q, k, cos, sin)
        got_grads = torch.autograd.grad(got, (q, k))
        torch.testing.assert_close(got, want)
        for g, w in zip(got_grads, want_grads):
            torch.testing.assert_close(g, w)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_drop_in_promotes_16_bit_q_k_beside_float32_tables_like_the_formula(dtype):
    """Under autocast a float32 model hands 16-bit q, k and float32 cos, sin to the function:
    the results are float32 (torch's promotion) and bitwise the formula's; gradients reach q and
    k in their own dtype, at least as close to the exact ones as the formula's."""
    q = projection_view(2, 5, 4, 8, dtype, 20).detach().requires_grad_()
    k = projection_view(2, 5, 2, 8, dtype, 21).detach().requires_grad_()
    cos, sin = tables(2, 5, 8, torch.float32)
    calls = []
    real = F._rotary_embedding
    try:
        F._rotary_embedding = lambda *a: calls.append(a) or real(*a)
        got = F.apply_rotary_pos_emb(q, k, cos, sin)
    finally:
        F._rotary_embedding = real
    assert len(calls) == 1
    want = formula(q, k, cos, sin)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype == torch.float32 and torch.equal(g, w)
    weights = [torch.randn(t.shape, dtype=torch.float32) for t in want]
    ours = torch.autograd.grad(sum((g * wt).sum() for g, wt in zip(got, weights)), (q, k))
    theirs = torch.autograd.grad(sum((w * wt).sum() for w, wt in zip(want, weights)), (q, k))
    q64, k64 = q.detach().double().requires_grad_(), k.detach().double().requires_grad_()
    exact = torch.autograd.grad(
        sum((w * wt.double()).sum() for w, wt in zip(formula(q64, k64, cos.double(), sin.double()), weights)),
        (q64, k64))
    for o, t, e in zip(ours, theirs, exact):
        assert o.dtype == dtype
        assert (o.double() - e).abs().sum() <= (t.double() - e).abs().sum()
