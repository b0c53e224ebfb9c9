"""Drop-in ``nn.Module`` layers backed by the cutlass_nn operators."""

from __future__ import annotations

from torch import Tensor, nn

from cutlass_nn import functional as F

__all__ = ["CutlassLinear", "Add2"]


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

    Shape:
        input ``[*, in_features]`` (empty batches allowed) -> output ``[*, out_features]``.
    """

    def forward(self, input: Tensor) -> Tensor:
        return F.linear(input, self.weight, self.bias)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> "CutlassLinear":
        """A ``CutlassLinear`` that shares ``linear``'s parameters (no copy).

        Training mode and forward hooks of ``linear`` are carried over, so swapping the module
        into a model changes nothing but the kernels that run.
        """
        if not isinstance(linear, nn.Linear):
            raise TypeError(
                f"cutlass_nn.CutlassLinear.from_linear: argument 'linear' must be an nn.Linear, "
                f"got {type(linear).__name__}"
            )
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
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
        return F.add2(a, b)

