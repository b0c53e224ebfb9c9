"""Drop-in ``nn.Module`` layers backed by the cutlass_nn operators."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from cutlass_nn import functional as F
from cutlass_nn.ops import ACTIVATIONS

_linear = torch.ops.cutlass_nn.linear.default
_linear_act = torch.ops.cutlass_nn.linear_act.default
_add2 = torch.ops.cutlass_nn.add2.default

__all__ = ["CutlassLinear", "Add2"]


def _check_activation(where: str, activation) -> str | None:
    """None or one of ACTIVATIONS (``"none"`` normalized to None), else a ValueError."""
    if activation is None or (isinstance(activation, str) and activation in ACTIVATIONS):
        return None if activation == "none" else activation
    allowed = ", ".join(f'"{a}"' for a in ACTIVATIONS)
    raise ValueError(
        f"cutlass_nn.{where}: argument 'activation' must be None or one of {allowed}, "
        f"got {activation!r}"
    )


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
        # Each hook dict comes with its flag dicts (with_kwargs / always_call) and, for backward
        # hooks, the full-vs-legacy flag: without them a with_kwargs hook is called with the
        # wrong signature and full backward hooks are silently never called.
        for hooks in (
            "_forward_hooks",
            "_forward_hooks_with_kwargs",
            "_forward_hooks_always_called",
            "_forward_pre_hooks",
            "_forward_pre_hooks_with_kwargs",
            "_backward_hooks",
            "_backward_pre_hooks",
        ):
            getattr(layer, hooks).update(getattr(linear, hooks))
        layer._is_full_backward_hook = linear._is_full_backward_hook
        return layer


class Add2(nn.Module):
    """Elementwise ``a + b`` of two same-shape tensors as a module (forward and backward on
    cutlass_nn kernels)."""

    def forward(self, a: Tensor, b: Tensor) -> Tensor:
        return _add2(a, b)

