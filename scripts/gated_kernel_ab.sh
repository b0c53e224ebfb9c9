#!/usr/bin/env bash
# A/B timing of versions of the gated-activation kernels (csrc/kernels/gated_act.cu) on this
# machine's GPU: each given source file is compiled with csrc/kernels/tests/gated_act_timing.cu
# into a binary of its own (the headers of this checkout), and the binaries run in turn, rounds
# alternating their order, at each problem size.
#
#   bash scripts/gated_kernel_ab.sh "ROWSxN ..." NAME=path/gated_act.cu [NAME=path ...]
#
# e.g. bash scripts/gated_kernel_ab.sh "4096x11008 16384x14336" head=csrc/kernels/gated_act.cu \
#          old=/tmp/gated_act_old.cu
# Environment: CUDA_HOME (default /usr/local/cuda), CUTLASS_NN_CUDA_ARCHS (default 90a; the
# first entry is used), ROUNDS (default 3), REPS (default 200).
set -euo pipefail
cd "$(dirname "$0")/.."
sizes=$1
shift
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
arch=${CUTLASS_NN_CUDA_ARCHS:-90a}
arch=${arch%%;*}
build=$(mktemp -d)
names=()
for spec in "$@"; do
  name=${spec%%=*}
  src=${spec#*=}
  cp "$src" "$build/gated_act_$name.cu"
  "$CUDA_HOME/bin/nvcc" -std=c++17 -O3 -DNDEBUG -gencode=arch=compute_$arch,code=sm_$arch \
    -Icsrc/kernels "$build/gated_act_$name.cu" csrc/kernels/tests/gated_act_timing.cu \
    -o "$build/timing_$name" &
  names+=("$name")
done
wait
echo "device: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); nvcc: $("$CUDA_HOME/bin/nvcc" --version | tail -1); date: $(date -u +%FT%TZ)"
for size in $sizes; do
  rows=${size%x*}
  n=${size#*x}
  for round in $(seq 1 "${ROUNDS:-3}"); do
    order=("${names[@]}")
    if (( round % 2 == 0 )); then
      order=()
      for (( i=${#names[@]}-1; i>=0; i-- )); do order+=("${names[$i]}"); done
    fi
    for name in "${order[@]}"; do
      echo "round $round $name: $("$build/timing_$name" "$rows" "$n" "${REPS:-200}")"
    done
  done
done
rm -rf "$build"
