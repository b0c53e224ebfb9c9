#!/usr/bin/env bash
# Builds the torch-free GEMM self-test: every generated kernel + gemm_dispatch.cu + launch_settings.cu + gemm_selftest.cu.
#
#   csrc/kernels/tests/build_selftest.sh <cutlass include dir> [build dir]
#
# <cutlass include dir> is .../cutlass_library/source/include (from `pip install
# nvidia-cutlass==4.2.0.0`); tools/util/include next to it is added too. Environment:
#   CUDA_HOME    (default /usr/local/cuda)
#   MAX_JOBS     parallel nvcc jobs (default: min(nproc, free GB / 4)); SM90 units need ~3.6 GB each
#   CUTLASS_NN_CUDA_ARCHS  (default "80;90a"); without 90a the SM90 kernels are left out
# Produces <build dir>/gemm_selftest (default build dir: build/gemm_selftest).
set -euo pipefail

if [[ $# -lt 1 ]]; then
  echo "usage: $0 <cutlass include dir> [build dir]" >&2
  exit 2
fi
CUTLASS_INC=$(cd "$1" && pwd)
KERNELS_DIR=$(cd "$(dirname "$0")/.." && pwd)
BUILD_DIR=${2:-build/gemm_selftest}
mkdir -p "$BUILD_DIR"
BUILD_DIR=$(cd "$BUILD_DIR" && pwd)
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
NVCC="$CUDA_HOME/bin/nvcc"
ARCHS=${CUTLASS_NN_CUDA_ARCHS:-"80;90a"}

FLAGS=(-DNDEBUG -DCUTLASS_ENABLE_GDC_FOR_SM90 -std=c++17 --expt-relaxed-constexpr --expt-extended-lambda -O3
       -I"$CUTLASS_INC" -I"$CUTLASS_INC/../tools/util/include" -I"$KERNELS_DIR")
IFS=';' read -ra ARCH_LIST <<< "$ARCHS"
for a in "${ARCH_LIST[@]}"; do
  case "$a" in
    90a) FLAGS+=(-gencode=arch=compute_90a,code=sm_90a -DCUTLASS_NN_HAS_SM90) ;;
    *) FLAGS+=("-gencode=arch=compute_$a,code=[sm_$a,compute_$a]") ;;
  esac
done

if [[ -z "${MAX_JOBS:-}" ]]; then
  mem_gb=$(awk '/MemAvailable/ {print int($2 / 1048576)}' /proc/meminfo)
  MAX_JOBS=$(( mem_gb / 4 ))
  (( MAX_JOBS > $(nproc) )) && MAX_JOBS=$(nproc)
  (( MAX_JOBS < 1 )) && MAX_JOBS=1
fi

SOURCES=("$KERNELS_DIR"/generated/*.cu "$KERNELS_DIR/gemm_dispatch.cu" "$KERNELS_DIR/launch_settings.cu"
         "$KERNELS_DIR/tests/gemm_selftest.cu")
echo "compiling ${#SOURCES[@]} files with $MAX_JOBS jobs into $BUILD_DIR"
# Objects are reused only when newer than their source and every header of the kernel layer.
NEWEST_HEADER=$(ls -t "$KERNELS_DIR"/*.h "$KERNELS_DIR"/*.cuh "$KERNELS_DIR"/generated/*.inc | head -1)
export NVCC BUILD_DIR NEWEST_HEADER
printf '%s\n' "${SOURCES[@]}" | xargs -P "$MAX_JOBS" -I{} bash -c '
  src="$1"; shift
  obj="$BUILD_DIR/$(basename "$src" .cu).o"
  if [[ ! -f "$obj" || "$src" -nt "$obj" || "$NEWEST_HEADER" -nt "$obj" ]]; then
    echo "  nvcc $(basename "$src")"
    "$NVCC" "$@" -c -o "$obj" "$src"
  fi' _ {} "${FLAGS[@]}"

OBJS=()
for s in "${SOURCES[@]}"; do OBJS+=("$BUILD_DIR/$(basename "$s" .cu).o"); done
"$NVCC" "${FLAGS[@]}" -o "$BUILD_DIR/gemm_selftest" "${OBJS[@]}" -cudart static -L"$CUDA_HOME/lib64"
echo "built $BUILD_DIR/gemm_selftest"
