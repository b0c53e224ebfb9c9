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
# Environment: CUDA_HOME (default /usr/local/cuda), GATED_AB_ARCH (default: the first GPU's
# compute capability as nvidia-smi reports it, "a" appended from 9.0 on, e.g. 90a), ROUNDS
# (default 3), REPS (default 200). Exits non-zero when a version does not build or a run fails.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ $# -lt 2 ]]; then
  echo "usage: $0 \"ROWSxN ...\" NAME=path/gated_act.cu [NAME=path ...]" >&2
  exit 2
fi
sizes=$1
shift
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
if [[ -z "${GATED_AB_ARCH:-}" ]]; then
  cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d ' .')
  GATED_AB_ARCH=$cap
  if (( cap >= 90 )); then GATED_AB_ARCH=${cap}a; fi
fi
arch=$GATED_AB_ARCH
build=$(mktemp -d)
trap 'rm -rf "$build"' EXIT
names=()
pids=()
for spec in "$@"; do
  if [[ "$spec" != *=* ]]; then
    echo "$0: '$spec' is not NAME=path" >&2
    exit 2
  fi
  name=${spec%%=*}
  src=${spec#*=}
  cp "$src" "$build/gated_act_$name.cu"
  "$CUDA_HOME/bin/nvcc" -std=c++17 -O3 -DNDEBUG -gencode=arch=compute_$arch,code=sm_$arch \
    -Icsrc/kernels "$build/gated_act_$name.cu" csrc/kernels/tests/gated_act_timing.cu \
    -o "$build/timing_$name" &
  pids+=($!)
  names+=("$name")
done
for i in "${!pids[@]}"; do
  wait "${pids[$i]}" || { echo "$0: version '${names[$i]}' did not build" >&2; exit 1; }
done
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
      result=$("$build/timing_$name" "$rows" "$n" "${REPS:-200}")
      echo "round $round $name: $result"
    done
  done
done
