#!/usr/bin/env bash
# GPU check of cutlass_nn on a fresh GPU machine with no network:
#   1. installs the CUTLASS headers from what was carried into .whl/ (the wheel
#      nvidia_cutlass-4.2.0.0-*.whl or its small pack cutlass_site.tar.xz: install_cutlass_site.sh),
#   2. builds the CUDA flavor in place with MAX_JOBS parallel jobs (timed),
#   3. with SELFTESTS=1, builds and runs the torch-free kernel self-tests (csrc/kernels/tests),
#   4. runs the whole pytest suite (GPU tests included; PYTEST_WORKERS processes with
#      pytest-xdist when it is installed) with a JUnit report,
#   5. writes a summary (device, torch/CUDA versions, date, command, pass/fail counts, build time)
#      with scripts/gpu_summary.py to $OUT/gpu_check_summary.md (and prints it).
# Usage: OUT=/some/dir bash scripts/gpu_check.sh [extra pytest args]
#   PYTEST_TARGETS (default "tests"): the test files / folders to run.
#   CUTLASS_NN_CUDA_ARCHS, MAX_JOBS: build knobs (README.md).
#   SKIP_BUILD=1: test the extension already built in place (cutlass_nn/_C*.so, e.g. carried from
#   an earlier run of this script) instead of building it; the summary says so.
#   SAVE_SO=1: after a successful build, pack the extension into $OUT/_C.abi3.so.xz (one file of
#   about 14 MB, scripts/prebuilt_extension.py) to carry into later calls.
#   PREBUILT_SO=path.xz: unpack that extension in place and test it (implies SKIP_BUILD=1).
#   SAVE_OBJECTS=1 (default with SAVE_SO=1): after a successful build, also save its object
#   cache to $OUT/objects.tar.xz.partNN (cutlass_nn/_object_cache.py; parts under 16 MiB): carried
#   into a later build as CUTLASS_NN_OBJECT_CACHE, the units whose inputs did not change are
#   linked from it instead of compiled. The units of an earlier call's save of the same build
#   ($EARLIER_SAVE, default build/object_cache_saved/objects.tar.xz: gpu_session.sh's build
#   step) are carried into it where their inputs still have the content they were keyed on.
set -uo pipefail
cd "$(dirname "$0")/.."
#: where gpu_session.sh's build step saves the objects it compiled (kept in the build folder
#: while the machine stays warm)
EARLIER_SAVE=${EARLIER_SAVE:-build/object_cache_saved/objects.tar.xz}
OUT=${OUT:-$PWD/gpu_check_out}
mkdir -p "$OUT"
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export MAX_JOBS=${MAX_JOBS:-16}
export PYTHONUNBUFFERED=1

if ! python3 -c "import cutlass_library" 2>/dev/null; then
  CUTLASS_SITE=/tmp/cutlass_site bash scripts/install_cutlass_site.sh || exit 1
  export PYTHONPATH=/tmp/cutlass_site${PYTHONPATH:+:$PYTHONPATH}
fi
CUTLASS_INC=$(python3 -c "import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), 'source'))")

if [ -n "${PREBUILT_SO:-}" ]; then
  python3 scripts/prebuilt_extension.py unpack "$PREBUILT_SO" cutlass_nn/_C.abi3.so || exit 1
  export SKIP_BUILD=1
fi
start=$(date +%s)
if [ "${SKIP_BUILD:-0}" = 1 ] && ls cutlass_nn/_C*.so >/dev/null 2>&1; then
  echo "SKIP_BUILD=1: testing the prebuilt $(ls cutlass_nn/_C*.so)" > "$OUT/build.log"
  build_rc=0
else
  python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1
  build_rc=$?
fi
build_s=$(( $(date +%s) - start ))
if [ $build_rc -eq 0 ] && [ "${SKIP_BUILD:-0}" != 1 ] && [ "${SAVE_SO:-0}" = 1 ]; then
  python3 scripts/prebuilt_extension.py pack cutlass_nn/_C.abi3.so "$OUT/_C.abi3.so.xz"
fi
if [ $build_rc -eq 0 ] && [ "${SKIP_BUILD:-0}" != 1 ] && [ "${SAVE_OBJECTS:-${SAVE_SO:-0}}" = 1 ]; then
  build_temp=$(ls -td build/temp.* 2>/dev/null | head -1)
  # The save of an earlier call of this build (gpu_session.sh build): its objects are older than
  # the checkout this call was given, so they are carried from that save, by content.
  previous=()
  if ls "$EARLIER_SAVE".part[0-9][0-9] >/dev/null 2>&1; then previous=(--previous "$EARLIER_SAVE"); fi
  if [ -z "$build_temp" ] ||
      ! python3 cutlass_nn/_object_cache.py save "$build_temp" "$OUT/objects.tar.xz" build/object_cache \
        "${previous[@]}" >> "$OUT/build.log" 2>&1; then
    echo "cutlass_nn build: object cache: the save failed (build.log)" >> "$OUT/build.log"
  fi
fi
echo "build: rc=$build_rc in ${build_s}s (MAX_JOBS=$MAX_JOBS)"
grep -E "cutlass_nn build:" "$OUT/build.log"
if [ $build_rc -ne 0 ]; then
  grep -E "error|Error" "$OUT/build.log" | head -40
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}

# The torch-free kernel self-tests recompile every kernel, so they run only when asked for.
selftest_log=/dev/null
if [ "${SELFTESTS:-0}" = 1 ]; then
  selftest_log="$OUT/selftests.log"
  : > "$selftest_log"
  for src in csrc/kernels/tests/*_selftest.cu; do
    name=$(basename "$src" .cu)
    deps="csrc/kernels/elementwise.cu"
    case "$name" in
      gemm_*) deps="csrc/kernels/gemm_dispatch.cu csrc/kernels/launch_settings.cu csrc/kernels/generated/*.cu" ;;
    esac
    nvcc -std=c++17 -O3 -DNDEBUG -DCUTLASS_NN_HAS_SM90 -DCUTLASS_ENABLE_GDC_FOR_SM90 --expt-relaxed-constexpr \
      -gencode=arch=compute_90a,code=sm_90a -Icsrc/kernels \
      -I"$CUTLASS_INC/include" -I"$CUTLASS_INC/tools/util/include" \
      $deps "$src" -o "/tmp/$name" >> "$selftest_log" 2>&1 &
  done
  wait
  for src in csrc/kernels/tests/*_selftest.cu; do
    name=$(basename "$src" .cu)
    if [ -x "/tmp/$name" ]; then
      echo "== $name" >> "$selftest_log"
      timeout 300 "/tmp/$name" >> "$selftest_log" 2>&1
      echo "$name: rc=$? $(grep -E '^[0-9]+ passed, [0-9]+ failed' "$selftest_log" | tail -1)"
    else
      echo "$name: did not compile (see selftests.log)"
    fi
  done
fi

python3 -m cutlass_nn.info
workers=()
if python3 -c "import xdist" 2>/dev/null; then workers=(-n "${PYTEST_WORKERS:-8}"); fi
python3 -m pytest -q -p no:cacheprovider "${workers[@]}" --junitxml="$OUT/pytest.xml" ${PYTEST_TARGETS:-tests} "$@" 2>&1 \
  | tee "$OUT/pytest.log" | tail -40
python3 scripts/gpu_summary.py --junit "$OUT/pytest.xml" --build-seconds "$build_s" \
  --build-rc "$build_rc" --selftests "$selftest_log" --command "bash scripts/gpu_check.sh $*" \
  > "$OUT/gpu_check_summary.md"
cat "$OUT/gpu_check_summary.md"
