"""The third way to build: CMake for LibTorch C++ users (csrc/CMakeLists.txt).

Runs scripts/cmake_build_check.sh, which builds libcutlass_nn_ops.so (CPU flavor) and the C++
example into a temporary directory, runs the example (cutlass_nn::linear / mm / add2 against
torch's own results) and loads the library with torch.ops.load_library in a fresh Python process
that never imports the cutlass_nn package. About 20-30 s on 2 cores.
"""

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "cmake_build_check.sh"


@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake not found on PATH")
def test_cmake_build_check(tmp_path):
    env = dict(os.environ)
    env["PYTHON"] = sys.executable  # build against, and load into, the torch running the tests
    env["CUTLASS_NN_CMAKE_BUILD_DIR"] = str(tmp_path / "build-cmake")
    env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", "2")
    proc = subprocess.run(
        ["bash", str(SCRIPT)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=1200,
    )
    out = proc.stdout
    assert proc.returncode == 0, f"scripts/cmake_build_check.sh failed:\n{out[-8000:]}"
    assert "cmake_build_check: PASS" in out, out[-8000:]
    assert "PASS C++ example" in out, out[-8000:]
    assert "PASS torch.ops.cutlass_nn.linear registered" in out, out[-8000:]
    assert "FAIL" not in out, out[-8000:]
