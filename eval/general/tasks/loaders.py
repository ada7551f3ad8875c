"""Dataset loaders that task YAMLs name with ``custom_dataset: !function loaders.NAME``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

_HERE = Path(__file__).parent


def json_beside_yaml(
    *, data_files: str | list[str] | dict[str, Any], config_source: str | None = None, **_: Any
) -> Any:
    """A local JSON/JSONL data set whose ``dataset_kwargs.data_files`` are relative to the YAML
    that names them (lm-eval passes the YAML's path as ``config_source``; without one, this
    module's directory). Absolute paths stay as they are."""
    import datasets

    base = Path(config_source).parent if config_source not in (None, "inline") else _HERE

    def resolve(f: str) -> str:
        return str(base / Path(f).expanduser())

    files: Any
    if isinstance(data_files, dict):
        files = {
            split: [resolve(f) for f in v] if isinstance(v, list) else resolve(v)
            for split, v in data_files.items()
        }
    elif isinstance(data_files, list):
        files = [resolve(f) for f in data_files]
    else:
        files = resolve(data_files)
    return datasets.load_dataset("json", data_files=files)
