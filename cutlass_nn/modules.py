"""Drop-in ``nn.Module`` layers backed by the cutlass_nn operators."""

from __future__ import annotations

import functools

import torch
from torch import Tensor, nn

from cutlass_nn import _checks
from cutlass_nn import fp8 as _fp8
from cutlass_nn import functional as F
from cutlass_nn.fp8_reference import Fp8Recipe
from cutlass_nn.ops import ACTIVATIONS, GATED_ACTIVATIONS

_linear_act = torch.ops.cutlass_nn.linear_act.default
_add2 = torch.ops.cutlass_nn.add2.default
_rms_norm = torch.ops.cutlass_nn.rms_norm.default
_add_rms_norm = torch.ops.cutlass_nn.add_rms_norm.default
_gated_mlp = torch.ops.cutlass_nn.gated_mlp.default

__all__ = [
    "CutlassLinear",
    "Add2",
    "RMSNorm",
    "AddRMSNorm",
    "GatedMLP",
    "LinearCrossEntropyLoss",
]


def _check_activation(where: str, activation) -> str | None:
    """None or one of ACTIVATIONS (``"none"`` normalized to None), else a ValueError."""
    if activation is None or (isinstance(activation, str) and activation in ACTIVATIONS):
        return None if activation == "none" else activation
    allowed = ", ".join(f'"{a}"' for a in ACTIVATIONS)
    raise ValueError(
        f"cutlass_nn.{where}: argument 'activation' must be None or one of {allowed}, "
        f"got {activation!r}"
    )


#: The values of CutlassLinear's ``precision``: None (the input's dtype) or "fp8"; ``"none"`` is
#: None said explicitly (stored as None), which ``from_linear`` / ``GatedMLP.from_module`` need
#: to turn an FP8 source into a plain layer, where None keeps the source's precision.
PRECISIONS = (None, "none", "fp8")


def _check_precision(where: str, precision, recipe) -> Fp8Recipe | None:
    """The FP8 recipe a layer keeps (None unless ``precision == "fp8"``), else an error."""
    if precision not in PRECISIONS:
        raise ValueError(
            f"cutlass_nn.{where}: argument 'precision' must be None, \"none\" or \"fp8\", "
            f"got {precision!r}"
        )
    if recipe is not None and not isinstance(recipe, Fp8Recipe):
        raise TypeError(
            f"cutlass_nn.{where}: argument 'fp8_recipe' must be None or a cutlass_nn.fp8.Fp8Recipe, "
            f"got {type(recipe).__name__}"
        )
    if precision != "fp8":
        if recipe is not None:
            raise ValueError(
                f"cutlass_nn.{where}: argument 'fp8_recipe' needs precision=\"fp8\", got "
                f"precision={precision!r}"
            )
        return None
    return recipe if recipe is not None else Fp8Recipe()


#: The torch form of every activation the layers name: CutlassLinear's activation after an FP8
#: GEMM (no fused FP8 epilogue yet), and GatedMLP's gated activation when it cannot run the fused
#: operator (see GatedMLP._plain_projections).
_TORCH_ACTS = {
    "relu": nn.functional.relu,
    "silu": nn.functional.silu,
    "gelu": nn.functional.gelu,
    "gelu_tanh": functools.partial(nn.functional.gelu, approximate="tanh"),
}


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
        precision: None (default: the GEMMs in the input's dtype; ``"none"`` says the same) or
            ``"fp8"``: forward and backward GEMMs on float8 operands with dynamic scaling (:func:`cutlass_nn.fp8.linear`;
            the activation, if any, applied after the FP8 GEMM). Parameters keep their dtype and
            the ``state_dict`` is unchanged; ``precision`` and ``fp8_recipe`` are attributes
            shown in the ``repr``.
        fp8_recipe: with ``precision="fp8"``, a :class:`cutlass_nn.fp8.Fp8Recipe` (default:
            tensorwise scaling, e4m3 gradients).

    Shape:
        input ``[*, in_features]`` (empty batches allowed) -> output ``[*, out_features]``.

    ``activation``, ``precision`` and ``fp8_recipe`` may be assigned after construction: each
    assignment is checked as the constructor checks it (a refused value leaves the layer as it
    was) and takes effect at the next forward; assigning ``precision = "fp8"`` keeps the layer's
    recipe (or takes the default one).
    """

    # activation, precision and fp8_recipe are properties that check what is assigned to them
    # (a layer's computation must not silently differ from what its attributes say); their
    # values live in _activation, _precision and _fp8_recipe, whose class defaults serve layers
    # pickled before the attributes existed (and see __setstate__ for those pickled when they
    # were plain attributes).
    _activation: str | None = None
    _precision: str | None = None
    _fp8_recipe: Fp8Recipe | None = None

    @property
    def activation(self) -> str | None:
        """None or one of "relu", "gelu", "gelu_tanh" (``"none"`` is stored as None)."""
        return self._activation

    @activation.setter
    def activation(self, value) -> None:
        self.__dict__["_activation"] = _check_activation("CutlassLinear.activation", value)

    @property
    def precision(self) -> str | None:
        """None (the GEMMs in the input's dtype) or "fp8"; assigning "fp8" keeps the layer's
        recipe or takes the default one, assigning None or "none" drops it."""
        return self._precision

    @precision.setter
    def precision(self, value) -> None:
        keep = self.__dict__.get("_fp8_recipe") if value == "fp8" else None  # None: not set yet
        recipe = _check_precision("CutlassLinear.precision", value, keep)
        self.__dict__["_precision"] = None if value == "none" else value
        self.__dict__["_fp8_recipe"] = recipe

    @property
    def fp8_recipe(self) -> Fp8Recipe | None:
        """The :class:`cutlass_nn.fp8.Fp8Recipe` of an FP8 layer (None otherwise; assigning
        None to an FP8 layer's takes the default recipe)."""
        return self._fp8_recipe

    @fp8_recipe.setter
    def fp8_recipe(self, value) -> None:
        self.__dict__["_fp8_recipe"] = _check_precision(
            "CutlassLinear.fp8_recipe", self.precision, value
        )

    def __setstate__(self, state) -> None:
        super().__setstate__(state)
        for name in ("activation", "precision", "fp8_recipe"):
            if name in self.__dict__:  # pickled when it was a plain attribute
                self.__dict__["_" + name] = self.__dict__.pop(name)

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        device=None,
        dtype=None,
        activation: str | None = None,
        precision: str | None = None,
        fp8_recipe: Fp8Recipe | None = None,
    ) -> None:
        # validated first: a bad value fails before any parameter is allocated
        in_features = _checks.check_size("CutlassLinear", "in_features", in_features)
        out_features = _checks.check_size("CutlassLinear", "out_features", out_features)
        act = _check_activation("CutlassLinear", activation)
        recipe = _check_precision("CutlassLinear", precision, fp8_recipe)
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.activation = act
        self.precision, self.fp8_recipe = (None if precision == "none" else precision), recipe

    def forward(self, input: Tensor) -> Tensor:
        try:
            if self.precision == "fp8":
                y = _fp8.linear(input, self.weight, self.bias, self.fp8_recipe)
                return y if self.activation is None else _TORCH_ACTS[self.activation](y)
            # One operator call (autocast, autograd and the kernel run in C++); with an
            # activation, linear_act, whose autograd kernel keeps the pre-activation when it is
            # needed.
            if self.activation is None:
                return F._plain_linear(input, self.weight, self.bias)
            return _linear_act(input, self.weight, self.bias, self.activation)
        except Exception:  # as in functional.linear: a non-tensor named after a failure only
            _checks.check_tensors("CutlassLinear.forward", {"input": input})
            raise

    def extra_repr(self) -> str:
        text = super().extra_repr()
        if self.activation is not None:
            text += f", activation={self.activation!r}"
        if self.precision is not None:
            text += f", precision={self.precision!r}, fp8_recipe={self.fp8_recipe!r}"
        return text

    @classmethod
    def from_linear(
        cls,
        linear: nn.Linear,
        activation: str | None = None,
        precision: str | None = None,
        fp8_recipe: Fp8Recipe | None = None,
    ) -> "CutlassLinear":
        """A ``CutlassLinear`` that shares ``linear``'s parameters (no copy), with an optional
        fused ``activation`` and ``precision`` / ``fp8_recipe`` (as in the constructor).

        When ``linear`` is itself a ``CutlassLinear``, what it has of these is kept unless given:
        ``activation=None`` keeps its activation (``"none"`` removes it), ``precision=None``
        keeps its precision (``"none"`` makes the layer a plain one), and ``fp8_recipe=None``
        its recipe (with ``precision="fp8"``).

        Training mode and forward hooks of ``linear`` are carried over, so swapping the module
        into a model changes nothing but the kernels that run (and, with ``activation``, adds
        the activation after the linear map).
        """
        if not isinstance(linear, nn.Linear):
            raise TypeError(
                f"cutlass_nn.CutlassLinear.from_linear: argument 'linear' must be an nn.Linear, "
                f"got {type(linear).__name__}"
            )
        if isinstance(linear, CutlassLinear):
            # the source's own computation, unless asked otherwise: a conversion that dropped
            # its activation or FP8 precision would silently compute something else
            if activation is None:
                activation = linear.activation
            if precision is None:
                precision = linear.precision
            if precision == linear.precision and fp8_recipe is None:
                fp8_recipe = linear.fp8_recipe
        act = _check_activation("CutlassLinear.from_linear", activation)
        recipe = _check_precision("CutlassLinear.from_linear", precision, fp8_recipe)
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        layer.activation = act
        layer.precision, layer.fp8_recipe = (None if precision == "none" else precision), recipe
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
        try:
            return _add2(a, b)
        except Exception:  # as in functional.add2
            _checks.check_tensors("Add2.forward", {"a": a, "b": b})
            raise



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
        if not isinstance(input, Tensor):
            _checks.check_tensors("RMSNorm.forward", {"input": input})
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
        hidden_size = _checks.check_size("AddRMSNorm", "hidden_size", hidden_size)
        if eps is not None:
            eps = _checks.check_real("AddRMSNorm", "eps", eps)
            if not (eps >= 0 and eps != float("inf")):
                raise _checks.fail(ValueError, "AddRMSNorm", "eps",
                                   "None or a finite number >= 0", repr(eps))
        super().__init__()
        self.hidden_size = hidden_size
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(self.hidden_size, device=device, dtype=dtype))

    def forward(self, x: Tensor, residual: Tensor) -> tuple[Tensor, Tensor]:
        return F.add_rms_norm(x, residual, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.hidden_size}, eps={self.eps}"


# ---- gated MLP -------------------------------------------------------------------------------


def _check_gated_activation(where: str, activation) -> str:
    """One of GATED_ACTIVATIONS, else a TypeError (not a string) or ValueError (unknown name)."""
    allowed = ", ".join(f'"{a}"' for a in GATED_ACTIVATIONS)
    if not isinstance(activation, str):
        raise TypeError(
            f"cutlass_nn.{where}: argument 'activation' must be a string, one of {allowed}, "
            f"got {type(activation).__name__}"
        )
    if activation not in GATED_ACTIVATIONS:
        raise ValueError(
            f"cutlass_nn.{where}: argument 'activation' must be one of {allowed}, got {activation!r}"
        )
    return activation


def _gated_activation_of(act_fn) -> str | None:
    """The gated activation name that ``act_fn`` computes, or None when it is none of them.

    Exact types only: a subclass may have changed the forward. The ``transformers`` classes are
    recognized by module and name, so that transformers need not be importable."""
    kind = type(act_fn)
    if kind is nn.SiLU or act_fn is nn.functional.silu:
        return "silu"
    if act_fn is nn.functional.gelu:
        return "gelu"
    if kind is nn.GELU:
        return {"none": "gelu", "tanh": "gelu_tanh"}.get(act_fn.approximate)
    if kind.__module__ != "transformers.activations":
        return None
    name = kind.__name__
    if name == "SiLUActivation":  # forward: F.silu
        return "silu"
    if name == "NewGELUActivation":  # forward: the tanh formula itself
        return "gelu_tanh"
    # GELUActivation and GELUTanh choose at construction between torch's function and a Python
    # formula of the same function, kept in `act`; anything else there is not what we compute.
    act = getattr(act_fn, "act", None)
    method = getattr(act, "__func__", None)  # a bound method: the Python formula
    if name == "GELUActivation":
        exact = act is nn.functional.gelu or (
            method is not None and method is getattr(kind, "_gelu_python", None)
        )
        return "gelu" if exact else None
    if name in ("GELUTanh", "PytorchGELUTanh"):  # the second: its older name (now an alias)
        tanh = (
            # older transformers' PytorchGELUTanh has no `act`: its forward calls
            # F.gelu(approximate="tanh") directly
            (act is None and name == "PytorchGELUTanh")
            or (
                isinstance(act, functools.partial)
                and act.func is nn.functional.gelu
                and not act.args
                and act.keywords == {"approximate": "tanh"}
            )
            or (method is not None and method is getattr(kind, "_gelu_tanh_python", None))
        )
        return "gelu_tanh" if tanh else None
    return None


def _is_plain_linear(layer) -> bool:
    """An ``nn.Linear`` computing ``x @ W.T + b`` and nothing else: exactly ``nn.Linear``, or a
    ``CutlassLinear`` without an activation (a model converted before, without fuse_mlp)."""
    return type(layer) is nn.Linear or (type(layer) is CutlassLinear and layer.activation is None)


def _gated_mlp_problem(mlp: nn.Module) -> str | None:
    """What keeps ``mlp`` from being a GatedMLP's source (its projections, their shapes and
    biases; not its activation), or None."""
    layers = {name: getattr(mlp, name, None) for name in ("gate_proj", "up_proj", "down_proj")}
    for name, layer in layers.items():
        if not _is_plain_linear(layer):
            return (
                f"must have an nn.Linear '{name}' (exactly nn.Linear, or a CutlassLinear without "
                f"activation), got {type(layer).__module__}.{type(layer).__qualname__}"
            )
    gate, up, down = layers.values()
    n, hidden = gate.out_features, gate.in_features
    shapes = [(up.out_features, up.in_features), (down.out_features, down.in_features)]
    if shapes != [(n, hidden), (hidden, n)]:
        return (
            f"must have gate_proj and up_proj of shape [n, hidden] and down_proj of shape "
            f"[hidden, n], got gate_proj {[n, hidden]}, up_proj {list(shapes[0])}, down_proj "
            f"{list(shapes[1])} (out_features, in_features)"
        )
    biases = [layer.bias is not None for layer in (gate, up, down)]
    if any(biases) and not all(biases):
        return (
            "must have a bias on all of gate_proj, up_proj, down_proj or on none, got "
            + ", ".join(f"{name}: {'bias' if b else 'no bias'}" for name, b in zip(layers, biases))
        )
    return None


def _adjacent(first: Tensor, second: Tensor) -> bool:
    """``second`` directly follows ``first`` in one storage: what the gated_mlp operator reads as
    one [2n, in] operand without a copy."""
    return (
        first.shape == second.shape
        and first.dtype == second.dtype
        and first.device == second.device
        and first.is_contiguous()
        and second.is_contiguous()
        and first.untyped_storage().data_ptr() == second.untyped_storage().data_ptr()
        and second.storage_offset() == first.storage_offset() + first.numel()
    )


def _pack_adjacent(first, second) -> None:
    """Move the data of Parameters ``first`` and ``second`` into one new buffer, ``first``'s
    rows then ``second``'s, by assigning ``.data``: the Parameter objects stay the same, so
    optimizers, hooks and other modules sharing them keep working on the packed storage.

    A no-op where packing is already done, impossible (different shapes, dtypes or devices)
    or meaningless (meta tensors; tensor subclasses such as DTensor, whose ``.data`` is not a
    plain tensor)."""
    if not (isinstance(first, nn.Parameter) and isinstance(second, nn.Parameter)):
        return
    if type(first.data) is not torch.Tensor or type(second.data) is not torch.Tensor:
        return
    if first.is_meta or first.layout != torch.strided or second.layout != torch.strided:
        return
    if first.shape != second.shape or first.dtype != second.dtype or first.device != second.device:
        return
    if _adjacent(first, second):
        return
    with torch.no_grad():
        buf = torch.cat((first.detach(), second.detach()))
    rows = first.shape[0]
    first.data = buf[:rows]
    second.data = buf[rows:]


def _repack_after_load(module: "GatedMLP", incompatible_keys) -> None:
    # load_state_dict(assign=True) puts the state_dict's own tensors in place of the weights;
    # an ordinary load copies into them and leaves the packing as it was (then a no-op).
    module._pack_gate_up()


class GatedMLP(nn.Module):
    """The gated MLP of Llama-style transformers, ``down_proj(act(gate_proj(x)) * up_proj(x))``,
    as one cutlass_nn operator (:func:`cutlass_nn.functional.gated_mlp`): the gate and up
    projections run as one GEMM, the gated activation as one kernel, and the backward keeps
    only the input and the gate+up output.

    Drop-in for ``transformers``' ``LlamaMLP`` (and the MLPs of Mistral, Qwen2/3, Gemma 1-3):
    the submodules ``gate_proj``, ``up_proj`` ([intermediate, hidden]) and ``down_proj``
    ([hidden, intermediate]) are :class:`CutlassLinear` layers, so the ``state_dict`` keys and
    shapes are theirs and load strictly both ways. :meth:`from_module` converts an existing MLP
    without copying its parameters.

    The gate and up weights (and biases) are kept as two halves of one contiguous
    ``[2 * intermediate, hidden]`` buffer, gate rows first, which is what lets the operator
    read them as one GEMM operand without a copy. The module re-establishes that layout after
    construction, :meth:`from_module`, ``.to()`` / ``.cuda()`` / ``.half()`` / ``to_empty()``,
    ``copy.deepcopy`` / unpickling and ``load_state_dict(assign=True)``, by assigning the
    Parameters' ``.data`` (the Parameter objects never change). Weights laid out otherwise
    still compute the same result, with a copy per call.

    If any of the three projections is no longer a plain ``CutlassLinear`` (replaced, given an
    activation, or carrying forward / backward hooks), or they differ in precision or FP8
    recipe, the forward calls them one by one, so that what they do still happens.

    Args:
        hidden_size: the input and output feature size.
        intermediate_size: the size ``n`` of the gate and up projections.
        activation: ``"silu"`` (default; ``F.silu``), ``"gelu"`` (``F.gelu``) or
            ``"gelu_tanh"`` (``F.gelu(approximate="tanh")``), applied to the gate. Kept in the
            attribute ``activation``, not in the ``state_dict``.
        bias: whether the three projections have biases (``LlamaConfig.mlp_bias``).
        device, dtype: factory arguments for the parameters.
        precision, fp8_recipe: None, or ``"fp8"`` with an optional
            :class:`cutlass_nn.fp8.Fp8Recipe`: the three projections are FP8 ``CutlassLinear``
            layers (``precision="fp8"``) and the forward is :func:`cutlass_nn.fp8.gated_mlp`
            (gate and up as one FP8 GEMM, the input quantized once for both; tensorwise, one
            scale for the gate and up weights together; the activation and product in float,
            rounded once); the ``state_dict`` is unchanged.

    Shape:
        input ``[*, hidden_size]`` (empty batches allowed) -> output ``[*, hidden_size]``.
    """

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        activation: str = "silu",
        bias: bool = False,
        device=None,
        dtype=None,
        precision: str | None = None,
        fp8_recipe: Fp8Recipe | None = None,
    ) -> None:
        # validated first: a bad value fails before any parameter is allocated
        hidden_size = _checks.check_size("GatedMLP", "hidden_size", hidden_size)
        intermediate_size = _checks.check_size("GatedMLP", "intermediate_size", intermediate_size)
        act = _check_gated_activation("GatedMLP", activation)
        recipe = _check_precision("GatedMLP", precision, fp8_recipe)
        super().__init__()
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.activation = act
        # Created in LlamaMLP's order with nn.Linear's initialization: under the same seed the
        # weights are those of the transformers module.
        factory = dict(bias=bias, device=device, dtype=dtype, precision=precision,
                       fp8_recipe=recipe)
        self.gate_proj = CutlassLinear(self.hidden_size, self.intermediate_size, **factory)
        self.up_proj = CutlassLinear(self.hidden_size, self.intermediate_size, **factory)
        self.down_proj = CutlassLinear(self.intermediate_size, self.hidden_size, **factory)
        self._pack_gate_up()
        self.register_load_state_dict_post_hook(_repack_after_load)

    @property
    def activation(self) -> str:
        """The gated activation, one of ``"silu"``, ``"gelu"``, ``"gelu_tanh"``. Checked when set
        (a TypeError or ValueError, the old value kept): every forward path (the fused operator,
        the FP8 one, the projections called one by one) then computes the same function."""
        return self._activation

    @activation.setter
    def activation(self, value) -> None:
        self._activation = _check_gated_activation("GatedMLP.activation", value)

    def _pack_gate_up(self) -> None:
        """Lay the gate and up weights (and biases) out as the two halves of one buffer, gate
        first, unless they already are (see the class docstring)."""
        gate, up = self.gate_proj, self.up_proj
        if not (isinstance(gate, nn.Linear) and isinstance(up, nn.Linear)):
            return
        _pack_adjacent(gate.weight, up.weight)
        if gate.bias is not None and up.bias is not None:
            _pack_adjacent(gate.bias, up.bias)

    def _plain_projections(self, precision) -> bool:
        """Whether the three projections are plain CutlassLinear layers of this precision (one
        FP8 recipe for all three), without activation or hooks: then a fused form computes what
        calling them would (up to its documented roundings)."""
        recipes = set()
        for layer in (self.gate_proj, self.up_proj, self.down_proj):
            if type(layer) is not CutlassLinear or layer.activation is not None:
                return False
            if layer.precision != precision:
                return False
            recipes.add(layer.fp8_recipe)
            if (
                layer._forward_hooks
                or layer._forward_pre_hooks
                or layer._backward_hooks
                or layer._backward_pre_hooks
            ):
                return False
        return len(recipes) == 1

    def forward(self, input: Tensor) -> Tensor:
        if not isinstance(input, Tensor):
            _checks.check_tensors("GatedMLP.forward", {"input": input})
        gate, up, down = self.gate_proj, self.up_proj, self.down_proj
        if self._plain_projections(None):
            fused = _gated_mlp
        elif self._plain_projections("fp8"):
            fused = functools.partial(_fp8.gated_mlp, recipe=gate.fp8_recipe)
        else:
            return down(_TORCH_ACTS[self.activation](gate(input)) * up(input))
        return fused(input, gate.weight, up.weight, down.weight, gate.bias, up.bias, down.bias,
                     self.activation)

    def _apply(self, fn, recurse=True):
        # .to() / .cuda() / .half() / to_empty() convert each Parameter on its own, into
        # separate storages: pack them again.
        super()._apply(fn, recurse)
        self._pack_gate_up()
        return self

    def __setstate__(self, state) -> None:
        # copy.deepcopy clones each Parameter on its own and pickle does not keep views of one
        # storage either (torch.save does): the copy's gate and up land in separate storages.
        super().__setstate__(state)
        if "activation" in self.__dict__:  # pickled before it was a property
            self._activation = self.__dict__.pop("activation")
        self._pack_gate_up()

    def extra_repr(self) -> str:
        text = (
            f"hidden_size={self.hidden_size}, intermediate_size={self.intermediate_size}, "
            f"activation={self.activation!r}, bias={self.gate_proj.bias is not None}"
        )
        if getattr(self.gate_proj, "precision", None) is not None:
            text += f", precision={self.gate_proj.precision!r}"
        return text

    @classmethod
    def from_module(
        cls,
        mlp: nn.Module,
        activation: str | None = None,
        precision: str | None = None,
        fp8_recipe: Fp8Recipe | None = None,
    ) -> "GatedMLP":
        """A ``GatedMLP`` sharing the parameters of a ``transformers``-style gated MLP (no copy;
        the Parameter objects are reused, through :meth:`CutlassLinear.from_linear`).

        ``mlp`` has ``gate_proj``, ``up_proj`` ([n, hidden]) and ``down_proj`` ([hidden, n]),
        each exactly an ``nn.Linear`` (or a ``CutlassLinear`` without activation), with biases
        on all three or none, and computes ``down_proj(act_fn(gate_proj(x)) * up_proj(x))`` --
        the caller vouches for that formula; :func:`cutlass_nn.convert` only takes the
        ``transformers`` classes known to compute it (``cutlass_nn.convert.GATED_MLPS``).

        Args:
            mlp: the module to convert. Its gate and up Parameters are re-laid-out into one
                buffer (same values, same Parameter objects), which ``mlp`` itself then uses too.
            activation: one of ``"silu"``, ``"gelu"``, ``"gelu_tanh"``; None (default) reads it
                from a ``GatedMLP``'s ``activation``, else from ``mlp.act_fn``: ``nn.SiLU`` / ``F.silu`` / transformers' ``SiLUActivation``
                -> ``"silu"``; ``nn.GELU()`` / ``F.gelu`` / ``GELUActivation`` -> ``"gelu"``;
                ``nn.GELU(approximate="tanh")`` / ``GELUTanh`` (``PytorchGELUTanh``) /
                ``NewGELUActivation`` -> ``"gelu_tanh"``.
            precision, fp8_recipe: as in the constructor (the projections become FP8 layers).
                None keeps what the projections have: ``CutlassLinear`` projections in FP8 stay
                in FP8 with their recipe (see :meth:`CutlassLinear.from_linear`); ``"none"``
                makes them plain layers.

        Training mode and the hooks of ``mlp`` (and of its projections) are carried over.

        Raises:
            TypeError: ``mlp`` does not have that structure, or its ``act_fn`` is none of the
                above (with ``activation`` None).
            ValueError: ``activation`` is not one of the names.
        """
        where = "GatedMLP.from_module"
        if activation is not None:
            act = _check_gated_activation(where, activation)
        _check_precision(where, precision, fp8_recipe)
        if not isinstance(mlp, nn.Module):
            raise TypeError(
                f"cutlass_nn.{where}: argument 'mlp' must be an nn.Module, got "
                f"{type(mlp).__module__}.{type(mlp).__qualname__}"
            )
        problem = _gated_mlp_problem(mlp)
        if problem is not None:
            raise TypeError(f"cutlass_nn.{where}: argument 'mlp' {problem}")
        if activation is None and isinstance(mlp, GatedMLP):
            act = mlp.activation
        elif activation is None:
            act_fn = getattr(mlp, "act_fn", None)
            act = _gated_activation_of(act_fn)
            if act is None:
                raise TypeError(
                    f"cutlass_nn.{where}: the activation of argument 'mlp' is unknown: its "
                    f"act_fn is a {type(act_fn).__module__}.{type(act_fn).__qualname__}, not "
                    "nn.SiLU, nn.GELU or one of transformers' SiLUActivation, GELUActivation, "
                    "GELUTanh, NewGELUActivation"
                )
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        layer.hidden_size = mlp.gate_proj.in_features
        layer.intermediate_size = mlp.gate_proj.out_features
        layer.activation = act
        for name in ("gate_proj", "up_proj", "down_proj"):
            # the caller's fp8_recipe as given: None keeps an FP8 projection's own recipe
            setattr(layer, name, CutlassLinear.from_linear(getattr(mlp, name), precision=precision,
                                                           fp8_recipe=fp8_recipe))
        # only the module's own flag: each projection keeps its mode (from_linear copied it)
        layer.training = mlp.training
        _copy_hooks(mlp, layer)
        layer._pack_gate_up()
        layer.register_load_state_dict_post_hook(_repack_after_load)
        return layer


class LinearCrossEntropyLoss(nn.Module):
    """The loss of a language-model head, ``F.cross_entropy(F.linear(hidden, weight, bias),
    target)``, without the ``[tokens, vocab]`` logits
    (:func:`cutlass_nn.functional.linear_cross_entropy`): ``forward(hidden, weight, target,
    bias=None)``. The head's weight is passed in (e.g. ``model.lm_head.weight``), so the
    module holds no parameters and the model's ``state_dict`` is unchanged.

    Args:
        ignore_index, reduction, label_smoothing: as for ``nn.CrossEntropyLoss``.
        chunk_size: tokens per chunk (None: about 256 MiB of float32 logits per chunk).
    """

    def __init__(
        self,
        ignore_index: int = -100,
        reduction: str = "mean",
        label_smoothing: float = 0.0,
        chunk_size: int | None = None,
    ) -> None:
        from cutlass_nn.linear_cross_entropy import _check_options

        # checked here as the function checks them: a bad value fails at construction, not at
        # the first training step
        options = _check_options("LinearCrossEntropyLoss", ignore_index, reduction,
                                 label_smoothing, chunk_size)
        super().__init__()
        self.ignore_index, self.reduction, self.label_smoothing, self.chunk_size = options

    def forward(
        self, hidden: Tensor, weight: Tensor, target: Tensor, bias: Tensor | None = None
    ) -> Tensor:
        return F.linear_cross_entropy(
            hidden,
            weight,
            target,
            bias,
            ignore_index=self.ignore_index,
            reduction=self.reduction,
            label_smoothing=self.label_smoothing,
            chunk_size=self.chunk_size,
        )

    def extra_repr(self) -> str:
        return (
            f"ignore_index={self.ignore_index}, reduction={self.reduction!r}, "
            f"label_smoothing={self.label_smoothing}, chunk_size={self.chunk_size}"
        )
