"""CutlassLinear under torch.distributed: DDP and FSDP2 (``fully_shard``), 2 processes.

Where they run:

* ``[cpu]``: everywhere, CI included: 2 processes on the gloo backend, rendezvous through a
  file in pytest's tmp dir (``file://``), gloo pinned to the loopback interface. Each job takes
  a few seconds (mostly the two children importing torch).
* ``[cuda]``: only on a machine with at least 2 CUDA GPUs and the CUDA flavor of the extension
  (nccl backend, one GPU per rank); skipped otherwise.

FSDP2 does work on CPU with gloo in torch 2.13 (checked: ``fully_shard`` shards the parameters
into ``DTensor``s, all-gathers them for forward and reduce-scatters the gradients), so the FSDP2
test runs on CPU too.

Each job trains the same converted MLP (tests/distributed_workers.py) with each rank on its own
half of a fixed batch, and is compared with the unsharded model trained on the full batch in
this process: gradients of the first step, the loss trajectory and the parameters after the
SGD steps, to float32 tolerance. The workers also check that the model really holds
CutlassLinear layers and that forward and backward reached the ``torch.ops.cutlass_nn``
operators (counted with a dispatch mode).

``test_fsdp2_layer_outputs_are_not_views`` guards a fixed bug: the linear operators used to
return a view of their own buffer, which made FSDP2 warn "returned a view tensor" and in-place
ops on CutlassLinear outputs fail in autograd.
"""

from __future__ import annotations

import time

import pytest
import torch
import torch.multiprocessing as mp

import cutlass_nn
import distributed_workers as W

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available(), reason="torch built without torch.distributed"
)

WORLD_SIZE = 2
DDP_STEPS = 3
FSDP2_STEPS = 5

# One forward + backward of the 3-layer MLP: 3 linears; no input gradient for the first layer.
EXPECTED_OPS = {"linear": 3, "linear_dgrad": 2, "linear_wgrad": 3, "bias_grad": 3}


def _device_param(device_type: str):
    if device_type == "cpu":
        ok = torch.distributed.is_gloo_available()
        return pytest.param("cpu", marks=pytest.mark.skipif(not ok, reason="needs gloo"))
    ok = (
        torch.cuda.is_available()
        and torch.cuda.device_count() >= WORLD_SIZE
        and cutlass_nn.has_cuda_kernels()
        and torch.distributed.is_nccl_available()
    )
    return pytest.param(
        "cuda",
        marks=[
            pytest.mark.cuda,
            pytest.mark.skipif(
                not ok,
                reason=f"needs {WORLD_SIZE} CUDA GPUs, nccl and the CUDA flavor of cutlass_nn",
            ),
        ],
    )


DEVICES = [_device_param("cpu"), _device_param("cuda")]


def tolerances(device_type: str) -> dict:
    # CPU: the sharded runs differ from the reference only in summation order. CUDA: the
    # reference is computed on CPU, the workers' GEMMs on CUTLASS kernels (IEEE float32).
    return dict(rtol=1e-5, atol=1e-6) if device_type == "cpu" else dict(rtol=1e-4, atol=1e-5)


def spawn_job(worker, tmp_path, device_type: str, steps: int) -> list[dict]:
    """Runs ``worker`` on WORLD_SIZE spawned processes; returns each rank's results. A child
    that raises fails the test with its traceback; a hang fails it after JOIN_TIMEOUT_S."""
    init_file = tmp_path / "pg_init"
    assert not init_file.exists()
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    ctx = mp.spawn(
        worker,
        args=(WORLD_SIZE, f"file://{init_file}", str(out_dir), device_type, steps),
        nprocs=WORLD_SIZE,
        join=False,
    )
    deadline = time.monotonic() + W.JOIN_TIMEOUT_S
    try:
        while not ctx.join(timeout=1.0):
            if time.monotonic() > deadline:
                pytest.fail(f"distributed job did not finish within {W.JOIN_TIMEOUT_S} s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.terminate()
                p.join(5)
                if p.is_alive():
                    p.kill()
                    p.join()
    return [torch.load(out_dir / f"rank{r}.pt") for r in range(WORLD_SIZE)]


def reference_for(steps: int) -> dict:
    """The single-process run on the full batch (in this process, CPU)."""
    ref = W.reference_run(steps)
    assert ref["op_counts"] == EXPECTED_OPS, ref["op_counts"]
    return ref


def check_common(results, ref, device_type, steps):
    tol = tolerances(device_type)
    for rank, res in enumerate(results):
        assert res["n_cutlass"] == 3, f"rank {rank}: the converted model has no CutlassLinear"
        assert res["op_counts"] == EXPECTED_OPS, (rank, res["op_counts"])
        assert res["grads"].keys() == ref["grads"].keys()
        for name, g in ref["grads"].items():
            torch.testing.assert_close(
                res["grads"][name], g, **tol, msg=lambda m: f"rank {rank} grad {name}: {m}"
            )
        torch.testing.assert_close(
            torch.tensor(res["losses"]), torch.tensor(ref["losses"][:steps]), **tol
        )
        for name, p in ref["params"].items():
            torch.testing.assert_close(
                res["params"][name], p, **tol, msg=lambda m: f"rank {rank} param {name}: {m}"
            )
    # the ranks agree with each other exactly (same all-reduced gradients, same updates)
    for name in ref["params"]:
        assert torch.equal(results[0]["params"][name], results[1]["params"][name]), name


# ---------------------------------------------------------------------------------------------
# DDP
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=DEVICES)
def ddp_results(request, tmp_path_factory):
    device_type = request.param
    results = spawn_job(W.ddp_worker, tmp_path_factory.mktemp("ddp"), device_type, DDP_STEPS)
    return device_type, results


def test_ddp_matches_single_process(ddp_results):
    device_type, results = ddp_results
    ref = reference_for(DDP_STEPS)
    assert [r["local_batch"] for r in results] == [W.BATCH // WORLD_SIZE] * WORLD_SIZE
    check_common(results, ref, device_type, DDP_STEPS)


# ---------------------------------------------------------------------------------------------
# FSDP2
# ---------------------------------------------------------------------------------------------


def _has_fully_shard() -> bool:
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.fixture(scope="module", params=DEVICES)
def fsdp2_results(request, tmp_path_factory):
    if not _has_fully_shard():
        pytest.skip("torch.distributed.fsdp.fully_shard (FSDP2) is not available")
    device_type = request.param
    results = spawn_job(W.fsdp2_worker, tmp_path_factory.mktemp("fsdp2"), device_type, FSDP2_STEPS)
    return device_type, results


def test_fsdp2_matches_single_process(fsdp2_results):
    device_type, results = fsdp2_results
    ref = reference_for(FSDP2_STEPS)
    for rank, res in enumerate(results):
        # sharded DTensor parameters between steps ...
        assert all(res["sharded"].values()), (rank, res["sharded"])
        # ... all-gathered to plain full-size tensors before they reach the custom op
        assert res["seen_in_forward"] == [
            ("Parameter", False, (16, W.IN_FEATURES)),
            ("Parameter", False, (11, 16)),
            ("Parameter", False, (W.OUT_FEATURES, 11)),
        ], (rank, res["seen_in_forward"])
    check_common(results, ref, device_type, FSDP2_STEPS)


def test_fsdp2_layer_outputs_are_not_views(fsdp2_results):
    _, results = fsdp2_results
    for res in results:
        assert not [w for w in res["warnings"] if "returned a view tensor" in w], res["warnings"]


# ---------------------------------------------------------------------------------------------
# FP8 layers (CutlassLinear(precision="fp8")) under DDP and FSDP2, CPU (gloo)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("wrapper", ["ddp", "fsdp2"])
def test_fp8_layers_train_under_ddp_and_fsdp2(wrapper, tmp_path):
    """Each rank quantizes its own half of the batch (the scales follow the local maximum), so the
    reference is that computation done in this process: each half through its own copy of the
    FP8 model, gradients averaged (equal up to the all-reduce's summation order). The ranks agree
    with each other exactly after the SGD steps, and the FP8 operators are what ran."""
    if not torch.distributed.is_gloo_available():
        pytest.skip("needs gloo")
    if wrapper == "fsdp2" and not _has_fully_shard():
        pytest.skip("torch.distributed.fsdp.fully_shard (FSDP2) is not available")
    worker = W.ddp_fp8_worker if wrapper == "ddp" else W.fsdp2_fp8_worker
    results = spawn_job(worker, tmp_path, "cpu", DDP_STEPS)
    ref = W.sharded_reference(WORLD_SIZE, fp8=True)
    for rank, res in enumerate(results):
        assert res["n_cutlass"] == 3
        ops = res["op_counts"]
        assert ops.get("fp8_scaled_mm") == 3 + 2 + 3 and "linear" not in ops, (rank, ops)
        for name, g in ref["grads"].items():
            torch.testing.assert_close(res["grads"][name], g, rtol=1e-5, atol=1e-6,
                                       msg=lambda m: f"rank {rank} grad {name}: {m}")
        assert abs(res["losses"][0] - ref["loss"]) <= 1e-6 * abs(ref["loss"])
    for name in results[0]["params"]:
        assert torch.equal(results[0]["params"][name], results[1]["params"][name]), name
