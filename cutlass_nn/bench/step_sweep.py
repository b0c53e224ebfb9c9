"""``python -m cutlass_nn.bench --what step-sweep``: each GEMM configuration timed inside the step.

The configuration sweep (``--sweep``) times every tile configuration of a GEMM shape in isolation,
one shape at a time, and the per-shape rule is fitted to it. Inside a model's training step the
same GEMMs run at other speeds (the GPU's clock, what the neighbouring kernels left in L2), and
not always in the sweep's order: in a compiled Llama step at hidden 1024, cuBLAS ran the 32000 x
1024 language-model head's weight gradient in 330 us where the sweep timed it at 380, ours in 391
against the sweep's 381 (benchmarks/NOTES.md v0.24). This benchmark measures the choice where it
counts: it builds a model of the model benchmark (:mod:`cutlass_nn.bench.models`; same family,
size, weights and batches) converted with ``cutlass_nn.convert``, compiles it (``--mode``), and
then, in interleaved rounds, forces each candidate configuration on every GEMM of the step
(``torch.ops.cutlass_nn._set_gemm_config``; where a configuration has no kernel for a problem,
the dispatcher's fallback for a forced configuration runs, and the report names the kernel that
ran), profiles ``--steps`` steps with each, and reports every GEMM operator's GPU time per call
by its input shapes under each candidate, beside the rule's (candidate ``rule``) and the stock
model's cuBLAS GEMMs of the same (m, n, k). A forced configuration changes no result beyond
rounding (every kernel computes the same product), and the dispatcher's plan cache keys on it,
so no recompilation happens between rounds.

What the table covers: the plain linear operators (:data:`SWEPT_OPS`, what ``convert`` makes of
an ``nn.Linear``); the forced configuration reaches every other 16-bit GEMM of the step too
(``mm``, accumulating weight gradients), whose time is in the step's total (``step_gpu_ms``)
but not in the table. The cuBLAS reference is by (m, n, k) only: the profiler records shapes,
not strides, so where the stock step runs several GEMMs of one (m, n, k) in different layouts
(a forward and another layer's dgrad), ``cublas_us_same_mnk`` lists each of their times and the
table prints the smallest.

Usage::

    python -m cutlass_nn.bench --what step-sweep [--family llama] [--size host] [--mode compile]
        [--candidates rule,0,2,2/1,2/2,3,3:2,10,13,14,14:1] [--rounds 3] [--steps 2]
        [--warmup 3] [--settle 2.0] [--vocab N] [--pdl] [--out DIR]

A candidate is ``rule`` or ``config[/splits][:swizzle]`` (``2/1``: config 2 data-parallel,
``14:1``: config 14 with a swizzle of 1), either with ``+c`` appended (``rule+c``, ``15+c``): the
plain products then run on the kernels with a C operand, as before v0.38, instead of those
without one (``_set_epilogue_without_c(False)``). ``reduce-overhead`` mode is refused: a CUDA-graph replay
records no operators, and its kernels were captured with one configuration. The GEMMs run without
programmatic dependent launch unless ``--pdl`` (with it, a GEMM's kernel starts while the one
before it finishes and waits for it on the GPU, so its measured time includes the end of its
predecessor and each candidate's time depends on its neighbours' candidates). JSON to ``--out``,
a table on stdout.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

#: The cutlass_nn operators whose GEMM this sweep forces (plain bf16 linears: what ``convert``
#: makes of an ``nn.Linear``), and how their input shapes give the GEMM's (m, n, k).
SWEPT_OPS = ("cutlass_nn::linear", "cutlass_nn::linear_dgrad", "cutlass_nn::linear_wgrad")

DEFAULT_CANDIDATES = "rule,0,2,2/1,2/2,3,3:2,10,13,14,14:1"


@dataclass(frozen=True)
class Candidate:
    """One forced setting of ``_set_gemm_config``: config -1 is the rule; ``with_c``: plain
    products on the kernels with a C operand (``_set_epilogue_without_c(False)``)."""

    config: int
    splits: int = 0
    swizzle: int = 0
    with_c: bool = False

    @property
    def label(self) -> str:
        suffix = "+c" if self.with_c else ""
        if self.config < 0:
            return "rule" + suffix
        text = str(self.config)
        if self.splits:
            text += f"/{self.splits}"
        if self.swizzle:
            text += f":{self.swizzle}"
        return text + suffix


_CANDIDATE = re.compile(r"^(\d+)(?:/(\d+))?(?::(\d+))?(\+c)?$")


def parse_candidates(text: str, config_count: int | None = None) -> list[Candidate]:
    """``rule,0,2/1,14:1`` -> candidates, the rule first (added if missing), no duplicates.
    Raises ValueError naming the bad entry."""
    out: list[Candidate] = [Candidate(-1)]
    for raw in text.split(","):
        item = raw.strip()
        if not item or item == "rule":
            continue
        if item == "rule+c":
            c = Candidate(-1, with_c=True)
            if c not in out:
                out.append(c)
            continue
        m = _CANDIDATE.match(item)
        if m is None:
            raise ValueError(f"--candidates: {item!r} is not 'rule' or config[/splits][:swizzle], "
                             f"with an optional '+c'")
        c = Candidate(int(m.group(1)), int(m.group(2) or 0), int(m.group(3) or 0),
                      m.group(4) is not None)
        if config_count is not None and c.config >= config_count:
            raise ValueError(f"--candidates: config {c.config} of {item!r} is not below the "
                             f"build's {config_count} configurations")
        if c.swizzle > 8 or c.splits > 64:
            raise ValueError(f"--candidates: {item!r}: swizzle must be <= 8 and splits <= 64")
        if c not in out:
            out.append(c)
    return out


def gemm_mnk(op: str, shapes: Sequence[Sequence[int]]) -> tuple[int, int, int]:
    """(m, n, k) of the GEMM an operator call runs, from its input shapes: ``linear(x [.., K],
    w [N, K])`` -> (T, N, K) with T the product of x's leading dims; ``linear_dgrad(g [.., N],
    w [N, K])`` -> (T, K, N); ``linear_wgrad(g [.., N], x [.., K])`` -> (N, K, T); ``aten::mm(a
    [M, K], b [K, N])`` -> (M, N, K)."""
    a, b = list(shapes[0]), list(shapes[1])
    rows = math.prod(a[:-1]) if len(a) > 1 else 1
    if op == "cutlass_nn::linear":
        return rows, b[0], a[-1]
    if op == "cutlass_nn::linear_dgrad":
        return rows, b[1], a[-1]
    if op == "cutlass_nn::linear_wgrad":
        return a[-1], b[-1], rows
    if op in ("aten::mm", "aten::addmm"):
        if op == "aten::addmm":  # addmm(bias, a, b)
            a, b = list(shapes[1]), list(shapes[2])
        return a[0], b[1], a[1]
    raise ValueError(f"gemm_mnk: no (m, n, k) rule for operator {op!r}")


def parse_shapes(text: str) -> list[list[int]]:
    """The profiler's input-shapes text (``[[4, 1024], [1024, 1024], []]``) as lists."""
    return json.loads(text)


def summarize_rounds(per_round: Sequence[dict[tuple[str, str], float]]) -> dict[tuple[str, str], float]:
    """Median over rounds of each (operator, shapes) time; keys missing in a round are skipped."""
    acc: dict[tuple[str, str], list[float]] = defaultdict(list)
    for times in per_round:
        for key, us in times.items():
            acc[key].append(us)
    return {key: statistics.median(v) for key, v in acc.items()}


def best_per_problem(times: dict[str, dict[tuple[str, str], float]], margin: float = 0.02
                     ) -> dict[tuple[str, str], dict[str, Any]]:
    """For each (operator, shapes): the fastest candidate and its time relative to the rule's
    (``rule_over_best`` > 1: the candidate is faster); the rule is kept unless a candidate beats
    it by more than ``margin`` (the spread of in-step timings)."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    rule = times.get("rule", {})
    for key, rule_us in rule.items():
        best_label, best_us = "rule", rule_us
        for label, t in times.items():
            us = t.get(key)
            if us is not None and us < best_us:
                best_label, best_us = label, us
        if best_label != "rule" and rule_us <= best_us * (1 + margin):
            best_label, best_us = "rule", rule_us
        out[key] = {"best": best_label, "best_us": best_us, "rule_us": rule_us,
                    "rule_over_best": rule_us / best_us if best_us > 0 else 1.0}
    return out


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    from cutlass_nn.bench import models

    p = argparse.ArgumentParser(prog="python -m cutlass_nn.bench --what step-sweep")
    p.add_argument("--what", choices=["step-sweep"], default="step-sweep")
    p.add_argument("--family", choices=models.FAMILIES, default="llama")
    p.add_argument("--size", choices=models.SIZES, default="host")
    p.add_argument("--mode", choices=("eager", "compile"), default="compile",
                   help="eager or torch.compile (reduce-overhead replays record no operators)")
    p.add_argument("--candidates", default=DEFAULT_CANDIDATES)
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds over the candidates")
    p.add_argument("--steps", type=int, default=2, help="profiled steps per candidate and round")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (compiles)")
    p.add_argument("--settle", type=float, default=2.0,
                   help="seconds of untimed steps after the warm-up, before the first round "
                        "(the GPU clock's ramp)")
    p.add_argument("--vocab", type=int, default=None, help="vocabulary (default: the size's)")
    p.add_argument("--pdl", action="store_true",
                   help="keep programmatic dependent launch on (off by default: see the docstring)")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = p.parse_args(list(argv))
    try:
        args.candidate_list = parse_candidates(args.candidates)
    except ValueError as exc:
        p.error(str(exc))
    for name in ("rounds", "steps"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if not (math.isfinite(args.settle) and 0 <= args.settle <= 600):
        p.error(f"--settle must be seconds in [0, 600], got {args.settle}")
    if args.mode == "compile" and args.warmup < 2:
        p.error(f"--mode compile compiles in its first steps: --warmup must be >= 2, got {args.warmup}")
    return args


def _profiled_gemm_times(trainer, batches, steps: int, ops: Sequence[str]
                         ) -> tuple[dict, float, dict]:
    """GPU microseconds per call of each (operator, shapes) in ``ops`` over ``steps`` steps, the
    step's GPU milliseconds (every kernel), and each (operator, shapes)'s calls per step."""
    from cutlass_nn.bench import step_profile as sp

    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts, record_shapes=True) as prof:
        for i in range(steps):
            trainer.step(batches[i % len(batches)])
        torch.cuda.synchronize()
    events = prof.events()
    rows = [g for g in sp.summarize_gemm_ops(sp.gemm_op_calls(events), steps, top=len(events))
            if g["op"] in ops]
    gpu_us = sum(e.device_time for e in events if sp.is_kernel(e))
    return ({(g["op"], g["shapes"]): g["us_per_call"] for g in rows}, gpu_us / steps / 1e3,
            {(g["op"], g["shapes"]): g["calls_per_step"] for g in rows})


def _probe_kernel(op: str, shapes: list[list[int]], candidate: Candidate) -> str:
    """The kernel that ``op`` runs on fresh contiguous bf16 operands of ``shapes`` with
    ``candidate`` forced (what a forced configuration without a kernel for the problem falls
    back to)."""
    import cutlass_nn

    ops = torch.ops.cutlass_nn
    args = [torch.randn(s, device="cuda", dtype=torch.bfloat16) if s else None for s in shapes]
    previous = ops._set_gemm_config(candidate.config, candidate.swizzle, candidate.splits)
    previous_without_c = ops._set_epilogue_without_c(not candidate.with_c)
    try:
        if op == "cutlass_nn::linear":
            ops.linear(args[0], args[1], args[2] if len(args) > 2 else None)
        elif op == "cutlass_nn::linear_dgrad":
            ops.linear_dgrad(args[0], args[1])
        else:
            ops.linear_wgrad(args[0], args[1])
        torch.cuda.synchronize()
        return cutlass_nn.ops.last_kernel_name()
    finally:
        ops._set_gemm_config(*previous)
        ops._set_epilogue_without_c(previous_without_c)


def round_order(candidates: Sequence[Candidate], r: int) -> list[Candidate]:
    """The candidates of round ``r``: in the given order in even rounds and reversed in odd ones
    (no candidate always runs right after the same one, whose GPU clock and L2 contents it
    inherits), rotated by ``r // 2`` (no candidate always runs first: until v0.33's sweeps the
    odd rounds reversed a rotation by ``r``, which put the first candidate, the rule, first in
    rounds 0 and 1, right after the warm-up, and its times came out 1-4% slow)."""
    n = len(candidates)
    seq = list(candidates) if r % 2 == 0 else list(candidates)[::-1]
    k = (r // 2) % n
    return seq[k:] + seq[:k]


def settle(trainer, batches, seconds: float) -> int:
    """Untimed steps until ``seconds`` have passed (at least one): the GPU's clock rises over the
    first second or so of load, and the first candidate of the first round must not pay for it.
    Returns the number of steps run."""
    import time

    steps = 0
    start = time.perf_counter()
    while steps == 0 or time.perf_counter() - start < seconds:
        trainer.step(batches[steps % len(batches)])
        if torch.cuda.is_available():
            torch.cuda.synchronize()  # wall time of GPU work, not of enqueueing it
        steps += 1
    return steps


def _probe_or_error(op: str, shapes: list[list[int]], candidate: Candidate) -> str:
    """:func:`_probe_kernel`, or ``"error: ..."`` (out of memory, a refused forced setting): a
    probe that fails must not lose the sweep's timings."""
    try:
        return _probe_kernel(op, shapes, candidate)
    except (RuntimeError, torch.cuda.OutOfMemoryError) as exc:
        return f"error: {str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__}"


def _sweep_rounds(args, candidates, trainer, batches, setter, per_round, step_ms, calls,
                  previous: Sequence[int]) -> None:
    """The interleaved rounds: each candidate forced, one untimed step, ``args.steps`` profiled
    ones; the setting in force before (``previous``) is restored even when a step raises."""
    without_c = torch.ops.cutlass_nn._set_epilogue_without_c
    previous_without_c = without_c(True)
    try:
        for r in range(args.rounds):
            order = round_order(candidates, r)
            for c in order:
                setter(c.config, c.swizzle, c.splits)
                without_c(not c.with_c)
                trainer.step(batches[0])  # one untimed step on the new setting
                torch.cuda.synchronize()
                times, ms, per_step = _profiled_gemm_times(trainer, batches, args.steps, SWEPT_OPS)
                calls.update(per_step)
                per_round[c.label].append(times)
                step_ms[c.label].append(ms)
    finally:
        setter(*previous)
        without_c(previous_without_c)


def main(argv: Sequence[str]) -> int:
    from cutlass_nn.bench import cli as bench
    from cutlass_nn.bench import models
    from cutlass_nn.bench import step_profile as sp

    args = parse_args(argv)
    meta = bench.gpu_run_meta(argv)
    if meta is None:
        return 2
    import cutlass_nn

    names = [n for n in torch.ops.cutlass_nn._gemm_configs().splitlines() if n]
    try:
        candidates = parse_candidates(args.candidates, len(names))
    except ValueError as exc:
        print(f"cutlass_nn.bench --what step-sweep: {exc}")
        return 2
    size = models.MODEL_SIZES[args.size]
    if args.vocab:
        from dataclasses import replace

        size = replace(size, vocab=args.vocab)
    batches = models.make_batches(size, 4, "cuda")

    # The stock model's GEMMs in the same mode, for reference (cuBLAS by (m, n, k)).
    with torch.device("cuda"):
        stock = models.build_model(args.family, size).to(dtype=torch.bfloat16)
    stock_side = sp.profile_side(stock, batches, args.steps, args.warmup, 60, args.mode)
    del stock
    torch.cuda.empty_cache()
    cublas: dict[tuple[int, int, int], list[float]] = defaultdict(list)
    for g in stock_side["gemm_ops"]:
        if g["op"] in ("aten::mm", "aten::addmm"):
            mnk = gemm_mnk(g["op"], parse_shapes(g["shapes"]))
            cublas[mnk].append(g["us_per_call"])

    torch._dynamo.reset()
    with torch.device("cuda"):
        model = models.build_model(args.family, size).to(dtype=torch.bfloat16)
    model = cutlass_nn.convert(model)
    trainer = models.Trainer(model, args.mode, "cuda")
    for i in range(args.warmup):
        trainer.step(batches[i % len(batches)])
    torch.cuda.synchronize()
    settle(trainer, batches, args.settle)

    per_round: dict[str, list[dict]] = defaultdict(list)
    step_ms: dict[str, list[float]] = defaultdict(list)
    setter = torch.ops.cutlass_nn._set_gemm_config
    calls: dict[tuple[str, str], float] = {}
    previous = setter(-1, 0, 0)
    with cutlass_nn.ops.programmatic_launch(bool(args.pdl)):
        _sweep_rounds(args, candidates, trainer, batches, setter, per_round, step_ms, calls,
                      previous)
    times = {label: summarize_rounds(rounds) for label, rounds in per_round.items()}
    best = best_per_problem(times)

    problems = []
    for key in sorted(times["rule"], key=lambda k: -times["rule"][k]):
        op, shapes_text = key
        shapes = parse_shapes(shapes_text)
        mnk = gemm_mnk(op, shapes)
        kernels = {c.label: _probe_or_error(op, shapes, c) for c in candidates}
        ref = cublas.get(mnk)
        problems.append({
            "op": op, "shapes": shapes_text, "mnk": list(mnk), "calls_per_step": calls.get(key),
            "us": {label: t.get(key) for label, t in times.items()},
            "kernel": kernels,
            "cublas_us_same_mnk": ref,
            **best[key],
        })
    result: dict[str, Any] = {
        "mode": "step-sweep", "meta": meta,
        "settings": {k: v for k, v in vars(args).items() if k != "candidate_list"} | {"out": str(args.out)},
        "config_names": names,
        "candidates": [c.label for c in candidates],
        "step_gpu_ms": {label: statistics.median(v) for label, v in step_ms.items()},
        "stock_step_gpu_ms": stock_side["gpu_ms_per_step"],
        "problems": problems,
        # What the step's GEMMs would save per step if each problem ran its in-step best.
        "best_saves_us_per_step": sum((p["rule_us"] - p["best_us"]) * (p["calls_per_step"] or 0)
                                      for p in problems),
    }
    print(f"== step-sweep {args.family}-{args.size} {args.mode}: GPU ms per step, stock "
          f"{stock_side['gpu_ms_per_step']:.3f}; " +
          ", ".join(f"{k} {v:.3f}" for k, v in result["step_gpu_ms"].items()))
    labels = [c.label for c in candidates]
    print("   us per call  " + " ".join(f"{label:>7s}" for label in labels) + "   cuBLAS  best")
    for p in problems:
        cells = " ".join(f"{p['us'][label]:7.1f}" if p["us"].get(label) else "      -" for label in labels)
        ref = f"{min(p['cublas_us_same_mnk']):7.1f}" if p["cublas_us_same_mnk"] else "      -"
        print(f"   {p['op'][12:]:13s} {'x'.join(map(str, p['mnk'])):16s} {cells} {ref}  "
              f"{p['best']} ({p['rule_over_best']:.3f})")
    print(f"   each problem on its in-step best: {result['best_saves_us_per_step']:.1f} us less "
          f"GEMM time per step")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"step_sweep_{bench._slug(meta)}_{bench._stamp()}.json"
    path.write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(f"json {path}", flush=True)
    return 0
