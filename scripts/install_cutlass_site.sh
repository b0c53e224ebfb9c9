#!/usr/bin/env bash
# Puts the CUTLASS headers (and the cutlass_library package that locates them) under
# ${CUTLASS_SITE:-/tmp/cutlass_site} on a machine without network, from what was carried into .whl/:
#   .whl/cutlass_site.tar.xz (about 1.1 MB: cutlass_library's Python files and the two header trees
#   the build reads), else the nvidia-cutlass wheel (6.4 MB). Both give the same files at the same
#   paths, so the object cache (cutlass_nn/_object_cache.py) keys alike on either. Make the small
#   pack here with `bash scripts/install_cutlass_site.sh --pack` (needs the wheel in .whl/).
set -euo pipefail
cd "$(dirname "$0")/.."
site=${CUTLASS_SITE:-/tmp/cutlass_site}
pack=.whl/cutlass_site.tar.xz
if [ "${1:-}" = --pack ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip install -q --no-index --no-deps --target "$tmp" .whl/nvidia_cutlass-*.whl
  tar -C "$tmp" -cJf "$pack" $(cd "$tmp" && ls cutlass_library/*.py) cutlass_library/source/include \
    cutlass_library/source/tools/util/include
  echo "install_cutlass_site: wrote $pack ($(stat -c %s "$pack") bytes)"
  exit 0
fi
[ -f "$site/cutlass_library/source/include/cutlass/version.h" ] && exit 0
# into a fresh folder first, moved into place only when complete: an interrupted run leaves no
# partial tree that a later run would take for an installed one
mkdir -p "$(dirname "${site%/}")"
tmp=$(mktemp -d "${site%/}.partial.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
if [ -f "$pack" ]; then
  tar -C "$tmp" -xJf "$pack"
else
  python3 -m pip install -q --no-index --no-deps --target "$tmp" .whl/nvidia_cutlass-*.whl
fi
mkdir -p "$site"
rm -rf "$site/cutlass_library"
mv "$tmp/cutlass_library" "$site/"
for extra in "$tmp"/*; do  # the wheel's other packages (pycute, ...), where installed from it
  [ -e "$extra" ] && [ ! -e "$site/$(basename "$extra")" ] && mv "$extra" "$site/"
done
exit 0
