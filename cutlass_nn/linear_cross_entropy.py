"""Linear + cross-entropy for language-model heads without the full logits.

``linear_cross_entropy(hidden, weight, target)`` is ``F.cross_entropy(F.linear(hidden, weight,
bias), target)``, computed over chunks of tokens. For each chunk: the logits GEMM (cutlass_nn's
``linear``, logits in the weight's dtype as the unfused head has them), then one kernel
(``ops.cross_entropy_rows_``) that computes each token's float32 log-sum-exp and loss and, when
gradients are needed, writes the logit gradient ``softmax - target distribution`` over the
chunk's logits; then the hidden-state gradient GEMM (``linear_dgrad``) and the weight gradient,
accumulated over the chunks in place (``linear_wgrad_accumulate_``: in the weight's dtype for
bfloat16 / float32 / float64 weights, in float32 for float16 ones, whose range a sum over many
tokens can exceed). So no ``[tokens, vocab]`` tensor exists, and for a reduced loss (``"mean"``
/ ``"sum"``) the three GEMMs of the unfused head are not repeated: the backward only scales the
stored gradients by the incoming scalar (in place in eager mode). With ``reduction="none"`` the
incoming gradient is per token, so the backward recomputes the chunks' logits.

The chunk loops are two custom operators (``cutlass_nn::_linear_cross_entropy_forward`` /
``_backward``) so that ``torch.compile`` treats them as opaque calls instead of tracing (and
functionalizing) their in-place accumulation; ``_LinearCrossEntropy`` is the
``torch.autograd.Function`` around them (first derivatives only).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from cutlass_nn import ops

__all__ = ["linear_cross_entropy", "REDUCTIONS", "DEFAULT_CHUNK_BYTES"]

#: ``reduction`` values, as for ``F.cross_entropy``
REDUCTIONS = ("mean", "sum", "none")
#: the default chunk holds about this many bytes of logits in the weight's dtype (512 MiB: 2048
#: tokens at a 128k vocabulary in bfloat16); the count is rounded down to a multiple of 128
#: tokens (the GEMM tile height) when it is larger than that
DEFAULT_CHUNK_BYTES = 512 << 20

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


def _chunk_rows(tokens: int, vocab: int, element_size: int, chunk_size: int | None) -> int:
    if chunk_size is not None:
        return chunk_size
    rows = max(1, DEFAULT_CHUNK_BYTES // (element_size * max(vocab, 1)))
    if rows > 128:
        rows -= rows % 128
    return max(1, min(max(tokens, 1), rows))


def _stat_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _wgrad_dtype(dtype: torch.dtype) -> torch.dtype:
    """The weight-gradient accumulator's dtype: float16's range is too small for sums over many
    tokens, so float16 weights accumulate in float32; bfloat16 has float32's range."""
    return torch.float32 if dtype == torch.float16 else dtype


def _placeholder(like: Tensor) -> Tensor:
    """What the custom operators return for a gradient that is not needed (they cannot return
    None): an empty tensor."""
    return like.new_empty(0)


def _chunk_grads(dz: Tensor, hc: Tensor, weight: Tensor, rows: slice, grad_h, grad_w, grad_b):
    """Add one chunk's share of the parameter gradients from its logit gradient dz [c, vocab]
    (in the weight's dtype): the hidden rows (linear_dgrad), the weight (linear_wgrad for the
    first chunk when the accumulator has the weight's dtype, accumulated in place after) and the
    bias (a float sum). Returns the weight-gradient accumulator."""
    if grad_b is not None:
        grad_b += dz.sum(0, dtype=grad_b.dtype)
    if grad_h is not None:
        grad_h[rows] = ops.linear_dgrad(dz, weight)
    if grad_w is None:
        return None
    if grad_w.shape != weight.shape:  # first chunk: nothing to accumulate into yet
        if grad_w.dtype == weight.dtype:
            return ops.linear_wgrad(dz, hc)
        grad_w = torch.zeros(weight.shape, dtype=grad_w.dtype, device=weight.device)
    ops.linear_wgrad_accumulate_(grad_w, dz, hc)
    return grad_w


def _run_chunks(hidden, weight, bias, target, row_scale, ignore_index, label_smoothing, chunk,
                need_h, need_w, need_b, keep_loss):
    """The chunk loop shared by the two operators: per chunk, the logits GEMM, the
    cross-entropy kernel (gradient written over the logits when any is needed, scaled per token
    by ``row_scale`` when given) and the gradient GEMMs. Returns (per-token loss or None,
    grad_h, grad_w accumulator, grad_b accumulator), None for what was not asked for."""
    h = hidden.reshape(-1, hidden.shape[-1])
    t = target.reshape(-1)
    tokens, vocab = h.shape[0], weight.shape[0]
    stat = _stat_dtype(hidden.dtype)
    loss = torch.empty(tokens, dtype=stat, device=h.device) if keep_loss else None
    write_grad = need_h or need_w or need_b
    grad_h = torch.empty_like(h) if need_h else None
    grad_w = weight.new_empty(0, dtype=_wgrad_dtype(weight.dtype)) if need_w else None
    grad_b = torch.zeros(vocab, dtype=stat, device=h.device) if need_b else None
    for start in range(0, tokens, chunk):
        rows = slice(start, min(start + chunk, tokens))
        hc = h[rows]
        z = ops.linear(hc, weight, bias)
        scale = None if row_scale is None else row_scale[rows]
        chunk_loss, _ = ops.cross_entropy_rows_(z, t[rows], scale, ignore_index, label_smoothing, write_grad)
        if loss is not None:
            loss[rows] = chunk_loss
        if write_grad:
            grad_w = _chunk_grads(z, hc, weight, rows, grad_h, grad_w, grad_b)
        del z
    if grad_w is not None and grad_w.shape != weight.shape:  # no tokens
        grad_w = torch.zeros(weight.shape, dtype=grad_w.dtype, device=weight.device)
    if grad_h is not None:
        grad_h = grad_h.reshape(hidden.shape)
    return loss, grad_h, grad_w, grad_b


@torch.library.custom_op("cutlass_nn::_linear_cross_entropy_forward", mutates_args=())
def _forward_op(
    hidden: Tensor, weight: Tensor, bias: Tensor | None, target: Tensor, ignore_index: int,
    label_smoothing: float, chunk: int, need_h: bool, need_w: bool, need_b: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(loss per token [tokens] in the statistics dtype, grad_h [*, hidden], grad_w [vocab,
    hidden] in _wgrad_dtype, grad_b [vocab] in the statistics dtype), the gradients those of
    the *sum* of the per-token losses and empty [0] tensors unless asked for."""
    with torch.no_grad():
        loss, grad_h, grad_w, grad_b = _run_chunks(
            hidden, weight, bias, target, None, ignore_index, label_smoothing, chunk,
            need_h, need_w, need_b, keep_loss=True)
    return (
        loss,
        _placeholder(hidden) if grad_h is None else grad_h,
        _placeholder(weight) if grad_w is None else grad_w,
        _placeholder(loss) if grad_b is None else grad_b,
    )


@_forward_op.register_fake
def _forward_fake(hidden, weight, bias, target, ignore_index, label_smoothing, chunk, need_h,
                  need_w, need_b):
    stat = _stat_dtype(hidden.dtype)
    tokens = target.numel()
    return (
        hidden.new_empty(tokens, dtype=stat),
        hidden.new_empty(hidden.shape) if need_h else hidden.new_empty(0),
        weight.new_empty(weight.shape, dtype=_wgrad_dtype(weight.dtype)) if need_w else weight.new_empty(0),
        hidden.new_empty(weight.shape[0], dtype=stat) if need_b else hidden.new_empty(0, dtype=stat),
    )


@torch.library.custom_op("cutlass_nn::_linear_cross_entropy_backward", mutates_args=())
def _backward_op(
    hidden: Tensor, weight: Tensor, bias: Tensor | None, target: Tensor, grad_loss: Tensor,
    ignore_index: int, label_smoothing: float, chunk: int, need_h: bool, need_w: bool,
    need_b: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """reduction="none": (grad_h, grad_w, grad_b) in the dtypes of hidden / weight / bias (empty
    [0] tensors unless asked for) for per-token incoming gradients grad_loss [tokens] in the
    statistics dtype; the chunks' logits are recomputed."""
    with torch.no_grad():
        _, grad_h, grad_w, grad_b = _run_chunks(
            hidden, weight, bias, target, grad_loss, ignore_index, label_smoothing, chunk,
            need_h, need_w, need_b, keep_loss=False)
    return (
        _placeholder(hidden) if grad_h is None else grad_h,
        _placeholder(weight) if grad_w is None else grad_w.to(weight.dtype),
        _placeholder(hidden) if grad_b is None else grad_b.to(weight.dtype),
    )


@_backward_op.register_fake
def _backward_fake(hidden, weight, bias, target, grad_loss, ignore_index, label_smoothing, chunk,
                   need_h, need_w, need_b):
    return (
        hidden.new_empty(hidden.shape) if need_h else hidden.new_empty(0),
        weight.new_empty(weight.shape) if need_w else weight.new_empty(0),
        hidden.new_empty(weight.shape[0]) if need_b else hidden.new_empty(0),
    )


def _last_read_of_saved_tensors() -> bool:
    """True when this backward is the last that can read the saved tensors: the graph is not
    kept (no retain_graph / create_graph) and nothing is being traced (tracing expresses the
    out-of-place form without a mutation)."""
    if torch.compiler.is_compiling():
        return False
    return not torch.ops.cutlass_nn._autograd_keeps_graph()


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, hidden, weight, bias, target, ignore_index, reduction, label_smoothing, chunk,
        out_dtype, grad_enabled,
    ):
        # needs_input_grad says True under torch.no_grad() too: grad_enabled (the caller's
        # grad mode) keeps an evaluation pass from forming gradients nobody will read
        need_h = grad_enabled and ctx.needs_input_grad[0]
        need_w = grad_enabled and ctx.needs_input_grad[1]
        need_b = grad_enabled and bias is not None and ctx.needs_input_grad[2]
        need_grad = need_h or need_w or need_b
        eager_grads = need_grad and reduction != "none"
        loss_tok, grad_h, grad_w, grad_b = _forward_op(
            hidden, weight, bias, target, ignore_index, label_smoothing, chunk,
            eager_grads and need_h, eager_grads and need_w, eager_grads and need_b,
        )
        stat = loss_tok.dtype
        n_valid = (target != ignore_index).sum()
        if reduction == "none":
            out = loss_tok.reshape(target.shape)
        elif reduction == "sum":
            out = loss_tok.sum()
        else:
            out = loss_tok.sum() / n_valid.to(stat)
        out = out.to(out_dtype)

        ctx.reduction = reduction
        ctx.need = (need_h, need_w, need_b)
        ctx.weight_dtype = weight.dtype
        if eager_grads:
            # mean: every token's gradient is scaled by 1 / n_valid (a tensor: no host sync),
            # applied in the backward together with the incoming gradient (an fp16 loss scale,
            # for instance) in float: folded in before the chunk gradients are rounded to 16
            # bits, it would flush the small ones to zero. With every token ignored the mean is
            # NaN, as in torch, and the gradients are 0.
            if reduction == "mean":
                count = n_valid.to(stat)
                scale = torch.where(count > 0, 1.0 / count.clamp_min(1), torch.zeros_like(count))
            else:
                scale = torch.ones((), dtype=stat, device=loss_tok.device)
            ctx.save_for_backward(grad_h, grad_w, grad_b, scale)
        elif need_grad:
            ctx.args = (ignore_index, label_smoothing, chunk)
            ctx.save_for_backward(hidden, weight, bias, target)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        need_h, need_w, need_b = ctx.need
        dh = dw = db = None
        if ctx.reduction != "none":
            grad_h, grad_w, grad_b, scale = ctx.saved_tensors
            # the incoming gradient times the reduction's scale, in float, applied to the
            # gradients of the summed loss formed in the forward
            factor = grad_out.to(scale.dtype) * scale
            if need_h:
                dh = (grad_h.to(factor.dtype) * factor).to(grad_h.dtype)
            if need_w:
                if grad_w.dtype == ctx.weight_dtype and _last_read_of_saved_tensors():
                    # in place: no second weight-sized buffer at the start of the backward
                    dw = grad_w.mul_(factor)
                else:
                    dw = torch.mul(grad_w, factor).to(ctx.weight_dtype)  # as mul_ rounds
            if need_b:
                db = (grad_b * factor).to(ctx.weight_dtype)
            return dh, dw, db, None, None, None, None, None, None, None
        hidden, weight, bias, target = ctx.saved_tensors
        ignore_index, label_smoothing, chunk = ctx.args
        g = grad_out.reshape(-1).to(_stat_dtype(hidden.dtype)).contiguous()
        gh, gw, gb = _backward_op(
            hidden, weight, bias, target, g, ignore_index, label_smoothing, chunk,
            need_h, need_w, need_b,
        )
        return (gh if need_h else None, gw if need_w else None, gb if need_b else None,
                None, None, None, None, None, None, None)


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
        chunk_size: tokens per chunk; None picks about 512 MiB of logits per chunk
            (:data:`DEFAULT_CHUNK_BYTES`).

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
    chunk = _chunk_rows(target.numel(), weight.shape[0], weight.element_size(), chunk_size)
    with torch.autocast(device_type, enabled=False):
        # autocast runs cross_entropy in float32: under it the loss comes back in float32 (it is
        # computed in float32); otherwise in hidden's dtype, as the unfused head's
        out_dtype = torch.float32 if autocast and hidden.dtype != torch.float64 else hidden.dtype
        return _LinearCrossEntropy.apply(
            hidden, weight, bias, target, int(ignore_index), reduction, float(label_smoothing),
            chunk, out_dtype, torch.is_grad_enabled(),
        )
