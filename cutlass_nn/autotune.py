"""Opt-in autotune of the GEMM kernel configuration per problem shape (CUDA flavor, Hopper).

The built-in rule picks a CUTLASS tile configuration from the problem's shape alone; it serves most
transformer shapes, and the benchmark records where it does not. Autotune times every candidate
configuration (128x256, 128x192 and 128x128 tiles, stream-K and split-K factors, the transposed
small-M kernels, the short-K and the small weight-gradient kernels; configurations 0, 1, 3,
10, 13, 14 and 15 each with the scheduler's default order and with a rasterization swizzle of 2)
on the problem's real shape, checks each candidate's result against the rule's, and keeps the
fastest in a process-wide table, per GPU and problem (M, N, K, operand layouts, dtypes, bias /
accumulation). The timed runs rotate through copies of A and B that together hold at least
twice the GPU's L2 (at most 32 copies), so that each run reads them from HBM, as the GEMMs of a
training step do; operands smaller than 1/16 of the L2 stay partly cached, and an accumulated
output (C = D) is not rotated.
Every later GEMM of that problem runs the kept choice; nothing changes a kept choice except
:func:`clear` and :func:`load`.

Off by default. Three ways to tune:

* ``cutlass_nn.convert(model, example_inputs=batch)`` (or :func:`tune`): one forward and backward
  of the model on the example, tuning every GEMM problem it meets; parameters, their ``.grad``,
  buffers and the random generators are left as they were.
* :func:`enable` / the :func:`tuning` block, or ``CUTLASS_NN_AUTOTUNE=1`` in the environment:
  first-call mode, where the first call of each untuned problem tunes it (that call synchronizes
  the stream and takes about 0.1 s; later calls cost one table lookup).
* :func:`load` a table saved by :func:`save` on the same GPU model; ``CUTLASS_NN_AUTOTUNE_CACHE``
  names a file that is loaded at import (if it exists) and saved at exit.

Safe under CUDA graphs and ``torch.compile``: a call on a stream that is being captured never
tunes (it runs the rule's choice; the problem is tuned at its next uncaptured call), and a
compiled graph calls the same operators, which read the same table. Tuning allocates a second set
of the problem's operands (where memory is short it gives up and the rule's choice runs), and
for the timed runs the copies above (where memory is short, as many as fit).
Problems of less than 2^24 multiply-adds are not tuned (host-bound: every choice is as fast).
Tuning and first-call mode are process-wide: do not tune in one thread while another captures a
CUDA graph. Each process tunes on its own, and two processes may keep different configurations
for one problem (their results then agree within rounding, not bitwise): in a multi-process job
tune on one rank, :func:`save`, and :func:`load` the file on every rank. With
``CUTLASS_NN_AUTOTUNE_CACHE`` naming an existing file, ``import cutlass_nn`` initializes CUDA (to
match the file's entries to the visible GPUs). In the CPU flavor every function here works and
the table stays empty.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import logging
import math
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch
from torch import Tensor, nn

from cutlass_nn import _checks
from cutlass_nn import _extension
from cutlass_nn._version import __version__

__all__ = [
    "TunedGemm",
    "clear",
    "enable",
    "enabled",
    "entries",
    "load",
    "report",
    "save",
    "tune",
    "tuning",
]

_ops = torch.ops.cutlass_nn
logger = logging.getLogger("cutlass_nn.autotune")

#: ``format`` field of the files :func:`save` writes.
FILE_FORMAT = "cutlass_nn.autotune/1"

_INT_FIELDS = (
    "device", "m", "n", "k", "layout_a", "layout_b", "dtype_ab", "dtype_cd", "bias",
    "accumulate", "config", "swizzle", "splits", "transposed", "rule_config", "rule_swizzle",
    "rule_splits", "rule_transposed", "candidates",
)  # fmt: skip
_FLOAT_FIELDS = ("best_us", "rule_us")
_DTYPES = ("float16", "bfloat16", "float32")  # kernels::DType 0, 1, 2
_LAYOUTS = ("row", "col")  # kernels::Layout 0, 1


@dataclasses.dataclass(frozen=True)
class TunedGemm:
    """One entry of the table: a GEMM ``D[m, n] = A[m, k] @ B[k, n]`` and the configuration it
    runs.

    ``layout_a`` / ``layout_b`` are ``"row"`` or ``"col"`` (how A and B are stored): a linear
    layer's forward is A row, B col; its input gradient (and ``mm`` of contiguous tensors) row,
    row; its weight gradient col, row. ``config`` indexes ``cutlass_nn.ops.gemm_configs()``
    (``config_name``); ``splits`` is the K decomposition of the stream-K configurations (0: the
    scheduler's own); ``transposed``: the kernel runs ``D^T = B^T A^T``. The ``rule_*`` fields are
    what the built-in rule picks; ``best_us`` / ``rule_us`` are the measured times of one call
    (``best_us == rule_us`` when the rule was kept). ``kernel`` is empty for loaded entries.
    """

    device: int
    device_name: str
    m: int
    n: int
    k: int
    layout_a: str
    layout_b: str
    dtype: str
    out_dtype: str
    bias: bool
    accumulate: bool
    config: int
    config_name: str
    swizzle: int
    splits: int
    transposed: bool
    rule_config: int
    rule_config_name: str
    rule_swizzle: int
    rule_splits: int
    rule_transposed: bool
    candidates: int
    best_us: float
    rule_us: float
    kernel: str

    @property
    def speedup(self) -> float:
        """Time of the rule's choice over the kept one's (1.0 when the rule was kept)."""
        return self.rule_us / self.best_us if self.best_us > 0 else 1.0

    @property
    def problem(self) -> tuple:
        """What identifies the problem in the table (device included)."""
        return (self.device, self.m, self.n, self.k, self.layout_a, self.layout_b, self.dtype,
                self.out_dtype, self.bias, self.accumulate)  # fmt: skip


def _config_names() -> list[str]:
    text = _ops._gemm_configs()
    return text.splitlines() if text else []


def _device_name(index: int) -> str:
    try:
        return torch.cuda.get_device_name(index)
    except Exception:  # no such device in this process
        return ""


def _multiprocessors(index: int) -> int:
    try:
        return torch.cuda.get_device_properties(index).multi_processor_count
    except Exception:
        return 0


# ---------------------------------------------------------------------------------------------
# The mode and the table
# ---------------------------------------------------------------------------------------------


def enable(on: bool = True) -> bool:
    """Turn first-call mode on (or off); returns the previous setting. Process-wide. A no-op
    (always off) in the CPU flavor."""
    if not isinstance(on, bool):
        raise TypeError(f"cutlass_nn.autotune.enable: argument 'on' must be a bool, got {type(on).__name__}")
    return bool(_ops._autotune_mode(int(on)))


def enabled() -> bool:
    """Whether first-call mode is on."""
    return bool(_ops._autotune_mode(-1))


@contextlib.contextmanager
def tuning(on: bool = True) -> Iterator[None]:
    """First-call mode on (or off) within the block, restored after it."""
    previous = enable(on)
    try:
        yield
    finally:
        _ops._autotune_mode(int(previous))


def entries() -> list[TunedGemm]:
    """The table's entries, sorted by device and problem."""
    ints, floats, kernels = _ops._autotune_entries()
    names = _config_names()
    nf, ff = len(_INT_FIELDS), len(_FLOAT_FIELDS)
    out = []
    for r in range(len(ints) // nf):
        v = dict(zip(_INT_FIELDS, ints[r * nf : (r + 1) * nf]))
        t = dict(zip(_FLOAT_FIELDS, floats[r * ff : (r + 1) * ff]))

        def name(i: int) -> str:
            return names[i] if 0 <= i < len(names) else str(i)

        out.append(
            TunedGemm(
                device=v["device"],
                device_name=_device_name(v["device"]),
                m=v["m"],
                n=v["n"],
                k=v["k"],
                layout_a=_LAYOUTS[v["layout_a"]],
                layout_b=_LAYOUTS[v["layout_b"]],
                dtype=_DTYPES[v["dtype_ab"]],
                out_dtype=_DTYPES[v["dtype_cd"]],
                bias=bool(v["bias"]),
                accumulate=bool(v["accumulate"]),
                config=v["config"],
                config_name=name(v["config"]),
                swizzle=v["swizzle"],
                splits=v["splits"],
                transposed=bool(v["transposed"]),
                rule_config=v["rule_config"],
                rule_config_name=name(v["rule_config"]),
                rule_swizzle=v["rule_swizzle"],
                rule_splits=v["rule_splits"],
                rule_transposed=bool(v["rule_transposed"]),
                candidates=v["candidates"],
                best_us=t["best_us"],
                rule_us=t["rule_us"],
                kernel=kernels[r],
            )
        )
    return sorted(out, key=lambda e: e.problem)


def clear() -> int:
    """Forget every entry (calls go back to the rule); returns how many there were."""
    return int(_ops._autotune_clear())


def report(items: Sequence[TunedGemm] | None = None) -> str:
    """A text table of ``items`` (default: every entry): problem, kept configuration, the rule's,
    and the measured times."""
    if items is None:
        items = entries()
    else:
        try:
            items = list(items)
        except TypeError:
            raise _checks.fail(TypeError, "autotune.report", "items",
                               "None or a sequence of cutlass_nn.autotune.TunedGemm",
                               _checks.given(items)) from None
        for i, e in enumerate(items):
            if not isinstance(e, TunedGemm):
                raise _checks.fail(TypeError, "autotune.report", "items",
                                   "None or a sequence of cutlass_nn.autotune.TunedGemm",
                                   f"a {type(e).__qualname__} at index {i}")
    if not items:
        return "cutlass_nn.autotune: no tuned GEMM"
    lines = [
        f"{'M':>6} {'N':>6} {'K':>6} {'A/B':>7} {'dtype':>8} {'extra':>5}  "
        f"{'kept':<40} {'rule':<40} {'us':>8} {'rule us':>8} {'gain':>5}"
    ]

    def describe(config: str, splits: int, transposed: bool) -> str:
        return config + (f" split{splits}" if splits else "") + (" (D^T)" if transposed else "")

    for e in items:
        extra = "bias" if e.bias else "acc" if e.accumulate else ""
        lines.append(
            f"{e.m:>6} {e.n:>6} {e.k:>6} {e.layout_a + '/' + e.layout_b:>7} {e.dtype:>8} "
            f"{extra:>5}  {describe(e.config_name, e.splits, e.transposed):<40} "
            f"{describe(e.rule_config_name, e.rule_splits, e.rule_transposed):<40} "
            f"{e.best_us:8.1f} {e.rule_us:8.1f} {e.speedup:5.2f}"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------------------------


def _check_path(op: str, path) -> Path:
    if not isinstance(path, (str, os.PathLike)):
        raise _checks.fail(TypeError, f"autotune.{op}", "path", "a str or os.PathLike",
                           _checks.given(path))
    return Path(path)


def save(path: str | os.PathLike) -> int:
    """Write the table to ``path`` (JSON, format :data:`FILE_FORMAT`); returns the number of
    entries written. Each entry names its GPU model and SM count, so a file serves every GPU of
    that model (and no other).

    An existing file's entries for problems this table does not hold are kept; entries of it
    that are malformed (which :func:`load` refuses the file for) are left out, with a
    ``UserWarning`` that shows them.

    Raises:
        ValueError: ``path`` exists and is not a cutlass_nn autotune file (invalid JSON, another
            format): it is not overwritten.
    """
    path = _check_path("save", path)
    items = entries()
    rows = []
    for e in items:
        row = dataclasses.asdict(e)
        row.pop("device")
        row["multiprocessors"] = _multiprocessors(e.device)
        rows.append(row)
    # Entries already in the file for problems this table does not hold (other GPU models,
    # other processes' shapes) are kept.
    mine = {_row_key(r) for r in rows}
    kept = [r for r in _existing_rows(path) if _row_key(r) not in mine]
    doc = {
        "format": FILE_FORMAT,
        "cutlass_nn": __version__,
        "torch": torch.__version__,
        "entries": kept + rows,
    }
    # A temporary file of this process's own, renamed over the target: a reader (or another
    # process saving at the same time) never sees half a file; the last rename wins.
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent or ".")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(doc, indent=1) + "\n")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return len(rows)


def _row_key(row: dict) -> tuple:
    return tuple(row.get(k) for k in ("device_name", "multiprocessors", "m", "n", "k", "layout_a",
                                      "layout_b", "dtype", "out_dtype", "bias", "accumulate"))


def _existing_rows(path: Path) -> list[dict]:
    """The well-formed entries of the autotune file at ``path`` ([] if there is no file). Raises
    when ``path`` is something else (:func:`save` must not overwrite it); skips malformed entries
    with a warning that shows them (one would make :func:`load` refuse the whole file)."""
    if not path.exists() or (path.is_file() and path.stat().st_size == 0):
        return []  # an empty file (a fresh tempfile, a touched path) holds nothing to lose
    try:
        doc = _document("save", path)
    except ValueError as exc:
        raise ValueError(f"{exc}; it is not overwritten") from None
    rows, dropped = [], []
    for i, row in enumerate(doc["entries"]):
        problem = _row_problem(row)
        if problem is None:
            rows.append(row)
        else:
            dropped.append(f"entry {i} {json.dumps(row)[:300]} ({problem})")
    if dropped:
        warnings.warn(
            f"cutlass_nn.autotune.save: {path}: {len(dropped)} malformed entr"
            f"{'y' if len(dropped) == 1 else 'ies'} left out, the others kept: "
            + "; ".join(dropped),
            UserWarning,
            stacklevel=3,
        )
    return rows


def _file_error(path: Path, what: str, op: str = "load") -> ValueError:
    return ValueError(f"cutlass_nn.autotune.{op}: {path} is not a cutlass_nn autotune file: {what}")


def _document(op: str, path: Path) -> dict:
    """The parsed file (format checked, ``entries`` a list), else a ValueError."""
    try:
        doc = json.loads(path.read_text())
    except UnicodeDecodeError as exc:
        raise _file_error(path, f"not UTF-8 text ({exc})", op) from None
    except json.JSONDecodeError as exc:
        raise _file_error(path, f"invalid JSON ({exc})", op) from None
    if not isinstance(doc, dict) or doc.get("format") != FILE_FORMAT:
        got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise _file_error(path, f"'format' must be {FILE_FORMAT!r}, got {got!r}", op)
    if not isinstance(doc.get("entries"), list):
        raise _file_error(path, "'entries' must be a list", op)
    return doc


def _parse_row(path: Path, i: int, row: Any) -> dict[str, Any]:
    """``row`` if entry ``i`` is well-formed, else :func:`load`'s ValueError."""
    problem = _row_problem(row)
    if problem is not None:
        raise _file_error(path, f"entry {i} {problem}")
    return row


def _row_problem(row: Any) -> str | None:
    """What is wrong with an entry of a file, or None."""
    if not isinstance(row, dict):
        return f"must be an object, got {type(row).__name__}"
    need = {
        "device_name": str, "multiprocessors": int, "m": int, "n": int, "k": int,
        "layout_a": str, "layout_b": str, "dtype": str, "out_dtype": str, "bias": bool,
        "accumulate": bool, "config": int, "swizzle": int, "splits": int, "transposed": bool,
        "rule_config": int, "rule_swizzle": int, "rule_splits": int, "rule_transposed": bool,
        "candidates": int, "best_us": (int, float), "rule_us": (int, float),
    }  # fmt: skip
    for key, kind in need.items():
        value = row.get(key)
        ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
        if not ok:
            return f"field {key!r} must be {getattr(kind, '__name__', 'a number')}, got {value!r}"
    for key, allowed in (("layout_a", _LAYOUTS), ("layout_b", _LAYOUTS), ("dtype", _DTYPES[:2]),
                         ("out_dtype", _DTYPES)):  # fmt: skip
        if row[key] not in allowed:
            return f"field {key!r} must be one of {allowed}, got {row[key]!r}"
    for key, kind in need.items():
        value = row[key]
        if kind is int and not 0 <= value < 2**31:
            return f"field {key!r} must be in [0, 2^31), got {value}"
        if kind == (int, float) and not (math.isfinite(value) and 0 <= value < 1e12):
            return f"field {key!r} must be a finite time >= 0, got {value}"
    return None


def load(path: str | os.PathLike) -> int:
    """Add the entries of a file written by :func:`save` for every visible GPU of the model and
    SM count they were tuned on (entries of other GPUs are skipped); returns the number of table
    entries added or replaced.

    Raises:
        FileNotFoundError: no such file.
        ValueError: the file is not a well-formed autotune file (nothing is added).
    """
    path = _check_path("load", path)
    doc = _document("load", path)
    parsed = [_parse_row(path, i, row) for i, row in enumerate(doc["entries"])]
    if not _extension.has_cuda_kernels() or not torch.cuda.is_available():
        return 0
    devices = [(i, _device_name(i), _multiprocessors(i)) for i in range(torch.cuda.device_count())]
    ints: list[int] = []
    floats: list[float] = []
    for row in parsed:
        for index, name, sms in devices:
            if name != row["device_name"] or sms != row["multiprocessors"]:
                continue
            values = dict(row, device=index)
            values["layout_a"] = _LAYOUTS.index(row["layout_a"])
            values["layout_b"] = _LAYOUTS.index(row["layout_b"])
            values["dtype_ab"] = _DTYPES.index(row["dtype"])
            values["dtype_cd"] = _DTYPES.index(row["out_dtype"])
            ints += [int(values[f]) for f in _INT_FIELDS]
            floats += [float(values[f]) for f in _FLOAT_FIELDS]
    try:
        _ops._autotune_add_entries(ints, floats)
    except RuntimeError as exc:
        raise _file_error(path, str(exc).splitlines()[0]) from None
    return len(ints) // len(_INT_FIELDS)


# ---------------------------------------------------------------------------------------------
# Tuning a model on example inputs
# ---------------------------------------------------------------------------------------------


def _split_inputs(example_inputs: Any) -> tuple[tuple, dict]:
    if isinstance(example_inputs, dict):
        return (), dict(example_inputs)
    if isinstance(example_inputs, (tuple, list)):
        return tuple(example_inputs), {}
    return (example_inputs,), {}


def tune(module: nn.Module, example_inputs: Any, *, backward: bool = True) -> list[TunedGemm]:
    """Tune every GEMM problem of one forward (and, with ``backward``, one backward) of
    ``module`` on ``example_inputs``; returns the entries this run added.

    ``example_inputs``: a tuple or list of positional arguments, a dict of keyword arguments, or
    a single tensor; use the shapes (and the ``torch.autocast`` context) of training, since
    entries are per shape. The backward runs through ``torch.autograd.grad`` on the outputs that
    require grad (with gradients of ones), so no ``.grad`` is written; the module's buffers (e.g.
    batch-norm statistics) and torch's default random generators (CPU, and CUDA where it is
    initialized; not generators the model creates itself) are restored afterwards, and
    parameters are not touched. Forward and backward hooks of the model run as in any step. Logs :func:`report` of the new entries at INFO level on the
    ``cutlass_nn.autotune`` logger.

    Raises:
        TypeError: ``module`` is not an ``nn.Module``, or ``backward`` not a bool.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(
            "cutlass_nn.autotune.tune: argument 'module' must be a torch.nn.Module, got "
            f"{type(module).__module__}.{type(module).__qualname__}"
        )
    _checks.check_bool("autotune.tune", "backward", backward)
    args, kwargs = _split_inputs(example_inputs)
    before = {e.problem for e in entries()}
    buffers = [
        (owner, name, buf, buf.detach().clone())
        for owner in module.modules()
        for name, buf in owner._buffers.items()
        if buf is not None
    ]
    cpu_rng = torch.random.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    previous = enable(True)
    try:
        with torch.enable_grad() if backward else torch.no_grad():
            out = module(*args, **kwargs)
            if backward:
                leaves = torch.utils._pytree.tree_leaves(out)
                outputs = [t for t in leaves if isinstance(t, Tensor) and t.requires_grad]
                wrt = [p for p in module.parameters() if p.requires_grad]
                wrt += [t for t in torch.utils._pytree.tree_leaves((args, kwargs))
                        if isinstance(t, Tensor) and t.requires_grad]  # fmt: skip
                if outputs and wrt:
                    torch.autograd.grad(
                        outputs, wrt, grad_outputs=[torch.ones_like(t) for t in outputs],
                        allow_unused=True,
                    )  # fmt: skip
    finally:
        _ops._autotune_mode(int(previous))
        torch.random.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
        failed = []
        with torch.no_grad():
            for owner, name, buf, saved in buffers:
                owner._buffers[name] = buf
                try:
                    buf.copy_(saved)
                except RuntimeError:  # resized in place by the model: restore the saved copy
                    owner._buffers[name] = saved
                    failed.append(name)
        if failed:
            logger.warning("buffers %s were replaced by their saved copies", failed)
    added = [e for e in entries() if e.problem not in before]
    if added:
        logger.info("tuned %d GEMM problem(s):\n%s", len(added), report(added))
    return added


# ---------------------------------------------------------------------------------------------
# Environment knobs, read once at import
# ---------------------------------------------------------------------------------------------

_TRUE = ("1", "true", "yes", "on")


def _init_from_env() -> None:
    if os.environ.get("CUTLASS_NN_AUTOTUNE", "").strip().lower() in _TRUE:
        enable(True)
    cache = os.environ.get("CUTLASS_NN_AUTOTUNE_CACHE", "").strip()
    if not cache:
        return
    path = Path(cache)
    if path.exists():
        try:
            load(path)
        except Exception as exc:  # a bad cache must not break the import
            logger.warning("CUTLASS_NN_AUTOTUNE_CACHE: not loaded: %s", exc)
    loaded = {(e.problem, e.config, e.splits, e.swizzle) for e in entries()}

    def save_at_exit() -> None:
        if {(e.problem, e.config, e.splits, e.swizzle) for e in entries()} != loaded:
            try:
                save(path)
            except Exception as exc:
                logger.warning("CUTLASS_NN_AUTOTUNE_CACHE: not saved: %s", exc)

    atexit.register(save_at_exit)
