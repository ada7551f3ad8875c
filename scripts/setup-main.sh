#!/usr/bin/env bash
# The main environment: the harness (editable) with runtime, training and dev dependencies.
set -euo pipefail
. "$(dirname "$0")/venv-lib.sh"
make_venv "${1:-.venv}"
# torch 2.13.0: on a machine without a GPU pip finds the CPU wheel on disk (find-links);
# elsewhere PyPI's build of the same version.
pip install "torch==2.13.0"
pip install -e ".[train,dev,tau2]"
# BFCL's official data, backends and checker, pinned, WITHOUT its dependencies (it pins
# numpy==1.26.4 and many API SDKs); the multi-turn modules need only the stdlib and mpmath.
pip install --no-deps "bfcl-eval==2026.3.23"
# Its response decoder (bfcl_eval.model_handler.utils, used for decoding parity) also imports
# tree-sitter parsers and tenacity: small, and at bfcl-eval's own pins.
pip install --no-deps "tree_sitter==0.21.3" "tree-sitter-java==0.21.0" \
  "tree-sitter-javascript==0.21.4" "tenacity>=8.5.0"
# Its memory backends (the memory_kv and memory_rec_sum categories) import these two.
pip install --no-deps "rank_bm25==0.2.2" "overrides==7.7.0"
"$venv/bin/python" -c "import torch, transformers, verl, trl, mcp, openai, inspect_evals.tau2; print('main env ok:', torch.__version__, transformers.__version__)"
"$venv/bin/python" -c "from bfcl_eval.model_handler.utils import convert_to_function_call"
"$venv/bin/python" -c "from bfcl_eval.eval_checker.multi_turn_eval.func_source_code import memory_kv, memory_rec_sum"
