"""Cases: the two functions to time (ours, torch's) and the correctness check of one row."""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn, Tensor

import cutlass_nn
from cutlass_nn import ops
from cutlass_nn.bench.correctness import compare_outputs, poison, sample_index, sampled_mm
from cutlass_nn.bench.plan import RowSpec
from cutlass_nn.bench.spec import (
    DEFAULT_L2_BYTES,
    LINACT_ACTIVATION,
    split_linact_op,
    Precision,
    PRECISIONS,
    REF_CHUNK_ELEMENTS,
    SAMPLE,
    SkipRow,
)
from cutlass_nn.bench.stats import (
    _first_line,
    add2_memory_bytes,
    gemm_input_bytes,
    gemm_memory_bytes,
    linact_input_bytes,
    linact_memory_bytes,
    rotation_sets,
)


@dataclass
class Case:
    """What a builder hands to :func:`run_row`.

    ``fns``: ``{"ours": f, "base": f}``, ``f(set_index)`` runs the operation once on input set
    ``set_index`` (0 <= set_index < n_sets). ``check()`` returns :func:`compare_outputs`' record.
    ``context()`` is entered around the check and the timing (precision mode, forced SM80).
    ``kernel_name()`` names the cutlass_nn kernel that ran last (read right after the check).
    """

    fns: dict[str, Callable[[int], Any]]
    check: Callable[[], dict]
    n_sets: int = 1
    context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    kernel_name: Callable[[], str] = ops.last_kernel_name


@contextlib.contextmanager
def precision_context(prec: Precision) -> Iterator[None]:
    """Sets TF32 on or off for float32 matmuls (legacy API only, like tests/cuda_helpers.py:
    torch refuses a mix of the legacy and the new fp32_precision APIs); restores it after."""
    if prec.tf32 is None:
        yield
        return
    previous = torch.get_float32_matmul_precision()
    previous_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = prec.tf32
    torch.set_float32_matmul_precision("high" if prec.tf32 else "highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)
        torch.backends.cuda.matmul.allow_tf32 = previous_tf32


@contextlib.contextmanager
def row_context(prec: Precision, sm80: bool) -> Iterator[None]:
    with precision_context(prec), ops.force_sm80_kernels() if sm80 else contextlib.nullcontext():
        yield


def guard_memory(need_bytes: int, device) -> None:
    """Raises SkipRow when a row would need more than ~85% of the free device memory."""
    if torch.device(device).type != "cuda":
        return
    free, _total = torch.cuda.mem_get_info()
    avail = free + torch.cuda.memory_reserved() - torch.cuda.memory_allocated()
    if need_bytes > 0.85 * avail:
        raise SkipRow(
            f"skipped: needs about {need_bytes / 2**30:.1f} GiB of device memory, "
            f"{avail / 2**30:.1f} GiB available"
        )


def build_gemm_case(
    op: str,
    m: int,
    n: int,
    k: int,
    prec: Precision,
    *,
    l2_bytes: int = DEFAULT_L2_BYTES,
    device="cuda",
    seed: int = 0,
) -> Case:
    """A GEMM row: forward (with bias; "sm80" the same under force_sm80_kernels), dgrad, wgrad,
    or a whole CutlassLinear forward+backward against nn.Linear with the same parameters."""
    dtype = prec.dtype
    es = torch.empty((), dtype=dtype).element_size()
    n_sets = rotation_sets(gemm_input_bytes(op, m, n, k, es), l2_bytes)
    guard_memory(gemm_memory_bytes(op, m, n, k, es, n_sets), device)
    gen = torch.Generator(device=device).manual_seed(seed)
    sample_gen = torch.Generator().manual_seed(seed)  # CPU: randperm of the sampled indices

    def rnd(*shape: int) -> Tensor:
        return torch.randn(shape, dtype=dtype, device=device, generator=gen)

    def context():
        return row_context(prec, op == "sm80")

    if op == "fwdbwd":
        return _fwdbwd_case(m, n, k, prec, rnd, n_sets, sample_gen, device, context)

    # ours(*inputs), base(*inputs), ref(*inputs, rows, cols) and the output's [rows, cols]
    if op in ("fwd", "sm80"):
        sets = [(rnd(m, k), rnd(n, k), rnd(n)) for _ in range(n_sets)]
        ours, base = cutlass_nn.functional.linear, F.linear

        def ref(x, w, b, rows, cols):
            return sampled_mm(x, w.t(), rows, cols) + b.index_select(0, cols).double()

        out_rows, out_cols = m, n
    elif op == "dgrad":  # dX[M, K] = dY[M, N] @ W[N, K]
        sets = [(rnd(m, n), rnd(n, k)) for _ in range(n_sets)]
        ours, base = ops.linear_dgrad, torch.matmul

        def ref(dy, w, rows, cols):
            return sampled_mm(dy, w, rows, cols)

        out_rows, out_cols = m, k
    elif op == "wgrad":  # dW[N, K] = dY[M, N]^T @ X[M, K]
        sets = [(rnd(m, n), rnd(m, k)) for _ in range(n_sets)]
        ours = ops.linear_wgrad

        def base(dy, x):
            return dy.t() @ x

        def ref(dy, x, rows, cols):
            return sampled_mm(dy.t(), x, rows, cols)

        out_rows, out_cols = n, k
    else:
        raise ValueError(f"unknown GEMM op {op!r}")

    def check() -> dict:
        args = sets[0]
        base_out = base(*args)
        poison([out_rows * out_cols], dtype, device)
        ours_out = ours(*args)  # last, so that kernel_name() names its kernel
        rows = sample_index(out_rows, SAMPLE, sample_gen, device)
        cols = sample_index(out_cols, SAMPLE, sample_gen, device)
        ref64 = ref(*args, rows, cols)
        return compare_outputs({"out": (ours_out, base_out, ref64, rows, cols)}, prec.floor)

    fns = {"ours": lambda i: ours(*sets[i]), "base": lambda i: base(*sets[i])}
    return Case(fns=fns, check=check, n_sets=n_sets, context=context)


def _fwdbwd_case(m, n, k, prec, rnd, n_sets, sample_gen, device, context) -> Case:
    """CutlassLinear vs nn.Linear sharing the same parameters; one step = zero the gradients
    (set_to_none), forward, backward with a random grad_output (input, weight, bias gradients)."""
    sets = []
    for _ in range(n_sets):
        lin = nn.Linear(k, n, bias=True, device="meta", dtype=prec.dtype)
        lin.weight = nn.Parameter(rnd(n, k))
        lin.bias = nn.Parameter(rnd(n))
        sets.append(
            SimpleNamespace(
                x=rnd(m, k).requires_grad_(True),
                dy=rnd(m, n),
                base=lin,
                ours=cutlass_nn.CutlassLinear.from_linear(lin),  # shares lin's parameters
            )
        )

    def step(s, module) -> None:
        s.base.zero_grad(set_to_none=True)  # the parameters of both modules
        s.x.grad = None
        module(s.x).backward(s.dy)

    def check() -> dict:
        s = sets[0]
        got = {}
        for name in ("base", "ours"):  # ours last: kernel_name() then names its last GEMM
            if name == "ours":
                poison([m * n, m * k, n * k], prec.dtype, device)
            s.base.zero_grad(set_to_none=True)
            s.x.grad = None
            y = getattr(s, name)(s.x)
            y.backward(s.dy)
            got[name] = {
                "y": y.detach(),
                "dx": s.x.grad,
                "dw": s.base.weight.grad,
                "db": s.base.bias.grad,
            }
        s.base.zero_grad(set_to_none=True)
        s.x.grad = None
        x, w, b, dy = s.x.detach(), s.base.weight.detach(), s.base.bias.detach(), s.dy
        rm, rn = (sample_index(d, SAMPLE, sample_gen, device) for d in (m, n))
        cn, ck = (sample_index(d, SAMPLE, sample_gen, device) for d in (n, k))
        refs = {
            "y": (sampled_mm(x, w.t(), rm, cn) + b.index_select(0, cn).double(), rm, cn),
            "dx": (sampled_mm(dy, w, rm, ck), rm, ck),
            "dw": (sampled_mm(dy.t(), x, rn, ck), rn, ck),
            "db": (dy.index_select(1, cn).double().sum(0), None, cn),
        }
        items = {key: (got["ours"][key], got["base"][key], *ref) for key, ref in refs.items()}
        return compare_outputs(items, prec.floor)

    fns = {
        "ours": lambda i: step(sets[i], sets[i].ours),
        "base": lambda i: step(sets[i], sets[i].base),
    }
    return Case(fns=fns, check=check, n_sets=n_sets, context=context)


def make_linact_module(
    in_features: int, out_features: int, dtype: torch.dtype, activation: str = LINACT_ACTIVATION
) -> nn.Module:
    """``cutlass_nn.CutlassLinear(..., activation=activation)`` on the meta device (the caller
    gives it real parameters). SkipRow when this cutlass_nn has no ``activation`` argument."""
    try:
        return cutlass_nn.CutlassLinear(
            in_features,
            out_features,
            bias=True,
            device="meta",
            dtype=dtype,
            activation=activation,
        )
    except TypeError as exc:
        raise SkipRow(
            "skipped: this cutlass_nn has no CutlassLinear(activation=...) "
            f"({_first_line(exc, 150)})"
        ) from exc


def compile_baseline(module: nn.Module) -> Callable[[Tensor], Tensor]:
    """The torch.compile baseline of a linact row: default mode, static shapes (one compile per
    shape, the fastest code inductor makes for it)."""
    return torch.compile(module, dynamic=False)


# The baselines' activation modules (also the references' float64 forward), and each
# activation's derivative (dz = act'(z) * dy) for the references.
LINACT_TORCH_MODULES: dict[str, Callable[[], nn.Module]] = {
    "gelu_tanh": lambda: nn.GELU(approximate="tanh"),
    "gelu": nn.GELU,
    "relu": nn.ReLU,
}
_ACT_BACKWARD64: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "gelu_tanh": lambda dy, z: torch.ops.aten.gelu_backward(dy, z, approximate="tanh"),
    "gelu": lambda dy, z: torch.ops.aten.gelu_backward(dy, z, approximate="none"),
    "relu": lambda dy, z: torch.where(z > 0, dy, torch.zeros_like(dy)),
}


def linact_reference(
    x: Tensor,
    w: Tensor,
    b: Tensor,
    dy: Tensor,
    rm: Tensor,
    cn: Tensor,
    ck: Tensor,
    activation: str = LINACT_ACTIVATION,
) -> dict[str, tuple[Tensor, Tensor | None, Tensor]]:
    """Float64 reference of ``y = act(x @ w.T + b)`` (``activation``: one of
    LINACT_ACTIVATIONS) and of its gradients for the incoming gradient ``dy``, on sampled
    elements: ``{name: (ref64, rows, cols)}`` for y [rm, cn], dx [rm, ck], dw [cn, ck] and db [cn].
    dx needs the pre-activation of the sampled rows over all N columns, dw and db that of all M
    rows over the sampled columns."""
    act, act_backward = LINACT_TORCH_MODULES[activation](), _ACT_BACKWARD64[activation]
    x, w, b, dy = x.detach(), w.detach(), b.detach(), dy.detach()
    m, k = x.shape
    n = w.shape[0]
    z_rows = sampled_mm(x, w.t(), rm, torch.arange(n, device=x.device)) + b.double()  # [r, N]
    dz_rows = act_backward(dy.index_select(0, rm).double(), z_rows)
    w_cols = w.index_select(0, cn).double()  # [c, K]
    chunk = max(1, REF_CHUNK_ELEMENTS // max(k, 1))
    z_cols = (
        torch.cat([x[i : i + chunk].double() @ w_cols.t() for i in range(0, m, chunk)])
        + b.index_select(0, cn).double()
    )  # [M, c]
    dz_cols = act_backward(dy.index_select(1, cn).double(), z_cols)
    return {
        "y": (act(z_rows.index_select(1, cn)), rm, cn),
        "dx": (dz_rows @ w.index_select(1, ck).double(), rm, ck),
        "dw": (dz_cols.t() @ x.index_select(1, ck).double(), cn, ck),
        "db": (dz_cols.sum(0), None, cn),
    }


def build_linact_case(
    op: str,
    m: int,
    n: int,
    k: int,
    prec: Precision,
    *,
    l2_bytes: int = DEFAULT_L2_BYTES,
    device="cuda",
    seed: int = 0,
) -> Case:
    """Linear + bias + activation, forward+backward: ours is ``CutlassLinear(K, N,
    activation=act)``, the baseline ``nn.Sequential(nn.Linear, <act module>)`` run eagerly (op
    "eager") or through ``torch.compile`` (op "compile"); the activation is GELU(tanh) unless the
    op names another ("eager-relu", "compile-gelu": split_linact_op), all three sharing the same
    parameters. One step = zero the gradients (set_to_none), forward, backward(dY)."""
    baseline, activation = split_linact_op(op)
    dtype = prec.dtype
    es = torch.empty((), dtype=dtype).element_size()
    n_sets = rotation_sets(linact_input_bytes(m, n, k, es), l2_bytes)
    guard_memory(linact_memory_bytes(m, n, k, es, n_sets), device)
    gen = torch.Generator(device=device).manual_seed(seed)
    sample_gen = torch.Generator().manual_seed(seed)

    def rnd(*shape: int) -> Tensor:
        return torch.randn(shape, dtype=dtype, device=device, generator=gen)

    if baseline == "compile":
        from torch import _dynamo  # heavy: imported only when a compile row runs

        _dynamo.reset()  # a fresh cache per row: no recompile limit, no dynamic shapes
    sets = []
    for _ in range(n_sets):
        ours = make_linact_module(k, n, dtype, activation)
        lin = nn.Linear(k, n, bias=True, device="meta", dtype=dtype)
        lin.weight = nn.Parameter(rnd(n, k))
        lin.bias = nn.Parameter(rnd(n))
        ours.weight, ours.bias = lin.weight, lin.bias  # shared, as the baseline's
        eager = nn.Sequential(lin, LINACT_TORCH_MODULES[activation]())
        sets.append(
            SimpleNamespace(
                x=rnd(m, k).requires_grad_(True),
                dy=rnd(m, n),
                lin=lin,
                ours=ours,
                base=eager if baseline == "eager" else compile_baseline(eager),
            )
        )

    def zero(s) -> None:
        s.lin.zero_grad(set_to_none=True)  # the parameters of all three modules
        s.x.grad = None

    def step(s, module) -> None:
        zero(s)
        module(s.x).backward(s.dy)

    def check() -> dict:
        s = sets[0]
        got = {}
        for name in ("base", "ours"):  # ours last: kernel_name() then names its last GEMM
            if name == "ours":
                poison([m * n, m * n, m * k, n * k], dtype, device)
            zero(s)
            y = getattr(s, name)(s.x)
            y.backward(s.dy)
            got[name] = {"y": y.detach(), "dx": s.x.grad, "dw": s.lin.weight.grad}
            got[name]["db"] = s.lin.bias.grad
        zero(s)
        rm = sample_index(m, SAMPLE, sample_gen, device)
        cn = sample_index(n, SAMPLE, sample_gen, device)
        ck = sample_index(k, SAMPLE, sample_gen, device)
        refs = linact_reference(s.x, s.lin.weight, s.lin.bias, s.dy, rm, cn, ck, activation)
        items = {key: (got["ours"][key], got["base"][key], *ref) for key, ref in refs.items()}
        result = compare_outputs(items, prec.floor)
        for other in sets[1:]:  # compile (and warm) the baseline on every input set now
            step(other, other.base)
            zero(other)
        return result

    fns = {
        "ours": lambda i: step(sets[i], sets[i].ours),
        "base": lambda i: step(sets[i], sets[i].base),
    }
    return Case(fns=fns, check=check, n_sets=n_sets, context=lambda: precision_context(prec))


def build_add2_case(
    op: str,
    numel: int,
    prec: Precision,
    *,
    l2_bytes: int = DEFAULT_L2_BYTES,
    device="cuda",
    seed: int = 0,
) -> Case:
    """cutlass_nn.add2(a, b) vs a + b: forward, or forward+backward (with a random grad_output)."""
    dtype = prec.dtype
    es = torch.empty((), dtype=dtype).element_size()
    n_sets = rotation_sets((2 if op == "fwd" else 3) * numel * es, l2_bytes)
    guard_memory(add2_memory_bytes(op, numel, es, n_sets), device)
    gen = torch.Generator(device=device).manual_seed(seed)
    sample_gen = torch.Generator().manual_seed(seed)

    def rnd() -> Tensor:
        return torch.randn((numel,), dtype=dtype, device=device, generator=gen)

    grad = op == "fwdbwd"
    sets = [
        SimpleNamespace(
            a=rnd().requires_grad_(grad), b=rnd().requires_grad_(grad), dy=rnd() if grad else None
        )
        for _ in range(n_sets)
    ]
    impls = {"ours": cutlass_nn.add2, "base": torch.add}

    def step(s, fn):
        if not grad:
            return fn(s.a, s.b)
        s.a.grad = None
        s.b.grad = None
        fn(s.a, s.b).backward(s.dy)
        return None

    def check() -> dict:
        s = sets[0]
        got = {}
        for name in ("base", "ours"):
            if name == "ours":
                poison([numel] * (3 if grad else 1), dtype, device)
            s.a.grad = s.b.grad = None
            y = impls[name](s.a, s.b)
            if grad:
                y.backward(s.dy)
            got[name] = {"y": y.detach(), "da": s.a.grad, "db": s.b.grad}
        s.a.grad = s.b.grad = None
        idx = sample_index(numel, SAMPLE * SAMPLE, sample_gen, device)
        a, b = s.a.detach(), s.b.detach()
        refs = {"y": a.index_select(0, idx).double() + b.index_select(0, idx).double()}
        if grad:
            refs["da"] = refs["db"] = s.dy.index_select(0, idx).double()
        items = {
            key: (got["ours"][key], got["base"][key], ref, None, idx) for key, ref in refs.items()
        }
        return compare_outputs(items, prec.floor)

    fns = {name: (lambda i, fn=fn: step(sets[i], fn)) for name, fn in impls.items()}
    return Case(fns=fns, check=check, n_sets=n_sets, kernel_name=lambda: "")


def build_case(spec: RowSpec, *, l2_bytes: int = DEFAULT_L2_BYTES, device="cuda") -> Case:
    """The Case of a planned row, with inputs seeded from the row's identity."""
    seed = zlib.crc32(f"{spec.group}/{spec.op}/{spec.precision}/{spec.label}".encode())
    prec = PRECISIONS[spec.precision]
    if spec.group == "gemm":
        return build_gemm_case(
            spec.op, *spec.shape, prec, l2_bytes=l2_bytes, device=device, seed=seed
        )
    if spec.group == "linact":
        return build_linact_case(
            spec.op, *spec.shape, prec, l2_bytes=l2_bytes, device=device, seed=seed
        )
    return build_add2_case(
        spec.op, spec.shape[0], prec, l2_bytes=l2_bytes, device=device, seed=seed
    )
