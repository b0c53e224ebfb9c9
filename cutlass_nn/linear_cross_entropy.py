"""Linear + cross-entropy for language-model heads without the full logits.

``linear_cross_entropy(hidden, weight, target)`` is ``F.cross_entropy(F.linear(hidden, weight,
bias), target)``, computed over chunks of tokens: for each chunk the logits GEMM (cutlass_nn's
``linear``), the log-sum-exp in float32 and the loss; when gradients are needed and the loss is
reduced (``"mean"`` / ``"sum"``), the chunk's logit gradient ``softmax - target distribution`` is
formed in the same buffer right away and turned into the hidden-state gradient (``linear_dgrad``)
and an accumulated weight gradient (``linear_wgrad_accumulate_``, float32 for 16-bit weights).
So no ``[tokens, vocab]`` tensor ever exists, and the three GEMMs of the unfused head are not
repeated: the backward only scales the stored gradients by the incoming scalar. With
``reduction="none"`` the incoming gradient is per token, so the forward keeps the float32
log-sum-exp per token and the backward recomputes the chunks' logits.

The composition runs on cutlass_nn's GEMM operators for every GEMM and on torch for the
elementwise float32 work; it is a ``torch.autograd.Function`` (first derivatives only).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from cutlass_nn import ops

__all__ = ["linear_cross_entropy", "REDUCTIONS", "DEFAULT_CHUNK_BYTES"]

#: ``reduction`` values, as for ``F.cross_entropy``
REDUCTIONS = ("mean", "sum", "none")
#: the default chunk holds about this many bytes of float32 logits (256 MiB: 512 tokens at a
#: 128k vocabulary)
DEFAULT_CHUNK_BYTES = 256 << 20

_FLOAT = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _fail(arg: str, msg: str):
    raise ValueError(f"cutlass_nn.linear_cross_entropy: argument '{arg}' {msg}")


def _check(hidden, weight, target, bias, reduction, label_smoothing, chunk_size) -> None:
    for name, t in (("hidden", hidden), ("weight", weight), ("target", target)):
        if not isinstance(t, Tensor):
            raise TypeError(
                f"cutlass_nn.linear_cross_entropy: argument '{name}' must be a Tensor, got "
                f"{type(t).__name__}"
            )
    if hidden.dtype not in _FLOAT:
        _fail("hidden", f"must have a floating dtype, got {hidden.dtype}")
    if hidden.dim() < 1:
        _fail("hidden", "must have at least 1 dimension [*, hidden]")
    if weight.dim() != 2 or weight.shape[1] != hidden.shape[-1]:
        _fail(
            "weight",
            f"must have shape [vocab, {hidden.shape[-1]}] (hidden = the last dimension of "
            f"'hidden'), got {list(weight.shape)}",
        )
    if weight.dtype != hidden.dtype:
        _fail("weight", f"must have the dtype of 'hidden' ({hidden.dtype}), got {weight.dtype}")
    if weight.device != hidden.device or target.device != hidden.device:
        bad = "weight" if weight.device != hidden.device else "target"
        _fail(bad, f"must be on the device of 'hidden' ({hidden.device})")
    if target.dtype != torch.int64:
        _fail("target", f"must be an int64 tensor of class indices, got {target.dtype}")
    if tuple(target.shape) != tuple(hidden.shape[:-1]):
        _fail(
            "target",
            f"must have the leading shape of 'hidden' {list(hidden.shape[:-1])}, got "
            f"{list(target.shape)}",
        )
    if bias is not None:
        if not isinstance(bias, Tensor) or bias.shape != (weight.shape[0],):
            _fail("bias", f"must be None or a tensor of shape [{weight.shape[0]}]")
        if bias.dtype != hidden.dtype or bias.device != hidden.device:
            _fail("bias", "must have the dtype and device of 'hidden'")
    if reduction not in REDUCTIONS:
        _fail("reduction", f"must be one of {', '.join(map(repr, REDUCTIONS))}, got {reduction!r}")
    if not 0.0 <= float(label_smoothing) <= 1.0:
        _fail("label_smoothing", f"must be in [0, 1], got {label_smoothing}")
    if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size < 1):
        _fail("chunk_size", f"must be None or a positive int, got {chunk_size!r}")


def _chunk_rows(tokens: int, vocab: int, chunk_size: int | None) -> int:
    if chunk_size is not None:
        return chunk_size
    return max(1, min(max(tokens, 1), DEFAULT_CHUNK_BYTES // (4 * max(vocab, 1))))


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


class _ChunkMath:
    """The float32 (float64 for float64 inputs) per-chunk pieces shared by forward and backward."""

    def __init__(self, vocab: int, ignore_index: int, label_smoothing: float):
        self.vocab = vocab
        self.ignore_index = ignore_index
        self.eps = float(label_smoothing)

    def targets(self, t: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(valid, safe target index, out of range) of a chunk's targets: ignored tokens are
        not valid; out-of-range targets are clamped for the gather and reported, so that they
        poison the loss with NaN instead of faulting the device."""
        valid = t != self.ignore_index
        bad = valid & ((t < 0) | (t >= self.vocab))
        safe = torch.where(valid & ~bad, t, torch.zeros_like(t))
        return valid, safe, bad

    @staticmethod
    def row_scale(valid: Tensor, bad: Tensor) -> Tensor:
        """Per-token factor of the logit gradient: 1 for counted tokens, exactly 0 for ignored
        ones, NaN for out-of-range targets (their loss is NaN; so are the gradients, so that a
        NaN check or a gradient scaler catches them)."""
        one = valid.to(torch.float32)
        return torch.where(bad, torch.full_like(one, float("nan")), one)

    def loss(self, z: Tensor, lse: Tensor, safe: Tensor) -> Tensor:
        """Per-token loss from logits z [c, V] and their log-sum-exp: (1 - eps) * nll +
        eps * (the mean over classes of -log p), torch's label-smoothing definition."""
        zy = z.gather(1, safe.unsqueeze(1)).squeeze(1)
        if self.eps == 0.0:
            return lse - zy
        return lse - (1.0 - self.eps) * zy - (self.eps / self.vocab) * z.sum(-1)

    def logit_grad_(self, z: Tensor, lse: Tensor, safe: Tensor, row_scale: Tensor) -> Tensor:
        """Turn z [c, V] in place into d loss_t / d z scaled by row_scale [c]:
        (softmax(z) - (1 - eps) onehot(target) - eps / V) * row_scale."""
        z.sub_(lse.unsqueeze(1)).exp_()
        if self.eps != 0.0:
            z.sub_(self.eps / self.vocab)
        rows = torch.arange(z.shape[0], device=z.device)
        z.index_put_((rows, safe), torch.full_like(lse, -(1.0 - self.eps)), accumulate=True)
        return z.mul_(row_scale.unsqueeze(1))


def _logits(h: Tensor, weight: Tensor, bias: Tensor | None, compute: torch.dtype) -> Tensor:
    return ops.linear(h, weight, bias).to(compute)


def _add_chunk_grads(held, hc, weight, start, grad_h, grad_w, grad_b) -> None:
    """The parameter gradients of one chunk from its (scaled) float logit gradient dzf [c, V]:
    the hidden rows (linear_dgrad), the weight (accumulated in place) and the bias (float sum).
    dzf comes as the only item of the list ``held`` (the caller keeps no other reference), so
    that it is freed once cast, before the GEMMs allocate."""
    dzf = held.pop()
    if grad_b is not None:
        grad_b += dzf.sum(0)
    dz = dzf.to(weight.dtype)  # the GEMM operands are in the weight's dtype
    del dzf
    if grad_h is not None:
        grad_h[start:start + dz.shape[0]] = ops.linear_dgrad(dz, weight)
    if grad_w is not None:
        ops.linear_wgrad_accumulate_(grad_w, dz, hc)


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, hidden, weight, bias, target, ignore_index, reduction, label_smoothing, chunk,
        out_dtype, grad_enabled,
    ):
        h = hidden.reshape(-1, hidden.shape[-1])
        t = target.reshape(-1)
        tokens, vocab = h.shape[0], weight.shape[0]
        compute = _compute_dtype(hidden.dtype)
        math = _ChunkMath(vocab, ignore_index, label_smoothing)
        # needs_input_grad says True under torch.no_grad() too: grad_enabled (the caller's
        # grad mode) keeps an evaluation pass from forming gradients nobody will read
        need_h = grad_enabled and ctx.needs_input_grad[0]
        need_w = grad_enabled and ctx.needs_input_grad[1]
        need_b = grad_enabled and bias is not None and ctx.needs_input_grad[2]
        need_grad = need_h or need_w or need_b
        eager_grads = need_grad and reduction != "none"
        valid_all = t != ignore_index
        n_valid = valid_all.sum()
        # mean: every token's gradient is scaled by 1 / n_valid (a tensor: no host sync). The
        # scale is applied in the backward, together with the incoming gradient (an fp16 loss
        # scale, for instance), in float: folded in before the chunk gradients are rounded to
        # 16 bits, it would flush the small ones to zero.
        # (With every token ignored the mean is NaN, as in torch, and the gradients are 0.)
        if reduction == "mean":
            count = n_valid.to(compute)
            scale = torch.where(count > 0, 1.0 / count.clamp_min(1), torch.zeros_like(count))
        else:
            scale = torch.ones((), dtype=compute, device=h.device)

        loss_tok = torch.empty(tokens, dtype=compute, device=h.device)
        lse_all = torch.empty(tokens, dtype=compute, device=h.device) if need_grad and not eager_grads else None
        grad_h = torch.empty_like(h) if eager_grads and need_h else None
        acc_dtype = compute if weight.dtype in (torch.float16, torch.bfloat16) else weight.dtype
        grad_w = torch.zeros(weight.shape, dtype=acc_dtype, device=h.device) if eager_grads and need_w else None
        grad_b = torch.zeros(vocab, dtype=compute, device=h.device) if eager_grads and need_b else None

        for start in range(0, tokens, chunk):
            end = min(start + chunk, tokens)
            hc = h[start:end]
            valid, safe, bad = math.targets(t[start:end])
            z = _logits(hc, weight, bias, compute)
            lse = torch.logsumexp(z, dim=-1)
            loss = math.loss(z, lse, safe)
            loss = torch.where(valid, loss, torch.zeros_like(loss))
            loss_tok[start:end] = torch.where(bad, torch.full_like(loss, float("nan")), loss)
            if lse_all is not None:
                lse_all[start:end] = lse
            if eager_grads:
                held = [math.logit_grad_(z, lse, safe, math.row_scale(valid, bad))]
                del z
                _add_chunk_grads(held, hc, weight, start, grad_h, grad_w, grad_b)

        if reduction == "none":
            out = loss_tok.reshape(target.shape)
        elif reduction == "sum":
            out = loss_tok.sum()
        else:
            out = loss_tok.sum() / n_valid.to(compute)
        out = out.to(out_dtype)

        ctx.reduction = reduction
        ctx.weight_dtype = weight.dtype
        ctx.hidden_shape = hidden.shape
        ctx.has_bias = bias is not None
        if eager_grads:
            ctx.save_for_backward(grad_h, grad_w, grad_b, scale)
        elif need_grad:
            ctx.chunk = chunk
            ctx.math = math
            ctx.save_for_backward(hidden, weight, bias, target, lse_all)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        if ctx.reduction != "none":
            grad_h, grad_w, grad_b, scale = ctx.saved_tensors
            # the incoming gradient times the reduction's scale, in float, applied to the
            # unscaled per-chunk gradients of the forward
            factor = grad_out.to(scale.dtype) * scale
            dh = dw = db = None
            if grad_h is not None:
                dh = (grad_h.to(factor.dtype) * factor).to(grad_h.dtype).reshape(ctx.hidden_shape)
            if grad_w is not None:
                dw = (grad_w * factor.to(grad_w.dtype)).to(ctx.weight_dtype)
            if grad_b is not None:
                db = (grad_b * factor).to(ctx.weight_dtype)
            return dh, dw, db, None, None, None, None, None, None, None
        return _backward_recompute(ctx, grad_out)


def _backward_recompute(ctx, grad_out: Tensor):
    """reduction="none": per-token incoming gradients; the logits are recomputed per chunk."""
    hidden, weight, bias, target, lse_all = ctx.saved_tensors
    math: _ChunkMath = ctx.math
    h = hidden.reshape(-1, hidden.shape[-1])
    t = target.reshape(-1)
    compute = _compute_dtype(hidden.dtype)
    g = grad_out.reshape(-1).to(compute)
    need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    need_b = bias is not None and ctx.needs_input_grad[2]
    grad_h = torch.empty_like(h) if need_h else None
    acc_dtype = compute if weight.dtype in (torch.float16, torch.bfloat16) else weight.dtype
    grad_w = torch.zeros(weight.shape, dtype=acc_dtype, device=h.device) if need_w else None
    grad_b = torch.zeros(weight.shape[0], dtype=compute, device=h.device) if need_b else None
    for start in range(0, h.shape[0], ctx.chunk):
        end = min(start + ctx.chunk, h.shape[0])
        hc = h[start:end]
        valid, safe, bad = math.targets(t[start:end])
        z = _logits(hc, weight, bias, compute)
        held = [math.logit_grad_(z, lse_all[start:end], safe, math.row_scale(valid, bad) * g[start:end])]
        del z
        _add_chunk_grads(held, hc, weight, start, grad_h, grad_w, grad_b)
    dh = None if grad_h is None else grad_h.reshape(hidden.shape)
    dw = None if grad_w is None else grad_w.to(weight.dtype)
    db = None if grad_b is None else grad_b.to(weight.dtype)
    return dh, dw, db, None, None, None, None, None, None, None


def linear_cross_entropy(
    hidden: Tensor,
    weight: Tensor,
    target: Tensor,
    bias: Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    chunk_size: int | None = None,
) -> Tensor:
    """``F.cross_entropy(F.linear(hidden, weight, bias), target, ignore_index=...,
    reduction=..., label_smoothing=...)`` without materializing the ``[tokens, vocab]`` logits.

    Args:
        hidden: ``[*, hidden]`` hidden states (the input of the output projection).
        weight: ``[vocab, hidden]`` the output projection's weight (e.g. ``lm_head.weight``),
            of ``hidden``'s dtype and device.
        target: int64 class indices of shape ``hidden.shape[:-1]``; ``ignore_index`` marks
            tokens that neither count nor get a gradient.
        bias: optional ``[vocab]``.
        reduction: ``"mean"`` (over the non-ignored tokens; NaN when every token is ignored, as
            in torch), ``"sum"`` or ``"none"`` (a loss per token, 0 for ignored ones).
        label_smoothing: in ``[0, 1]``, torch's definition.
        chunk_size: tokens per chunk; None picks about 256 MiB of float32 logits per chunk.

    The log-sum-exp and loss are float32 (float64 for float64 inputs), computed from logits
    rounded to ``hidden``'s dtype (as the unfused head rounds them); the loss is returned in
    ``hidden``'s dtype. A target outside ``[0, vocab)`` that is not ``ignore_index`` makes its
    token's loss and gradients NaN (no device fault, no host synchronization). Under
    ``torch.autocast``, floating arguments other than float64 are cast to the autocast dtype
    first, as ``F.linear`` would, and the loss is returned in float32, as autocast runs
    ``F.cross_entropy``. First derivatives only (no double backward).

    With a ``transformers`` causal LM, take the hidden states of the base model and the head's
    weight, and shift the labels by one::

        hidden = model.model(input_ids=ids).last_hidden_state      # [batch, seq, hidden]
        loss = linear_cross_entropy(hidden[:, :-1], model.lm_head.weight, ids[:, 1:])
    """
    device_type = hidden.device.type if isinstance(hidden, Tensor) else "cpu"
    autocast = torch.is_autocast_enabled(device_type)
    if autocast:
        # as F.linear under autocast: floating arguments other than float64 in the autocast dtype
        low = torch.get_autocast_dtype(device_type)

        def cast(t):
            if isinstance(t, Tensor) and t.is_floating_point() and t.dtype != torch.float64:
                return t.to(low)
            return t

        hidden, weight, bias = cast(hidden), cast(weight), cast(bias)
    _check(hidden, weight, target, bias, reduction, label_smoothing, chunk_size)
    chunk = _chunk_rows(target.numel(), weight.shape[0], chunk_size)
    with torch.autocast(device_type, enabled=False):
        # autocast runs cross_entropy in float32: under it the loss comes back in float32 (it is
        # computed in float32); otherwise in hidden's dtype, as the unfused head's
        out_dtype = torch.float32 if autocast and hidden.dtype != torch.float64 else hidden.dtype
        return _LinearCrossEntropy.apply(
            hidden, weight, bias, target, int(ignore_index), reduction, float(label_smoothing),
            chunk, out_dtype, torch.is_grad_enabled(),
        )
