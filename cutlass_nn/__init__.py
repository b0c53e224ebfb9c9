"""cutlass_nn: drop-in PyTorch layers whose forward and backward run on CUTLASS kernels.

Public API:

* :class:`CutlassLinear` -- drop-in for ``nn.Linear``; :class:`Add2` -- ``a + b`` as a module.
* :class:`RMSNorm` -- drop-in for ``nn.RMSNorm`` (and Llama-style RMSNorms); :class:`AddRMSNorm`
  -- residual add + RMSNorm in one kernel.
* :class:`GatedMLP` -- drop-in for the gated MLP of Llama-style ``transformers`` models
  (``down(act(gate(x)) * up(x))`` as one operator, gate and up as one GEMM).
* :func:`convert` -- swap the ``nn.Linear`` layers of a model for ``CutlassLinear`` (and, with
  ``fuse_norm=True``, its RMSNorms for ``RMSNorm``; with ``fuse_mlp=True``, its gated MLPs for
  ``GatedMLP``).
* :class:`LinearCrossEntropyLoss` / :func:`linear_cross_entropy` -- a language-model head's
  linear + cross-entropy without the ``[tokens, vocab]`` logits; :func:`fuse_lm_head` (or
  ``convert(..., fuse_head=True)``) -- a ``transformers`` causal LM's training loss through it.
* :func:`mm` -- drop-in for ``torch.mm`` (``out=`` included).
* :mod:`cutlass_nn.functional` -- ``linear``, ``mm``, ``add2``, ``rms_norm``, ``add_rms_norm``,
  ``gated_act``, ``gated_mlp``, ``linear_cross_entropy``.
* :mod:`cutlass_nn.ops` -- the raw operators (also reachable as ``torch.ops.cutlass_nn.*``).
* :mod:`cutlass_nn.autotune` -- opt-in per-shape tuning of the GEMM kernel configuration.
* :func:`fused_wgrad_accumulation` / :func:`set_fused_wgrad_accumulation` -- opt-in: linear
  layers' weight-gradient GEMMs add into an existing ``.grad`` (gradient accumulation).
* :func:`attach_main_grads` / :func:`detach_main_grads` -- float32 main-gradient buffers
  (``p.main_grad``) that the weight-gradient GEMMs add into directly.
"""

from cutlass_nn._version import __version__
from cutlass_nn import ops  # loads the extension and registers fake / autograd implementations
from cutlass_nn import functional
from cutlass_nn import autotune
from cutlass_nn import fp8
from cutlass_nn.functional import (
    add2,
    add_rms_norm,
    gated_mlp,
    linear,
    linear_cross_entropy,
    mm,
    rms_norm,
)
from cutlass_nn.modules import (
    Add2,
    AddRMSNorm,
    CutlassLinear,
    GatedMLP,
    LinearCrossEntropyLoss,
    RMSNorm,
)
from cutlass_nn.convert import convert
from cutlass_nn.fused_head import fuse_lm_head
from cutlass_nn.grad_accumulation import (
    attach_main_grads,
    detach_main_grads,
    fused_wgrad_accumulation,
    fused_wgrad_accumulation_enabled,
    set_fused_wgrad_accumulation,
)
from cutlass_nn._extension import build_info, has_cuda_kernels

__all__ = [
    "__version__",
    "Add2",
    "AddRMSNorm",
    "CutlassLinear",
    "GatedMLP",
    "LinearCrossEntropyLoss",
    "RMSNorm",
    "add2",
    "add_rms_norm",
    "attach_main_grads",
    "autotune",
    "build_info",
    "convert",
    "detach_main_grads",
    "functional",
    "fuse_lm_head",
    "fused_wgrad_accumulation",
    "fp8",
    "fused_wgrad_accumulation_enabled",
    "gated_mlp",
    "has_cuda_kernels",
    "linear",
    "linear_cross_entropy",
    "mm",
    "ops",
    "rms_norm",
    "set_fused_wgrad_accumulation",
]

autotune._init_from_env()  # CUTLASS_NN_AUTOTUNE, CUTLASS_NN_AUTOTUNE_CACHE
