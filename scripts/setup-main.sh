#!/usr/bin/env bash
# The main environment: the harness (editable) with runtime, training and dev dependencies.
set -euo pipefail
venv=${1:-.venv}
py=${PYTHON:-python3}
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
# pip --quiet still warns about empty local index folders on some machines: filter that out.
pip() { "$venv/bin/python" -m pip "$@" --quiet --disable-pip-version-check 2>&1 \
  | { grep -v "is ignored: it is neither a file nor a directory" || true; }
  return "${PIPESTATUS[0]}"; }
# torch 2.13.0: on a machine without a GPU pip finds the CPU wheel on disk (find-links);
# elsewhere PyPI's build of the same version.
pip install "torch==2.13.0"
pip install -e ".[train,dev]"
# BFCL's official data, backends and checker, pinned, WITHOUT its dependencies (it pins
# numpy==1.26.4 and many API SDKs); the multi-turn modules need only the stdlib and mpmath.
pip install --no-deps "bfcl-eval==2026.3.23"
"$venv/bin/python" -c "import torch, transformers, verl, trl, mcp, openai; print('main env ok:', torch.__version__, transformers.__version__)"
