#!/usr/bin/env python
"""Train a small MLP on scikit-learn's handwritten digits with cutlass_nn.

This is the end-to-end example of ``cutlass_nn``: the same model is built from
plain ``nn.Linear`` layers and, for ``--impl cutlass``, converted in place with
``cutlass_nn.convert()`` so that both implementations start from bit-identical
weights. The checkpoint is saved with ``nn.Linear``-compatible keys and is
reloaded into a plain PyTorch model as a check.

Usage (run from the repository root)::

    # default run (cutlass_nn layers, CPU)
    python training_examples/train_mlp.py

    # pure PyTorch reference
    python training_examples/train_mlp.py --impl torch

    # run both implementations from the same seed/data/init and compare;
    # exits non-zero if they disagree
    python training_examples/train_mlp.py --compare

    # GPU, mixed precision, torch.compile, GELU (tanh approximation)
    python training_examples/train_mlp.py --device cuda --amp --amp-dtype fp16 \\
        --compile --activation gelu_tanh

    # data-parallel on 2 processes (gloo on CPU, nccl with --device cuda)
    torchrun --nproc_per_node=2 --standalone training_examples/train_mlp.py --impl torch

Outputs (rank 0 only) go to ``--out`` (default ``training_examples/out``):
``mlp_<impl>.pt`` (checkpoint: state_dict + args + feature scaler) and
``curves_<impl>.png`` (loss / accuracy per epoch; ``curves_compare.png`` with
``--compare``). The last line of a run has the stable form::

    final: impl=torch device=cpu world_size=1 epochs=30 loss=0.000866 test_acc=0.9722 ...

``samples_per_s`` is steady-state training throughput (epoch 1, which holds
warm-up and torch.compile compilation, is excluded when epochs > 1);
``wall_s`` is the wall time of the run (model build, training, evaluation);
``peak_mem_mb`` is torch.cuda.max_memory_allocated on CUDA, else the process'
peak RSS (ru_maxrss). The default CPU run takes ~4 s in total on 2 cores and
reaches ~97% test accuracy.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import os
import resource
import sys
import time
from pathlib import Path

# cuBLAS needs this set before it is initialised to run deterministically.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

NUM_FEATURES = 64  # 8x8 digit images, flattened
NUM_CLASSES = 10
TEST_FRACTION = 0.2
DEFAULT_OUT = Path(__file__).resolve().parent / "out"


# ----------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------
def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Train an MLP on sklearn digits with cutlass_nn or torch.nn.Linear.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--impl", choices=["cutlass", "torch"], default="cutlass",
                   help="linear layer implementation")
    p.add_argument("--compare", action="store_true",
                   help="train with both impls (same seed/data/init) and compare")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--amp", action="store_true",
                   help="mixed precision via torch.autocast (bf16 on CPU)")
    p.add_argument("--amp-dtype", choices=["bf16", "fp16"], default="bf16",
                   help="autocast dtype (fp16 is CUDA only and uses a GradScaler)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--activation", choices=list(ACTIVATIONS), default="relu")
    p.add_argument("--hidden", type=int, default=256, help="hidden layer width")
    p.add_argument("--layers", type=int, default=2, help="number of hidden layers")
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=64,
                   help="GLOBAL batch size (split evenly across ranks)")
    p.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate")
    p.add_argument("--seed", type=int, default=0,
                   help="seeds the split, the init and the data order")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT,
                   help="directory for checkpoint and plot")
    p.add_argument("--no-plot", action="store_true", help="do not write the PNG")
    p.add_argument("--quiet", action="store_true",
                   help="no progress bar / per-epoch lines, only summary lines")
    p.add_argument("--acc-tol", type=float, default=1.0,
                   help="--compare: max test accuracy difference in percentage points")
    p.add_argument("--loss-atol", type=float, default=2e-3,
                   help="--compare: absolute final-loss tolerance")
    p.add_argument("--loss-rtol", type=float, default=0.1,
                   help="--compare: relative final-loss tolerance")
    args = p.parse_args(argv)
    if args.layers < 1 or args.hidden < 1 or args.epochs < 1:
        p.error("--layers, --hidden and --epochs must be >= 1")
    return args


# ----------------------------------------------------------------------------
# Distributed helpers (torchrun sets RANK / WORLD_SIZE / LOCAL_RANK)
# ----------------------------------------------------------------------------
def setup_distributed(device_arg: str):
    """Returns (rank, world_size, device); initialises a process group under torchrun."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    cuda = device_arg.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        raise SystemExit("--device cuda requested but CUDA is not available")
    if world_size > 1:
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if cuda:
            device = torch.device("cuda", local_rank)
            torch.cuda.set_device(device)
        else:
            device = torch.device("cpu")
        dist.init_process_group(backend="nccl" if cuda else "gloo")
    else:
        device = torch.device(device_arg)
    return rank, world_size, device


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


# ----------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------
def load_data(seed: int, device: torch.device):
    """sklearn digits, stratified train/test split, features standardised with
    statistics of the training split only. Everything lives on `device`
    (the data set is tiny: 1797 x 64)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    from sklearn.preprocessing import StandardScaler

    X, y = load_digits(return_X_y=True)
    X_tr, X_te, y_tr, y_te = train_test_split(
        X, y, test_size=TEST_FRACTION, stratify=y, random_state=seed)
    scaler = StandardScaler().fit(X_tr)
    X_tr, X_te = scaler.transform(X_tr), scaler.transform(X_te)

    def t(a, dtype):
        return torch.as_tensor(np.ascontiguousarray(a), dtype=dtype, device=device)

    data = dict(X_train=t(X_tr, torch.float32), y_train=t(y_tr, torch.long),
                X_test=t(X_te, torch.float32), y_test=t(y_te, torch.long))
    # Stored in the checkpoint so that it is usable for inference on raw pixels.
    scaler_state = dict(mean=torch.as_tensor(scaler.mean_, dtype=torch.float32),
                        scale=torch.as_tensor(scaler.scale_, dtype=torch.float32))
    return data, scaler_state


# ----------------------------------------------------------------------------
# Model
# ----------------------------------------------------------------------------
ACTIVATIONS = {
    "relu": nn.ReLU,
    "gelu": nn.GELU,
    "gelu_tanh": lambda: nn.GELU(approximate="tanh"),
}


class MLP(nn.Module):
    """in -> [Linear -> act] x layers -> Linear -> logits.

    Linear layers and activations are kept in separate ModuleLists so that the
    state_dict keys (hidden.N.weight, head.weight, ...) do not change when an
    activation is fused into a CutlassLinear (the activation slot then becomes
    nn.Identity, which has no parameters)."""

    def __init__(self, in_features, hidden, layers, out_features, activation):
        super().__init__()
        dims = [in_features] + [hidden] * layers
        self.hidden = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.acts = nn.ModuleList(ACTIVATIONS[activation]() for _ in range(layers))
        self.head = nn.Linear(hidden, out_features)

    def forward(self, x):
        for linear, act in zip(self.hidden, self.acts):
            x = act(linear(x))
        return self.head(x)


def import_cutlass_nn():
    """Lazy import so that --impl torch works without the extension."""
    try:
        import cutlass_nn
    except ImportError as e:
        raise SystemExit(f"--impl cutlass needs the cutlass_nn package ({e}); "
                         "install it or use --impl torch") from e
    return cutlass_nn


def build_model(args, impl: str, device: torch.device) -> nn.Module:
    """Builds the MLP from nn.Linear under a fixed seed, so the initial weights
    are identical for both impls, then swaps in cutlass_nn layers if asked."""
    torch.manual_seed(args.seed)
    model = MLP(NUM_FEATURES, args.hidden, args.layers, NUM_CLASSES, args.activation)
    if impl == "cutlass":
        cutlass_nn = import_cutlass_nn()
        fused = "activation" in inspect.signature(cutlass_nn.CutlassLinear).parameters
        if fused:
            # Fuse Linear+activation into one CutlassLinear (epilogue) and copy
            # the nn.Linear weights over, so init stays identical.
            for i, lin in enumerate(model.hidden):
                fl = cutlass_nn.CutlassLinear(lin.in_features, lin.out_features, bias=True,
                                              activation=args.activation)
                fl.load_state_dict(lin.state_dict(), strict=True)
                model.hidden[i] = fl
                model.acts[i] = nn.Identity()
        # Replaces every remaining nn.Linear (all of them if not fused) in place.
        model = cutlass_nn.convert(model)
        model.fused_activation = fused  # informational only
    return model.to(device)


# ----------------------------------------------------------------------------
# Train / evaluate
# ----------------------------------------------------------------------------
def autocast_ctx(args, device: torch.device):
    if not args.amp:
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if args.amp_dtype == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


@torch.no_grad()
def evaluate(model, X, y, args, device):
    """Returns (accuracy, logits) on the full set (every rank evaluates the full
    test set with the unwrapped model, so the result does not depend on the
    world size)."""
    model.eval()
    with autocast_ctx(args, device):
        logits = model(X).float()
    model.train()
    acc = (logits.argmax(1) == y).float().mean().item()
    return acc, logits


def peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    # ru_maxrss is in KiB on Linux (bytes on macOS); this is the whole process.
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (2**20 if sys.platform == "darwin" else 2**10)


def train(args, impl: str, data, device, rank: int, world_size: int):
    """Trains one model. Returns a dict with the model, history and metrics."""
    from tqdm.auto import tqdm
    from torch.utils.data.distributed import DistributedSampler

    t_start = time.perf_counter()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    log = (lambda *a: None) if (args.quiet or rank != 0) else tqdm.write

    model = build_model(args, impl, device)
    init_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    train_model = model
    if world_size > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP
        train_model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    if args.compile:
        train_model = torch.compile(train_model)

    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    use_scaler = args.amp and args.amp_dtype == "fp16"
    if use_scaler and device.type != "cuda":
        raise SystemExit("--amp-dtype fp16 is only supported with --device cuda")
    scaler = torch.amp.GradScaler(device.type, enabled=use_scaler)

    # Same global-batch semantics for any world size: DistributedSampler takes a
    # seeded permutation (identical on all ranks) and gives rank r every
    # world_size-th index; with a local batch of batch_size / world_size, the k-th
    # local batches of all ranks together are exactly positions
    # [k*B, (k+1)*B) of that permutation -- the k-th batch of a 1-process run.
    # DDP averages gradients, so each step equals a step on the global batch.
    # Incomplete global batches are dropped, so every step has the same shape.
    X_tr, y_tr = data["X_train"], data["y_train"]
    if args.batch_size % world_size:
        raise SystemExit(f"--batch-size {args.batch_size} must be divisible by "
                         f"the world size {world_size}")
    local_bs = args.batch_size // world_size
    sampler = DistributedSampler(range(len(X_tr)), num_replicas=world_size, rank=rank,
                                 shuffle=True, seed=args.seed, drop_last=True)
    steps_per_epoch = len(sampler) // local_bs
    if steps_per_epoch == 0:
        raise SystemExit("--batch-size is larger than the training set")

    history = dict(loss=[], test_acc=[])
    train_time, samples_seen = 0.0, 0
    show_bar = not (args.quiet or rank != 0 or not sys.stderr.isatty())
    for epoch in range(1, args.epochs + 1):
        sampler.set_epoch(epoch)  # reshuffle deterministically
        idx = torch.tensor(list(sampler), dtype=torch.long, device=device)
        t0 = time.perf_counter()
        loss_sum = torch.zeros((), device=device)
        # one progress bar per epoch, over its optimizer steps (terminals only)
        bar = tqdm(range(steps_per_epoch), desc=f"{impl} epoch {epoch}/{args.epochs}",
                   unit="step", leave=False, disable=not show_bar)
        for step in bar:
            sel = idx[step * local_bs:(step + 1) * local_bs]
            xb, yb = X_tr[sel], y_tr[sel]
            with autocast_ctx(args, device):
                logits = train_model(xb)
            loss = F.cross_entropy(logits.float(), yb)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            loss_sum += loss.detach()
        # Mean training loss of the epoch over all ranks (one sync per epoch).
        if world_size > 1:
            dist.all_reduce(loss_sum)
        epoch_loss = loss_sum.item() / (steps_per_epoch * world_size)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        # Throughput is measured in steady state: the first epoch (warm-up,
        # torch.compile compilation, cuBLAS/CUTLASS init) is excluded when
        # there is more than one epoch.
        if epoch > 1 or args.epochs == 1:
            train_time += time.perf_counter() - t0
            samples_seen += steps_per_epoch * args.batch_size

        acc, _ = evaluate(model, data["X_test"], data["y_test"], args, device)
        history["loss"].append(epoch_loss)
        history["test_acc"].append(acc)
        bar.close()
        log(f"epoch {epoch:3d}/{args.epochs} impl={impl} loss={epoch_loss:.4f} "
            f"test_acc={acc:.4f}")

    acc, logits = evaluate(model, data["X_test"], data["y_test"], args, device)
    return dict(impl=impl, model=model, init_state=init_state, history=history,
                loss=history["loss"][-1], test_acc=acc, test_logits=logits,
                samples_per_s=samples_seen / max(train_time, 1e-9),
                train_s=train_time, wall_s=time.perf_counter() - t_start,
                peak_mem_mb=peak_memory_mb(device))


# ----------------------------------------------------------------------------
# Outputs: summary line, checkpoint (+ reload check), plot
# ----------------------------------------------------------------------------
def final_line(args, r, device, world_size) -> str:
    amp = args.amp_dtype if args.amp else "off"
    return (f"final: impl={r['impl']} device={device.type} world_size={world_size} "
            f"epochs={args.epochs} loss={r['loss']:.6f} test_acc={r['test_acc']:.4f} "
            f"samples_per_s={r['samples_per_s']:.0f} wall_s={r['wall_s']:.2f} "
            f"peak_mem_mb={r['peak_mem_mb']:.1f} amp={amp} compile={int(args.compile)} "
            f"activation={args.activation} "
            f"fused_act={int(getattr(r['model'], 'fused_activation', False))}")


def save_and_verify_checkpoint(args, r, data, scaler_state, device) -> bool:
    """Saves state_dict + args, reloads it into a plain nn.Linear MLP with
    strict=True and checks that it reaches the same test accuracy."""
    path = args.out / f"mlp_{r['impl']}.pt"
    ckpt = dict(
        state_dict={k: v.detach().cpu() for k, v in r["model"].state_dict().items()},
        args={k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        impl=r["impl"], test_acc=r["test_acc"], scaler=scaler_state,
        torch_version=str(torch.__version__),
    )
    torch.save(ckpt, path)

    loaded = torch.load(path, map_location="cpu", weights_only=True)
    a = loaded["args"]
    plain = MLP(NUM_FEATURES, a["hidden"], a["layers"], NUM_CLASSES, a["activation"])
    plain.load_state_dict(loaded["state_dict"], strict=True)  # raises on key mismatch
    plain.to(device)
    acc, logits = evaluate(plain, data["X_test"], data["y_test"], args, device)
    max_diff = (logits - r["test_logits"]).abs().max().item()
    # The torch model is reloaded bit-for-bit; a different GEMM may flip a
    # borderline sample, so cutlass gets the --compare accuracy tolerance.
    tol = 0.0 if r["impl"] == "torch" else args.acc_tol / 100
    ok = abs(acc - r["test_acc"]) <= tol + 1e-12
    print(f"checkpoint: path={path} strict_load_into_nn_linear=ok "
          f"reloaded_test_acc={acc:.4f} trained_test_acc={r['test_acc']:.4f} "
          f"max_abs_logit_diff={max_diff:.3g} {'OK' if ok else 'MISMATCH'}", flush=True)
    return ok


def plot_curves(runs, path: Path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for r in runs:
        epochs = range(1, len(r["history"]["loss"]) + 1)
        ax1.plot(epochs, r["history"]["loss"], label=r["impl"])
        ax2.plot(epochs, [100 * a for a in r["history"]["test_acc"]], label=r["impl"])
    ax1.set(xlabel="epoch", ylabel="train loss", yscale="log", title="training loss")
    ax2.set(xlabel="epoch", ylabel="test accuracy [%]", title="test accuracy")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def compare_runs(args, ref, cut) -> bool:
    """Prints both runs side by side; True if they agree within tolerance."""
    init_diff = max((ref["init_state"][k].float() - cut["init_state"][k].float()).abs().max().item()
                    for k in ref["init_state"])
    ref_sd, cut_sd = ref["model"].state_dict(), cut["model"].state_dict()
    param_diff = max((ref_sd[k].float() - cut_sd[k].float()).abs().max().item() for k in ref_sd)
    logit_diff = (ref["test_logits"] - cut["test_logits"]).abs().max().item()
    d_acc = abs(ref["test_acc"] - cut["test_acc"]) * 100
    d_loss = abs(ref["loss"] - cut["loss"])
    loss_tol = args.loss_atol + args.loss_rtol * max(abs(ref["loss"]), abs(cut["loss"]))
    ok = d_acc <= args.acc_tol and d_loss <= loss_tol and init_diff == 0.0

    print(f"{'':18s}{'torch':>12s}{'cutlass':>12s}")
    print(f"{'final loss':18s}{ref['loss']:12.6f}{cut['loss']:12.6f}")
    print(f"{'test acc':18s}{ref['test_acc']:12.4f}{cut['test_acc']:12.4f}")
    print(f"{'samples/s':18s}{ref['samples_per_s']:12.0f}{cut['samples_per_s']:12.0f}")
    print(f"max abs diff: init_params={init_diff:.3g} final_params={param_diff:.3g} "
          f"test_logits={logit_diff:.3g}")
    print(f"compare: {'OK' if ok else 'FAIL'} d_acc_pp={d_acc:.2f} (tol {args.acc_tol}) "
          f"d_loss={d_loss:.3g} (tol {loss_tol:.3g}) init_identical={int(init_diff == 0.0)}",
          flush=True)
    return ok


# ----------------------------------------------------------------------------
def main(argv=None) -> int:
    args = parse_args(argv)
    rank, world_size, device = setup_distributed(args.device)
    try:
        # Determinism: fixed seeds everywhere, deterministic kernels where torch has them.
        torch.manual_seed(args.seed)
        np.random.seed(args.seed)
        torch.use_deterministic_algorithms(True, warn_only=True)
        if args.amp and args.amp_dtype == "fp16" and device.type != "cuda":
            raise SystemExit("--amp-dtype fp16 is only supported with --device cuda")

        data, scaler_state = load_data(args.seed, device)
        impls = ["torch", "cutlass"] if args.compare else [args.impl]
        if "cutlass" in impls:
            import_cutlass_nn()  # fail early with a clear message
        if rank == 0:
            args.out.mkdir(parents=True, exist_ok=True)
            n_tr, n_te = len(data["X_train"]), len(data["X_test"])
            print(f"data: digits train={n_tr} test={n_te} features={NUM_FEATURES} | "
                  f"model: {args.layers}x{args.hidden} {args.activation} | "
                  f"device={device} world_size={world_size} amp="
                  f"{args.amp_dtype if args.amp else 'off'} compile={args.compile}", flush=True)

        ok, runs = True, []
        for impl in impls:
            r = train(args, impl, data, device, rank, world_size)
            runs.append(r)
            if rank == 0:
                ok &= save_and_verify_checkpoint(args, r, data, scaler_state, device)
                if not args.no_plot:
                    plot_curves([r], args.out / f"curves_{impl}.png")
                print(final_line(args, r, device, world_size), flush=True)
        if args.compare and rank == 0:
            if not args.no_plot:
                plot_curves(runs, args.out / "curves_compare.png")
            ok &= compare_runs(args, *runs)
        if is_distributed():
            # Rank 0 verifies the checkpoint and plots while the others are done; tearing
            # the gloo group down on one rank while a peer is still busy has aborted the
            # process at exit ("terminate called without an active exception"), so every
            # rank waits here and they leave the group together.
            dist.barrier()
        return 0 if ok else 1
    finally:
        if is_distributed():
            dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
