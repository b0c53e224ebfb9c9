"""Fused weight-gradient accumulation (opt-in, process-wide).

When gradients accumulate over micro-batches (no ``zero_grad`` between backward passes), autograd
normally has each linear layer's backward write a new weight gradient, which ``AccumulateGrad``
then adds into ``weight.grad``: an extra ``[out, in]`` buffer and an extra pass over it per layer
and micro-batch. With fused accumulation on, the weight-gradient GEMM adds into the existing
``weight.grad`` itself (``ops.linear_wgrad_accumulate_``, beta = 1) and autograd receives no
separate gradient for the weight.

It applies to :class:`cutlass_nn.CutlassLinear` / ``functional.linear`` (with or without a fused
activation) and :class:`cutlass_nn.GatedMLP` / ``functional.gated_mlp`` when the weight is a
plain leaf whose ``.grad`` already exists (the first micro-batch after
``zero_grad(set_to_none=True)`` takes the usual path), with the weight's shape, dtype and device,
in a plain ``backward()`` (``torch.autograd.grad`` and ``inputs=`` take the usual path); not while building a graph of the gradient (``create_graph``), and not when something
would observe the weight's gradient before accumulation (a tensor hook or ``retain_grad`` on the
weight): those cases take the usual path, so results never change, only where the sum is formed.
The weight's ``AccumulateGrad`` node still runs and fires its post hooks, so DDP (including
``no_sync`` micro-batches and ``gradient_as_bucket_view``) and ``register_post_accumulate_grad_hook``
see the accumulated gradient. Under ``torch.compile`` the compiled backward takes the usual path.

Main-gradient buffers (:func:`attach_main_grads`): every trainable parameter gets a
``p.main_grad`` buffer (float32 for 16-bit and float32 parameters) that its gradients accumulate
into instead of ``p.grad``, which stays ``None``. The weight-gradient GEMMs of ``linear``,
``linear_act`` and ``gated_mlp`` add into it directly (beta = 1, float32 accumulators added to the
float32 buffer: one rounding fewer per micro-batch than 16-bit ``.grad`` accumulation, and no
16-bit gradient at all), from the first micro-batch on, whether or not the switch above is on;
every other gradient (biases, norms, embeddings, the usual-path cases) is formed as usual and
folded into the buffer by a post-accumulate-grad hook.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch import nn

from cutlass_nn import _extension  # noqa: F401  (loads the operators)

__all__ = [
    "attach_main_grads",
    "detach_main_grads",
    "fused_wgrad_accumulation",
    "fused_wgrad_accumulation_enabled",
    "set_fused_wgrad_accumulation",
]


def _check_module(name: str, module) -> None:
    if not isinstance(module, nn.Module):
        raise TypeError(
            f"cutlass_nn.{name}: argument 'module' must be a torch.nn.Module, got "
            f"{type(module).__qualname__}"
        )


def _check_bool(name: str, value) -> None:
    if not isinstance(value, bool):
        raise TypeError(
            f"cutlass_nn.{name}: argument 'enabled' must be a bool, got {type(value).__qualname__}"
        )


def set_fused_wgrad_accumulation(enabled: bool) -> bool:
    """Turn fused weight-gradient accumulation on or off for the whole process (every thread);
    returns the previous setting."""
    _check_bool("set_fused_wgrad_accumulation", enabled)
    return bool(torch.ops.cutlass_nn._fused_wgrad_accumulation(1 if enabled else 0))


def fused_wgrad_accumulation_enabled() -> bool:
    """Whether fused weight-gradient accumulation is on (off by default)."""
    return bool(torch.ops.cutlass_nn._fused_wgrad_accumulation(-1))


@contextlib.contextmanager
def fused_wgrad_accumulation(enabled: bool = True) -> Iterator[None]:
    """Context manager: fused weight-gradient accumulation on (or off) inside, the previous
    setting restored on exit. Process-wide, like :func:`set_fused_wgrad_accumulation`."""
    _check_bool("fused_wgrad_accumulation", enabled)
    previous = set_fused_wgrad_accumulation(enabled)
    try:
        yield
    finally:
        set_fused_wgrad_accumulation(previous)


_HOOK_ATTR = "_cutlass_nn_main_grad_hook"
#: the buffer of a parameter whose dtype no weight-gradient GEMM takes (complex): the fold-in
#: hook's alone, not registered with the operators (cutlass_nn._set_main_grad refuses it)
_HOOK_ONLY_BUFFER_ATTR = "_cutlass_nn_hook_only_main_grad"
_GEMM_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _main_grad_dtype(p: torch.Tensor) -> torch.dtype:
    return torch.promote_types(p.dtype, torch.float32)


def _fold_into_main_grad(p: torch.Tensor) -> None:
    """Post-accumulate-grad hook: a gradient that autograd formed as usual goes into the
    parameter's main-gradient buffer (the fused GEMMs have already written theirs there)."""
    grad = p.grad
    if grad is None:
        return
    buffer = getattr(p, _HOOK_ONLY_BUFFER_ATTR, None)
    if buffer is None:
        buffer = torch.ops.cutlass_nn._main_grad(p)
    if buffer is None or getattr(p, "main_grad", None) is not buffer:
        raise RuntimeError(
            "cutlass_nn.attach_main_grads: a parameter's 'main_grad' was replaced or deleted "
            "after attach_main_grads; change main-gradient buffers only with "
            "cutlass_nn.detach_main_grads / attach_main_grads"
        )
    if grad.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr():
        raise RuntimeError(
            "cutlass_nn.attach_main_grads: a parameter's .grad shares memory with its main_grad "
            "at backward time (e.g. p.grad = p.main_grad.to(p.dtype) for a float32 parameter, "
            "left set after the optimizer step); set p.grad = None (optimizer.zero_grad()) "
            "before the next backward"
        )
    buffer.add_(grad.detach())
    p.grad = None


def _attach(p: nn.Parameter, buffer: torch.Tensor) -> None:
    # registered first: _set_main_grad checks the buffer (cutlass_nn._set_main_grad: the
    # weight's shape and device, contiguous, the weight's dtype or float32 beside a 16-bit
    # weight), and a refused buffer must leave p.grad where it was. A parameter whose dtype no
    # GEMM takes (complex) gets a buffer that only the fold-in hook fills: not registered.
    if p.dtype in _GEMM_DTYPES:
        torch.ops.cutlass_nn._set_main_grad(p, buffer)
    else:
        setattr(p, _HOOK_ONLY_BUFFER_ATTR, buffer)
    if p.grad is not None:  # a gradient from before: it moves into the buffer
        buffer.add_(p.grad.detach())
        p.grad = None
    p.main_grad = buffer
    setattr(p, _HOOK_ATTR, p.register_post_accumulate_grad_hook(_fold_into_main_grad))


def attach_main_grads(module: nn.Module) -> dict[str, torch.Tensor]:
    """Give every trainable parameter of ``module`` a main-gradient buffer ``p.main_grad``
    (zeros; float32 for float16 / bfloat16 / float32 parameters, the parameter's dtype
    otherwise) that its gradients accumulate into; ``p.grad`` stays ``None``.

    The weight-gradient GEMMs of :class:`CutlassLinear` / ``functional.linear`` (with or
    without an activation) and of :class:`GatedMLP` add into the buffer directly (a GatedMLP's
    gate and up buffers are the two halves of one ``[2n, in]`` buffer, so that one GEMM serves
    both), under the same conditions as fused accumulation (no ``create_graph``, no tensor hook
    on the weight, no dispatch mode, eager backward); every other gradient is formed as usual
    and added into the buffer by a post-accumulate-grad hook, so the buffers always hold the
    sum of all backward passes since they were zeroed. Zero them yourself between steps
    (``p.main_grad.zero_()``), and step an optimizer on them (for example over float32 master
    copies of the parameters, or after ``p.grad = p.main_grad.to(p.dtype)``).

    ``p.grad`` must be ``None`` when a backward pass starts: whatever it holds then is folded
    into the buffer (``optimizer.zero_grad()`` after the step does it; a ``.grad`` that shares
    memory with the buffer is an error). A gradient present at attach time moves into the new
    buffer. ``torch.autograd.grad`` returns gradients and leaves the buffers alone;
    ``backward(inputs=...)`` adds into the named parameters' buffers through the hook.
    Layers under activation checkpointing or saved-tensor hooks take the usual path (folded by the hook: same values, no fused GEMM). Parameters that
    already have a buffer keep it (calling this twice is harmless). Not for DDP / FSDP: they
    reduce ``.grad``, and FSDP2's sharded parameters (DTensor) are refused with a TypeError;
    reduce the buffers yourself. Not for concurrent backward passes over shared parameters
    from several threads. Returns the buffers by parameter name. Undo with
    :func:`detach_main_grads`.
    """
    _check_module("attach_main_grads", module)
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(module, DistributedDataParallel):
        raise TypeError(
            "cutlass_nn.attach_main_grads: argument 'module' must not be DistributedDataParallel "
            "(it reduces .grad, which main-gradient buffers leave None)"
        )
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # a torch without distributed support has no DTensor
        DTensor = ()
    for name, p in module.named_parameters():
        if isinstance(p, DTensor):
            raise TypeError(
                "cutlass_nn.attach_main_grads: parameter "
                f"'{name}' is a sharded DTensor (FSDP2 / tensor parallel), which main-gradient "
                "buffers do not support"
            )
    from cutlass_nn.modules import GatedMLP

    done: set[int] = set()
    for sub in module.modules():
        if not isinstance(sub, GatedMLP):
            continue
        gate, up = sub.gate_proj.weight, sub.up_proj.weight
        if (gate is not up and gate.requires_grad and up.requires_grad and gate.shape == up.shape
                and gate.dtype == up.dtype and gate.device == up.device
                and not hasattr(gate, _HOOK_ATTR) and not hasattr(up, _HOOK_ATTR)):
            both = torch.zeros((2 * gate.shape[0],) + tuple(gate.shape[1:]),
                               dtype=_main_grad_dtype(gate), device=gate.device)
            _attach(gate, both[: gate.shape[0]])
            _attach(up, both[gate.shape[0]:])
            done.update((id(gate), id(up)))
    buffers = {}
    for name, p in module.named_parameters():
        if not p.requires_grad:
            continue
        if id(p) not in done and not hasattr(p, _HOOK_ATTR):
            _attach(p, torch.zeros(p.shape, dtype=_main_grad_dtype(p), device=p.device))
        buffers[name] = p.main_grad
    return buffers


def detach_main_grads(module: nn.Module) -> None:
    """Undo :func:`attach_main_grads` for ``module``'s parameters: gradients go to ``.grad``
    again, and the ``main_grad`` attributes and hooks are removed (the buffers themselves are
    left to whoever still holds them)."""
    _check_module("detach_main_grads", module)
    for p in module.parameters():
        handle = getattr(p, _HOOK_ATTR, None)
        if handle is None:
            continue
        handle.remove()
        delattr(p, _HOOK_ATTR)
        if hasattr(p, _HOOK_ONLY_BUFFER_ATTR):
            delattr(p, _HOOK_ONLY_BUFFER_ATTR)
        else:
            torch.ops.cutlass_nn._set_main_grad(p, None)
        if hasattr(p, "main_grad"):
            del p.main_grad
