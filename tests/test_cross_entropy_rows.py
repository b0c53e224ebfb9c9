"""ops.cross_entropy_rows_ (the fused head's per-chunk kernel) on the CPU backend: loss, log-sum-exp
and the in-place gradient against float64 autograd through F.cross_entropy (label smoothing,
ignored rows, per-row scales, tiny and odd vocabularies), out-of-range targets (NaN for their row
only), write_grad=False leaving the logits untouched, argument errors that name the argument and
mutate nothing, opcheck, and the autograd helper that tells a Python backward whether the graph is
kept. The CUDA kernel is compared with this implementation in tests/test_cuda_cross_entropy_rows.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as TF

from cutlass_nn import ops

_ops = torch.ops.cutlass_nn


def reference(z, t, row_scale=None, ignore_index=-100, smoothing=0.0):
    """(loss, lse, grad) in float64 from autograd through F.cross_entropy."""
    z64 = z.detach().double().requires_grad_()
    loss = TF.cross_entropy(z64, t, reduction="none", ignore_index=ignore_index, label_smoothing=smoothing)
    scale = torch.ones_like(loss) if row_scale is None else row_scale.double()
    (grad,) = torch.autograd.grad(loss, z64, scale)
    return loss.detach(), torch.logsumexp(z64.detach(), 1), grad


@pytest.mark.parametrize("vocab", [1, 7, 50, 1003])
@pytest.mark.parametrize("smoothing", [0.0, 0.3])
@pytest.mark.parametrize("scaled", [False, True], ids=["unscaled", "row_scale"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_matches_float64_autograd(vocab, smoothing, scaled, dtype):
    gen = torch.Generator().manual_seed(vocab * 7 + int(scaled))
    rows = 9
    z = (torch.randn(rows, vocab, generator=gen, dtype=torch.float64) * 3).to(dtype)
    t = torch.randint(0, vocab, (rows,), generator=gen)
    t[2] = t[7] = -100
    stat = torch.float64 if dtype == torch.float64 else torch.float32
    row_scale = torch.randn(rows, generator=gen, dtype=stat) if scaled else None
    ref_loss, ref_lse, ref_grad = reference(z, t, row_scale, smoothing=smoothing)
    buf = z.clone()
    loss, lse = ops.cross_entropy_rows_(buf, t, row_scale, -100, smoothing, True)
    assert loss.dtype == lse.dtype == stat and loss.shape == lse.shape == (rows,)
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(loss.double(), ref_loss, **tol)
    torch.testing.assert_close(lse.double(), ref_lse, **tol)
    torch.testing.assert_close(buf.double(), ref_grad, **tol)
    assert torch.equal(buf[2], torch.zeros_like(buf[2])) and torch.equal(buf[7], torch.zeros_like(buf[7]))


def test_lower_precision_gradient_is_rounded_once_from_float():
    gen = torch.Generator().manual_seed(3)
    z = torch.randn(6, 300, generator=gen).to(torch.bfloat16)
    t = torch.randint(0, 300, (6,), generator=gen)
    _, _, ref_grad = reference(z, t)
    buf = z.clone()
    loss, _ = ops.cross_entropy_rows_(buf, t)
    assert loss.dtype == torch.float32 and buf.dtype == torch.bfloat16
    torch.testing.assert_close(buf, ref_grad.to(torch.bfloat16), rtol=0, atol=0)


def test_write_grad_false_leaves_logits_untouched():
    gen = torch.Generator().manual_seed(4)
    z = torch.randn(5, 33, generator=gen)
    t = torch.randint(0, 33, (5,), generator=gen)
    buf = z.clone()
    loss, lse = ops.cross_entropy_rows_(buf, t, None, -100, 0.1, False)
    assert torch.equal(buf, z)
    ref_loss, ref_lse, _ = reference(z, t, smoothing=0.1)
    torch.testing.assert_close(loss.double(), ref_loss, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse.double(), ref_lse, rtol=1e-5, atol=1e-5)


def test_out_of_range_targets_poison_their_row_only():
    gen = torch.Generator().manual_seed(5)
    z = torch.randn(4, 10, generator=gen, dtype=torch.float64)
    t = torch.tensor([3, 10, -1, 0])
    buf = z.clone()
    loss, _ = ops.cross_entropy_rows_(buf, t)
    assert loss[1].isnan() and loss[2].isnan() and buf[1].isnan().all() and buf[2].isnan().all()
    good = torch.tensor([0, 3])
    ref_loss, _, ref_grad = reference(z[good], t[good])
    torch.testing.assert_close(loss[good], ref_loss)
    torch.testing.assert_close(buf[good], ref_grad)


def test_ignore_index_other_than_the_default_and_no_rows():
    z = torch.randn(3, 4, dtype=torch.float64)
    t = torch.tensor([1, 7, 2])
    buf = z.clone()
    loss, _ = ops.cross_entropy_rows_(buf, t, None, 7)
    assert loss[1] == 0 and torch.equal(buf[1], torch.zeros(4, dtype=torch.float64))
    loss, lse = ops.cross_entropy_rows_(torch.empty(0, 5), torch.empty(0, dtype=torch.long))
    assert loss.shape == lse.shape == (0,)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: (torch.randn(4, 6).t(), torch.zeros(6, dtype=torch.long), None, 0.0),
         "argument 'logits' must be contiguous"),
        (lambda: (torch.randn(24), torch.zeros(24, dtype=torch.long), None, 0.0),
         "argument 'logits' must be a 2-D tensor"),
        (lambda: (torch.randn(4, 0), torch.zeros(4, dtype=torch.long), None, 0.0),
         "argument 'logits' must have at least one class"),
        (lambda: (torch.randn(4, 6), torch.zeros(4, dtype=torch.int32), None, 0.0),
         "argument 'target' must be an int64 tensor"),
        (lambda: (torch.randn(4, 6), torch.zeros(5, dtype=torch.long), None, 0.0),
         "argument 'target' must have size 4"),
        (lambda: (torch.randn(4, 6), torch.zeros(4, dtype=torch.long), torch.ones(4, dtype=torch.float64), 0.0),
         "argument 'row_scale' must have dtype float32"),
        (lambda: (torch.randn(4, 6), torch.zeros(4, dtype=torch.long), torch.ones(3), 0.0),
         "argument 'row_scale' must have size 4"),
        (lambda: (torch.randn(4, 6), torch.zeros(4, dtype=torch.long), None, 1.5),
         "argument 'label_smoothing' must be in \\[0, 1\\]"),
        (lambda: (torch.randn(4, 6).long(), torch.zeros(4, dtype=torch.long), None, 0.0),
         "argument 'logits' must have a floating dtype"),
    ],
)
def test_bad_arguments_name_the_argument_and_mutate_nothing(make, match):
    logits, target, row_scale, smoothing = make()
    before = logits.clone()
    with pytest.raises(RuntimeError, match="cutlass_nn.cross_entropy_rows_: " + match):
        ops.cross_entropy_rows_(logits, target, row_scale, -100, smoothing, True)
    assert torch.equal(logits, before)


def test_row_scale_may_not_share_the_logits_memory():
    z = torch.randn(4, 4)
    with pytest.raises(RuntimeError, match="argument 'row_scale' must not share memory"):
        ops.cross_entropy_rows_(z, torch.zeros(4, dtype=torch.long), z[0], -100, 0.0, True)


@pytest.mark.parametrize("scaled", [False, True])
@pytest.mark.parametrize("write_grad", [False, True])
def test_opcheck(scaled, write_grad):
    z = torch.randn(5, 12)
    t = torch.tensor([0, 3, -100, 11, 5])
    scale = torch.randn(5) if scaled else None
    torch.library.opcheck(_ops.cross_entropy_rows_.default, (z, t, scale, -100, 0.1, write_grad))


def test_keeps_graph_helper_sees_retain_graph():
    seen = []

    class Probe(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            seen.append(_ops._autograd_keeps_graph())
            return g

    x = torch.randn(3, requires_grad=True)
    Probe.apply(x).sum().backward(retain_graph=True)
    Probe.apply(x).sum().backward()
    assert seen == [True, False]
    assert _ops._autograd_keeps_graph()  # outside a backward pass: the safe answer
