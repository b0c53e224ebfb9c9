"""Summary, targets, tables, JSON and plots of a run (pure; no GPU)."""

from __future__ import annotations

import json
import math
import os
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cutlass_nn.bench.spec import (
    ADD2_OPS,
    GEMM_OPS,
    LINACT_ACTIVATIONS,
    LINACT_ALL_OPS,
    LINACT_OPS,
    OP_TITLES,
    PRECISION_ORDER,
    SMALL_M,
    linact_op,
)
from cutlass_nn.bench.stats import _fmt, _fmt_err, _good_ratio, _max_or_nan, geomean, worst_errors


@dataclass(frozen=True)
class Target:
    """One performance target of the issue: the ``reduce`` ("geomean" or "min") of the ratios of
    the rows it selects must be >= ``threshold``."""

    key: str  # its key in summary["targets"]
    title: str
    group: str
    ops: tuple[str, ...]
    precisions: tuple[str, ...]
    reduce: str
    threshold: float
    max_m: int | None = None  # GEMM rows with M <= max_m only
    min_numel: int = 0  # add2 rows with at least this many elements only
    shape_set: str | None = None  # rows of this --shapes set only (None: the default shapes)

    def selects(self, row: dict) -> bool:
        shape = row.get("shape") or [0]
        return (
            row.get("shape_set") == self.shape_set
            and row.get("group") == self.group
            and row.get("op") in self.ops
            and row.get("precision") in self.precisions
            and (self.max_m is None or shape[0] <= self.max_m)
            and shape[0] >= self.min_numel
        )


TARGETS: tuple[Target, ...] = (
    *(
        Target(f"{p}_fwd_geomean", f"{p} fwd geomean", "gemm", ("fwd",), (p,), "geomean", 1.00)
        for p in ("bf16", "fp16")
    ),
    *(
        Target(f"{p}_fwd_min", f"{p} fwd min", "gemm", ("fwd",), (p,), "min", 0.90)
        for p in ("bf16", "fp16")
    ),
    *(
        Target(
            f"{p}_fwdbwd_geomean",
            f"{p} fwd+bwd geomean",
            "gemm",
            ("fwdbwd",),
            (p,),
            "geomean",
            1.00,
        )
        for p in ("bf16", "fp16")
    ),
    Target(
        "small_m_fwdbwd_min",
        f"small-M (M<={SMALL_M}) fwd+bwd min",
        "gemm",
        ("fwdbwd",),
        ("bf16", "fp16"),
        "min",
        1.5,
        max_m=SMALL_M,
    ),
    Target(
        "linact_eager_geomean",
        "linact vs eager geomean",
        "linact",
        ("eager",),
        ("bf16", "fp16"),
        "geomean",
        1.10,
    ),
    Target(
        "linact_compile_geomean",
        "linact vs compile geomean",
        "linact",
        ("compile",),
        ("bf16", "fp16"),
        "geomean",
        1.03,
    ),
    # "Fusions", item 5: every fused epilogue at the MLP shapes (--linact-set mlp), each row
    *(
        Target(
            f"linact_mlp_{baseline}_min",
            f"linact MLP vs {baseline} min",
            "linact",
            tuple(linact_op(baseline, act) for act in LINACT_ACTIVATIONS),
            ("bf16",),
            "min",
            threshold,
            shape_set="mlp",
        )
        for baseline, threshold in (("eager", 1.05), ("compile", 1.00))
    ),
    Target(
        "add2_16m_256m_min",
        "add2 16M/256M min",
        "add2",
        ADD2_OPS,
        ("bf16", "fp32"),
        "min",
        0.95,
        min_numel=1 << 24,
    ),
    # "Real models, part 2": the transformer shape set (--shapes transformer), per operation
    *(
        Target(
            f"transformer_{op}_{reduce}",
            f"transformer {op} {reduce}",
            "gemm",
            (op,),
            ("bf16", "fp16"),
            reduce,
            threshold,
            shape_set="transformer",
        )
        for op in ("fwd", "dgrad", "wgrad")
        for reduce, threshold in (("geomean", 1.00), ("min", 0.90))
    ),
    Target(
        "fp32_highest_geomean",
        "fp32 highest vs cuBLAS geomean",
        "gemm",
        ("fwd", "dgrad", "wgrad", "fwdbwd"),
        ("fp32",),
        "geomean",
        2.0,
    ),
)


def evaluate_targets(rows: Sequence[dict], targets: Sequence[Target] = TARGETS) -> dict:
    """``{key: record}`` for each target: the value over the rows that were measured (status ok),
    the status PASS (value >= threshold and no selected row FAILed or errored), MISS, or "n/a"
    (no selected row was measured), the row counts, and for "min" the worst row."""
    out = {}
    for t in targets:
        sel = [r for r in rows if t.selects(r)]
        good = [(r, _good_ratio(r)) for r in sel]
        good = [(r, v) for r, v in good if v is not None]
        counts = Counter(r.get("status", "?") for r in sel)
        bad = counts.get("FAIL", 0) + counts.get("error", 0)
        value, worst = None, None
        if good:
            if t.reduce == "min":
                worst, value = min(good, key=lambda rv: rv[1])
            else:
                value = geomean([v for _, v in good])
        if value is None:
            status = "MISS" if bad else "n/a"
        else:
            status = "PASS" if value >= t.threshold and not bad else "MISS"
        out[t.key] = {
            "title": t.title,
            "reduce": t.reduce,
            "threshold": t.threshold,
            "value": value,
            "status": status,
            "n_ok": len(good),
            "n_rows": len(sel),
            "not_ok": {k: v for k, v in counts.items() if k != "ok"},
            "worst": None if worst is None else describe(worst),
        }
    return out


def summarize(rows: Sequence[dict]) -> dict:
    """Geometric means of the ratio per (group, op, precision), the fwd and fwd+bwd geomeans per
    precision, the smallest ratio, the small-M GEMM ratios, the errors of the float32 "highest"
    rows (ours and cuBLAS vs float64), the issue's targets and the row counts by status."""
    ok = [r for r in rows if r.get("status") == "ok" and r.get("ratio") is not None]
    groups: dict[tuple, list[float]] = defaultdict(list)
    eager_groups: dict[tuple, list[float]] = defaultdict(list)
    for r in ok:
        groups[(r["group"], r["op"], r["precision"])].append(r["ratio"])
        if r.get("eager_ratio") is not None:
            eager_groups[(r["group"], r["op"], r["precision"])].append(r["eager_ratio"])
    geomeans = [
        {
            "group": g,
            "op": op,
            "precision": p,
            "geomean": geomean(v),
            "eager_geomean": geomean(eager_groups.get((g, op, p), [])),
            "n": len(v),
        }
        for (g, op, p), v in groups.items()
    ]

    def per_precision(op: str) -> dict[str, float | None]:
        return {
            e["precision"]: e["geomean"] for e in geomeans if e["group"] == "gemm" and e["op"] == op
        }

    valid = [r for r in ok if math.isfinite(r["ratio"])]
    worst = min(valid, key=lambda r: r["ratio"]) if valid else None
    small_m = [
        {"precision": r["precision"], "op": r["op"], "label": r["label"], "ratio": r["ratio"]}
        for r in ok
        if r["group"] == "gemm" and r["shape"][0] <= SMALL_M
    ]
    fp32_errors = []
    for r in rows:
        if r.get("group") == "gemm" and r.get("precision") == "fp32" and r.get("check"):
            e_ours, e_torch = worst_errors(r)
            fp32_errors.append(
                {
                    "label": r["label"],
                    "op": r["op"],
                    "status": r.get("status"),
                    "err_ours": e_ours,
                    "err_torch": e_torch,
                }
            )
    return {
        "ratio_definition": "base median time / ours median time (> 1: cutlass_nn is faster)",
        "geomeans": geomeans,
        "fwd_geomean": per_precision("fwd"),
        "fwdbwd_geomean": per_precision("fwdbwd"),
        "min_ratio": None if worst is None else {"ratio": worst["ratio"], "row": describe(worst)},
        "small_m": small_m,
        "fp32_highest_errors": fp32_errors,
        "targets": evaluate_targets(rows),
        "counts": dict(Counter(r.get("status", "?") for r in rows)),
    }


def describe(row: dict) -> str:
    """e.g. "gemm bf16 fwd 16384x4096x4096"."""
    return f"{row['group']} {row['precision']} {row['op']} {row['label']}"


def _cell(row: dict | None, width: int, show_rate: bool = False) -> str:
    """A table cell: the ratio (with ours' rate before it) or the row's status."""
    if row is None:
        text = "-"
    elif row.get("status") != "ok":
        text = {"FAIL": "FAIL", "error": "ERR", "skipped": "skip"}.get(row.get("status"), "?")
    else:
        ratio = row.get("ratio")
        text = f"{ratio:.3f}" if ratio is not None and math.isfinite(ratio) else "nan"
        if show_rate:
            r = row.get("ours_rate")
            text = f"{r:7.1f} {text}" if r is not None and math.isfinite(r) else f"    nan {text}"
    return text.rjust(width)


def format_tables(rows: Sequence[dict]) -> list[str]:
    """The compact tables: GEMM ratios per (precision, shape) and add2 GB/s per (dtype, size)."""
    lines: list[str] = []
    mlp = [r for r in rows if r["group"] == "linact" and r.get("shape_set") == "mlp"]
    rows = [r for r in rows if not (r["group"] == "linact" and r.get("shape_set") == "mlp")]
    index = {(r["group"], r["op"], r["precision"], r["label"]): r for r in rows}
    gemm_keys = list(
        dict.fromkeys(
            (r["precision"], r["label"]) for r in rows if r["group"] in ("gemm", "linact")
        )
    )
    linact = any(r["group"] == "linact" for r in rows)
    if gemm_keys:
        lines.append(
            "GEMM: ratio = torch time / ours time (>1: ours faster); TF = ours TFLOP/s; "
            "tf32 = float32 with TF32, fp32 = 'highest'"
            + ("; linact = Linear+GELU(tanh) fwd+bwd vs eager / torch.compile" if linact else "")
        )
        lines.append(
            f"{'prec':<5} {'M x N x K':<18} {'fwd TF':>7} {'ratio':>6} {'sm80':>6} {'dgrad':>6} "
            f"{'wgrad':>6} {'f+b TF':>7} {'ratio':>6}"
            + (f" {'act/eg':>6} {'act/cp':>6}" if linact else "")
        )
        for prec, label in sorted(gemm_keys, key=lambda k: PRECISION_ORDER.index(k[0])):
            c = {op: index.get(("gemm", op, prec, label)) for op in GEMM_OPS}
            line = (
                f"{prec:<5} {label:<18} {_cell(c['fwd'], 14, True)} {_cell(c['sm80'], 6)} "
                f"{_cell(c['dgrad'], 6)} {_cell(c['wgrad'], 6)} {_cell(c['fwdbwd'], 14, True)}"
            )
            if linact:
                for op in LINACT_OPS:
                    line += " " + _cell(index.get(("linact", op, prec, label)), 6)
            lines.append(line)
    add2_keys = list(
        dict.fromkeys((r["precision"], r["label"]) for r in rows if r["group"] == "add2")
    )
    if add2_keys:
        lines.append("add2: GB/s counting 2 reads + 1 write; ratio = torch time / ours time")
        lines.append(
            f"{'dtype':<5} {'elements':>10} {'fwd ours':>9} {'torch':>7} {'ratio':>6} "
            f"{'f+b ours':>9} {'torch':>7} {'ratio':>6}"
        )
        for prec, label in add2_keys:
            cells = []
            for op in ADD2_OPS:
                r = index.get(("add2", op, prec, label))
                if r is not None and r.get("status") == "ok":
                    cells.append(f"{r['ours_rate']:9.0f} {r['base_rate']:7.0f} {_cell(r, 6)}")
                else:
                    cells.append(f"{'':9} {'':7} {_cell(r, 6)}")
            lines.append(f"{prec:<5} {int(label):>10} " + " ".join(cells))
    return lines + _format_linact_mlp(mlp)


def _format_linact_mlp(rows: Sequence[dict]) -> list[str]:
    """The --linact-set mlp table: per MLP shape, each activation's ratio against the eager and
    the torch.compile baseline."""
    if not rows:
        return []
    index = {(r["op"], r["label"]): r for r in rows}
    header = "".join(f" {act + ' eg':>12} {act + ' cp':>12}" for act in LINACT_ACTIVATIONS)
    lines = [
        "linact MLP (Linear + bias + activation fwd+bwd, T x 4h x h): ratio = torch time / ours "
        "time vs eager (eg) and torch.compile (cp)",
        f"{'T x 4h x h':<18}{header}",
    ]
    for label in dict.fromkeys(r["label"] for r in rows):
        cells = "".join(
            " " + _cell(index.get((linact_op(baseline, act), label)), 12)
            for act in LINACT_ACTIVATIONS
            for baseline in LINACT_OPS
        )
        lines.append(f"{label:<18}{cells}")
    return lines


def format_summary(
    summary: dict, peaks: dict, rows: Sequence[dict], max_problems: int = 6
) -> list[str]:
    """Peaks, geometric means, the minimum, small-M ratios, problems (FAIL / error) and counts."""
    lines = []
    mm = ", ".join(f"{p} {_fmt(v, '.0f')}" for p, v in (peaks.get("mm_tflops") or {}).items())
    lines.append(
        f"peaks: torch.mm 8192^3 {mm or 'n/a'} TFLOP/s; "
        f"copy {_fmt(peaks.get('copy_gbps'), '.0f')} GB/s (read+write)"
    )
    by_op: dict[tuple[str, str], list[str]] = defaultdict(list)
    by_op_eager: dict[tuple[str, str], list[str]] = defaultdict(list)
    for e in summary["geomeans"]:
        by_op[(e["group"], e["op"])].append(f"{e['precision']} {_fmt(e['geomean'])} ({e['n']})")
        if e.get("eager_geomean") is not None:
            by_op_eager[(e["group"], e["op"])].append(
                f"{e['precision']} {_fmt(e['eager_geomean'])}"
            )
    for heading, table in (
        ("geomean ratio (>1: ours faster), rows in ():", by_op),
        ("geomean eager-latency ratio (one call, host included; >1: ours returns sooner):",
         by_op_eager),
    ):
        if not table:
            continue
        lines.append(heading)
        for (group, op), parts in table.items():
            title = OP_TITLES.get(op, op)
            name = title if group == "gemm" else f"{group} {title}"
            lines.append(f"  {name:<17} " + "  ".join(parts))
    if summary["min_ratio"]:
        lines.append(
            f"min ratio: {_fmt(summary['min_ratio']['ratio'])} ({summary['min_ratio']['row']})"
        )
    small: dict[tuple[str, str], list[str]] = defaultdict(list)
    for e in summary["small_m"]:
        small[(e["precision"], e["label"])].append(
            f"{OP_TITLES.get(e['op'], e['op'])} {_fmt(e['ratio'])}"
        )
    for (prec, label), parts in small.items():
        lines.append(f"small M {prec} {label}: " + ", ".join(parts))
    lines += format_fp32_errors(summary.get("fp32_highest_errors") or [])
    problems = [r for r in rows if r.get("status") in ("FAIL", "error")]
    for r in problems[:max_problems]:
        lines.append(f"{r['status'].upper()} {describe(r)}: {r.get('note', '')}"[:200])
    if len(problems) > max_problems:
        lines.append(f"... {len(problems) - max_problems} more FAIL / error rows in the JSON")
    skipped = [r for r in rows if r.get("status") == "skipped"]
    if skipped:
        first = skipped[0]
        line = f"skipped {len(skipped)} row(s), e.g. {describe(first)}: {first.get('note', '')}"
        lines.append(line[:200])
    lines += format_targets(summary.get("targets") or {})
    counts = summary["counts"]
    lines.append(
        "rows: " + ", ".join(f"{counts.get(s, 0)} {s}" for s in ("ok", "FAIL", "error", "skipped"))
    )
    return lines


def format_fp32_errors(entries: Sequence[dict]) -> list[str]:
    """One line per float32 "highest" shape: the worst relative error (vs float64) of ours and
    of cuBLAS over its fwd / dgrad / wgrad / fwd+bwd rows (sm80 is left out)."""
    by_label: dict[str, list[dict]] = defaultdict(list)
    for e in entries:
        if e["op"] != "sm80":
            by_label[e["label"]].append(e)
    lines = []
    for label, es in by_label.items():
        ops_ = ",".join(OP_TITLES.get(e["op"], e["op"]) for e in es)
        lines.append(
            f"fp32 highest {label}: ours err {_fmt_err(_max_or_nan([e['err_ours'] for e in es]))}"
            f" vs cuBLAS err {_fmt_err(_max_or_nan([e['err_torch'] for e in es]))} "
            f"(worst of {ops_})"
        )
    return lines


def format_targets(targets: dict) -> list[str]:
    """The issue's targets, one line each: PASS / MISS / n/a, the threshold and the value."""
    if not targets:
        return []
    lines = ["targets (PASS: met on the rows measured; MISS also when a selected row failed):"]
    for t in targets.values():
        extra = []
        if t.get("worst"):
            extra.append(f"worst {t['worst']}")
        extra.append(f"{t['n_ok']}/{t['n_rows']} rows")
        extra += [f"{n} {status}" for status, n in (t.get("not_ok") or {}).items()]
        lines.append(
            f"  {t['status']:<4} {t['title']:<30} >= {t['threshold']:.2f}: "
            f"{_fmt(t['value'])} ({', '.join(extra)})"[:200]
        )
    return lines


def format_progress(i: int, total: int, row: dict, elapsed_s: float) -> str:
    """One line per finished row, printed while the run goes."""
    head = (
        f"[{i + 1:3d}/{total} {elapsed_s:5.0f}s] "
        f"{row['precision']:<4} {row['group']:<6} {row['op']:<7} {row['label']:<18}"
    )
    if row.get("status") != "ok":
        return f"{head} {row.get('status', '?').upper()}: {row.get('note', '')}"[:240]
    o = row["ours"]
    return (
        f"{head} ours {row['ours_rate']:7.1f} {row['unit']} "
        f"[{o['p10_ms']:.4g}-{o['p90_ms']:.4g} ms] "
        f"torch {row['base_rate']:7.1f} ratio {row['ratio']:.3f} "
        + (
            f"eager {row['ours_eager_ms'] * 1e3:.0f}/{row['base_eager_ms'] * 1e3:.0f} us "
            f"{row['eager_ratio']:.3f} "
            if row.get("eager_ratio") is not None
            else ""
        )
        + f"(n={o['n']}, sets={row.get('input_sets')}) "
        f"{row.get('kernel') or ''}"
    )[:240]


def to_jsonable(obj: Any) -> Any:
    """Plain JSON: NaN / inf become null, tuples lists, anything unknown its str()."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, (bool, int, str)) or obj is None:
        return obj
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    return str(obj)


def write_json(path: Path, results: dict) -> None:
    """Writes atomically (a partial file never replaces a complete one)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(to_jsonable(results), indent=1, allow_nan=False) + "\n")
    os.replace(tmp, path)


def plot_results(rows: Sequence[dict], path: Path, title: str) -> Path | None:
    """Bars of the ratio per shape, one panel per GEMM precision (one bar per operation) and one
    for add2, with the 1.0 line. Rows that are not ok get a status letter instead of a bar."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        ("gemm", p)
        for p in PRECISION_ORDER
        if any(r["group"] in ("gemm", "linact") and r["precision"] == p for r in rows)
    ]
    panels += [
        ("add2", p)
        for p in ("bf16", "fp32")
        if any(r["group"] == "add2" and r["precision"] == p for r in rows)
    ]
    if not panels:
        return None
    fig, axes = plt.subplots(
        len(panels), 1, figsize=(13, 1.2 + 3.4 * len(panels)), squeeze=False, layout="constrained"
    )
    for ax, (group, prec) in zip(axes[:, 0], panels):
        groups = ("gemm", "linact") if group == "gemm" else (group,)
        sel = [r for r in rows if r["group"] in groups and r["precision"] == prec]
        labels = list(dict.fromkeys(r["label"] for r in sel))
        candidates = (
            [("gemm", op) for op in GEMM_OPS] + [("linact", op) for op in LINACT_ALL_OPS]
            if group == "gemm"
            else [(group, op) for op in ADD2_OPS]
        )
        op_list = [
            (g, op) for g, op in candidates if any((r["group"], r["op"]) == (g, op) for r in sel)
        ]
        width = 0.8 / max(len(op_list), 1)
        index = {(r["group"], r["op"], r["label"]): r for r in sel}
        for j, (g, op) in enumerate(op_list):
            xs, ys = [], []
            for i, label in enumerate(labels):
                r = index.get((g, op, label))
                x = i - 0.4 + width * (j + 0.5)
                if r is None:
                    continue
                if _good_ratio(r) is not None:
                    xs.append(x)
                    ys.append(r["ratio"])
                else:
                    ax.text(
                        x,
                        0.02,
                        {"FAIL": "F", "error": "E", "skipped": "S"}.get(r.get("status"), "?"),
                        ha="center",
                        va="bottom",
                        fontsize=8,
                        color="red",
                    )
            op_title = OP_TITLES.get(op, op)
            ax.bar(xs, ys, width, label=op_title if g != "linact" else f"linact {op_title}")
        ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
        top = max([_good_ratio(r) or 0.0 for r in sel] + [1.0])
        ax.set_ylim(0, min(top, 20.0) * 1.3)  # headroom for the legend
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, rotation=15, fontsize=8)
        ax.set_ylabel("torch time / ours time")
        ax.set_title(
            f"{group} {prec}  (>1: cutlass_nn faster; F fail, E error, S skipped)", fontsize=10
        )
        ax.legend(fontsize=8, ncol=len(op_list), loc="upper right")
    fig.suptitle(title, fontsize=11)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
