#!/usr/bin/env bash
# One GPU session's measurements in three device calls, each under the device's 10-minute limit
# (the full CUDA build alone takes about 10 minutes on 16 cores, so it is split over two calls;
# the machine keeps the build folder only while it stays warm, so call `check` right after
# `build`):
#
#   bash scripts/gpu_session.sh build    # install the carried CUTLASS headers, build ($BUILD_TIME
#                                        # s at most, default 480), then save the object cache
#                                        # (the units this call compiled or took from a carried
#                                        # cache; a partial one where the build did not finish)
#                                        # to $OUT/objects.tar.xz.partNN and, for the check
#                                        # step's save, build/object_cache_saved/
#   bash scripts/gpu_session.sh check    # scripts/gpu_check.sh with SAVE_SO=1 into $OUT/check:
#                                        # finishes the build, packs the extension into
#                                        # $OUT/check/_C.abi3.so.xz, runs the kernel-selection
#                                        # tests and writes the summary; then the sweep
#                                        # ($SWEEP_SHAPES, if set) and the shape-set benchmark;
#                                        # with PREBUILT_SO set, tests that extension instead
#   bash scripts/gpu_session.sh models   # the model benchmark on an extension carried back in
#                                        # ($PREBUILT_SO, default .whl/_C.abi3.so.xz)
#
# Everything goes under $OUT (the device's output folder). The CUTLASS headers come from .whl/:
# the small pack .whl/cutlass_site.tar.xz or the wheel (scripts/install_cutlass_site.sh; README.md,
# "GPU machine"). Carry only the files a call needs (for `build`: cutlass_site.tar.xz, plus the
# object cache's parts if there is one; for a PREBUILT_SO call: the extension's pack): the tracked
# tree plus the whole .whl/ exceeds the device's 64 MiB.
# An object cache of an earlier build carried in as .whl/objects.tar.xz.partNN (what the build
# step leaves in $OUT/ when the build finished there, else what the check step leaves in
# $OUT/check/, with the build step's units carried into it) is used by the build (CUTLASS_NN_OBJECT_CACHE,
# cutlass_nn/_object_cache.py): only the units whose inputs changed are compiled; OBJECT_CACHE
# names another one, OBJECT_CACHE=none builds everything.
# Knobs: SWEEP_SHAPES (layer shapes T x N x K, comma-separated; no sweep when empty), SWEEP_CONFIGS (default all), SWEEP_SWIZZLES (default 1), SWEEP_SPLITS
# (the stream-K configurations' splits, -2..-64 the batched split-K's slices; default the
# bench's), SWEEP_OPS (default
# fwd,dgrad,wgrad), PYTEST_TARGETS (default tests/test_cuda_kernel_selection.py), BENCH_TIME
# (shape-set benchmark's --time-limit, default 200; 0 skips it), MODEL_TIME (default 250),
# BUILD_TIME (the build step's limit, default 480 s, leaving the save its time within the call's 600),
# SAVE_OBJECTS (1, default: the build step saves the object cache; 0: it does not).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:?set OUT to the output folder}
mkdir -p "$OUT"
step=${1:?usage: gpu_session.sh build|check|models}
site=/tmp/cutlass_site
CUTLASS_SITE=$site bash scripts/install_cutlass_site.sh || exit 1
export PYTHONPATH=$PWD:$site${PYTHONPATH:+:$PYTHONPATH} CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export PYTHONUNBUFFERED=1 CUTLASS_NN_CUDA_ARCHS=${CUTLASS_NN_CUDA_ARCHS:-90a} MAX_JOBS=${MAX_JOBS:-16}
object_cache=${OBJECT_CACHE:-.whl/objects.tar.xz}
object_cache=${object_cache%.part00}
if [ "$object_cache" != none ] && { ls "$object_cache".part* >/dev/null 2>&1 || [ -f "$object_cache" ]; }; then
  export CUTLASS_NN_OBJECT_CACHE=$object_cache
fi

case "$step" in
  build)
    nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv | tee "$OUT/gpu.txt"
    # Each build step is a new run of the object cache (cutlass_nn/_object_cache.py): its run
    # record starts now, and the units an earlier build step on this warm machine compiled are
    # carried from that step's save, by content, instead of from the build folder.
    saved=build/object_cache_saved
    rm -rf "$saved.prev" build/object_cache_run.json
    [ -d "$saved" ] && mv "$saved" "$saved.prev"
    start=$(date +%s)
    timeout "${BUILD_TIME:-480}" python3 setup.py build_ext --inplace > "$OUT/build1.log" 2>&1
    rc=$?
    if [ $rc -eq 0 ]; then note=""; else note=" (resumed by the check step)"; fi
    echo "build rc=$rc after $(( $(date +%s) - start )) s$note" | tee -a "$OUT/build1.log"
    build_temp=$(ls -td build/temp.* 2>/dev/null | head -1)
    if [ $rc -ne 0 ] && [ -n "$build_temp" ]; then
      # ninja starts its compilers in process groups of their own, so some outlive the timeout;
      # they are stopped before the save reads the build folder (their command lines name it).
      pattern="$(cd "$build_temp" && pwd)/"
      pkill -TERM -f -- "$pattern" 2>/dev/null
      for _ in $(seq 30); do pgrep -f -- "$pattern" >/dev/null || break; sleep 1; done
      pkill -KILL -f -- "$pattern" 2>/dev/null
    fi
    # The objects compiled in this call are saved in this call: the device copies the checkout
    # afresh into the next one, whose save would then see every input newer than these objects
    # and leave them out; gpu_check.sh's save (the check step) carries this one.
    if [ -n "$build_temp" ] && [ "${SAVE_OBJECTS:-1}" = 1 ]; then
      previous=()
      if ls "$saved.prev"/objects.tar.xz.part[0-9][0-9] >/dev/null 2>&1; then
        previous=(--previous "$saved.prev/objects.tar.xz")
      fi
      start=$(date +%s)
      timeout 90 python3 cutlass_nn/_object_cache.py save "$build_temp" "$saved/objects.tar.xz" \
        build/object_cache "${previous[@]}" 2>&1 | tee -a "$OUT/build1.log"
      save_rc=${PIPESTATUS[0]}
      echo "object cache save: rc=$save_rc after $(( $(date +%s) - start )) s" | tee -a "$OUT/build1.log"
      cp "$saved"/objects.tar.xz.part[0-9][0-9] "$OUT/" 2>/dev/null
      # A finished build saved whole here: the check step has nothing to add.
      if [ $rc -eq 0 ] && [ "$save_rc" -eq 0 ]; then touch "$saved/complete"; fi
    fi
    rm -rf "$saved.prev"
    ;;
  check)
    # A prebuilt extension is unpacked here, once, so that a failed unpack stops the step
    # instead of leaving an older extension in place to be tested and benchmarked; gpu_check.sh
    # then tests it as built in place (SKIP_BUILD=1; its summary gives the extension's MD5).
    if [ -n "${PREBUILT_SO:-}" ]; then
      python3 scripts/prebuilt_extension.py unpack "$PREBUILT_SO" cutlass_nn/_C.abi3.so || exit 1
    fi
    # The object cache is saved again only where the build step's save is not the whole build.
    save_objects=1
    [ -f build/object_cache_saved/complete ] && save_objects=0
    rm -f build/object_cache_saved/complete
    env -u PREBUILT_SO ${PREBUILT_SO:+SKIP_BUILD=1} SAVE_SO=1 SAVE_OBJECTS=$save_objects \
      PYTEST_TARGETS="${PYTEST_TARGETS:-tests/test_cuda_kernel_selection.py}" \
      OUT="$OUT/check" bash scripts/gpu_check.sh -q 2>&1 | tail -15
    # A prebuilt extension (PREBUILT_SO) is tested as it is and not packed again.
    if [ -z "${PREBUILT_SO:-}" ] && [ ! -f "$OUT/check/_C.abi3.so.xz" ]; then
      echo "gpu_session.sh: the build failed" >&2
      exit 1
    fi
    ls cutlass_nn/_C*.so >/dev/null 2>&1 || { echo "gpu_session.sh: no extension to run" >&2; exit 1; }
    if [ -n "${SWEEP_SHAPES:-}" ]; then
      sweep_configs=()
      [ -n "${SWEEP_CONFIGS:-}" ] && sweep_configs=(--sweep-configs "$SWEEP_CONFIGS")
      [ -n "${SWEEP_SPLITS:-}" ] && sweep_configs+=(--sweep-splits "$SWEEP_SPLITS")
      python3 -m cutlass_nn.bench --sweep "${sweep_configs[@]}" \
        --sweep-swizzles "${SWEEP_SWIZZLES:-1}" --what "${SWEEP_OPS:-fwd,dgrad,wgrad}" \
        --sweep-shapes "$SWEEP_SHAPES" --budget-ms 60 --time-limit 100 --out "$OUT" 2>&1 | tail -40
    fi
    if [ "${BENCH_TIME:-200}" != 0 ]; then
      python3 -m cutlass_nn.bench --shapes transformer --what fwd,dgrad,wgrad --budget-ms 60 \
        --time-limit "${BENCH_TIME:-200}" --out "$OUT" 2>&1 | tail -25
    fi
    ;;
  models)
    python3 scripts/prebuilt_extension.py unpack "${PREBUILT_SO:-.whl/_C.abi3.so.xz}" \
      cutlass_nn/_C.abi3.so || exit 1
    python3 -m cutlass_nn.bench --what models --families llama,gpt --sizes gpu \
      --modes compile,eager --steps 20 --time-limit "${MODEL_TIME:-250}" --out "$OUT" 2>&1 | tail -30
    ;;
  *)
    echo "gpu_session.sh: step must be build, check or models, got '$step'" >&2
    exit 2
    ;;
esac
