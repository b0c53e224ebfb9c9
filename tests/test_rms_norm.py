"""rms_norm / add_rms_norm / rms_norm_backward on the CPU backend and the Python surface around
them: float64 reference, gradcheck and gradgradcheck, argument errors (same message as the C++
checks, nothing mutated), fake implementations under torch.compile, the RMSNorm / AddRMSNorm
modules as drop-ins (state_dict both ways, fallbacks) and convert(fuse_norm=True) on a
transformers Llama. The CUDA kernels are tested in tests/test_cuda_rms_norm.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as TF
from torch import nn

import cutlass_nn
from cutlass_nn import functional as F

ops = torch.ops.cutlass_nn
DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]


def ref_rms_norm(x, weight, eps, residual=None):
    """float64 (out, h); h is the sum rounded to x's dtype, as the operators define it."""
    h = x if residual is None else x + residual
    hd = h.double()
    return hd * torch.rsqrt(hd.pow(2).mean(-1, keepdim=True) + eps) * weight.double(), h


def rel_err(got, ref):
    return ((got.double() - ref.double()).abs().max() / ref.double().abs().max().clamp_min(1e-30)).item()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (2, 5, 64), (17, 1000)], ids=str)
def test_forward_matches_float64_reference(dtype, shape):
    g = torch.Generator().manual_seed(hash(shape) % 1000)
    x = torch.randn(shape, generator=g).to(dtype)
    r = torch.randn(shape, generator=g).to(dtype)
    w = (1 + 0.1 * torch.randn(shape[-1], generator=g)).to(dtype)
    out, rstd = ops.rms_norm(x, w, 1e-6)
    ref, _ = ref_rms_norm(x, w, 1e-6)
    bound = 2 * torch.finfo(dtype).eps
    assert out.dtype == dtype and out.shape == x.shape
    assert rstd.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    assert rstd.shape == x.shape[:-1]
    assert rel_err(out, ref) <= bound
    out2, h, rstd2 = ops.add_rms_norm(x, r, w, 1e-6)
    ref2, href = ref_rms_norm(x, w, 1e-6, r)
    assert torch.equal(h, href)
    assert rel_err(out2, ref2) <= bound


def test_float32_weight_beside_bfloat16_input_keeps_the_input_dtype():
    x = torch.randn(4, 32).bfloat16()
    w = torch.randn(32)
    out = F.rms_norm(x, w, 1e-5)
    assert out.dtype == torch.bfloat16
    ref, _ = ref_rms_norm(x, w, 1e-5)
    assert rel_err(out, ref) <= 2 * torch.finfo(torch.bfloat16).eps


def test_eps_defaults_to_machine_epsilon_like_torch():
    x, w = torch.randn(3, 16), torch.randn(16)
    torch.testing.assert_close(F.rms_norm(x, w), TF.rms_norm(x, (16,), w), rtol=0, atol=1e-6)


@pytest.mark.parametrize("fn", ["rms_norm", "add_rms_norm"])
def test_gradcheck_and_gradgradcheck(fn):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 3, 9, dtype=torch.float64, generator=g, requires_grad=True)
    r = torch.randn(4, 3, 9, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(9, dtype=torch.float64, generator=g, requires_grad=True)
    if fn == "rms_norm":
        f, args = (lambda a, c: F.rms_norm(a, c, 1e-4)), (x, w)
    else:
        f, args = (lambda a, b, c: F.add_rms_norm(a, b, c, 1e-4)), (x, r, w)
    assert torch.autograd.gradcheck(f, args)
    assert torch.autograd.gradgradcheck(f, args)


def test_add_rms_norm_gradient_of_the_new_residual_alone():
    x = torch.randn(5, 8, dtype=torch.float64, requires_grad=True)
    r = torch.randn(5, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(8, dtype=torch.float64, requires_grad=True)
    out, h = F.add_rms_norm(x, r, w, 1e-6)
    (h * 3).sum().backward()  # `out` unused: its gradient is undefined, not zeros
    assert torch.equal(x.grad, torch.full_like(x, 3.0))
    assert torch.equal(r.grad, torch.full_like(r, 3.0))
    assert w.grad is None


def test_backward_operator_matches_autograd_and_skips_weight_grad():
    x = torch.randn(6, 10, dtype=torch.float64, requires_grad=True)
    w = torch.randn(10, dtype=torch.float64, requires_grad=True)
    go = torch.randn(6, 10, dtype=torch.float64)
    gh = torch.randn(6, 10, dtype=torch.float64)
    ref = TF.rms_norm(x, (10,), w, 1e-6)
    dx, dw = torch.autograd.grad(ref, (x, w), go)
    _, rstd = ops.rms_norm(x.detach(), w.detach(), 1e-6)
    gi, gw = cutlass_nn.ops.rms_norm_backward(go, gh, x.detach(), w.detach(), rstd, True)
    torch.testing.assert_close(gi, dx + gh)
    torch.testing.assert_close(gw, dw)
    gi2, gw2 = cutlass_nn.ops.rms_norm_backward(go, None, x.detach(), w.detach(), rstd, False)
    torch.testing.assert_close(gi2, dx)
    assert gw2.shape == (0,)


def test_empty_batches():
    x = torch.randn(0, 3, 16, requires_grad=True)
    w = torch.randn(16, requires_grad=True)
    out = F.rms_norm(x, w, 1e-6)
    out.sum().backward()
    assert out.shape == (0, 3, 16)
    assert torch.equal(w.grad, torch.zeros(16))


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: ops.rms_norm(torch.randn(3, 4), torch.randn(5), 1e-6),
         r"cutlass_nn.rms_norm: argument 'input' must have size 5 in dimension 1 "
         r"\(features = weight.shape\[0\]\), got shape \[3, 4\]"),
        (lambda: ops.rms_norm(torch.randn(3, 4), torch.randn(4, 1), 1e-6),
         r"cutlass_nn.rms_norm: argument 'weight' must be a 1-D tensor"),
        (lambda: ops.rms_norm(torch.randn(3, 4), torch.randn(4).double(), 1e-6),
         r"cutlass_nn.rms_norm: argument 'weight' must have dtype float32 \(the dtype of 'input'\), got float64"),
        (lambda: ops.rms_norm(torch.randn(3, 4).half(), torch.randn(4).double(), 1e-6),
         r"must have dtype float16 \(the dtype of 'input'\) or float32, got float64"),
        (lambda: ops.rms_norm(torch.ones(3, 4, dtype=torch.int32), torch.randn(4), 1e-6),
         r"cutlass_nn.rms_norm: argument 'input' must have a floating dtype"),
        (lambda: ops.rms_norm(torch.randn(3, 4), torch.randn(4), -1.0),
         r"cutlass_nn.rms_norm: argument 'eps' must be a finite number >= 0, got -1"),
        (lambda: ops.rms_norm(torch.randn(3, 4), torch.randn(4), float("nan")),
         r"argument 'eps' must be a finite number >= 0"),
        (lambda: ops.rms_norm(torch.tensor(1.0), torch.randn(1), 1e-6),
         r"cutlass_nn.rms_norm: argument 'input' must have at least 1 dimension"),
        (lambda: ops.add_rms_norm(torch.randn(3, 4), torch.randn(2, 4), torch.randn(4), 1e-6),
         r"cutlass_nn.add_rms_norm: argument 'residual' must have the shape of 'x'"),
        (lambda: ops.add_rms_norm(torch.randn(3, 4), torch.randn(3, 4).double(), torch.randn(4), 1e-6),
         r"cutlass_nn.add_rms_norm: argument 'residual' must have dtype float32"),
        (lambda: ops.rms_norm_backward(torch.randn(3, 4), None, torch.randn(3, 4), torch.randn(4),
                                       torch.randn(3).double(), True),
         r"cutlass_nn.rms_norm_backward: argument 'rstd' must have dtype float32, got float64"),
        (lambda: ops.rms_norm_backward(torch.randn(3, 4), None, torch.randn(3, 4), torch.randn(4),
                                       torch.randn(4), True),
         r"cutlass_nn.rms_norm_backward: argument 'rstd' must have the leading dimensions of 'h' \[3\], got \[4\]"),
        (lambda: ops.rms_norm_backward(torch.randn(3, 5), None, torch.randn(3, 4), torch.randn(4),
                                       torch.randn(3), True),
         r"cutlass_nn.rms_norm_backward: argument 'grad_output' must have the shape of 'h'"),
    ],
)
def test_argument_errors_name_operator_and_argument(call, message):
    with pytest.raises(RuntimeError, match=message):
        call()


@pytest.mark.parametrize("fn", ["rms_norm", "add_rms_norm"])
def test_compile_fullgraph_matches_eager(fn):
    x = torch.randn(2, 6, 32, requires_grad=True)
    r = torch.randn(2, 6, 32, requires_grad=True)
    w = torch.randn(32, requires_grad=True)
    if fn == "rms_norm":
        f = lambda a, b, c: F.rms_norm(a, c, 1e-6) * 2  # noqa: E731
    else:
        f = lambda a, b, c: F.add_rms_norm(a, b, c, 1e-6)[0] * F.add_rms_norm(a, b, c, 1e-6)[1]  # noqa: E731
    eager = f(x, r, w)
    grads = torch.autograd.grad(eager.sum(), (x, r, w), allow_unused=True)
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")(x, r, w)
    cgrads = torch.autograd.grad(compiled.sum(), (x, r, w), allow_unused=True)
    torch.testing.assert_close(compiled, eager)
    for a, b in zip(cgrads, grads):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b)


def test_fake_implementations_raise_like_eager():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x, w = torch.empty(3, 4), torch.empty(5)
        with pytest.raises(RuntimeError, match="cutlass_nn.rms_norm: argument 'input' must have size 5"):
            ops.rms_norm(x, w, 1e-6)
        out, h, rstd = ops.add_rms_norm(torch.empty(2, 3, 4), torch.empty(2, 3, 4), torch.empty(4), 1e-6)
        assert rstd.shape == (2, 3) and rstd.dtype == torch.float32 and h.shape == (2, 3, 4)
        gi, gw = ops.rms_norm_backward(torch.empty(2, 4), None, torch.empty(2, 4), torch.empty(4),
                                       torch.empty(2), False)
        assert gi.shape == (2, 4) and gw.shape == (0,)


def test_opcheck():
    x = torch.randn(3, 16, requires_grad=True)
    r = torch.randn(3, 16, requires_grad=True)
    w = torch.randn(16, requires_grad=True)
    torch.library.opcheck(ops.rms_norm.default, (x, w, 1e-6))
    torch.library.opcheck(ops.add_rms_norm.default, (x, r, w, 1e-6))
    _, rstd = ops.rms_norm(x.detach(), w.detach(), 1e-6)
    torch.library.opcheck(ops.rms_norm_backward.default,
                          (torch.randn(3, 16), None, x.detach(), w.detach(), rstd, True))


# ---- modules ---------------------------------------------------------------------------------


def test_rms_norm_module_is_a_drop_in_for_nn_rmsnorm():
    torch.manual_seed(0)
    stock = nn.RMSNorm(24, eps=1e-5)
    with torch.no_grad():
        stock.weight.normal_()
    ours = cutlass_nn.RMSNorm(24, eps=1e-5)
    ours.load_state_dict(stock.state_dict(), strict=True)
    stock.load_state_dict(ours.state_dict(), strict=True)
    assert isinstance(ours, nn.RMSNorm) and repr(ours) == repr(stock)
    x = torch.randn(2, 3, 24, dtype=torch.float64).float()
    torch.testing.assert_close(ours(x), stock(x))
    converted = cutlass_nn.RMSNorm.from_module(stock)
    assert converted.weight is stock.weight
    torch.testing.assert_close(converted(x), stock(x))


def test_rms_norm_module_falls_back_where_the_kernel_does_not_apply():
    x = torch.randn(2, 3, 4)
    multi = cutlass_nn.RMSNorm((3, 4))
    torch.testing.assert_close(multi(x), TF.rms_norm(x, (3, 4), multi.weight))
    no_affine = cutlass_nn.RMSNorm(4, elementwise_affine=False)
    torch.testing.assert_close(no_affine(x), TF.rms_norm(x, (4,)))
    mixed = cutlass_nn.RMSNorm(4, dtype=torch.bfloat16)  # float32 input, bfloat16 weight
    torch.testing.assert_close(mixed(x), TF.rms_norm(x, (4,), mixed.weight.float()), atol=1e-2, rtol=1e-2)


def test_from_module_rejects_what_it_cannot_convert():
    with pytest.raises(TypeError, match="cutlass_nn.RMSNorm.from_module: argument 'norm' must be"):
        cutlass_nn.RMSNorm.from_module(nn.LayerNorm(4))
    with pytest.raises(TypeError, match="must have a weight"):
        cutlass_nn.RMSNorm.from_module(nn.RMSNorm(4, elementwise_affine=False))


def test_add_rms_norm_module():
    m = cutlass_nn.AddRMSNorm(8, eps=1e-6, dtype=torch.float64)
    with torch.no_grad():
        m.weight.normal_()
    x, r = torch.randn(3, 8, dtype=torch.float64), torch.randn(3, 8, dtype=torch.float64)
    out, h = m(x, r)
    ref, href = ref_rms_norm(x, m.weight, 1e-6, r)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(h, href)
    assert list(m.state_dict()) == ["weight"] and "8, eps=1e-06" in repr(m)


def test_add_rms_norm_promotes_mixed_dtypes_like_the_add():
    x = torch.randn(3, 8).bfloat16()
    r = torch.randn(3, 8)
    w = torch.randn(8)
    out, h = F.add_rms_norm(x, r, w, 1e-6)
    assert h.dtype == torch.float32 and out.dtype == torch.float32
    torch.testing.assert_close(h, x.float() + r)


# ---- convert ---------------------------------------------------------------------------------


def _tiny_llama(seed=0):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=97)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.normal_(1.0, 0.2)  # not all ones: a wrong weight path would show
    return model


def test_convert_fuse_norm_on_a_transformers_llama():
    stock = _tiny_llama()
    ours = _tiny_llama()
    ours.load_state_dict(stock.state_dict())
    cutlass_nn.convert(ours, fuse_norm=True)
    norms = [m for m in ours.modules() if isinstance(m, cutlass_nn.RMSNorm)]
    assert len(norms) == 5  # 2 per decoder layer + the final norm
    assert set(ours.state_dict()) == set(stock.state_dict())
    ids = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(3))
    ls, lo = stock(input_ids=ids, labels=ids).loss, ours(input_ids=ids, labels=ids).loss
    torch.testing.assert_close(lo, ls, rtol=1e-5, atol=1e-5)
    ls.backward()
    lo.backward()
    for (name, p), q in zip(stock.named_parameters(), ours.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5, msg=name)
    # state_dict back into a stock model, strictly
    _tiny_llama(1).load_state_dict(ours.state_dict(), strict=True)


def test_convert_without_fuse_norm_leaves_norms():
    model = _tiny_llama()
    cutlass_nn.convert(model)
    assert not any(isinstance(m, cutlass_nn.RMSNorm) for m in model.modules())
