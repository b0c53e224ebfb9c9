#!/usr/bin/env python
"""Train a small Llama-style language model with cutlass_nn's transformer layers.

The model is a ``transformers`` ``LlamaForCausalLM`` with random weights. ``--impl cutlass``
(default) converts it in place with ``cutlass_nn.convert(model, fuse_norm=True, fuse_mlp=True)``
(CutlassLinear projections, fused RMSNorms, fused gated MLPs) and computes the loss with
``cutlass_nn.functional.linear_cross_entropy`` on the base model's hidden states, so the
``[tokens, vocab]`` logits never exist; ``--impl torch`` trains the stock model with its own
loss. ``--compare`` trains both from the same initial weights on the same batches and fails
(exit 1) if their losses drift apart by more than ``--tolerance`` (relative).

The data is synthetic but learnable: token sequences from a fixed random Markov chain in which
each token has a handful of likely successors, so the loss falls from ln(vocab) towards the
chain's entropy (printed at the start as the floor).

Usage (run from the repository root)::

    python training_examples/train_lm.py                       # CPU, a few seconds
    python training_examples/train_lm.py --compare
    python training_examples/train_lm.py --device cuda --dtype bfloat16 --hidden 1024 \\
        --layers 4 --vocab 32000 --seq 1024 --batch 8 --steps 500

Outputs go to ``--out`` (default ``training_examples/out``): ``lm_<impl>.json`` (arguments and
the loss of every step) and, with matplotlib, ``lm_curves.png``. The last line has the form::

    final: impl=cutlass device=cpu steps=60 loss=... floor=... tokens_per_s=...
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import cutlass_nn  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--impl", choices=["cutlass", "torch"], default="cutlass")
    p.add_argument("--compare", action="store_true", help="train both implementations and compare")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--successors", type=int, default=4, help="likely next tokens per token")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tolerance", type=float, default=0.02,
                   help="--compare: largest allowed relative loss difference")
    p.add_argument("--out", type=Path, default=REPO / "training_examples" / "out")
    return p.parse_args(argv)


class MarkovData:
    """Batches of sequences from a random Markov chain: each token's successors are drawn from
    ``successors`` tokens with random (Dirichlet) weights."""

    def __init__(self, vocab: int, successors: int, seed: int):
        rng = np.random.default_rng(seed)
        self.vocab = vocab
        self.next_tokens = rng.integers(0, vocab, size=(vocab, successors))
        self.next_probs = rng.dirichlet(np.ones(successors), size=vocab)
        self.rng = np.random.default_rng(seed + 1)

    def floor(self) -> float:
        """The chain's conditional entropy (nats per token): the best reachable loss."""
        p = self.next_probs
        return float(-(p * np.log(p)).sum(1).mean())

    def batch(self, batch: int, seq: int) -> torch.Tensor:
        out = np.empty((batch, seq), dtype=np.int64)
        out[:, 0] = self.rng.integers(0, self.vocab, size=batch)
        for j in range(1, seq):
            prev = out[:, j - 1]
            choice = (self.rng.random(batch)[:, None] > self.next_probs[prev].cumsum(1)).sum(1)
            choice = np.minimum(choice, self.next_tokens.shape[1] - 1)
            out[:, j] = self.next_tokens[prev, choice]
        return torch.from_numpy(out)


def build_model(args, device, dtype):
    import transformers

    cfg = transformers.LlamaConfig(
        hidden_size=args.hidden,
        intermediate_size=int(args.hidden * 8 / 3 / 64 + 0.5) * 64,
        num_hidden_layers=args.layers,
        num_attention_heads=max(1, args.hidden // 64),
        num_key_value_heads=max(1, args.hidden // 128),
        vocab_size=args.vocab,
        max_position_embeddings=max(args.seq, 128),
    )
    torch.manual_seed(args.seed)
    return transformers.LlamaForCausalLM(cfg).to(device=device, dtype=dtype)


def make_loss(model, impl: str):
    if impl == "torch":
        return lambda ids: model(input_ids=ids, labels=ids).loss
    cutlass_nn.convert(model, fuse_norm=True, fuse_mlp=True)

    def loss(ids):
        hidden = model.model(input_ids=ids).last_hidden_state
        return cutlass_nn.functional.linear_cross_entropy(
            hidden[:, :-1], model.lm_head.weight, ids[:, 1:]
        )

    return loss


def train(args, impl: str, batches) -> dict:
    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    model = build_model(args, device, dtype)
    loss_fn = make_loss(model, impl)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    losses, start, timed_tokens = [], None, 0
    for step, ids in enumerate(batches):
        if step == 1:  # step 0 holds one-time set-up
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
        ids = ids.to(device)
        loss = loss_fn(ids)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
        if step >= 1:
            timed_tokens += ids.numel()
    if device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start if start is not None else float("nan")
    return {"impl": impl, "losses": losses, "tokens_per_s": timed_tokens / elapsed if elapsed else 0}


def plot(runs: list[dict], floor: float, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for run in runs:
        ax.plot(run["losses"], label=run["impl"])
    ax.axhline(floor, color="gray", linestyle="--", label="chain entropy")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats / token)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv=None) -> int:
    args = parse_args(argv)
    data = MarkovData(args.vocab, args.successors, args.seed)
    batches = [data.batch(args.batch, args.seq) for _ in range(args.steps)]
    floor = data.floor()
    print(f"data: Markov chain over {args.vocab} tokens, floor {floor:.3f} nats/token, "
          f"start ~ln(vocab) = {math.log(args.vocab):.3f}", flush=True)
    impls = ["torch", "cutlass"] if args.compare else [args.impl]
    runs = [train(args, impl, batches) for impl in impls]
    args.out.mkdir(parents=True, exist_ok=True)
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    for run in runs:
        (args.out / f"lm_{run['impl']}.json").write_text(
            json.dumps({"args": settings, "floor": floor, **run}, indent=1) + "\n")
    plot(runs, floor, args.out / "lm_curves.png")
    status = 0
    if args.compare:
        a, b = (r["losses"] for r in runs)
        worst = max(abs(x - y) / abs(x) for x, y in zip(a, b))
        print(f"compare: max relative loss difference {worst:.2e} (tolerance {args.tolerance})")
        status = 0 if worst <= args.tolerance else 1
    for run in runs:
        print(f"final: impl={run['impl']} device={args.device} dtype={args.dtype} "
              f"steps={args.steps} loss={run['losses'][-1]:.4f} floor={floor:.4f} "
              f"tokens_per_s={run['tokens_per_s']:.0f}")
    return status


if __name__ == "__main__":
    sys.exit(main())
