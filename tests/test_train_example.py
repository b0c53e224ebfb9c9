"""End-to-end tests of training_examples/train_mlp.py.

The script is run as a subprocess (short 2-epoch runs) and its stable
``final: key=value ...`` summary line is parsed. The cutlass tests are skipped
when ``cutlass_nn`` cannot be imported; the torchrun test is skipped when
torch.distributed / gloo is unavailable. Total run time is ~20-30 s on 2 CPU
cores (without cutlass_nn).
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "training_examples" / "train_mlp.py"
EPOCHS = 2
# After 2 epochs (~44 Adam steps) the default MLP is at ~93% test accuracy;
# 85% is a sane floor that still catches a broken model / training loop.
MIN_ACC_2_EPOCHS = 0.85
SUBPROCESS_TIMEOUT = 180  # seconds, per script run

# Use pytest-timeout's marker if the plugin is installed (avoids an "unknown
# marker" warning otherwise); subprocess timeouts apply in any case.
if importlib.util.find_spec("pytest_timeout") is not None:
    timeout = pytest.mark.timeout
else:
    def timeout(_seconds):
        return lambda f: f


def _cutlass_nn_dir():
    """Directory that makes `import cutlass_nn` work, or None (with the reason)."""
    try:
        import cutlass_nn
    except Exception as e:  # ImportError, or a broken extension build
        return None, f"cutlass_nn is not importable ({type(e).__name__}: {e})"
    return str(Path(cutlass_nn.__file__).resolve().parent.parent), None


CUTLASS_DIR, CUTLASS_SKIP_REASON = _cutlass_nn_dir()
needs_cutlass = pytest.mark.skipif(CUTLASS_DIR is None, reason=str(CUTLASS_SKIP_REASON))


def _env():
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1" if (os.cpu_count() or 1) <= 2 else "2")
    env["PYTHONUNBUFFERED"] = "1"
    if CUTLASS_DIR is not None:  # let the subprocess import cutlass_nn like we do
        env["PYTHONPATH"] = os.pathsep.join(p for p in (CUTLASS_DIR, env.get("PYTHONPATH")) if p)
    return env


def run_script(out_dir: Path, *args: str, launcher=(), check=True):
    cmd = [sys.executable, *launcher, str(SCRIPT), "--epochs", str(EPOCHS), "--quiet",
           "--out", str(out_dir), *args]
    proc = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True,
                          timeout=SUBPROCESS_TIMEOUT)
    if check and proc.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} exited {proc.returncode}\n"
                    f"--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}")
    return proc


def final_lines(stdout: str) -> list[dict]:
    """Parses every `final: k=v k=v ...` line into a dict (numbers as float)."""
    out = []
    for line in stdout.splitlines():
        if line.startswith("final: "):
            d = dict(kv.split("=", 1) for kv in line[len("final: "):].split())
            for k, v in d.items():
                if re.fullmatch(r"-?[0-9.]+(e-?[0-9]+)?", v):
                    d[k] = float(v)
            out.append(d)
    return out


def check_run(stdout: str, out_dir: Path, impl: str) -> dict:
    finals = [f for f in final_lines(stdout) if f["impl"] == impl]
    assert len(finals) == 1, stdout
    f = finals[0]
    assert f["epochs"] == EPOCHS
    assert f["test_acc"] >= MIN_ACC_2_EPOCHS, stdout
    assert 0 < f["loss"] < 1.0, stdout
    assert f["samples_per_s"] > 0 and f["wall_s"] > 0 and f["peak_mem_mb"] > 0
    # Checkpoint was reloaded into a plain nn.Linear model with strict=True.
    assert re.search(rf"checkpoint: path=\S*mlp_{impl}\.pt strict_load_into_nn_linear=ok .* OK$",
                     stdout, re.M), stdout
    ckpt_path, png = out_dir / f"mlp_{impl}.pt", out_dir / f"curves_{impl}.png"
    assert ckpt_path.is_file() and png.is_file()
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=True)
    assert ckpt["args"]["epochs"] == EPOCHS
    assert all(k.endswith((".weight", ".bias")) for k in ckpt["state_dict"])
    return f


@pytest.fixture(scope="module")
def torch_run(tmp_path_factory):
    """One single-process --impl torch run shared by several tests."""
    out = tmp_path_factory.mktemp("torch_run")
    proc = run_script(out, "--impl", "torch")
    return proc, out


def test_torch_impl(torch_run):
    proc, out = torch_run
    f = check_run(proc.stdout, out, "torch")
    assert f["device"] == "cpu" and f["world_size"] == 1


def test_deterministic_given_seed(torch_run, tmp_path):
    """Same seed -> bit-identical loss and accuracy (CPU)."""
    proc, _ = torch_run
    again = run_script(tmp_path, "--impl", "torch", "--no-plot")
    a, b = final_lines(proc.stdout)[0], final_lines(again.stdout)[0]
    assert (a["loss"], a["test_acc"]) == (b["loss"], b["test_acc"])
    assert not (tmp_path / "curves_torch.png").exists()  # --no-plot honoured


@needs_cutlass
def test_cutlass_impl(tmp_path):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    proc = run_script(tmp_path, "--impl", "cutlass", "--device", device)
    check_run(proc.stdout, tmp_path, "cutlass")


@needs_cutlass
def test_compare(tmp_path):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    proc = run_script(tmp_path, "--compare", "--device", device, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"^compare: OK .*init_identical=1$", proc.stdout, re.M), proc.stdout
    torch_f = check_run(proc.stdout, tmp_path, "torch")
    cut_f = check_run(proc.stdout, tmp_path, "cutlass")
    assert abs(torch_f["test_acc"] - cut_f["test_acc"]) <= 0.01
    assert (tmp_path / "curves_compare.png").is_file()


@timeout(240)
@pytest.mark.skipif(not (torch.distributed.is_available()
                         and torch.distributed.is_gloo_available()),
                    reason="torch.distributed with the gloo backend is not available")
def test_torchrun_two_processes(torch_run, tmp_path):
    """DDP on 2 CPU processes (gloo) matches the single-process run."""
    proc = run_script(tmp_path, "--impl", "torch",
                      launcher=("-m", "torch.distributed.run", "--nproc_per_node=2",
                                "--standalone"))
    finals = final_lines(proc.stdout)
    assert len(finals) == 1, "only rank 0 may print the summary\n" + proc.stdout
    f = check_run(proc.stdout, tmp_path, "torch")
    assert f["world_size"] == 2
    single = final_lines(torch_run[0].stdout)[0]
    assert abs(f["test_acc"] - single["test_acc"]) <= 0.02, (f, single)
