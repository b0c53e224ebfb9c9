"""The CUDA cross_entropy_rows_ kernel against float64 autograd through F.cross_entropy and
against the CPU implementation: every dtype, vocabularies that take the 16-byte path and the
element path (1, 7, odd, 32000, 128k), rows that start unaligned, label smoothing, per-row scales,
ignored and out-of-range targets (NaN for their row only, no device fault), write_grad=False, and
many rows (the grid-stride loop)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as TF

from cuda_helpers import CUDA_MARKS
from cutlass_nn import ops

pytestmark = CUDA_MARKS

# loss / lse tolerance (float statistics) and gradient tolerance (one rounding to the dtype)
TOL = {
    torch.float64: (1e-12, 1e-12),
    torch.float32: (2e-5, 1e-5),
    torch.bfloat16: (2e-5, 2 ** -8),
    torch.float16: (2e-5, 2 ** -11),
}


def reference(z, t, row_scale=None, smoothing=0.0):
    z64 = z.detach().double().requires_grad_()
    loss = TF.cross_entropy(z64, t, reduction="none", label_smoothing=smoothing)
    scale = torch.ones_like(loss) if row_scale is None else row_scale.double()
    (grad,) = torch.autograd.grad(loss, z64, scale)
    return loss.detach(), torch.logsumexp(z64.detach(), 1), grad


@pytest.mark.parametrize("dtype", list(TOL), ids=str)
@pytest.mark.parametrize("rows,vocab", [(3, 1), (5, 7), (37, 1003), (64, 32000), (4, 131072)])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("scaled", [False, True], ids=["unscaled", "row_scale"])
def test_matches_float64(dtype, rows, vocab, smoothing, scaled):
    gen = torch.Generator(device="cuda").manual_seed(rows * vocab + int(scaled))
    z = (torch.randn(rows, vocab, device="cuda", generator=gen) * 4).to(dtype)
    t = torch.randint(0, vocab, (rows,), device="cuda", generator=gen)
    t[::3] = -100
    stat = torch.float64 if dtype == torch.float64 else torch.float32
    row_scale = torch.rand(rows, device="cuda", generator=gen, dtype=stat) if scaled else None
    ref_loss, ref_lse, ref_grad = reference(z, t, row_scale, smoothing)
    buf = z.clone()
    loss, lse = ops.cross_entropy_rows_(buf, t, row_scale, -100, smoothing, True)
    stat_tol, grad_tol = TOL[dtype]
    torch.testing.assert_close(loss.double(), ref_loss, rtol=stat_tol, atol=stat_tol)
    torch.testing.assert_close(lse.double(), ref_lse, rtol=stat_tol, atol=stat_tol)
    # one rounding of the float gradient to dtype: within half an ulp of the largest entry
    assert (buf.double() - ref_grad).abs().max() <= grad_tol * max(1.0, ref_grad.abs().max().item())
    assert not buf[::3].any()  # ignored rows: exact zeros
    # the CPU implementation on the same inputs agrees
    cpu = z.cpu().clone()
    cpu_loss, _ = ops.cross_entropy_rows_(cpu, t.cpu(), None if row_scale is None else row_scale.cpu(),
                                          -100, smoothing, True)
    torch.testing.assert_close(loss.cpu(), cpu_loss, rtol=stat_tol, atol=stat_tol)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_rows_that_start_unaligned_take_the_element_path(dtype):
    # a vocabulary the 16-byte packs divide, rows starting one element into the storage:
    # contiguous, not 16-byte aligned, so only the element path may read them
    vocab = 1024
    z = torch.randn(8 * vocab + 1, device="cuda").to(dtype)[1:].view(8, vocab)
    assert z.is_contiguous() and z.data_ptr() % 16 != 0
    t = torch.randint(0, vocab, (8,), device="cuda")
    ref_loss, _, ref_grad = reference(z, t)
    loss, _ = ops.cross_entropy_rows_(z, t)
    torch.testing.assert_close(loss.double(), ref_loss, rtol=2e-5, atol=2e-5)
    assert (z.double() - ref_grad).abs().max() <= TOL[dtype][1]


def test_out_of_range_targets_are_nan_for_their_row_not_a_fault():
    z = torch.randn(6, 256, device="cuda", dtype=torch.bfloat16)
    t = torch.tensor([0, 256, 5, -7, 255, -100], device="cuda")
    loss, lse = ops.cross_entropy_rows_(z, t)
    torch.cuda.synchronize()
    assert loss[1].isnan() and loss[3].isnan() and z[1].isnan().all() and z[3].isnan().all()
    assert torch.isfinite(loss[[0, 2, 4]]).all() and torch.isfinite(z[[0, 2, 4]]).all()
    assert loss[5] == 0 and not z[5].any() and torch.isfinite(lse).all()


def test_write_grad_false_and_many_rows():
    gen = torch.Generator(device="cuda").manual_seed(2)
    z = torch.randn(5000, 300, device="cuda", generator=gen).to(torch.bfloat16)
    t = torch.randint(0, 300, (5000,), device="cuda", generator=gen)
    buf = z.clone()
    loss, _ = ops.cross_entropy_rows_(buf, t, None, -100, 0.0, False)
    assert torch.equal(buf, z)
    ref_loss, _, _ = reference(z, t)
    torch.testing.assert_close(loss.double(), ref_loss, rtol=2e-5, atol=2e-5)


def test_extreme_logits_stay_finite():
    # large magnitudes: the online maximum keeps exp() in range
    z = torch.tensor([[1e4, -1e4, 0.0, 3e4], [-3e4, -3e4, -3e4, -3e4]], device="cuda")
    t = torch.tensor([3, 1], device="cuda")
    ref_loss, ref_lse, ref_grad = reference(z, t)
    loss, lse = ops.cross_entropy_rows_(z, t)
    torch.testing.assert_close(loss.double(), ref_loss)
    torch.testing.assert_close(lse.double(), ref_lse)
    torch.testing.assert_close(z.double(), ref_grad)


@pytest.mark.parametrize("dtype", list(TOL), ids=str)
@pytest.mark.parametrize("vocab", [3, 1024, 4099])  # element path, 16-byte path, odd
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_non_finite_rows_match_torch(dtype, vocab, smoothing):
    """lse is torch.logsumexp's for rows with an infinite maximum (+inf beside a +inf logit, -inf
    for a row of -inf; NaN beside a NaN), and loss and gradient are F.cross_entropy's: NaN for
    those rows (csrc/kernels/cross_entropy.cu: exp_rel's x == m case and log_s_row), finite for
    the others; the CPU implementation gives the same."""
    inf, nan = float("inf"), float("nan")
    gen = torch.Generator(device="cuda").manual_seed(vocab)
    z = torch.randn(8, vocab, device="cuda", generator=gen, dtype=torch.float64)
    z[0, vocab // 2] = inf
    z[1] = -inf
    z[2] = inf
    z[3, 0], z[3, -1] = -inf, inf
    z[4, 0], z[4, -1] = nan, inf
    z[5] = -inf
    z[5, vocab // 3] = nan
    z[6] = -inf
    z[6, -1] = 2.0  # a finite maximum among -inf: finite
    z = z.to(dtype)  # row 7: finite
    t = torch.tensor([1, 0, 2, 1, 0, 2, 1, 2], device="cuda") % vocab
    ref_loss, ref_lse, ref_grad = reference(z, t, None, smoothing)
    buf = z.clone()
    loss, lse = ops.cross_entropy_rows_(buf, t, None, -100, smoothing, True)
    stat_tol, grad_tol = TOL[dtype]
    torch.testing.assert_close(lse.double(), ref_lse, rtol=stat_tol, atol=stat_tol, equal_nan=True)
    torch.testing.assert_close(loss.double(), ref_loss, rtol=stat_tol, atol=stat_tol, equal_nan=True)
    assert torch.equal(buf.isnan(), ref_grad.isnan())
    finite = ~ref_grad.isnan()
    assert (buf.double()[finite] - ref_grad[finite]).abs().max() <= grad_tol
    cpu = z.cpu().clone()
    cpu_loss, cpu_lse = ops.cross_entropy_rows_(cpu, t.cpu(), None, -100, smoothing, True)
    torch.testing.assert_close(lse.cpu(), cpu_lse, rtol=stat_tol, atol=stat_tol, equal_nan=True)
    torch.testing.assert_close(loss.cpu(), cpu_loss, rtol=stat_tol, atol=stat_tol, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_gradient_over_more_rows_than_blocks(dtype):
    # each block moves on to further rows (the grid-stride loop) while overwriting the previous
    gen = torch.Generator(device="cuda").manual_seed(9)
    rows, vocab = 5000, 520
    z = torch.randn(rows, vocab, device="cuda", generator=gen).to(dtype)
    t = torch.randint(0, vocab, (rows,), device="cuda", generator=gen)
    t[::7] = -100
    scale = torch.rand(rows, device="cuda", generator=gen)
    ref_loss, _, ref_grad = reference(z, t, scale, 0.1)
    buf = z.clone()
    loss, _ = ops.cross_entropy_rows_(buf, t, scale, -100, 0.1, True)
    torch.testing.assert_close(loss.double(), ref_loss, rtol=2e-5, atol=2e-5)
    assert (buf.double() - ref_grad).abs().max() <= TOL[dtype][1]
    cpu = z.cpu().clone()
    ops.cross_entropy_rows_(cpu, t.cpu(), scale.cpu(), -100, 0.1, True)
    assert (buf.cpu().double() - cpu.double()).abs().max() <= 2 * TOL[dtype][1]
