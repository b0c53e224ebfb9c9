#!/usr/bin/env bash
# Sets up a fresh machine for cutlass_nn: creates .venv, installs the CPU build of torch 2.13.0
# and the test / example dependencies, and builds the extension into it (editable install).
# Used by README.md's two commands and by .ci/run. Safe to run again (it reuses .venv).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/pip install -q torch==2.13.0 setuptools wheel ninja
# --no-build-isolation: the extension must compile against the torch installed above, not a copy
# that pip would fetch into a throw-away build environment.
.venv/bin/pip install -q --no-build-isolation -e '.[test,train]'
.venv/bin/python -m cutlass_nn.info
