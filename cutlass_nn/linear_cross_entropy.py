"""Linear + cross-entropy for language-model heads without the full logits.

``linear_cross_entropy(hidden, weight, target)`` is ``F.cross_entropy(F.linear(hidden, weight,
bias), target)``, computed over chunks of tokens. For each chunk: the logits GEMM (cutlass_nn's
``linear``, logits in the weight's dtype as the unfused head has them), then one kernel
(``ops.cross_entropy_rows_``) that computes each token's float32 log-sum-exp and loss and, when
gradients are needed, writes the logit gradient ``softmax - target distribution`` over the
chunk's logits; then the hidden-state gradient GEMM (``linear_dgrad``) and the weight gradient,
accumulated over the chunks in place (``linear_wgrad_accumulate_``: in the weight's dtype
for float32 / float64 weights and for bfloat16 ones over at most ``MAX_LOW_PRECISION_CHUNKS``
chunks, in float32 otherwise: float16's range is too small for sums over many tokens, and each
bfloat16 chunk adds one rounding). So no ``[tokens, vocab]`` tensor exists, and for a reduced loss (``"mean"``
/ ``"sum"``) the three GEMMs of the unfused head are not repeated: the backward only scales the
stored gradients by the incoming scalar (in place in eager mode, with ``ops.scale_``, which
reads the scalar on the device and skips the pass when it is 1). For ``"mean"`` the 1 / tokens
factor is folded into the logit gradient by the row kernel (except for float16, whose range
would flush small gradients to zero), so after a plain ``loss.backward()`` the backward makes no
pass over the weight gradient at all. With ``reduction="none"`` the
incoming gradient is per token, so the backward recomputes the chunks' logits.

The loss is a custom operator (``cutlass_nn::_linear_cross_entropy``, its chunk loop opaque
to ``torch.compile``) with its autograd formula registered on it (first derivatives only);
the recomputing backward of ``reduction="none"`` is a second one
(``cutlass_nn::_linear_cross_entropy_backward``).
"""

from __future__ import annotations

import contextlib

import torch
from torch import Tensor
from cutlass_nn import _checks
from cutlass_nn import ops
from cutlass_nn.ops import _stat_dtype

__all__ = ["linear_cross_entropy", "REDUCTIONS", "DEFAULT_CHUNK_BYTES", "MAX_LOW_PRECISION_CHUNKS"]

#: ``reduction`` values, as for ``F.cross_entropy``
REDUCTIONS = ("mean", "sum", "none")
#: the default chunk holds about this many bytes of logits in the weight's dtype (512 MiB: 2048
#: tokens at a 128k vocabulary in bfloat16); the count is rounded down to a multiple of 128
#: tokens (the GEMM tile height) when it is larger than that
DEFAULT_CHUNK_BYTES = 512 << 20

#: at most this many chunks accumulate a bfloat16 weight gradient in bfloat16 (each adds one
#: rounding of the running sum: at 8 chunks the error is about twice the unfused head's single
#: rounding); more chunks accumulate in float32
MAX_LOW_PRECISION_CHUNKS = 8

_FLOAT = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _fail(arg: str, msg: str):
    raise ValueError(f"cutlass_nn.linear_cross_entropy: argument '{arg}' {msg}")


def _check_options(where: str, ignore_index, reduction, label_smoothing,
                   chunk_size) -> tuple[int, str, float, int | None]:
    """The options as the operators take them, checked (``cutlass_nn.<where>`` in the messages):
    no float ``ignore_index`` truncated by int() or string ``label_smoothing`` parsed by float(),
    and each within what the int64 / float arguments of the operators hold."""
    ignore_index = _checks.check_int(where, "ignore_index", ignore_index, _checks.INT64_MIN,
                                     _checks.INT64_MAX, expected=_checks.INT64_TEXT)
    if not isinstance(reduction, str) or reduction not in REDUCTIONS:
        raise _checks.fail(ValueError, where, "reduction",
                           f"one of {', '.join(map(repr, REDUCTIONS))}", repr(reduction))
    smoothing = _checks.check_real(where, "label_smoothing", label_smoothing)
    if not 0.0 <= smoothing <= 1.0:
        raise _checks.fail(ValueError, where, "label_smoothing", "in [0, 1]", repr(label_smoothing))
    if chunk_size is not None:
        chunk_size = _checks.check_int(where, "chunk_size", chunk_size, minimum=1,
                                       expected="None or a positive int")
    return ignore_index, reduction, smoothing, chunk_size


def _check(hidden, weight, target, bias) -> None:
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
    if weight.shape[0] < 1:
        _fail("weight", f"must have at least one row (vocab >= 1), got shape {list(weight.shape)}")
    if weight.dtype != hidden.dtype:
        _fail("weight", f"must have the dtype of 'hidden' ({hidden.dtype}), got {weight.dtype}")
    if weight.device != hidden.device or target.device != hidden.device:
        bad, given = (("weight", weight.device) if weight.device != hidden.device
                      else ("target", target.device))
        _fail(bad, f"must be on the device of 'hidden' ({hidden.device}), got {given}")
    if target.dtype != torch.int64:
        _fail("target", f"must be an int64 tensor of class indices, got {target.dtype}")
    if tuple(target.shape) != tuple(hidden.shape[:-1]):
        _fail(
            "target",
            f"must have the leading shape of 'hidden' {list(hidden.shape[:-1])}, got "
            f"{list(target.shape)}",
        )
    if bias is not None:
        if not isinstance(bias, Tensor):
            raise TypeError(
                f"cutlass_nn.linear_cross_entropy: argument 'bias' must be None or a Tensor, got "
                f"{type(bias).__name__}"
            )
        if bias.shape != (weight.shape[0],):
            _fail("bias", f"must be None or a tensor of shape [{weight.shape[0]}], got "
                          f"{list(bias.shape)}")
        if bias.dtype != hidden.dtype or bias.device != hidden.device:
            _fail(
                "bias",
                f"must have the dtype and device of 'hidden' ({hidden.dtype}, {hidden.device}), "
                f"got {bias.dtype}, {bias.device}",
            )


def _chunk_rows(tokens: int, vocab: int, element_size: int, chunk_size: int | None) -> int:
    if chunk_size is not None:
        return chunk_size
    rows = max(1, DEFAULT_CHUNK_BYTES // (element_size * max(vocab, 1)))
    if rows > 128:
        rows -= rows % 128
    return max(1, min(max(tokens, 1), rows))


def _chunk_count(tokens: int, chunk: int) -> int:
    return -(-tokens // chunk)


def _wgrad_dtype(dtype: torch.dtype, chunks: int) -> torch.dtype:
    """The weight-gradient accumulator's dtype. float16's range is too small for sums over many
    tokens: float32. bfloat16 has float32's range but 8 bits of mantissa, and each chunk adds one
    rounding of the running sum: bfloat16 (no weight-sized float32 buffer) up to
    MAX_LOW_PRECISION_CHUNKS chunks, float32 beyond (where the unfused head's logits would be
    far larger than that buffer)."""
    if dtype == torch.float16 or (dtype == torch.bfloat16 and chunks > MAX_LOW_PRECISION_CHUNKS):
        return torch.float32
    return dtype


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
        ops.mm_out(dz, weight, grad_h[rows])  # the dgrad GEMM writes the chunk's rows in place
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
    # contiguous whatever hidden's layout: the chunks' dgrad writes its rows, scale_ scales it
    grad_h = torch.empty(h.shape, dtype=h.dtype, device=h.device) if need_h else None
    wgrad_dtype = _wgrad_dtype(weight.dtype, _chunk_count(tokens, chunk))
    grad_w = weight.new_empty(0, dtype=wgrad_dtype) if need_w else None
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


@torch.library.custom_op("cutlass_nn::_linear_cross_entropy", mutates_args=())
def _loss_op(
    hidden: Tensor, weight: Tensor, bias: Tensor | None, target: Tensor, ignore_index: int,
    reduction: str, label_smoothing: float, chunk: int, need_h: bool, need_w: bool, need_b: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(loss, grad_h, grad_w, grad_b, scale). loss: reduced as asked (``[*]`` for "none"), in the
    statistics dtype. For "mean" / "sum" and each need_* flag, the gradient of the reduced loss
    up to a factor (grad_w in _wgrad_dtype, grad_b in the statistics dtype), else an empty [0]
    tensor; scale: that factor (1 / the number of counted tokens for "mean" with float16
    inputs, whose gradients are of the summed loss; 1 otherwise). What the autograd formula
    below saves."""
    eager_grads = reduction != "none"
    stat = _stat_dtype(hidden.dtype)
    with torch.no_grad():
        count = (target != ignore_index).sum().to(stat)
        ones = torch.ones((), dtype=stat, device=hidden.device)
        # a tensor: no host sync; the gradients are 0 with every token ignored
        inv_count = torch.where(count > 0, 1.0 / count.clamp_min(1), torch.zeros_like(count))
        # "mean": the row kernel scales each logit gradient by 1 / count before rounding it
        # (float16 would flush small ones to zero: there the backward scales the float32 sums)
        fold = reduction == "mean" and hidden.dtype != torch.float16
        row_scale = inv_count.expand(target.numel()).contiguous() if fold else None
        loss_tok, grad_h, grad_w, grad_b = _run_chunks(
            hidden, weight, bias, target, row_scale, ignore_index, label_smoothing, chunk,
            eager_grads and need_h, eager_grads and need_w, eager_grads and need_b, keep_loss=True)
        if reduction == "none":
            out = loss_tok.reshape(target.shape)
        elif reduction == "sum":
            out = loss_tok.sum()
        else:
            out = loss_tok.sum() / count  # NaN with every token ignored, as in torch
        scale = inv_count if reduction == "mean" and not fold else ones
    return (
        out,
        _placeholder(hidden) if grad_h is None else grad_h,
        _placeholder(weight) if grad_w is None else grad_w,
        _placeholder(loss_tok) if grad_b is None else grad_b,
        scale,
    )


@_loss_op.register_fake
def _loss_fake(hidden, weight, bias, target, ignore_index, reduction, label_smoothing, chunk,
               need_h, need_w, need_b):
    stat = _stat_dtype(hidden.dtype)
    eager = reduction != "none"
    return (
        hidden.new_empty(target.shape if reduction == "none" else (), dtype=stat),
        hidden.new_empty(hidden.shape) if eager and need_h else hidden.new_empty(0),
        weight.new_empty(weight.shape, dtype=_wgrad_dtype(weight.dtype, _chunk_count(target.numel(), chunk)))
        if eager and need_w
        else weight.new_empty(0),
        hidden.new_empty(weight.shape[0], dtype=stat) if eager and need_b
        else hidden.new_empty(0, dtype=stat),
        hidden.new_empty((), dtype=stat),
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


def _setup_context(ctx, inputs, output):
    hidden, weight, bias, target, ignore_index, reduction, label_smoothing, chunk = inputs[:8]
    need_h, need_w, need_b = inputs[8:]
    # the saved-gradient outputs never receive gradients: no zero tensors of their sizes (a
    # weight-sized one among them) for the backward to ignore
    ctx.set_materialize_grads(False)
    ctx.reduction = reduction
    ctx.need = (need_h, need_w, need_b)
    ctx.weight_dtype = weight.dtype
    if reduction != "none":
        _, grad_h, grad_w, grad_b, scale = output
        ctx.save_for_backward(grad_h, grad_w, grad_b, scale)
    else:
        ctx.args = (ignore_index, label_smoothing, chunk)
        ctx.save_for_backward(hidden, weight, bias, target)


def _scaled(grad: Tensor, factor: Tensor, in_place: bool) -> Tensor:
    """grad * factor (0-dim, statistics dtype), formed in float and rounded once (torch.mul
    would round the factor to grad's 16-bit dtype first); in place (``ops.scale_``) when
    allowed."""
    if torch.compiler.is_compiling():  # one fused pointwise kernel, no mutation to trace
        return (grad.to(factor.dtype) * factor).to(grad.dtype)
    out = grad if in_place and grad.is_contiguous() else grad.clone(memory_format=torch.contiguous_format)
    ops.scale_(out, factor)
    return out


@_checks.first_derivative_only("linear_cross_entropy")  # no second derivative through it
def _backward(ctx, grad_out, *_unused_output_grads):
    need_h, need_w, need_b = ctx.need
    dh = dw = db = None
    if grad_out is None:  # not materialized: nothing reached the loss
        pass
    elif ctx.reduction != "none":
        grad_h, grad_w, grad_b, scale = ctx.saved_tensors
        # the incoming gradient (an fp16 loss scale, for instance) times the saved factor (1, or
        # 1 / tokens for float16, whose saved gradients are of the summed loss), in float
        factor = grad_out.to(scale.dtype) * scale
        # in place when no later backward can read the saved gradients: no second weight-sized
        # buffer at the start of the backward, and scale_ reads the factor on the device and
        # makes no pass at all when it is 1 (a plain loss.backward() of a "mean" or "sum" loss)
        in_place = _last_read_of_saved_tensors()
        if need_h:
            dh = _scaled(grad_h, factor, in_place)
        if need_w:
            dw = _scaled(grad_w, factor, in_place).to(ctx.weight_dtype)
        if need_b:
            db = (grad_b * factor).to(ctx.weight_dtype)
    else:
        hidden, weight, bias, target = ctx.saved_tensors
        ignore_index, label_smoothing, chunk = ctx.args
        g = grad_out.reshape(-1).to(_stat_dtype(hidden.dtype)).contiguous()
        gh, gw, gb = _backward_op(
            hidden, weight, bias, target, g, ignore_index, label_smoothing, chunk,
            need_h, need_w, need_b,
        )
        dh, dw, db = (gh if need_h else None, gw if need_w else None, gb if need_b else None)
    return dh, dw, db, None, None, None, None, None, None, None, None


_loss_op.register_autograd(_backward, setup_context=_setup_context)


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
    ``F.cross_entropy``. First derivatives only: a backward with ``create_graph=True`` raises a
    RuntimeError (no second derivative).

    With a ``transformers`` causal LM, take the hidden states of the base model and the head's
    weight, and shift the labels by one::

        hidden = model.model(input_ids=ids).last_hidden_state      # [batch, seq, hidden]
        loss = linear_cross_entropy(hidden[:, :-1], model.lm_head.weight, ids[:, 1:])
    """
    ignore_index, reduction, label_smoothing, chunk_size = _check_options(
        "linear_cross_entropy", ignore_index, reduction, label_smoothing, chunk_size)
    device_type = hidden.device.type if isinstance(hidden, Tensor) else "cpu"
    low = ops._autocast_dtype(device_type)
    autocast = low is not None
    if autocast:
        # as F.linear under autocast: floating arguments other than float64 in the autocast dtype

        def cast(t):
            if isinstance(t, Tensor) and t.is_floating_point() and t.dtype != torch.float64:
                return t.to(low)
            return t

        hidden, weight, bias = cast(hidden), cast(weight), cast(bias)
    _check(hidden, weight, target, bias)
    chunk = _chunk_rows(target.numel(), weight.shape[0], weight.element_size(), chunk_size)
    # (no autocast context where autocast is off: torch.autocast raises for the meta device)
    with torch.autocast(device_type, enabled=False) if autocast else contextlib.nullcontext():
        # autocast runs cross_entropy in float32: under it the loss comes back in float32 (it is
        # computed in float32); otherwise in hidden's dtype, as the unfused head's
        out_dtype = torch.float32 if autocast and hidden.dtype != torch.float64 else hidden.dtype
        # what needs a gradient, decided here (requires_grad and grad mode) so that an
        # evaluation pass forms none
        grad_mode = torch.is_grad_enabled()
        need_h = grad_mode and hidden.requires_grad
        need_w = grad_mode and weight.requires_grad
        need_b = grad_mode and bias is not None and bias.requires_grad
        out = _loss_op(
            hidden, weight, bias, target, ignore_index, reduction, label_smoothing,
            chunk, need_h, need_w, need_b,
        )[0]
        return out.to(out_dtype)
