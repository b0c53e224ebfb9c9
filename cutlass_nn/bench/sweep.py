"""--sweep: every SM90 tile configuration (and swizzle, split-K) of each GEMM shape."""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import torch

from cutlass_nn import ops
from cutlass_nn.bench.cases import Case
from cutlass_nn.bench.spec import AUTO_CONFIG, SWEEP_SPLITS
from cutlass_nn.bench.stats import _first_line, _fmt, _good_ratio, rate, time_stats, worst_errors
from cutlass_nn.bench.timing import Timer


SetConfig = Callable[..., list[int]]  # set_config(config, swizzle, splits=0) -> previous


def parse_config_names(text: str) -> list[str]:
    """The names of ``torch.ops.cutlass_nn._gemm_configs()``: one per line, a configuration's
    index is its line number ("" in the CPU flavor: no configuration)."""
    return [line.strip() for line in text.splitlines()]


def is_stream_k(name: str) -> bool:
    """Whether a configuration (by its name) uses the stream-K tile scheduler, the only one that
    reads the ``splits`` of ``_set_gemm_config``."""
    return "streamk" in name.lower()


def _too_many_arguments(exc: Exception) -> bool:
    """Whether calling the setter with (config, swizzle, splits) failed because it takes only
    (config, swizzle): a build from before ``splits`` (torch's schema check says "expected at
    most 2 argument(s)"; a Python stand-in raises TypeError)."""
    if isinstance(exc, TypeError):
        return True
    return bool(re.search(r"expected at most \d+ argument", str(exc)))


class ConfigSetter:
    """``set_config(config, swizzle, splits=0)``: forces a configuration through ``setter`` (the
    operator ``_set_gemm_config``) and returns the previous setting as a list (``[config,
    swizzle, splits]``, or ``[config, swizzle]`` from an older build; ``set_config(*previous)``
    restores either). An older setter that takes no ``splits`` still serves splits == 0; other
    splits raise RuntimeError. ``takes_splits``: True / False, or None until the first call shows
    it (when the setter has no schema to read)."""

    def __init__(self, setter: Callable[..., Any], takes_splits: bool | None = None):
        self.setter = setter
        self.takes_splits = takes_splits

    def __call__(self, config: int, swizzle: int, splits: int = 0) -> list[int]:
        config, swizzle, splits = int(config), int(swizzle), int(splits)
        if self.takes_splits is not False:
            try:
                previous = self.setter(config, swizzle, splits)
            except (TypeError, RuntimeError) as exc:
                if self.takes_splits or not _too_many_arguments(exc):
                    raise
                self.takes_splits = False
            else:
                self.takes_splits = True
                return [int(v) for v in previous]
        if splits != 0:
            raise RuntimeError(
                f"this cutlass_nn build's _set_gemm_config takes no splits argument (only config "
                f"and swizzle): cannot force splits={splits}; rebuild cutlass_nn, or sweep with "
                "--sweep-splits 0"
            )
        return [int(v) for v in self.setter(config, swizzle)]


def _schema_takes_splits(setter: Any) -> bool | None:
    """From the operator's schema: whether it has a third argument (None: no schema to read)."""
    try:
        return len(setter.default._schema.arguments) >= 3
    except Exception:
        return None


def gemm_config_api() -> tuple[list[str], SetConfig]:
    """The configuration names and the setter ``set_config(config, swizzle, splits=0)`` (a
    ConfigSetter: returns the previous setting). RuntimeError when this build has no such
    operators."""
    namespace = torch.ops.cutlass_nn
    try:
        text = namespace._gemm_configs()
        setter = namespace._set_gemm_config
    except (AttributeError, RuntimeError) as exc:
        raise RuntimeError(
            "this cutlass_nn build has no configuration override "
            f"(torch.ops.cutlass_nn._gemm_configs / _set_gemm_config): {_first_line(exc)}"
        ) from exc
    return parse_config_names(text), ConfigSetter(setter, _schema_takes_splits(setter))


def sweep_variants(
    names: Sequence[str],
    swizzles: Sequence[int],
    splits: Sequence[int] = SWEEP_SPLITS,
    configs: Sequence[int] | None = None,
) -> list[tuple[int, int, int]]:
    """(config, swizzle, splits) of a sweep: the automatic rule first, then every configuration
    (by index into ``names``; only those of ``configs`` when given) with every swizzle asked for,
    and every splits asked for when the configuration is a stream-K one (the others ignore
    splits: 0 only, once)."""
    variants = [AUTO_CONFIG]
    chosen = set(range(len(names))) if configs is None else set(configs)
    for c, name in enumerate(names):
        if c not in chosen:
            continue
        ks = list(dict.fromkeys(splits)) if is_stream_k(name) else [0]
        variants += [(c, s, k) for s in swizzles for k in ks]
    return variants


def variant_key(config: int, swizzle: int, splits: int = 0) -> str:
    """ "auto" for the rule's own choice, else e.g. "c3/s4" (config 3, swizzle 4, splits the
    rule's) or "c2/s1/k4" (split-K into 4)."""
    if (config, swizzle, splits) == AUTO_CONFIG:
        return "auto"
    key = f"{'auto' if config < 0 else f'c{config}'}/s{swizzle}"
    return f"{key}/k{splits}" if splits else key


def sweep_plan(
    dtypes: Sequence[str], shapes: Sequence[tuple[int, int, int]], ops_: Sequence[str]
) -> list[tuple[str, tuple[int, int, int], str]]:
    """(precision, shape, op) of each timed group of a sweep, in order."""
    return [(p, shape, op) for p in dtypes for shape in shapes for op in ops_]


def _with_config(
    set_config: SetConfig, config: int, swizzle: int, splits: int, fn: Callable[[int], Any]
):
    def run(i: int) -> Any:
        set_config(config, swizzle, splits)  # host state only: read by the next launch
        return fn(i)

    return run


def run_sweep_group(
    case: Case,
    variants: Sequence[tuple[int, int, int]],
    set_config: SetConfig,
    timer_for: Callable[[int], Timer],
    *,
    kernel_name: Callable[[], str] = ops.last_kernel_name,
    healthy: Callable[[], bool] = lambda: True,
) -> tuple[list[dict], dict | None, bool]:
    """One (shape, op) of the sweep. Each variant (config, swizzle, splits) is forced and checked
    like a row (a configuration that cannot run the shape raises: status "error" with the message's
    first line; a wrong result: "FAIL"); then the baseline and every variant that passed are timed
    together, interleaved (``timer_for(n_variants)``). The configuration in force before is
    restored at the end, also after an error. Returns (entries, baseline stats or None, whether
    the CUDA context is still usable)."""
    entries: list[dict] = []
    base_stats = None
    previous: list[int] | None = None
    context_ok = True
    try:
        with case.context():
            for config, swizzle, splits in variants:
                entry = {
                    "config": config,
                    "swizzle": swizzle,
                    "splits": splits,
                    "key": variant_key(config, swizzle, splits),
                    "status": "error",
                    "note": "",
                }
                entries.append(entry)
                if not context_ok:
                    entry["status"] = "skipped"
                    entry["note"] = "skipped: the CUDA context is unusable after an earlier error"
                    continue
                try:
                    prev = set_config(config, swizzle, splits)
                    if previous is None:
                        previous = prev
                    check = case.check()
                    entry["kernel"] = kernel_name()  # ours ran last in the check
                    entry["err_ours"], entry["err_torch"] = worst_errors({"check": check})
                    entry["status"] = "ok" if check["ok"] else "FAIL"
                    if not check["ok"]:
                        entry["note"] = f"wrong result, not timed: {check['summary']}"[:300]
                except Exception as exc:
                    entry["status"] = "error"
                    entry["note"] = _first_line(exc)
                    context_ok = healthy()
            timed = [e for e in entries if e["status"] == "ok"]
            if timed and context_ok:
                fns: dict[str, Callable[[int], Any]] = {"base": case.fns["base"]}
                for e in timed:
                    fns[e["key"]] = _with_config(
                        set_config, e["config"], e["swizzle"], e["splits"], case.fns["ours"]
                    )
                try:
                    times = timer_for(len(timed))(fns, case.n_sets)
                except Exception as exc:
                    for e in timed:
                        e["status"] = "error"
                        e["note"] = f"while timing: {_first_line(exc)}"
                    context_ok = healthy()
                else:
                    base_stats = time_stats(times["base"])
                    for e in timed:
                        e["ours"] = time_stats(times[e["key"]])
                        o = e["ours"]["median_ms"]
                        e["ratio"] = base_stats["median_ms"] / o if o > 0 else math.nan
    finally:
        if previous is not None:
            try:
                set_config(*previous)
            except Exception:
                if context_ok:  # with a broken context, the error that broke it matters more
                    raise
    return entries, base_stats, context_ok


def finish_sweep_entries(
    ident: dict, entries: Sequence[dict], base: dict | None, names: Sequence[str]
) -> list[dict]:
    """The JSON rows of one sweep group: identity (precision, op, shape, label, work), the
    configuration's name, the shared baseline statistics, and ours' rate."""
    rows = []
    for e in entries:
        row = dict(ident, **e)
        row["config_name"] = (
            "auto" if e["config"] < 0 else (names[e["config"]] if e["config"] < len(names) else "?")
        )
        if base is not None and "ours" in e:
            row["base"] = base
            row["ours_rate"] = rate(ident["work"], e["ours"]["median_ms"], "TFLOP/s")
            row["base_rate"] = rate(ident["work"], base["median_ms"], "TFLOP/s")
        rows.append(row)
    return rows


def sweep_best(rows: Sequence[dict]) -> list[dict]:
    """Per (precision, shape, op): the fastest measured variant (largest ratio) and the ratio and
    kernel of the automatic rule, for comparison."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        groups[(r["precision"], r["label"], r["op"])].append(r)
    out = []
    for (prec, label, op), rs in groups.items():
        measured = [r for r in rs if _good_ratio(r) is not None]
        auto = next((r for r in rs if r["key"] == "auto"), None)
        best = max(measured, key=lambda r: r["ratio"]) if measured else None
        out.append(
            {
                "precision": prec,
                "label": label,
                "op": op,
                "config": None if best is None else best["config"],
                "swizzle": None if best is None else best["swizzle"],
                "splits": None if best is None else best.get("splits", 0),
                "config_name": None if best is None else best["config_name"],
                "kernel": None if best is None else best.get("kernel"),
                "ratio": None if best is None else best["ratio"],
                "ours_median_ms": None if best is None else best["ours"]["median_ms"],
                "auto_ratio": None if auto is None else _good_ratio(auto),
                "auto_kernel": None if auto is None else auto.get("kernel"),
                "n_measured": len(measured),
            }
        )
    return out


_STATUS_CELL = {"FAIL": "FAIL", "error": "ERR", "skipped": "skip"}


def format_sweep_table(rows: Sequence[dict], names: Sequence[str], width: int = 6) -> list[str]:
    """The sweep as a table: one line per (precision, shape, op), one column per configuration
    ("auto" = the rule's choice, then c0, c1, ...); a cell is the best ratio (torch time / ours
    time) over the swizzles (and splits) tried, or ERR / FAIL / skip when none of them was
    measured."""
    lines = []
    legend = [f"c{i} {name}" for i, name in enumerate(names)]
    line = "configs:"
    for item in legend:
        if len(line) + len(item) + 3 > 190:
            lines.append(line)
            line = "        "
        line += f" {item} |"
    lines.append(line.rstrip(" |"))
    columns = ["auto"] + [f"c{i}" for i in range(len(names))]
    lines.append(
        "sweep: ratio = torch time / ours time, best over the swizzles and splits tried "
        "(>1: ours faster)"
    )
    lines.append(
        f"{'prec':<5} {'M x N x K':<18} {'op':<5} {'torch ms':>8}"
        + "".join(f"{c:>{width}}" for c in columns)
    )
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        groups[(r["precision"], r["label"], r["op"])].append(r)
    for (prec, label, op), rs in groups.items():
        base = next((r["base"]["median_ms"] for r in rs if r.get("base")), None)
        cells = []
        for i, _ in enumerate(columns):
            config = -1 if i == 0 else i - 1
            mine = [r for r in rs if r["config"] == config]
            ratios = [v for v in (_good_ratio(r) for r in mine) if v is not None]
            if ratios:
                text = f"{max(ratios):.3f}"
            elif not mine:
                text = "-"
            else:
                statuses = {r.get("status") for r in mine}
                status = next((s for s in ("FAIL", "error", "skipped") if s in statuses), "?")
                text = _STATUS_CELL.get(status, "?")
            cells.append(text.rjust(width))
        lines.append(f"{prec:<5} {label:<18} {op:<5} {_fmt(base, '8.4f'):>8}" + "".join(cells))
    return lines


def format_sweep_best(best: Sequence[dict]) -> list[str]:
    """One line per (precision, shape, op): the best configuration, swizzle and splits vs the
    rule's."""
    lines = ["best configuration per shape and op (ratio = torch time / ours time):"]
    for b in best:
        head = f"  {b['precision']} {b['label']} {b['op']}:"
        if b["config"] is None:
            lines.append(f"{head} nothing measured")
            continue
        auto = f"auto {_fmt(b['auto_ratio'])} {b.get('auto_kernel') or ''}".strip()
        line = (
            f"{head} {variant_key(b['config'], b['swizzle'], b.get('splits') or 0)} "
            f"{b['config_name']} "
            f"ratio {_fmt(b['ratio'])} ({auto})"
        )
        lines.append(line[:200])
    return lines


def format_sweep_progress(i: int, total: int, rows: Sequence[dict], elapsed_s: float) -> str:
    """One line per finished sweep group."""
    if not rows:
        return f"[{i + 1:3d}/{total} {elapsed_s:5.0f}s] (no variants)"
    r0 = rows[0]
    head = (
        f"[{i + 1:3d}/{total} {elapsed_s:5.0f}s] {r0['precision']} {r0['op']:<5} {r0['label']:<18}"
    )
    (best,) = sweep_best(rows)
    counts = Counter(r.get("status") for r in rows)
    base = next((r["base"]["median_ms"] for r in rows if r.get("base")), None)
    parts = [f"torch {_fmt(base, '.4f')} ms", f"auto {_fmt(best['auto_ratio'])}"]
    if best["config"] is not None:
        key = variant_key(best["config"], best["swizzle"], best["splits"] or 0)
        parts.append(f"best {key} {_fmt(best['ratio'])}")
    parts.append(", ".join(f"{n} {s}" for s, n in counts.items()))
    if counts.get("skipped") == len(rows) or counts.get("error") == len(rows):
        parts.append(str(r0.get("note", "")))
    return f"{head} " + "; ".join(parts)[:200]
