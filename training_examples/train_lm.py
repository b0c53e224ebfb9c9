#!/usr/bin/env python
"""Train a small byte-level language model with cutlass_nn's transformer layers.

The model is a ``transformers`` ``LlamaForCausalLM`` (random init, 256 byte tokens). The corpus
ships with Python itself: the text of the language reference topics in ``pydoc_data.topics``
(~465 KB of English and code), nothing is downloaded. Implementations (``--impl``):

* ``torch``: the stock model;
* ``cutlass``: ``cutlass_nn.convert(model)``, every ``nn.Linear`` on cutlass_nn's GEMMs;
* ``cutlass-fused`` (default): ``convert(model, fuse_norm=True, fuse_mlp=True, fuse_head=True)``:
  fused RMSNorms, fused gated MLPs, and the loss through ``linear_cross_entropy`` (no logits);
* ``cutlass-fp8``: every projection of the decoder layers a ``CutlassLinear(precision="fp8")``
  (``--fp8-scaling`` tensorwise or rowwise, e4m3 gradients), the LM head and embeddings as they
  are. All projections train in FP8 whatever their size (``convert``'s FP8 size rule would keep
  this model's small layers in their dtype): the run measures FP8's effect on the loss, not
  speed.

``--compare`` trains ``torch`` and ``--impl`` from the same initial weights on the same batches
and fails (exit 1) if their loss curves (moving averages over ``steps / 15`` steps) differ by
more than ``--tolerance`` (relative); the largest single-step difference is printed too. At the
end each model writes a short sample from a prompt (sampling with ``--temperature``).

Usage (run from the repository root)::

    python training_examples/train_lm.py                 # CPU, tiny config, about a minute
    python training_examples/train_lm.py --compare
    python training_examples/train_lm.py --device cuda --amp --compile --hidden 1024 \\
        --layers 8 --seq 512 --batch 32 --steps 2000

Outputs go to ``--out`` (default ``training_examples/out``): ``lm_<impl>.json`` (arguments,
per-step losses, throughput, peak memory, the sample) and ``lm_curves.png``. The last lines
have the form::

    final: impl=cutlass-fused device=cpu steps=... loss=... tokens_per_s=... peak_mem_mb=...
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import cutlass_nn  # noqa: E402

IMPLS = ("torch", "cutlass", "cutlass-fused", "cutlass-fp8")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--impl", choices=IMPLS, default="cutlass-fused")
    p.add_argument("--fp8-scaling", choices=("tensorwise", "rowwise"), default="tensorwise",
                   help="--impl cutlass-fp8: the FP8 recipe's scaling")
    p.add_argument("--compare", action="store_true",
                   help="train torch and --impl from the same weights and batches, compare")
    p.add_argument("--device", default="cpu")
    p.add_argument("--amp", action="store_true",
                   help="bfloat16 autocast (float32 weights and optimizer state)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tolerance", type=float, default=0.02,
                   help="--compare: largest allowed relative difference of the smoothed curves")
    p.add_argument("--prompt", default="The assert statement")
    p.add_argument("--sample-bytes", type=int, default=120)
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--out", type=Path, default=REPO / "training_examples" / "out")
    return p.parse_args(argv)


def corpus() -> np.ndarray:
    """The bytes of Python's language-reference topics (ships with CPython)."""
    from pydoc_data.topics import topics

    text = "\n\n".join(topics[key] for key in sorted(topics))
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8)


def batches(data: np.ndarray, args) -> list[torch.Tensor]:
    """--steps random windows of --seq bytes per batch row (same for every implementation)."""
    rng = np.random.default_rng(args.seed)
    starts = rng.integers(0, len(data) - args.seq - 1, size=(args.steps, args.batch))
    windows = data[starts[..., None] + np.arange(args.seq)]
    return [torch.from_numpy(w.astype(np.int64)) for w in windows]


def build_model(args, impl: str, device):
    import transformers

    cfg = transformers.LlamaConfig(
        hidden_size=args.hidden,
        intermediate_size=int(args.hidden * 8 / 3 / 64 + 0.5) * 64,
        num_hidden_layers=args.layers,
        num_attention_heads=max(1, args.hidden // 64),
        num_key_value_heads=max(1, args.hidden // 128),
        vocab_size=256,
        max_position_embeddings=max(args.seq, 256),
    )
    torch.manual_seed(args.seed)
    model = transformers.LlamaForCausalLM(cfg).to(device)
    if impl == "cutlass":
        cutlass_nn.convert(model)
    elif impl == "cutlass-fused":
        cutlass_nn.convert(model, fuse_norm=True, fuse_mlp=True, fuse_head=True)
    elif impl == "cutlass-fp8":
        recipe = cutlass_nn.fp8.Fp8Recipe(scaling=args.fp8_scaling)
        for layer in model.model.layers:
            for parent in layer.modules():
                for name, child in list(parent.named_children()):
                    if type(child) is torch.nn.Linear:
                        setattr(parent, name, cutlass_nn.CutlassLinear.from_linear(
                            child, precision="fp8", fp8_recipe=recipe))
    return model


class Progress:
    """A one-line progress bar on a terminal, a line every 10% otherwise."""

    def __init__(self, total: int, label: str):
        self.total, self.label, self.tty = total, label, sys.stdout.isatty()
        self.next_line = 0

    def update(self, step: int, loss: float) -> None:
        done = (step + 1) / self.total
        if self.tty:
            bar = "#" * int(30 * done)
            print(f"\r{self.label} [{bar:<30}] {step + 1}/{self.total} loss {loss:.3f}",
                  end="", flush=True)
            if step + 1 == self.total:
                print()
        elif done >= self.next_line / 10 or step + 1 == self.total:
            print(f"{self.label}: step {step + 1}/{self.total} loss {loss:.4f}", flush=True)
            self.next_line = int(done * 10) + 1


def peak_memory_mb(device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


@torch.no_grad()
def sample(model, args, device) -> str:
    gen = torch.Generator(device="cpu").manual_seed(args.seed)
    ids = torch.tensor([list(args.prompt.encode("utf-8"))], device=device)
    model.eval()
    for _ in range(args.sample_bytes):
        logits = model(input_ids=ids[:, -args.seq:]).logits[0, -1].float().cpu()
        probs = torch.softmax(logits / max(args.temperature, 1e-3), dim=-1)
        ids = torch.cat([ids, torch.multinomial(probs, 1, generator=gen).to(device)[None]], dim=1)
    model.train()
    return bytes(ids[0].tolist()).decode("utf-8", errors="replace")


def train(args, impl: str, data: list[torch.Tensor]) -> dict:
    device = torch.device(args.device)
    model = build_model(args, impl, device)
    step_fn = torch.compile(model) if args.compile else model
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    progress = Progress(len(data), impl)
    losses, timed_tokens, start = [], 0, None
    for step, ids in enumerate(data):
        if step == 1:  # step 0 holds one-time set-up (and compilation)
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
        ids = ids.to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.amp):
            loss = step_fn(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
        progress.update(step, losses[-1])
        if step >= 1:
            timed_tokens += ids.numel()
    if device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start if start is not None else float("nan")
    return {
        "impl": impl,
        "losses": losses,
        "tokens_per_s": timed_tokens / elapsed if elapsed and elapsed == elapsed else 0.0,
        "peak_mem_mb": peak_memory_mb(device),
        "sample": sample(model, args, device),
    }


def plot(runs: list[dict], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for run in runs:
        ax.plot(run["losses"], label=run["impl"])
    ax.axhline(math.log(256), color="gray", linestyle=":", label="ln 256 (uniform)")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats / byte)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv=None) -> int:
    args = parse_args(argv)
    data = corpus()
    steps = batches(data, args)
    print(f"corpus: pydoc_data.topics, {len(data):,} bytes; {args.steps} steps of "
          f"{args.batch}x{args.seq} bytes", flush=True)
    impls = ["torch", args.impl] if args.compare and args.impl != "torch" else [args.impl]
    runs = [train(args, impl, steps) for impl in impls]
    args.out.mkdir(parents=True, exist_ok=True)
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    for run in runs:
        (args.out / f"lm_{run['impl']}.json").write_text(
            json.dumps({"args": settings, **run}, indent=1) + "\n")
        print(f"sample ({run['impl']}): {run['sample']!r}")
    plot(runs, args.out / "lm_curves.png")
    status = 0
    if len(runs) == 2:
        # Two runs that differ only in rounding drift apart step by step (Adam amplifies the
        # tiny gradient differences), so the criterion is on the curves: moving averages over
        # a window of steps. The largest per-step difference is reported beside it.
        a, b = (np.asarray(r["losses"]) for r in runs)
        per_step = float(np.max(np.abs(a - b) / np.abs(a)))
        window = max(1, len(a) // 15)
        kernel = np.ones(window) / window
        ma, mb = np.convolve(a, kernel, "valid"), np.convolve(b, kernel, "valid")
        curve = float(np.max(np.abs(ma - mb) / np.abs(ma)))
        print(f"compare: loss curves ({window}-step moving averages) differ by at most "
              f"{curve:.2e} relative (tolerance {args.tolerance}); largest single-step "
              f"difference {per_step:.2e}")
        status = 0 if curve <= args.tolerance else 1
    for run in runs:
        print(f"final: impl={run['impl']} device={args.device} amp={args.amp} "
              f"compile={args.compile} steps={args.steps} loss={run['losses'][-1]:.4f} "
              f"tokens_per_s={run['tokens_per_s']:.0f} peak_mem_mb={run['peak_mem_mb']:.0f}")
    return status


if __name__ == "__main__":
    sys.exit(main())
