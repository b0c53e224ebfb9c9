"""Property tests: CutlassLinear vs nn.Linear, mm vs torch.mm, add2 vs a + b over generated
shapes, dtypes, layouts and requires_grad subsets."""

from __future__ import annotations

import math

import torch
from hypothesis import given, note
from hypothesis import strategies as st
from torch import nn

import cutlass_nn
from conftest import DTYPES, assert_close_ref

# Batch and feature sizes both include 0 (empty inputs, in_features = 0, out_features = 0).
dtypes = st.sampled_from(DTYPES)
sizes = st.integers(0, 300)
features = st.integers(0, 300)


def _rand(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)


def _view(t, layout):
    """The same values as ``t`` in another memory layout (2-D and up)."""
    if layout == "contig" or t.dim() < 2:
        return t.clone()
    if layout == "t":
        return t.transpose(-1, -2).contiguous().transpose(-1, -2)
    big = torch.zeros(*t.shape[:-1], t.shape[-1] * 2 + 1, dtype=t.dtype)
    big[..., 1::2] = t
    return big[..., 1::2]


@given(
    lead=st.lists(st.integers(0, 3), min_size=0, max_size=3),
    m=sizes,
    n=features,
    k=features,
    bias=st.booleans(),
    grads=st.tuples(st.booleans(), st.booleans(), st.booleans()),
    dtype=dtypes,
    seed=st.integers(0, 2**16),
)
def test_cutlass_linear_matches_nn_linear(lead, m, n, k, bias, grads, dtype, seed):
    shape = (*lead, m, k)
    m_total = math.prod(shape[:-1])
    note(f"input {shape}, weight [{n}, {k}], bias={bias}, grads={grads}, {dtype}")
    ref = nn.Linear(k, n, bias=bias, dtype=dtype)
    ref64 = nn.Linear(k, n, bias=bias, dtype=torch.float64)
    with torch.no_grad():
        ref.weight.copy_(_rand((n, k), dtype, seed))
        if bias:
            ref.bias.copy_(_rand((n,), dtype, seed + 1))
        ref64.weight.copy_(ref.weight)
        if bias:
            ref64.bias.copy_(ref.bias)
    layer = cutlass_nn.CutlassLinear(k, n, bias=bias, dtype=dtype)
    layer.load_state_dict(ref.state_dict())
    x = _rand(shape, dtype, seed + 2)
    dy = _rand((*shape[:-1], n), dtype, seed + 3)

    params = {
        "layer": (layer.weight, layer.bias),
        "ref": (ref.weight, ref.bias),
        "ref64": (ref64.weight, ref64.bias),
    }
    gx, gw, gb = grads
    for w, b in params.values():
        w.requires_grad_(gw)
        if b is not None:
            b.requires_grad_(gb)
    xs = {name: x.clone().to(torch.float64 if name == "ref64" else dtype).requires_grad_(gx)
          for name in params}
    outs = {
        "layer": layer(xs["layer"]),
        "ref": ref(xs["ref"]),
        "ref64": ref64(xs["ref64"]),
    }
    assert_close_ref(outs["layer"], outs["ref"], outs["ref64"], reduction=k)

    if not outs["layer"].requires_grad:
        assert not any(grads[:2]) and not (gb and bias)
        return
    for name, out in outs.items():
        out.backward(dy.to(out.dtype))
    got = [xs["layer"].grad, layer.weight.grad, layer.bias.grad if bias else None]
    exp = [xs["ref"].grad, ref.weight.grad, ref.bias.grad if bias else None]
    exp64 = [xs["ref64"].grad, ref64.weight.grad, ref64.bias.grad if bias else None]
    for i, (a, e, e64) in enumerate(zip(got, exp, exp64)):
        if e is None:
            assert a is None, i
            continue
        assert a is not None, i
        assert_close_ref(a, e, e64, reduction=n if i == 0 else m_total)


@given(
    n=sizes,
    m=sizes,
    p=sizes,
    layouts=st.tuples(st.sampled_from(["contig", "t", "slice"]), st.sampled_from(["contig", "t", "slice"])),
    grads=st.tuples(st.booleans(), st.booleans()),
    dtype=dtypes,
    seed=st.integers(0, 2**16),
)
def test_mm_matches_torch(n, m, p, layouts, grads, dtype, seed):
    a0 = _rand((n, m), dtype, seed)
    b0 = _rand((m, p), dtype, seed + 1)
    a = _view(a0, layouts[0]).requires_grad_(grads[0])
    b = _view(b0, layouts[1]).requires_grad_(grads[1])
    ra, rb = a0.clone().requires_grad_(grads[0]), b0.clone().requires_grad_(grads[1])
    assert a.is_leaf and b.is_leaf and ra.is_leaf
    ra64 = a0.double().requires_grad_(grads[0])
    rb64 = b0.double().requires_grad_(grads[1])
    y, ry, ry64 = cutlass_nn.mm(a, b), torch.mm(ra, rb), torch.mm(ra64, rb64)
    assert_close_ref(y, ry, ry64, reduction=m)
    if not any(grads):
        assert not y.requires_grad
        return
    dy = _rand((n, p), dtype, seed + 2)
    y.backward(dy)
    ry.backward(dy)
    ry64.backward(dy.double())
    for t, r, r64, red in ((a, ra, ra64, p), (b, rb, rb64, n)):
        if r.requires_grad:
            assert_close_ref(t.grad, r.grad, r64.grad, reduction=red)
        else:
            assert t.grad is None


@given(
    shape=st.lists(st.integers(0, 7), min_size=0, max_size=4),
    layouts=st.tuples(st.sampled_from(["contig", "t", "slice"]), st.sampled_from(["contig", "t", "slice"])),
    grads=st.tuples(st.booleans(), st.booleans()),
    dtype=dtypes,
    seed=st.integers(0, 2**16),
)
def test_add2_matches_torch(shape, layouts, grads, dtype, seed):
    a0 = _rand(shape, dtype, seed)
    b0 = _rand(shape, dtype, seed + 1)
    a = _view(a0, layouts[0]).requires_grad_(grads[0])
    b = _view(b0, layouts[1]).requires_grad_(grads[1])
    y = cutlass_nn.add2(a, b)
    expected = a0 + b0
    assert_close_ref(y, expected, a0.double() + b0.double())
    assert y.requires_grad == any(grads)
    if any(grads):
        dy = _rand(shape, dtype, seed + 2)
        y.backward(dy)
        for t in (a, b):
            if t.requires_grad:
                torch.testing.assert_close(t.grad, dy, rtol=0, atol=0)
            else:
                assert t.grad is None


@given(
    batch=st.integers(0, 3),
    heads=st.tuples(st.integers(0, 4), st.integers(0, 4)),
    seq=st.integers(0, 9),
    half=st.integers(0, 6),
    cos_batch_one=st.booleans(),
    layouts=st.tuples(*[st.sampled_from(["contig", "heads_last", "wide"])] * 2),
    seed=st.integers(0, 2**16),
)
def test_rotary_embedding_matches_the_formula(batch, heads, seq, half, cos_batch_one, layouts, seed):
    """float64: the operator is the formula bitwise (same products and sums), for any sizes
    (zero included) and input layouts, and the output keeps a dense input's strides."""
    dim = 2 * half

    def make(h, layout, s):
        t = _rand((batch, h, seq, dim), torch.float64, s)
        if layout == "heads_last":  # a projection's [B, S, H, D] output viewed as [B, H, S, D]
            return t.transpose(1, 2).contiguous().transpose(1, 2)
        if layout == "wide":  # every other head of a wider tensor: not dense
            big = torch.zeros(batch, 2 * h, seq, dim, dtype=torch.float64)
            big[:, ::2] = t
            return big[:, ::2]
        return t

    q, k = make(heads[0], layouts[0], seed), make(heads[1], layouts[1], seed + 1)
    cos = _rand((1 if cos_batch_one else batch, seq, dim), torch.float64, seed + 2)
    sin = _rand(cos.shape, torch.float64, seed + 3)
    note(f"q {tuple(q.shape)} {q.stride()}, k {tuple(k.shape)} {k.stride()}, cos {tuple(cos.shape)}")
    got = cutlass_nn.ops.rotary_embedding(q, k, cos, sin)
    for x, out in zip((q, k), got):
        c, s = cos.unsqueeze(1), sin.unsqueeze(1)
        rot = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        assert torch.equal(out, x * c + rot * s)
        if x.numel() > 0 and (x.is_contiguous() or x.transpose(1, 2).is_contiguous()):
            assert out.stride() == x.stride()
