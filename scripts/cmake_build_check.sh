#!/usr/bin/env bash
# Checks the CMake build for LibTorch C++ users (csrc/CMakeLists.txt), CPU flavor:
#   1. configure and build libcutlass_nn_ops.so and examples/cpp/linear_example (-j2);
#   2. run the example: cutlass_nn::linear / mm / add2 from C++ against torch's own results;
#   3. in a fresh Python process that never imports the cutlass_nn package,
#      torch.ops.load_library(libcutlass_nn_ops.so) must register torch.ops.cutlass_nn.linear,
#      and its result must match torch.nn.functional.linear.
# Prints PASS/FAIL per step; exits non-zero on the first failure.
#
# Environment: PYTHON (default: python3) is the Python whose torch is built against;
# CUTLASS_NN_CMAKE_BUILD_DIR (default: build-cmake/ at the repository root) the build directory;
# CMAKE_BUILD_PARALLEL_LEVEL (default 2) the parallel compile jobs; extra arguments are passed to
# the configure step (e.g. -DCUTLASS_NN_CXX_STANDARD=20).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
python=${PYTHON:-python3}
build=${CUTLASS_NN_CMAKE_BUILD_DIR:-$root/build-cmake}
jobs=${CMAKE_BUILD_PARALLEL_LEVEL:-2}

fail() { echo "cmake_build_check: FAIL: $*"; exit 1; }
command -v cmake >/dev/null || fail "cmake not found on PATH"

prefix=$("$python" -c 'import torch; print(torch.utils.cmake_prefix_path)') \
  || fail "'$python' cannot import torch (set PYTHON to the Python whose torch to build against)"

echo "== configure ($build) =="
start=$(date +%s)
# -Wl,--as-needed imitates linkers that default to it (Ubuntu): the example must still load
# libcutlass_nn_ops.so although it references none of its symbols (see csrc/CMakeLists.txt).
cmake -S csrc -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" \
  -DCUTLASS_NN_BUILD_EXAMPLES=ON -DCMAKE_EXE_LINKER_FLAGS=-Wl,--as-needed "$@" \
  || fail "cmake configure"
echo "== build (-j$jobs) =="
cmake --build "$build" -j"$jobs" || fail "cmake build"
echo "cmake build: $(( $(date +%s) - start )) s (configure + build, -j$jobs)"

lib="$build/libcutlass_nn_ops.so"
[ -f "$lib" ] || fail "$lib was not built"
if command -v readelf >/dev/null; then
  readelf -d "$lib" | grep -qi 'NEEDED.*libpython' && fail "$lib depends on libpython"
  readelf -d "$build/linear_example" | grep -q 'NEEDED.*libcutlass_nn_ops' \
    || fail "the linker dropped libcutlass_nn_ops.so from linear_example (DT_NEEDED)"
fi
nm -D --defined-only "$lib" 2>/dev/null | grep -q PyInit__C && fail "$lib defines PyInit__C"
echo "PASS libcutlass_nn_ops.so built, no Python in it"

echo "== C++ example =="
"$build/linear_example" || fail "examples/cpp/linear_example"
echo "PASS C++ example"

echo "== Python: torch.ops.load_library without the cutlass_nn package =="
# -I: no current directory or PYTHONPATH on sys.path; run from / so the source tree is not found.
(cd / && "$python" -I - "$lib" <<'PY'
import sys

import torch

lib = sys.argv[1]
torch.ops.load_library(lib)
assert "cutlass_nn" not in sys.modules, "the cutlass_nn package was imported"
assert lib in torch.ops.loaded_libraries, torch.ops.loaded_libraries
linear = torch.ops.cutlass_nn.linear  # raises AttributeError if the library registered nothing
x, w, b = torch.randn(4, 3, 8), torch.randn(5, 8), torch.randn(5)
torch.testing.assert_close(linear(x, w, b), torch.nn.functional.linear(x, w, b))
torch.testing.assert_close(linear(x, w), torch.nn.functional.linear(x, w))
info = torch.ops.cutlass_nn.build_info()
assert "flavor=" in info, info
assert "cutlass_nn" not in sys.modules, "the cutlass_nn package was imported"
print("PASS torch.ops.cutlass_nn.linear registered by", lib, "matches F.linear;",
      info.replace("\n", " "))
PY
) || fail "torch.ops.load_library check"

echo "cmake_build_check: PASS"
