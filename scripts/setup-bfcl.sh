#!/usr/bin/env bash
# The official BFCL pipeline, whole: bfcl-eval with all its pins in a virtualenv of its own
# (it pins numpy 1.26.4 and many API SDKs, which must stay out of .venv). The tests score our
# exported results with its `bfcl evaluate`; the benchmark runs its `bfcl generate` too.
set -euo pipefail
. "$(dirname "$0")/venv-lib.sh"
make_venv "${1:-.venv-bfcl}"
# torch first (the CPU wheel where there is no GPU), or sentence-transformers pulls CUDA torch.
pip install "torch==2.13.0"
# soundfile: its qwen-agent dependency imports it without declaring it.
pip install "bfcl-eval==2026.3.23" soundfile
"$venv/bin/bfcl" --help > /dev/null
echo "official bfcl ok: $venv/bin/bfcl"
