#!/usr/bin/env bash
# Records how many clusters of 1-16 CTAs (one CTA per SM) this GPU holds at once: builds
# scripts/cluster_occupancy.cu with nvcc for sm_90a, runs it, and writes a Markdown record (device,
# driver, nvcc, date, command, the table) to $OUT/cluster_occupancy.md (and prints it).
# Usage: OUT=/some/dir bash scripts/cluster_occupancy.sh
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_check_out}
mkdir -p "$OUT"
NVCC=${CUDA_HOME:-/usr/local/cuda}/bin/nvcc
"$NVCC" -arch=sm_90a -O2 -o /tmp/cutlass_nn_cluster_occupancy scripts/cluster_occupancy.cu
{
  echo "# Co-resident thread-block clusters"
  echo
  echo "- device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
  echo "- nvcc: $("$NVCC" --version | tail -2 | head -1)"
  echo "- date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "- command: OUT=$OUT bash scripts/cluster_occupancy.sh (commit ${CUTLASS_NN_GIT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)})"
  echo
  echo '```'
  /tmp/cutlass_nn_cluster_occupancy
  echo '```'
} | tee "$OUT/cluster_occupancy.md"
