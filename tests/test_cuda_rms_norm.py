"""The RMSNorm CUDA kernels (rms_norm, add_rms_norm, rms_norm_backward) against a float64
reference: every dtype, odd and aligned widths, each kernel variant (registers-cached rows of
several depths and the re-reading kernels for very wide rows, 16-byte and scalar accesses),
strided and misaligned inputs, a float32 weight beside 16-bit activations, empty shapes,
bitwise reproducibility, torch.compile, and a converted transformers Llama."""

from __future__ import annotations

import pytest
import torch

import cutlass_nn
from cuda_helpers import CUDA_MARKS
from cutlass_nn import functional as F

pytestmark = CUDA_MARKS
ops = torch.ops.cutlass_nn

DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.float64]
# max |error| / max |reference| allowed: a couple of roundings of the output dtype (16-bit), or
# the float32 statistics' accumulation over up to ~40k terms (float32).
BOUND = {torch.bfloat16: 2 ** -7, torch.float16: 2 ** -10, torch.float32: 2e-6, torch.float64: 1e-12}

# (rows, cols): odd widths (scalar path), pack-aligned widths of each register depth of the
# forward (<= 1024 packs: 2, <= 4096: 8) and backward (1, 2, 4 packs per thread), and widths past
# them (the re-reading kernels).
SHAPES = [(1, 1), (3, 7), (5, 100), (64, 1000), (33, 4095), (128, 64), (257, 4096), (16, 8192),
          (8, 16384), (4, 20000), (3, 40000), (2, 70000)]


def reference(x, w, eps, residual=None, grad_out=None, grad_h=None):
    """float64 out, h and (with grad_out) grads of x (= of residual and h) and of w."""
    h = x if residual is None else x + residual
    hd = h.double().requires_grad_(grad_out is not None)
    wd = w.double().requires_grad_(grad_out is not None)
    out = hd * torch.rsqrt(hd.pow(2).mean(-1, keepdim=True) + eps) * wd
    if grad_out is None:
        return out.detach(), h
    dh, dw = torch.autograd.grad(out, (hd, wd), grad_out.double())
    if grad_h is not None:
        dh = dh + grad_h.double()
    return out.detach(), h, dh, dw


def rel_err(got, ref, floor=0.0):
    """max |got - ref| over max(max |ref|, floor): ``floor`` is the size of the terms a result
    is formed from, for results that cancel to ~0 (the input gradient of a 1-wide row)."""
    scale = max(ref.double().abs().max().item(), floor, 1e-30)
    return (got.double() - ref.double()).abs().max().item() / scale


def rand(shape, dtype, gen, scale=1.0):
    return (torch.randn(shape, generator=gen, device="cuda", dtype=torch.float32) * scale).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("residual", [False, True], ids=["norm", "add_norm"])
def test_forward_and_backward_match_float64(dtype, shape, residual, gen):
    rows, cols = shape
    x = rand(shape, dtype, gen)
    r = rand(shape, dtype, gen) if residual else None
    w = (1 + 0.2 * torch.randn(cols, generator=gen, device="cuda")).to(dtype)
    g = rand(shape, dtype, gen)
    gh = rand(shape, dtype, gen) if residual else None
    eps = 1e-6
    if residual:
        out, h, rstd = ops.add_rms_norm(x, r, w, eps)
    else:
        (out, rstd), h = ops.rms_norm(x, w, eps), x
    ref_out, ref_h, ref_dh, ref_dw = reference(x, w, eps, r, g, gh)
    assert torch.equal(h, ref_h)  # the new residual is the rounded sum, bit for bit
    assert rel_err(out, ref_out) <= BOUND[dtype]
    dh, dw = ops.rms_norm_backward(g, gh, h, w, rstd, True)
    assert dh.dtype == dtype and dw.dtype == dtype
    terms = (g.double() * w.double() * rstd.double().unsqueeze(-1)).abs().max().item()
    assert rel_err(dh, ref_dh, terms) <= 2 * BOUND[dtype]
    assert rel_err(dw, ref_dw) <= 2 * BOUND[dtype]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_float32_weight_beside_16bit_activations(dtype, gen):
    x, g = rand((64, 4096), dtype, gen), rand((64, 4096), dtype, gen)
    w = 1 + 0.2 * torch.randn(4096, generator=gen, device="cuda")
    out, rstd = ops.rms_norm(x, w, 1e-5)
    ref_out, _, ref_dh, ref_dw = reference(x, w, 1e-5, None, g)
    assert out.dtype == dtype and rel_err(out, ref_out) <= BOUND[dtype]
    dh, dw = ops.rms_norm_backward(g, None, x, w, rstd, True)
    assert dw.dtype == torch.float32
    assert rel_err(dh, ref_dh) <= 2 * BOUND[dtype]
    assert rel_err(dw, ref_dw) <= 1e-5  # float32 sums of exact products, rounded once


@pytest.mark.parametrize("layout", ["transposed", "offset"])
def test_strided_and_misaligned_inputs(layout, gen):
    if layout == "transposed":
        x = rand((256, 96), torch.bfloat16, gen).t()  # [96, 256], not contiguous
        r = rand((256, 96), torch.bfloat16, gen).t()
    else:
        x = rand((96 * 256 + 1,), torch.bfloat16, gen)[1:].view(96, 256)  # 2-byte aligned
        r = rand((96 * 256 + 3,), torch.bfloat16, gen)[3:].view(96, 256)
    w = (1 + 0.2 * torch.randn(256, generator=gen, device="cuda")).bfloat16()
    out, h, rstd = ops.add_rms_norm(x, r, w, 1e-6)
    ref_out, ref_h = reference(x, w, 1e-6, r)
    assert torch.equal(h, ref_h)
    assert rel_err(out, ref_out) <= BOUND[torch.bfloat16]
    x0 = x.clone()
    F.rms_norm(x, w)  # inputs are never written
    assert torch.equal(x, x0)


def test_empty_shapes():
    w = torch.ones(16, device="cuda")
    out, rstd = ops.rms_norm(torch.empty(0, 16, device="cuda"), w, 1e-6)
    assert out.shape == (0, 16) and rstd.shape == (0,)
    dh, dw = ops.rms_norm_backward(torch.empty(0, 16, device="cuda"), None,
                                   torch.empty(0, 16, device="cuda"), w, rstd, True)
    assert dh.shape == (0, 16) and torch.equal(dw, torch.zeros(16, device="cuda"))
    out, rstd = ops.rms_norm(torch.empty(4, 0, device="cuda"), torch.empty(0, device="cuda"), 1e-6)
    assert out.shape == (4, 0) and rstd.shape == (4,)


def test_backward_is_bitwise_reproducible(gen):
    x, g = rand((4096, 4096), torch.bfloat16, gen), rand((4096, 4096), torch.bfloat16, gen)
    w = (1 + 0.2 * torch.randn(4096, generator=gen, device="cuda")).bfloat16()
    _, rstd = ops.rms_norm(x, w, 1e-6)
    first = ops.rms_norm_backward(g, None, x, w, rstd, True)
    for _ in range(3):
        again = ops.rms_norm_backward(g, None, x, w, rstd, True)
        assert torch.equal(again[0], first[0]) and torch.equal(again[1], first[1])


def test_autograd_matches_cpu_operator_and_compile(gen):
    x = rand((8, 33, 512), torch.float32, gen).requires_grad_(True)
    r = rand((8, 33, 512), torch.float32, gen).requires_grad_(True)
    w = (1 + 0.2 * torch.randn(512, generator=gen, device="cuda")).requires_grad_(True)

    def f(a, b, c):
        out, h = F.add_rms_norm(a, b, c, 1e-6)
        return (out * h).sum()

    grads = torch.autograd.grad(f(x, r, w), (x, r, w))
    cpu = [t.detach().cpu().requires_grad_(True) for t in (x, r, w)]
    cpu_grads = torch.autograd.grad(f(*cpu), cpu)
    for a, b in zip(grads, cpu_grads):
        torch.testing.assert_close(a.cpu(), b, rtol=1e-4, atol=1e-4)
    compiled = torch.compile(f, fullgraph=True)
    cgrads = torch.autograd.grad(compiled(x, r, w), (x, r, w))
    for a, b in zip(cgrads, grads):
        torch.testing.assert_close(a, b)


def test_converted_llama_matches_stock_in_bfloat16():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=1000)
    torch.manual_seed(0)
    stock = transformers.LlamaForCausalLM(cfg).cuda().bfloat16()
    ours = transformers.LlamaForCausalLM(cfg).cuda().bfloat16()
    ours.load_state_dict(stock.state_dict())
    cutlass_nn.convert(ours, fuse_norm=True)
    assert sum(isinstance(m, cutlass_nn.RMSNorm) for m in ours.modules()) == 5
    ids = torch.randint(0, 1000, (2, 128), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    ls, lo = stock(input_ids=ids, labels=ids).loss, ours(input_ids=ids, labels=ids).loss
    # one bf16 rounding of the norm outputs apart (transformers rounds twice), through 2 layers
    assert abs(ls.item() - lo.item()) <= 0.02 * abs(ls.item())
    lo.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in ours.parameters())
