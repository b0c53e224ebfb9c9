"""Worker processes of tests/test_distributed.py (DDP and FSDP2 over a converted model).

Everything here is a module-level function so that ``torch.multiprocessing.spawn`` can pickle it
by reference: each child imports this module (tests/ is on ``sys.path``, as for cuda_helpers).
A worker writes its results with ``torch.save`` to ``<out_dir>/rank<r>.pt``; the test process
loads them after the join and compares them with ``reference_run()``, the same model trained
on the full batch in one process.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import sys
import traceback
import warnings
from collections import Counter
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import cutlass_nn

# A hung collective raises after this long (gloo and nccl honour init_process_group's timeout).
PG_TIMEOUT = datetime.timedelta(seconds=60)
# The parent gives up on the children (and kills them) after this long.
JOIN_TIMEOUT_S = 120.0

BATCH = 8  # split evenly over the ranks
IN_FEATURES, OUT_FEATURES = 6, 5
LR, MOMENTUM = 0.1, 0.9
MODEL_SEED, DATA_SEED = 1234, 4321


# ---------------------------------------------------------------------------------------------
# Model, data, training loop (shared by the workers and the single-process reference)
# ---------------------------------------------------------------------------------------------


def build_model(device: str | torch.device = "cpu", fp8: bool = False) -> nn.Module:
    """A small MLP built from plain ``nn.Linear`` (seeded), then converted in place. The 11- and
    5-row layers shard unevenly over 2 ranks (FSDP2 pads them). With ``fp8`` every layer is an
    FP8 ``CutlassLinear`` (tensorwise; the layers are below convert's FP8 size rule, so they are
    made FP8 directly)."""
    torch.manual_seed(MODEL_SEED)
    model = nn.Sequential(
        nn.Linear(IN_FEATURES, 16),
        nn.Tanh(),
        nn.Linear(16, 11),
        nn.ReLU(),  # not inplace=True: see test_distributed's module docstring
        nn.Linear(11, OUT_FEATURES, bias=True),
    )
    cutlass_nn.convert(model)
    if fp8:
        for i in (0, 2, 4):
            model[i] = cutlass_nn.CutlassLinear.from_linear(model[i], precision="fp8")
    return model.to(device)


def fixed_batch(device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(DATA_SEED)
    x = torch.randn(BATCH, IN_FEATURES, generator=g)
    y = torch.randn(BATCH, OUT_FEATURES, generator=g)
    return x.to(device), y.to(device)


def shard(t: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    return t.chunk(world_size)[rank]


def count_cutlass_linear(model: nn.Module) -> int:
    return sum(type(m) is cutlass_nn.CutlassLinear for m in model.modules())


class CountCutlassOps(TorchDispatchMode):
    """Counts the ``torch.ops.cutlass_nn`` operators that reach the dispatcher (forward and
    backward)."""

    def __init__(self):
        super().__init__()
        self.counts: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "cutlass_nn":
            self.counts[func._opname] += 1
        return func(*args, **(kwargs or {}))


def train(model, x, y, steps: int, *, grads_fn, loss_fn=None):
    """``steps`` SGD steps on (x, y). Returns (global losses, gradients of the first step,
    cutlass_nn op counts of the first forward + backward). ``grads_fn(model)`` reads the
    (full) gradients; ``loss_fn(local_loss)`` turns the local loss into the global one."""
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    losses, first_grads, op_counts = [], None, None
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        counter = CountCutlassOps()
        with counter if step == 0 else contextlib.nullcontext():
            out = model(x)
            loss = F.mse_loss(out, y)
            loss.backward()
        if step == 0:
            op_counts = dict(counter.counts)
            first_grads = grads_fn(model)
        losses.append(float(loss_fn(loss.detach()) if loss_fn else loss.detach()))
        opt.step()
    return losses, first_grads, op_counts


def _cpu_dict(named):
    return {name: t.detach().to("cpu", copy=True) for name, t in named}


def reference_run(steps: int, fp8: bool = False) -> dict:
    """The unsharded model trained on the full batch in this process (CPU)."""
    model = build_model(fp8=fp8)
    x, y = fixed_batch()
    losses, grads, op_counts = train(
        model, x, y, steps,
        grads_fn=lambda m: _cpu_dict((n, p.grad) for n, p in m.named_parameters()),
    )
    return dict(
        losses=losses,
        grads=grads,
        params=_cpu_dict(model.named_parameters()),
        op_counts=op_counts,
    )


def sharded_reference(world_size: int, fp8: bool = False) -> dict:
    """What a data-parallel first step computes, in this process: each rank's half of the batch
    through its own copy of the model (its own FP8 scales), gradients and losses averaged."""
    x, y = fixed_batch()
    grads, losses = [], []
    for rank in range(world_size):
        model = build_model(fp8=fp8)
        out = model(shard(x, rank, world_size))
        loss = F.mse_loss(out, shard(y, rank, world_size))
        loss.backward()
        grads.append(_cpu_dict((n, p.grad) for n, p in model.named_parameters()))
        losses.append(float(loss.detach()))
    mean = {n: sum(g[n] for g in grads) / world_size for n in grads[0]}
    return dict(grads=mean, loss=sum(losses) / world_size)


# ---------------------------------------------------------------------------------------------
# Process-group plumbing
# ---------------------------------------------------------------------------------------------


def _setup(rank: int, world_size: int, init_method: str, device_type: str) -> torch.device:
    torch.set_num_threads(1)  # 2 processes on a small CI runner: no oversubscription
    if device_type == "cuda":
        torch.cuda.set_device(rank)
        backend, device = "nccl", torch.device("cuda", rank)
    else:
        # gloo's default device resolves the hostname; on CI containers that can fail or pick an
        # external interface. Stay on loopback.
        if sys.platform == "linux" and os.path.exists("/sys/class/net/lo"):
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        backend, device = "gloo", torch.device("cpu")
    dist.init_process_group(
        backend,
        init_method=init_method,
        rank=rank,
        world_size=world_size,
        timeout=PG_TIMEOUT,
        **({"device_id": device} if device_type == "cuda" else {}),
    )
    return device


def _global_mean(t: torch.Tensor) -> torch.Tensor:
    t = t.clone()
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t / dist.get_world_size()


def _run(fn, rank, world_size, init_method, out_dir, device_type, *args):
    """Runs ``fn``; the process group is destroyed whatever happens. An exception propagates
    (spawn reports it to the parent with its traceback)."""
    try:
        device = _setup(rank, world_size, init_method, device_type)
        result = fn(rank, world_size, device, *args)
        torch.save(result, Path(out_dir) / f"rank{rank}.pt")
    except BaseException:
        traceback.print_exc()
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    # Success: leave without the interpreter's teardown. About one FSDP2 CPU job in 25 aborted
    # there ("terminate called without an active exception", SIGABRT) after the results were
    # saved, the process group destroyed and the atexit handlers run (traced with stage
    # markers): a C++ thread of torch's still joinable at static destruction, which the test
    # would misreport as a failed worker.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# ---------------------------------------------------------------------------------------------
# DDP
# ---------------------------------------------------------------------------------------------


def _ddp_body(rank, world_size, device, steps, fp8=False):
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = build_model(device, fp8)
    n_cutlass = count_cutlass_linear(model)
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    x, y = fixed_batch(device)
    x, y = shard(x, rank, world_size), shard(y, rank, world_size)

    def full_grads(m):
        return _cpu_dict((n.removeprefix("module."), p.grad) for n, p in m.named_parameters())

    losses, grads, op_counts = train(ddp, x, y, steps, grads_fn=full_grads, loss_fn=_global_mean)
    return dict(
        n_cutlass=n_cutlass,
        losses=losses,
        grads=grads,
        params=_cpu_dict(model.named_parameters()),
        op_counts=op_counts,
        local_batch=x.shape[0],
    )


def ddp_worker(rank, world_size, init_method, out_dir, device_type, steps):
    _run(_ddp_body, rank, world_size, init_method, out_dir, device_type, steps)


def ddp_fp8_worker(rank, world_size, init_method, out_dir, device_type, steps):
    _run(_ddp_body, rank, world_size, init_method, out_dir, device_type, steps, True)


# ---------------------------------------------------------------------------------------------
# FSDP2 (torch.distributed.fsdp.fully_shard)
# ---------------------------------------------------------------------------------------------


def _fsdp2_body(rank, world_size, device, steps, fp8=False):
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    # An explicit mesh of the run's device type: without it FSDP2 shards onto the accelerator
    # whenever one is visible, also in the CPU (gloo) run on a GPU machine.
    mesh = init_device_mesh(torch.device(device).type, (world_size,))
    model = build_model(device, fp8)
    layers = [m for m in model.modules() if type(m) is cutlass_nn.CutlassLinear]
    n_cutlass = len(layers)
    for layer in layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)

    # Between steps the parameters are DTensors sharded on dim 0 ...
    sharded = {
        n: (isinstance(p, DTensor) and tuple(p.placements) == (Shard(0),))
        for n, p in model.named_parameters()
    }
    # ... and what each CutlassLinear hands to torch.ops.cutlass_nn.linear in forward is the
    # all-gathered unsharded parameter (a plain tensor of the full shape).
    seen_in_forward = []

    def record(module, args):
        w = module.weight
        seen_in_forward.append((type(w).__name__, isinstance(w, DTensor), tuple(w.shape)))

    for layer in layers:
        layer.register_forward_pre_hook(record)

    x, y = fixed_batch(device)
    x, y = shard(x, rank, world_size), shard(y, rank, world_size)

    def full_grads(m):
        # full_tensor() is a collective: every rank calls it in the same order
        return _cpu_dict((n, p.grad.full_tensor()) for n, p in m.named_parameters())

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        losses, grads, op_counts = train(
            model, x, y, steps, grads_fn=full_grads, loss_fn=_global_mean
        )
    params = _cpu_dict((n, p.full_tensor()) for n, p in model.named_parameters())
    return dict(
        n_cutlass=n_cutlass,
        sharded=sharded,
        seen_in_forward=seen_in_forward[:n_cutlass],
        losses=losses,
        grads=grads,
        params=params,
        op_counts=op_counts,
        warnings=sorted({str(w.message) for w in caught}),
    )


def fsdp2_worker(rank, world_size, init_method, out_dir, device_type, steps):
    _run(_fsdp2_body, rank, world_size, init_method, out_dir, device_type, steps)


def fsdp2_fp8_worker(rank, world_size, init_method, out_dir, device_type, steps):
    _run(_fsdp2_body, rank, world_size, init_method, out_dir, device_type, steps, True)


# ---------------------------------------------------------------------------------------------
# DDP with gradient accumulation (no_sync micro-batches) and fused weight-gradient accumulation
# ---------------------------------------------------------------------------------------------


def _micro_batches_and_reference(world_size, micro, device, seed):
    """Every rank's ``micro`` micro-batches, and the reference gradients: one process, no
    wrapper, fused accumulation off, all ranks' micro-batches accumulated, then averaged over the
    ranks (what DDP's all-reduce and FSDP2's reduce-scatter form)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(world_size, micro, 3, IN_FEATURES, generator=g).to(device)
    y = torch.randn(world_size, micro, 3, OUT_FEATURES, generator=g).to(device)
    ref = build_model(device)
    for r in range(world_size):
        for i in range(micro):
            F.mse_loss(ref(x[r, i]), y[r, i]).backward()
    return x, y, _cpu_dict((n, p.grad / world_size) for n, p in ref.named_parameters())


def _run_fused_micro_batches(micro, run_micro_batch) -> dict:
    """``run_micro_batch(i)`` for each micro-batch with fused accumulation on; how many weight
    gradients were formed new and how many added in place (counted with the profiler: under a
    dispatch mode such as CountCutlassOps the fused path is off)."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    with cutlass_nn.fused_wgrad_accumulation(), torch.profiler.profile(activities=activities) as prof:
        for i in range(micro):
            run_micro_batch(i)
    names = [e.name for e in prof.events()]
    return dict(
        accumulated_in_place=names.count("cutlass_nn::linear_wgrad_accumulate_"),
        new_wgrads=names.count("cutlass_nn::linear_wgrad"),
    )


def _ddp_accumulate_body(rank, world_size, device, micro):
    from torch.nn.parallel import DistributedDataParallel as DDP

    x, y, reference = _micro_batches_and_reference(world_size, micro, device, DATA_SEED + 1)
    model = build_model(device)
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)

    def micro_batch(i):
        sync = i == micro - 1
        with contextlib.nullcontext() if sync else ddp.no_sync():
            F.mse_loss(ddp(x[rank, i]), y[rank, i]).backward()

    counts = _run_fused_micro_batches(micro, micro_batch)
    return dict(
        grads=_cpu_dict((n, p.grad) for n, p in model.named_parameters()),
        reference=reference,
        **counts,
    )


def ddp_accumulate_worker(rank, world_size, init_method, out_dir, device_type, micro):
    _run(_ddp_accumulate_body, rank, world_size, init_method, out_dir, device_type, micro)


# ---------------------------------------------------------------------------------------------
# FSDP2 with gradient accumulation (micro-batches without gradient sync) and fused
# weight-gradient accumulation
# ---------------------------------------------------------------------------------------------


def _fsdp2_accumulate_body(rank, world_size, device, micro):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    x, y, reference = _micro_batches_and_reference(world_size, micro, device, DATA_SEED + 2)
    mesh = init_device_mesh(torch.device(device).type, (world_size,))
    model = build_model(device)
    for layer in [m for m in model.modules() if type(m) is cutlass_nn.CutlassLinear]:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)

    def micro_batch(i):
        # the earlier micro-batches keep unsharded gradients; the last one reduce-scatters
        model.set_requires_gradient_sync(i == micro - 1)
        F.mse_loss(model(x[rank, i]), y[rank, i]).backward()

    counts = _run_fused_micro_batches(micro, micro_batch)
    return dict(
        grads=_cpu_dict((n, p.grad.full_tensor()) for n, p in model.named_parameters()),
        reference=reference,
        **counts,
    )


def fsdp2_accumulate_worker(rank, world_size, init_method, out_dir, device_type, micro):
    _run(_fsdp2_accumulate_body, rank, world_size, init_method, out_dir, device_type, micro)
