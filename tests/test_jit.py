"""The JIT build (CUTLASS_NN_JIT=1 / cutlass_nn.jit.load) works from a bare source checkout.

One subprocess compiles the CPU flavor from csrc/ into a temporary build directory (~20-60 s)
and imports cutlass_nn from the checkout with CUTLASS_NN_JIT=1; the in-tree cutlass_nn._C must
not be imported.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

CHILD = textwrap.dedent(
    """
    import os, sys
    import torch
    import cutlass_nn
    import cutlass_nn.jit

    root = os.environ["EXPECTED_ROOT"]
    build_dir = os.environ["TORCH_EXTENSIONS_DIR"]
    assert "cutlass_nn._C" not in sys.modules, "the in-tree cutlass_nn._C was imported"
    assert os.path.dirname(cutlass_nn.__file__) == os.path.join(root, "cutlass_nn"), cutlass_nn.__file__
    path = cutlass_nn.jit.loaded_path()
    assert path is not None and path.startswith(build_dir), path
    assert path in torch.ops.loaded_libraries, torch.ops.loaded_libraries
    assert cutlass_nn.jit.load() == path  # loaded once per process

    info = cutlass_nn.build_info()
    assert info["flavor"] == "cpu", info
    assert info["torch_version"] == torch.__version__, info

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 5, 7, generator=g)
    w = torch.randn(3, 7, generator=g)
    b = torch.randn(3, generator=g)
    torch.testing.assert_close(cutlass_nn.linear(x, w, b), torch.nn.functional.linear(x, w, b))
    torch.testing.assert_close(cutlass_nn.linear(x, w), torch.nn.functional.linear(x, w))
    print("JIT OK", path)
    """
)


@pytest.mark.slow
def test_jit_build_imports_without_the_installed_extension(tmp_path):
    env = dict(os.environ)
    env.update(
        CUTLASS_NN_JIT="1",
        CUTLASS_NN_CUDA_ARCHS="none",  # the CPU flavor even with a CUDA torch: one quick compile
        PYTHONPATH=str(ROOT),
        TORCH_EXTENSIONS_DIR=str(tmp_path / "torch_extensions"),
        EXPECTED_ROOT=str(ROOT),
    )
    result = subprocess.run(
        [sys.executable, "-c", CHILD],
        cwd=tmp_path,  # not the checkout: nothing is picked up from the working directory
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert "JIT OK" in result.stdout


def test_jit_variable_values(monkeypatch):
    from cutlass_nn import _extension

    monkeypatch.delenv("CUTLASS_NN_JIT", raising=False)
    assert not _extension.jit_requested()
    for value in ("1", "true", "ON", "verbose"):
        monkeypatch.setenv("CUTLASS_NN_JIT", value)
        assert _extension.jit_requested()
    for value in ("0", "", "no"):
        monkeypatch.setenv("CUTLASS_NN_JIT", value)
        assert not _extension.jit_requested()


BLOCK_C = textwrap.dedent(
    """
    import importlib.abc, sys

    class BlockC(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "cutlass_nn._C":
                raise ImportError("blocked by the test")

    sys.meta_path.insert(0, BlockC())
    try:
        import cutlass_nn
    except ImportError as exc:
        assert "could not be loaded" in str(exc) and "blocked by the test" in str(exc), exc
        assert "cutlass_nn.jit" not in sys.modules
        print("CLEAR ImportError")
    """
)


def test_without_the_jit_variable_a_missing_extension_still_fails_clearly(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "CUTLASS_NN_JIT"}
    env["PYTHONPATH"] = str(ROOT)
    result = subprocess.run(
        [sys.executable, "-c", BLOCK_C], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert "CLEAR ImportError" in result.stdout


def test_jit_and_setup_share_one_build_description(monkeypatch):
    """setup.py and cutlass_nn/jit.py both build from cutlass_nn/_build_config.py."""
    monkeypatch.setenv("CUTLASS_NN_CUDA_ARCHS", "none")  # no CUTLASS headers needed
    setup_py = (ROOT / "setup.py").read_text()
    assert "_build_config.py" in setup_py
    assert "glob" not in setup_py and "-std=" not in setup_py and "gencode" not in setup_py
    from cutlass_nn import _build_config

    config = _build_config.extension_config(log=lambda msg: None)
    assert "csrc/ops_registry.cpp" in config.sources
    assert all((ROOT / s).is_file() for s in config.sources)
    assert _build_config.cxx_standard() in config.cxx_flags
