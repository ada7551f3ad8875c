#!/usr/bin/env bash
# The main environment: the harness (editable) with runtime, training and dev dependencies.
set -euo pipefail
venv=${1:-.venv}
py=${PYTHON:-python3}
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check)
# torch 2.13.0: on a machine without a GPU pip finds the CPU wheel on disk (find-links);
# elsewhere PyPI's build of the same version.
"${pip[@]}" "torch==2.13.0"
"${pip[@]}" -e ".[train,dev]"
"$venv/bin/python" -c "import torch, transformers, verl, trl, mcp, openai; print('main env ok:', torch.__version__, transformers.__version__)"
