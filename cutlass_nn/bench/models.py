"""``python -m cutlass_nn.bench --what models``: whole-model training steps, ``nn.Linear`` against
``cutlass_nn.convert``, the number a user feels.

Usage::

    python -m cutlass_nn.bench --what models [--families llama,gpt,bert] [--sizes host,gpu]
        [--modes eager,compile,reduce-overhead] [--steps 20] [--vocab N] [--out DIR]
    python -m cutlass_nn.bench --what models --combine A.json B.json ...   # one JSON + PNG

Models come from ``transformers`` configs with random initialization (nothing is downloaded):

* ``llama``: a Llama-style decoder (grouped-query attention with 4 query heads per key/value
  head, SwiGLU MLP, RMSNorm, rotary embeddings);
* ``gpt``: a GPT-2-style decoder (learned positions, LayerNorm, GELU(tanh) MLP, multi-head
  attention): ``transformers``' GPTBigCode with ``multi_query=False``, the GPT-2 block built on
  ``nn.Linear`` (GPT-2's own class uses a ``Conv1D`` layer that ``convert`` does not touch);
* ``bert``: a BERT-style encoder with its masked-LM head, trained on every token.

Each at a host-bound size (hidden 1024, 2 layers) and a GPU-bound one (hidden 4096, 2 layers),
4096 tokens per step (batch 4 x 1024), vocabulary 32000 (``--vocab``), bfloat16 parameters,
fused AdamW, in eager mode, under ``torch.compile`` and ``mode="reduce-overhead"``.

Method per row (family, size, mode): the stock model and the converted copy of the same initial
weights are built and warmed up (compiled) one after the other; one step of each runs under the
CPU profiler, to check that the converted model runs cutlass_nn operators and the stock one does
not: after the timed steps (``meta["operator_check"]``), except for reduce-overhead rows, whose
timed replays dispatch no operator, so their first step is checked. Then ``--steps`` timed
steps per side in blocks of ``--block`` back-to-back steps with no synchronization inside a
block (the losses are read after it), the sides alternating block by block (and which goes
first each round), so that drift of the host's speed reaches both alike;
both step through the same batches. Step time = the median over a side's blocks of block wall
time / steps. The row's ratio = the median of the per-round ratios (stock block / converted
block of one round, adjacent in time), its spread their interquartile range: the host's speed
drifts by tens of percent over a host-bound run (both sides' blocks move together), and a
paired ratio cancels what the two blocks of a round share, where the ratio of the sides'
median step times (``ratio_of_medians``, also reported) compares blocks from different moments
(2026-11-28, H200: bert-host eager 0.976 of medians, 1.078 paired, both sides' blocks drifting
from about 10 to 14 ms per step and back). Every ratio between sides (a peer's, the PDL A/B's)
is taken the same way. ``--combine`` reads a row recorded before (its ``ratio`` the ratio of
medians, no ``ratio_of_medians``) as a current one (``models_report.normalize_row``). Per block, what else ran in it (``block_probes``:
garbage collections and their time, dynamo compilations, the slowest step's enqueue time).
Peak memory of a side = what it keeps allocated after its warm-up (parameters, optimizer state,
compiled graphs' memory; torch's cuBLAS workspaces excluded; read after a garbage collection) +
the largest rise of the allocator's peak during one of its blocks, read twice: in allocator
blocks (``peak_bytes``, what ``torch.cuda.max_memory_allocated`` counts) and in the bytes the
tensors requested (``peak_requested_bytes``). The allocator hands out a free block up to 1 MiB
larger than asked without splitting it, so the same tensors can take a block more or less on
either side depending on what happened to be free (``--memory-trace`` names the site); the
requested bytes are what a side's tensors need. Reported: step time, tokens/s, ratio (stock /
converted step time: > 1, converted faster), peak memory and its ratio (converted / stock, in
blocks and in tensor bytes), host time to enqueue a step, the largest loss difference (at most
``LOSS_RTOL`` of the stock loss: agreement). ``--liger`` and ``--torchao`` add a third side,
another project's speed-up of the same stock model (:mod:`cutlass_nn.bench.peers`). ``--pdl-ab``
adds the converted model with programmatic dependent launch off around all its steps
(``pdl_speedup``: its step time / the converted one's).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import statistics
import sys
import time
import traceback
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from torch import nn

import cutlass_nn
from cutlass_nn.bench import fp8 as bench_fp8, peers
from cutlass_nn.bench.arg_types import csv_choices
from cutlass_nn.bench.attention_probe import format_attention_masks, probe_attention_masks
from cutlass_nn.bench.block_probe import BlockProbe, alternating_blocks, frozen_heap
from cutlass_nn.bench.memory_readings import memory_now, peak_since_reset, raise_transient
from cutlass_nn.bench.memory_trace import SideMemoryTrace, format_difference, recording
from cutlass_nn.bench.models_report import (  # noqa: F401 (targets: part of this module's API)
    LOSS_RTOL,
    ci95_text,
    fmt_or_dash,
    format_table,
    format_targets,
    normalize_row,
    paired_step_ratio,
    plot,
    ratio_spread_text,
    targets,
)
from cutlass_nn.bench.stats import paired_ratio_spread

FAMILIES = ("llama", "gpt", "bert")
SIZES = ("host", "gpu")
MODES = ("eager", "compile", "reduce-overhead")


@dataclass(frozen=True)
class ModelSize:
    hidden: int
    layers: int
    heads: int
    batch: int
    seq: int
    vocab: int


# host: hidden about 1k (the step is bound by the host's enqueue time); gpu: hidden 4096.
MODEL_SIZES = {
    "host": ModelSize(hidden=1024, layers=2, heads=16, batch=4, seq=1024, vocab=32000),
    "gpu": ModelSize(hidden=4096, layers=2, heads=32, batch=4, seq=1024, vocab=32000),
}


def build_model(family: str, size: ModelSize, seed: int = 0) -> nn.Module:
    """A ``transformers`` model of ``family`` at ``size`` with random weights (seeded)."""
    import transformers as tf

    torch.manual_seed(seed)
    h = size.hidden
    if family == "llama":
        config = tf.LlamaConfig(
            hidden_size=h,
            intermediate_size=int(h * 8 / 3 / 256 + 0.5) * 256 if h >= 256 else 2 * h,
            num_hidden_layers=size.layers,
            num_attention_heads=size.heads,
            num_key_value_heads=max(size.heads // 4, 1),
            vocab_size=size.vocab,
            max_position_embeddings=size.seq,
            tie_word_embeddings=False,
        )
        return tf.LlamaForCausalLM(config)
    if family == "gpt":
        config = tf.GPTBigCodeConfig(
            n_embd=h,
            n_inner=4 * h,
            n_layer=size.layers,
            n_head=size.heads,
            vocab_size=size.vocab,
            n_positions=size.seq,
            multi_query=False,
            activation_function="gelu_pytorch_tanh",
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            bos_token_id=0,
            eos_token_id=0,
        )
        return tf.GPTBigCodeForCausalLM(config)
    if family == "bert":
        config = tf.BertConfig(
            hidden_size=h,
            intermediate_size=4 * h,
            num_hidden_layers=size.layers,
            num_attention_heads=size.heads,
            vocab_size=size.vocab,
            max_position_embeddings=size.seq,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
        )
        return tf.BertForMaskedLM(config)
    raise ValueError(f"cutlass_nn.bench: unknown model family {family!r} (one of {FAMILIES})")


def make_batches(size: ModelSize, n: int, device, seed: int = 1) -> list[dict[str, torch.Tensor]]:
    """``n`` random token batches (inputs and labels) for a language-model loss."""
    gen = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(n):
        ids = torch.randint(0, size.vocab, (size.batch, size.seq), generator=gen)
        ids = ids.to(device)
        batches.append({"input_ids": ids, "labels": ids})
    return batches


def count_linears(model: nn.Module) -> int:
    return sum(1 for m in model.modules() if type(m) is nn.Linear)


class Trainer:
    """One model, its fused AdamW and its (maybe compiled) forward; ``step(batch)`` runs
    forward, backward and the optimizer step and returns the loss tensor (not synchronized)."""

    def __init__(self, model: nn.Module, mode: str, device,
                 context: Callable[[], AbstractContextManager] = nullcontext):
        self.model = model
        self.context = context
        fused = torch.device(device).type == "cuda"
        self.opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused)
        if mode == "eager":
            self.forward: Callable[..., Any] = model
        elif mode == "compile":
            self.forward = torch.compile(model)
        elif mode == "reduce-overhead":
            self.forward = torch.compile(model, mode="reduce-overhead")
        else:
            raise ValueError(f"cutlass_nn.bench: unknown mode {mode!r} (one of {MODES})")
        self.cudagraphs = mode == "reduce-overhead"

    def step(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        with self.context():
            if self.cudagraphs:
                torch.compiler.cudagraph_mark_step_begin()
            loss = self.forward(**batch).loss
            loss.backward()
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
        # A CUDA-graph output is overwritten by the next replay: keep a copy.
        return loss.detach().clone()


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


SIDES = ("stock", "cutlass_nn")
NO_PDL_SIDE = "cutlass_nn_no_pdl"  # --pdl-ab: the converted model with PDL off
#: What a side's steps run inside (a side not named here: nothing).
SIDE_CONTEXTS: dict[str, Callable[[], AbstractContextManager]] = {
    NO_PDL_SIDE: lambda: cutlass_nn.ops.programmatic_launch(False),
}


def _ran_cutlass_ops(trainer: Trainer, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, bool]:
    """One step under the CPU profiler: its loss, and whether a cutlass_nn operator ran (the
    first steps of a compiled model run its operators on the host, CUDA graphs included). Later
    rows of the run are timed after it: Kineto is asked to finalize CUPTI when it stops."""
    os.environ.setdefault("TEARDOWN_CUPTI", "1")  # else its callbacks outlive it (torch #144455)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        loss = trainer.step(batch)
    return loss, any(e.name.startswith("cutlass_nn::") for e in prof.events())


def _time_blocks(out: dict[str, dict[str, Any]], trainers: dict[str, Trainer],
                 order: list[str], batches: Sequence[dict[str, torch.Tensor]], *, steps: int,
                 block: int, device) -> None:
    """The timed part of :func:`run_sides`: alternating blocks of ``block`` back-to-back steps
    per side (the side that goes first alternates), recorded into each side's ``out`` entry."""
    cuda = torch.device(device).type == "cuda"
    for side, first, n in alternating_blocks(order, steps, block):
        rec, trainer = out[side], trainers[side]
        _sync(device)
        t_read = time.perf_counter()
        start_alloc = memory_now(device)
        read_ms = (time.perf_counter() - t_read) * 1e3
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
        pending = []
        with BlockProbe() as probe:
            start = time.perf_counter()
            for j in range(n):
                s0 = time.perf_counter()
                pending.append(trainer.step(batches[(first + j) % len(batches)]))
                rec["enqueue_all_ms"].append((time.perf_counter() - s0) * 1e3)
            _sync(device)
            rec["block_step_ms"].append((time.perf_counter() - start) * 1e3 / n)
        rec["block_probes"].append(dict(probe.summary(),
                                        max_enqueue_ms=max(rec["enqueue_all_ms"][-n:]),
                                        memory_read_ms=read_ms))
        if cuda:
            raise_transient(rec, peak_since_reset(device), start_alloc)
        rec["losses"] += [float(x) for x in pending]


def run_sides(
    models: dict[str, Callable[[], nn.Module]],
    mode: str,
    batches: Sequence[dict[str, torch.Tensor]],
    *,
    warmup: int,
    steps: int,
    block: int,
    device,
    memory_trace: bool = False,
) -> dict[str, dict[str, Any]]:
    """Builds and warms up each side (compiling it), then times them in alternating blocks of
    ``block`` back-to-back steps (the side that goes first alternates), so that drift of the
    host's speed over the run reaches both sides alike. Each side steps through the same batch
    sequence. Returns per side: median step time over its blocks, host enqueue time, losses,
    whether cutlass_nn operators ran, and (CUDA) peak memory = the memory the side keeps
    (parameters, optimizer state, compiled graphs' pools) + the largest transient of its steps;
    with ``memory_trace``, where the memory it keeps was allocated (``memory_trace``)."""
    cuda = torch.device(device).type == "cuda"
    trainers: dict[str, Trainer] = {}
    out: dict[str, dict[str, Any]] = {}
    # The allocator records stacks (--memory-trace) while the sides are built and warmed up,
    # never while they are timed.
    with recording(device) if memory_trace else nullcontext():
        for side, make in models.items():
            before = memory_now(device)
            trace = SideMemoryTrace(device) if memory_trace else None
            t0 = time.perf_counter()
            trainers[side] = trainer = Trainer(make(), mode, device,
                                               SIDE_CONTEXTS.get(side, nullcontext))
            # With the first step profiled, a converted compiled step measured slower (NOTES,
            # thirty-seventh session): it profiles the first step only for CUDA-graph replays
            # (whose operators run only in the first steps), else a step after the timed blocks.
            if mode == "reduce-overhead":
                ran_ops = _ran_cutlass_ops(trainer, batches[0])[1]
            else:
                ran_ops = None  # checked after the timed blocks
                trainer.step(batches[0])
            for i in range(1, warmup):
                trainer.step(batches[i % len(batches)])
            _sync(device)
            after = memory_now(device)
            out[side] = {
                "warmup_s": time.perf_counter() - t0,
                "ran_cutlass_ops": ran_ops,
                "persistent_bytes": after[0] - before[0],
                "persistent_requested_bytes": after[1] - before[1],
                "losses": [],
                "block_step_ms": [],
                "block_probes": [],  # per block: collections, compiles, slowest enqueue
                "enqueue_all_ms": [],
                "transient_bytes": 0,
                "transient_requested_bytes": 0,
            }
            if trace is not None:
                out[side]["memory_trace"] = trace.finish()
    # What the sides built and warmed up (models, optimizers, Dynamo's and Inductor's caches) is
    # frozen while they are timed: the garbage collections of the blocks' memory readings then
    # skip that heap and traverse only what the steps made since. A 1000-step compiled row on
    # the GPU machine spent about 0.4 s per block outside its steps, most likely in full
    # collections of that heap (NOTES, thirty-sixth session; `memory_read_ms` of each block
    # probe now times the reading). Unfrozen afterwards, so the sides can be freed.
    with frozen_heap():
        _time_blocks(out, trainers, list(models), batches, steps=steps, block=block,
                     device=device)
    for side, rec in out.items():
        if rec["ran_cutlass_ops"] is None:
            rec["ran_cutlass_ops"] = _ran_cutlass_ops(trainers[side], batches[0])[1]
        rec["step_ms"] = statistics.median(rec["block_step_ms"])
        rec["timed_gc_ms"] = sum(b["gc_ms"] for b in rec["block_probes"])
        rec["timed_compiles"] = sum(b["compiles"] for b in rec["block_probes"])
        rec["enqueue_ms"] = statistics.median(rec.pop("enqueue_all_ms"))
        if cuda:
            rec["peak_bytes"] = rec["persistent_bytes"] + rec["transient_bytes"]
            rec["peak_requested_bytes"] = (rec["persistent_requested_bytes"]
                                           + rec["transient_requested_bytes"])
        else:
            for key in ("persistent_bytes", "transient_bytes", "persistent_requested_bytes",
                        "transient_requested_bytes"):
                del rec[key]
    return out


@dataclass(frozen=True)
class RowSpec:
    family: str
    size: str
    mode: str

    @property
    def label(self) -> str:
        return f"{self.family}-{self.size} {self.mode}"


def plan(families: Sequence[str], sizes: Sequence[str], modes: Sequence[str]) -> list[RowSpec]:
    """Host-bound sizes first (this issue's targets), eager before compiled (which compiles)."""
    return [RowSpec(f, s, m) for s in sizes for m in modes for f in families]


def compare_losses(stock: Sequence[float], ours: Sequence[float]) -> dict[str, Any]:
    diffs = [abs(a - b) for a, b in zip(stock, ours)]
    worst = max(diffs) if diffs else math.nan
    rel = max((d / max(abs(a), 1e-6) for d, a in zip(diffs, stock)), default=math.nan)
    finite = all(math.isfinite(x) for x in (*stock, *ours))
    return {
        "max_abs_diff": worst,
        "max_rel_diff": rel,
        "agree": bool(finite and diffs and rel <= LOSS_RTOL),
    }


def convert_side(
    model: nn.Module,
    *,
    fp8: str | None = None,
    fuse_norm: bool = False,
    fuse_mlp: bool = False,
    fuse_rope: bool = False,
    fuse_head: bool = False,
    example_inputs: dict[str, torch.Tensor] | None = None,
) -> nn.Module:
    """The converted side of a row: ``cutlass_nn.convert`` with the benchmark's options (FP8 ones
    from :func:`cutlass_nn.bench.fp8.convert_args`; the head fused where ``can_fuse_lm_head``)."""
    fp8_args = {} if fp8 is None else bench_fp8.convert_args(fp8)
    return cutlass_nn.convert(model, example_inputs=example_inputs, fuse_norm=fuse_norm,
                              fuse_mlp=fuse_mlp, fuse_rope=fuse_rope, **fp8_args,
                              fuse_head=fuse_head and cutlass_nn.fused_head.can_fuse_lm_head(model))


def run_row(
    spec: RowSpec,
    *,
    steps: int,
    block: int,
    warmup: int,
    device="cuda",
    dtype=torch.bfloat16,
    sizes: dict[str, ModelSize] = MODEL_SIZES,
    autotune: bool = False,
    fuse_norm: bool = False,
    fuse_mlp: bool = False,
    fuse_head: bool = False,
    fuse_rope: bool = False,
    liger: bool = False,
    fp8: str | None = None,
    torchao: bool = False,
    pdl_ab: bool = False,
    memory_trace: bool = False,
) -> dict[str, Any]:
    """Stock, then converted, on the same weights and batches; never raises (status "error")."""
    size = sizes[spec.size]
    row: dict[str, Any] = {
        "family": spec.family, "size": spec.size, "mode": spec.mode, "label": spec.label,
        "model": asdict(size), "tokens_per_step": size.batch * size.seq, "status": "error",
    }
    try:
        batches = make_batches(size, 4, device)

        def make(side: str) -> Callable[[], nn.Module]:
            def build() -> nn.Module:
                with torch.device(device):  # initialized on the device: fast for large sizes
                    model = build_model(spec.family, size).to(dtype=dtype)
                row["parameters"] = sum(p.numel() for p in model.parameters())
                row["linears"] = count_linears(model)
                if side in peers.PEERS:
                    return peers.apply(side, model, fp8)
                if side not in ("cutlass_nn", NO_PDL_SIDE):
                    return model
                return convert_side(model, fp8=fp8, fuse_norm=fuse_norm, fuse_mlp=fuse_mlp,
                                    fuse_rope=fuse_rope, fuse_head=fuse_head,
                                    example_inputs=batches[0] if autotune else None)

            return build

        torch._dynamo.reset()
        names = list(SIDES)
        for peer, wanted in (("liger", liger), ("torchao", torchao)):
            reason = peers.skip_reason(peer, spec.family, fp8) if wanted else None
            if reason:
                row[peer] = {"status": reason[0], "note": reason[1]}
            elif wanted:
                names.append(peer)
        if pdl_ab:
            names.append(NO_PDL_SIDE)
        sides = run_sides(
            {side: make(side) for side in names},
            spec.mode,
            batches,
            warmup=warmup,
            steps=steps,
            block=block,
            device=device,
            memory_trace=memory_trace,
        )
        if memory_trace:
            row["memory_trace_difference"] = format_difference(
                {n: sides[n].get("memory_trace") for n in names})
        converted = [sides[n] for n in ("cutlass_nn", NO_PDL_SIDE) if n in sides]
        if not all(c["ran_cutlass_ops"] for c in converted) or sides["stock"]["ran_cutlass_ops"]:
            raise RuntimeError(
                "the converted model ran no cutlass_nn operator (or the stock one did): the "
                "comparison would be meaningless"
            )
        row.update(sides)
        stock, ours = sides["stock"], sides["cutlass_nn"]
        row["ratio_of_medians"] = stock["step_ms"] / ours["step_ms"]
        row["block_ratio"] = paired_ratio_spread(stock["block_step_ms"], ours["block_step_ms"])
        # the paired median (as paired_step_ratio takes it) from the spread just computed
        row["ratio"] = (row["block_ratio"]["median"] if row["block_ratio"]["n"]
                        else row["ratio_of_medians"])
        tokens = row["tokens_per_step"]
        for side in sides.values():
            side["tokens_per_s"] = tokens / (side["step_ms"] / 1e3)
        if "peak_bytes" in stock:
            row["memory_ratio"] = ours["peak_bytes"] / stock["peak_bytes"]
        if stock.get("peak_requested_bytes"):
            row["memory_ratio_requested"] = (ours["peak_requested_bytes"]
                                             / stock["peak_requested_bytes"])
        row["loss"] = compare_losses(stock["losses"], ours["losses"])
        if (no_pdl := sides.get(NO_PDL_SIDE)) is not None:
            row["ratio_no_pdl"] = paired_step_ratio(stock, no_pdl)
            row["pdl_speedup"] = paired_step_ratio(no_pdl, ours)
            no_pdl["loss"] = compare_losses(stock["losses"], no_pdl["losses"])
        for peer in peers.PEERS:
            if peer in sides:
                peers.finish(sides[peer], stock, ours, compare_losses)
        row["status"] = "ok"
    except Exception as exc:  # one row's failure (out of memory, a compile error) is recorded
        row["note"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ''}"
        row["traceback"] = traceback.format_exc(limit=12)
    finally:
        sides = None
        torch._dynamo.reset()
        gc.collect()
        if torch.device(device).type == "cuda":
            torch.cuda.empty_cache()
    return row


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m cutlass_nn.bench --what models",
        description="Whole-model training steps: nn.Linear vs cutlass_nn.convert (JSON + PNG).",
    )
    p.add_argument("--what", choices=["models"], default="models")
    p.add_argument("--families", type=csv_choices(FAMILIES), default=list(FAMILIES))
    p.add_argument("--sizes", type=csv_choices(SIZES), default=list(SIZES))
    p.add_argument("--modes", type=csv_choices(MODES), default=list(MODES))
    p.add_argument("--steps", type=int, default=20, help="timed steps per side (>= 20 for a record)")
    p.add_argument("--block", type=int, default=5, help="steps per timed block")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (compiles)")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    p.add_argument("--time-limit", type=float, default=540.0, help="seconds; later rows skipped")
    p.add_argument("--vocab", type=int, default=None, help="vocabulary size of every model "
                   "(default 32000; GPT-2's own is 50257, BERT's 30522)")
    p.add_argument("--autotune", action="store_true",
                   help="convert with example_inputs (the first batch): cutlass_nn.autotune "
                   "tunes the converted model's GEMM problems before its timed steps")
    p.add_argument("--fuse-norm", action="store_true",
                   help="convert with fuse_norm=True: the RMSNorms of the Llama rows run on "
                   "cutlass_nn's RMSNorm kernels too")
    p.add_argument("--fuse-mlp", action="store_true",
                   help="convert with fuse_mlp=True: the gated MLPs of the Llama rows run as "
                   "cutlass_nn.GatedMLP (one gate+up GEMM, fused gated activation)")
    p.add_argument("--fuse-head", action="store_true",
                   help="convert with fuse_head=True: the Llama rows' loss through "
                   "linear_cross_entropy (no logits)")
    p.add_argument("--fuse-rope", action="store_true",
                   help="convert with fuse_rope=True: the Llama rows' rotary embedding as one "
                   "rotary_embedding operator per attention layer")
    p.add_argument("--liger", action="store_true",
                   help="add a third side to the Llama rows: the stock model with Liger-Kernel's "
                   "patch (RMSNorm, SwiGLU, fused linear + cross-entropy; needs liger_kernel)")
    p.add_argument("--torchao", action="store_true",
                   help="with --fp8: add a side converted by torchao's float8 training with its "
                   "recipe of that name (needs torchao; cutlass_nn/bench/peers.py)")
    p.add_argument("--fp8", choices=bench_fp8.FP8_CHOICES, default=None,
                   help="convert with precision='fp8' and this scaling (e4m3 gradients; with "
                   "-fast-accum, fast accumulation in the forward GEMM): the layers that pass "
                   "cutlass_nn.fp8.eligible train in FP8; the LM head is left an nn.Linear")
    p.add_argument("--fp8-reuse", action="store_true",
                   help="with --fp8: turn on cutlass_nn.fp8.reuse_quantized_inputs (off by "
                   "default; consecutive FP8 layers reading one activation share its "
                   "quantization)")
    p.add_argument("--pdl-ab", action="store_true",
                   help="add a side: the converted model with programmatic dependent launch "
                   "off (row keys ratio_no_pdl, pdl_speedup)")
    p.add_argument("--memory-trace", action="store_true",
                   help="record where each side's kept memory was allocated (CUDA allocator "
                   "history with Python stacks; row key memory_trace_difference)")
    p.add_argument("--combine", type=Path, nargs="+", metavar="JSON",
                   help="merge earlier model-benchmark JSONs into one JSON + PNG (no GPU)")
    return p.parse_args(argv)


def _write(path: Path, results: dict) -> None:
    path.write_text(json.dumps(results, indent=1, default=str) + "\n")


def combine(paths: Sequence[Path], out_dir: Path) -> int:
    parts = [json.loads(Path(p).read_text()) for p in paths]
    rows = [normalize_row(r) for part in parts for r in part["rows"]]
    meta = dict(parts[0]["meta"], combined_from=[str(p) for p in paths],
                commands=[part["meta"].get("command") for part in parts])
    results = {"mode": "models", "meta": meta, "rows": rows, "targets": targets(rows)}
    stem = Path(paths[-1]).stem + "_combined"
    out_dir.mkdir(parents=True, exist_ok=True)
    _write(out_dir / f"{stem}.json", results)
    plot(rows, out_dir / f"{stem}.png", _title(meta))
    for line in format_table(rows) + format_targets(results["targets"]):
        print(line)
    print(f"json {out_dir / (stem + '.json')}")
    return 0


def _title(meta: dict) -> str:
    return f"training step, nn.Linear vs cutlass_nn: {meta.get('device')}, torch {meta.get('torch')}, {meta.get('date_utc')}"


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    if args.combine:
        return combine(args.combine, args.out)
    from cutlass_nn.bench import cli as bench

    meta = bench.gpu_run_meta(argv)
    if meta is None:
        return 2
    try:
        import transformers

        meta["transformers"] = transformers.__version__
    except ImportError:
        print("cutlass_nn.bench --what models needs `transformers` (pip install transformers)",
              file=sys.stderr)
        return 2
    meta["loss_rtol"] = LOSS_RTOL
    meta["operator_check"] = "after the timed steps (reduce-overhead rows: their first step)"
    for flag in ("autotune", "fuse_norm", "fuse_mlp", "fuse_head", "fuse_rope", "liger",
                 "fp8_reuse", "torchao", "pdl_ab", "memory_trace"):
        meta[flag] = bool(getattr(args, flag))
    meta["fp8"] = args.fp8
    cutlass_nn.fp8.reuse_quantized_inputs(bool(args.fp8_reuse))
    meta["programmatic_launch"] = cutlass_nn.ops.programmatic_launch_enabled()
    specs = plan(args.families, args.sizes, args.modes)
    sizes = {k: replace(v, vocab=args.vocab or v.vocab) for k, v in MODEL_SIZES.items()}
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"models_{bench._slug(meta)}_{bench._stamp()}"
    json_path = args.out / f"{stem}.json"
    results: dict[str, Any] = {"mode": "models", "meta": meta, "settings": vars(args) | {"out": str(args.out)}, "rows": []}
    t0 = time.monotonic()
    print(f"cutlass_nn.bench models: {meta['device']}, torch {meta['torch']}, "
          f"transformers {meta['transformers']}; {len(specs)} rows", flush=True)
    if any(spec.mode != "eager" for spec in specs):
        meta["attention_masks"] = probe_attention_masks(sorted({spec.family for spec in specs}))
        for line in format_attention_masks(meta["attention_masks"]):
            print(line, flush=True)
        t0 = time.monotonic()  # the probe's seconds do not count against --time-limit
    for i, spec in enumerate(specs):
        if time.monotonic() - t0 > args.time_limit:
            row = {"family": spec.family, "size": spec.size, "mode": spec.mode,
                   "label": spec.label, "status": "skipped", "note": "time limit"}
        else:
            row = run_row(spec, steps=args.steps, block=args.block, warmup=args.warmup,
                          sizes=sizes, autotune=args.autotune, fuse_norm=args.fuse_norm,
                          fuse_mlp=args.fuse_mlp, fuse_head=args.fuse_head,
                          fuse_rope=args.fuse_rope, liger=args.liger, fp8=args.fp8,
                          torchao=args.torchao, pdl_ab=args.pdl_ab,
                          memory_trace=args.memory_trace)
        results["rows"].append(row)
        _write(json_path, results)
        if row["status"] == "ok":
            print(f"[{i + 1}/{len(specs)} {time.monotonic() - t0:4.0f}s] {spec.label}: stock "
                  f"{row['stock']['step_ms']:.2f} ms, cutlass_nn {row['cutlass_nn']['step_ms']:.2f} ms, "
                  f"ratio {row['ratio']:.3f} (rounds' IQR {ratio_spread_text(row)}, 95% CI "
                  f"{ci95_text(row)}; of median "
                  f"steps {row['ratio_of_medians']:.3f}), memory "
                  f"{fmt_or_dash(row.get('memory_ratio'), '.3f')} (tensor bytes "
                  f"{fmt_or_dash(row.get('memory_ratio_requested'), '.4f')}), "
                  f"loss diff {row['loss']['max_abs_diff']:.4f}; in timed blocks, gc "
                  f"{row['stock']['timed_gc_ms']:.0f} / {row['cutlass_nn']['timed_gc_ms']:.0f} ms, "
                  f"compiles {row['stock']['timed_compiles']} / {row['cutlass_nn']['timed_compiles']}"
                  + (f"; PDL off {row[NO_PDL_SIDE]['step_ms']:.2f} ms (ratio "
                     f"{row['ratio_no_pdl']:.3f}), PDL speed-up {row['pdl_speedup']:.3f}"
                     if "pdl_speedup" in row else ""), flush=True)
            for line in row.get("memory_trace_difference", []):
                print(line, flush=True)
        else:
            print(f"[{i + 1}/{len(specs)}] {spec.label}: {row['status'].upper()} {row.get('note', '')}", flush=True)
    rows = results["rows"]
    results["targets"] = targets(rows)
    results["wall_s"] = time.monotonic() - t0
    if args.autotune:
        results["autotune"] = [dict(asdict(e), speedup=e.speedup)
                               for e in cutlass_nn.autotune.entries()]
    _write(json_path, results)
    try:
        plot(rows, json_path.with_suffix(".png"), _title(meta))
    except Exception as exc:
        print(f"(no plot: {exc})")
    print()
    for line in (format_table(rows) + format_targets(results["targets"]) + peers.format_peers(rows)
                 + format_attention_masks(meta.get("attention_masks", {}))):
        print(line)
    print(f"json {json_path}", flush=True)
    return 0 if all(r["status"] in ("ok", "skipped") for r in rows) else 3
