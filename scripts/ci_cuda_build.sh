#!/usr/bin/env bash
# Proves on a machine WITHOUT a GPU that the CUDA flavor of cutlass_nn compiles, links and
# imports: a separate venv (.venv-cuda) with the CUDA build of torch 2.14.1 and the pinned CUTLASS
# headers, nvcc from /usr/local/cuda, a non-editable install built from a copy of the tree (so it
# cannot clash with the CPU flavor built in place by scripts/setup.sh), then an import that must
# report the CUDA flavor, and the CPU tests of the operators run against that build.
# It compiles the representative GEMM kernel set (CUTLASS_NN_KERNEL_SET=ci: every hand-written
# source, one generated kernel per family: SM90 kernel schedule or SM80 configuration, epilogue,
# fused activation or not, operand precision class), which proves each family compiles and links
# with far fewer files to compile; the other tiles / layouts / dtypes / activations of a family
# are compiled by the full set, which the GPU machine builds and tests.
set -euo pipefail
cd "$(dirname "$0")/.."
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export MAX_JOBS=${MAX_JOBS:-2}   # 2 cores, ~3.5 GB per CUTLASS job
export CUTLASS_NN_KERNEL_SET=${CUTLASS_NN_KERNEL_SET:-ci}
root=$PWD
if [ ! -x .venv-cuda/bin/python ]; then
  python3 -m venv .venv-cuda
fi
.venv-cuda/bin/pip install -q torch==2.14.1 setuptools wheel ninja nvidia-cutlass==4.2.0.0 \
  pytest hypothesis expecttest numpy
copy=$(mktemp -d)
git ls-files -z | xargs -0 -I{} cp --parents {} "$copy"
start=$(date +%s)
(cd "$copy" && "$root/.venv-cuda/bin/pip" install -q --no-build-isolation --no-deps .)
echo "CUDA-flavor build: $(( $(date +%s) - start )) s with MAX_JOBS=$MAX_JOBS, kernel set $CUTLASS_NN_KERNEL_SET"
# Where the build's time goes: ninja's log of the compile (pip builds in the copy's build/), the
# slowest units first, so that the next cut of the CI kernel set can be chosen from a measurement.
ninja_log=$(ls "$copy"/build/temp*/.ninja_log 2>/dev/null | head -1 || true)
if [ -n "$ninja_log" ]; then
  # informative only: a summary that fails must not fail the build that succeeded
  python3 scripts/ninja_log_summary.py "$ninja_log" --top 15 || echo "ninja log summary failed"
fi
cd "$copy"   # import the installed package, not the source tree
rm -rf cutlass_nn
"$root/.venv-cuda/bin/python" -m cutlass_nn.info
"$root/.venv-cuda/bin/python" -c "
import cutlass_nn
info = cutlass_nn.build_info()
assert info['flavor'] == 'cuda', info
assert '90a' in info['cuda_archs'] and '80' in info['cuda_archs'], info
assert info['kernel_set'] == '$CUTLASS_NN_KERNEL_SET', info
print('CUDA flavor imports:', info)
"
"$root/.venv-cuda/bin/python" -m pytest -q -p no:cacheprovider tests/test_ops.py tests/test_cuda_ops.py
rm -rf "$copy"
