"""Drop-in ``nn.Module`` layers backed by the cutlass_nn operators."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from cutlass_nn import functional as F
from cutlass_nn.ops import ACTIVATIONS

_linear = torch.ops.cutlass_nn.linear.default
_linear_act = torch.ops.cutlass_nn.linear_act.default
_add2 = torch.ops.cutlass_nn.add2.default
_rms_norm = torch.ops.cutlass_nn.rms_norm.default
_add_rms_norm = torch.ops.cutlass_nn.add_rms_norm.default

__all__ = ["CutlassLinear", "Add2", "RMSNorm", "AddRMSNorm"]


def _check_activation(where: str, activation) -> str | None:
    """None or one of ACTIVATIONS (``"none"`` normalized to None), else a ValueError."""
    if activation is None or (isinstance(activation, str) and activation in ACTIVATIONS):
        return None if activation == "none" else activation
    allowed = ", ".join(f'"{a}"' for a in ACTIVATIONS)
    raise ValueError(
        f"cutlass_nn.{where}: argument 'activation' must be None or one of {allowed}, "
        f"got {activation!r}"
    )


def _copy_hooks(src: nn.Module, dst: nn.Module) -> None:
    """Give ``dst`` the forward / backward hooks of ``src`` (the module it replaces).

    Each hook dict comes with its flag dicts (with_kwargs / always_call) and, for backward
    hooks, the full-vs-legacy flag: without them a with_kwargs hook is called with the wrong
    signature and full backward hooks are silently never called."""
    for hooks in (
        "_forward_hooks",
        "_forward_hooks_with_kwargs",
        "_forward_hooks_always_called",
        "_forward_pre_hooks",
        "_forward_pre_hooks_with_kwargs",
        "_backward_hooks",
        "_backward_pre_hooks",
    ):
        getattr(dst, hooks).update(getattr(src, hooks))
    dst._is_full_backward_hook = src._is_full_backward_hook


class CutlassLinear(nn.Linear):
    """Drop-in for ``torch.nn.Linear`` whose forward and backward run on cutlass_nn kernels.

    Same constructor, parameters (``weight`` [out_features, in_features], ``bias``
    [out_features]), default initialization, ``state_dict`` keys and ``repr`` as ``nn.Linear``
    (it subclasses it, so ``isinstance(layer, nn.Linear)`` stays true and a ``state_dict`` moves
    between the two with ``strict=True``).

    Args:
        in_features: size of each input sample.
        out_features: size of each output sample.
        bias: whether to learn an additive bias.
        device, dtype: factory arguments for the parameters.
        activation: ``None`` (default; plain linear), ``"relu"``, ``"gelu"`` or ``"gelu_tanh"``:
            the layer computes ``act(input @ weight.T + bias)`` with the activation fused into
            the GEMM epilogue (``F.relu``, ``F.gelu(approximate="none")``,
            ``F.gelu(approximate="tanh")``). ``"none"`` is stored as None. Kept in the
            attribute ``activation`` and shown in the ``repr``; it is not part of the
            ``state_dict``, which stays ``nn.Linear``'s.

    Shape:
        input ``[*, in_features]`` (empty batches allowed) -> output ``[*, out_features]``.
    """

    #: None or one of "relu", "gelu", "gelu_tanh" (a class default, so that layers pickled
    #: before the attribute existed still load).
    activation: str | None = None

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        device=None,
        dtype=None,
        activation: str | None = None,
    ) -> None:
        # validated first: a bad value fails before any parameter is allocated
        act = _check_activation("CutlassLinear", activation)
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.activation = act

    def forward(self, input: Tensor) -> Tensor:
        # One operator call (autocast, autograd and the kernel run in C++); with an activation,
        # linear_act, whose autograd kernel keeps the pre-activation when it is needed.
        if self.activation is None:
            return _linear(input, self.weight, self.bias)
        return _linear_act(input, self.weight, self.bias, self.activation)

    def extra_repr(self) -> str:
        text = super().extra_repr()
        if self.activation is not None:
            text += f", activation={self.activation!r}"
        return text

    @classmethod
    def from_linear(cls, linear: nn.Linear, activation: str | None = None) -> "CutlassLinear":
        """A ``CutlassLinear`` that shares ``linear``'s parameters (no copy), with an optional
        fused ``activation`` (as in the constructor).

        Training mode and forward hooks of ``linear`` are carried over, so swapping the module
        into a model changes nothing but the kernels that run (and, with ``activation``, adds
        the activation after the linear map).
        """
        if not isinstance(linear, nn.Linear):
            raise TypeError(
                f"cutlass_nn.CutlassLinear.from_linear: argument 'linear' must be an nn.Linear, "
                f"got {type(linear).__name__}"
            )
        act = _check_activation("CutlassLinear.from_linear", activation)
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        layer.activation = act
        layer.in_features = linear.in_features
        layer.out_features = linear.out_features
        layer.weight = linear.weight
        layer.register_parameter("bias", linear.bias)
        layer.train(linear.training)
        _copy_hooks(linear, layer)
        return layer


class Add2(nn.Module):
    """Elementwise ``a + b`` of two same-shape tensors as a module (forward and backward on
    cutlass_nn kernels)."""

    def forward(self, a: Tensor, b: Tensor) -> Tensor:
        return _add2(a, b)



_HALF = (torch.float16, torch.bfloat16)
_FLOAT = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _norm_fits(input: Tensor, weight: Tensor | None) -> bool:
    """Whether the fused kernels take (input, weight): a floating input, a weight of its dtype
    (or float32 beside 16-bit input) on its device."""
    return (
        weight is not None
        and input.dtype in _FLOAT
        and (weight.dtype == input.dtype or (input.dtype in _HALF and weight.dtype == torch.float32))
        and weight.device == input.device
        and input.dim() >= 1
    )


class RMSNorm(nn.RMSNorm):
    """Drop-in for ``torch.nn.RMSNorm`` (and, through :meth:`from_module`, for the RMSNorm of
    Llama-style ``transformers`` models) whose forward and backward are one cutlass_nn kernel
    each: float32 statistics, the output rounded once.

    Same constructor, parameter (``weight``), ``state_dict`` and ``repr`` as ``nn.RMSNorm``.
    Normalizing over the last dimension with a weight whose dtype is the input's (or float32
    beside 16-bit input) runs the fused operator; anything else (several normalized
    dimensions, ``elementwise_affine=False``, mixed dtypes the kernel does not take) computes
    what the original module computes, with torch ops.
    """

    #: how the fallback computes: "torch" (F.rms_norm) or "llama" (``transformers``' formula:
    #: ``weight * (x.float() * rsqrt(var + eps)).to(x.dtype)``).
    _fallback: str = "torch"

    def forward(self, input: Tensor) -> Tensor:
        weight = self.weight
        if len(self.normalized_shape) == 1 and _norm_fits(input, weight):
            eps = torch.finfo(input.dtype).eps if self.eps is None else self.eps
            return _rms_norm(input, weight, eps)[0]
        if self._fallback == "llama":
            x = input.to(torch.float32)
            x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
            return weight * x.to(input.dtype)
        return nn.functional.rms_norm(input, self.normalized_shape, weight, self.eps)

    @classmethod
    def from_module(cls, norm: nn.Module) -> "RMSNorm":
        """An ``RMSNorm`` sharing ``norm``'s weight (no copy): ``norm`` is an ``nn.RMSNorm``
        (with a weight) or a Llama-style RMSNorm of ``transformers`` (a ``weight`` of shape
        ``[features]`` and a float ``variance_epsilon``). Training mode and hooks are carried
        over; the ``state_dict`` keys stay ``weight``."""
        if isinstance(norm, nn.RMSNorm):
            if norm.weight is None:
                raise TypeError(
                    "cutlass_nn.RMSNorm.from_module: argument 'norm' must have a weight "
                    "(elementwise_affine=True), got an nn.RMSNorm without one"
                )
            shape, eps, fallback = tuple(norm.normalized_shape), norm.eps, "torch"
        elif isinstance(getattr(norm, "weight", None), torch.Tensor) and isinstance(
            getattr(norm, "variance_epsilon", None), float
        ):
            if norm.weight.dim() != 1:
                raise TypeError(
                    "cutlass_nn.RMSNorm.from_module: argument 'norm' must have a 1-D weight, "
                    f"got shape {list(norm.weight.shape)}"
                )
            shape, eps, fallback = (norm.weight.shape[0],), norm.variance_epsilon, "llama"
        else:
            raise TypeError(
                "cutlass_nn.RMSNorm.from_module: argument 'norm' must be an nn.RMSNorm or a "
                "Llama-style RMSNorm (weight and variance_epsilon), got "
                f"{type(norm).__module__}.{type(norm).__qualname__}"
            )
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        layer.normalized_shape = shape
        layer.eps = eps
        layer.elementwise_affine = True
        layer.weight = norm.weight
        layer._fallback = fallback
        layer.train(norm.training)
        _copy_hooks(norm, layer)
        return layer


class AddRMSNorm(nn.Module):
    """The residual add of a pre-norm transformer block fused with the RMSNorm after it:
    ``forward(x, residual) -> (rms_norm(x + residual), x + residual)``, one kernel each way
    (:func:`cutlass_nn.functional.add_rms_norm`).

    Args:
        hidden_size: the normalized (last) dimension.
        eps: added to the mean square; None is the input dtype's machine epsilon.
        device, dtype: factory arguments for ``weight`` (initialized to ones).
    """

    def __init__(self, hidden_size: int, eps: float | None = 1e-6, device=None, dtype=None):
        super().__init__()
        self.hidden_size = int(hidden_size)
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(self.hidden_size, device=device, dtype=dtype))

    def forward(self, x: Tensor, residual: Tensor) -> tuple[Tensor, Tensor]:
        return F.add_rms_norm(x, residual, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.hidden_size}, eps={self.eps}"
