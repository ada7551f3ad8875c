"""One way to load configuration for every entry point.

Precedence, lowest first: the model's defaults, a YAML or JSON file, ``ASTRA_*`` environment
variables, then explicit overrides (the CLI's flags). Nested fields are reached from the
environment with a double underscore: ``ASTRA_SAMPLING__TEMPERATURE=0.6``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from astra_agent.errors import ConfigError

M = TypeVar("M", bound=BaseModel)

ENV_PREFIX = "ASTRA_"


def read_mapping(path: str | Path) -> dict[str, Any]:
    """Read a YAML or JSON file that must hold a mapping."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    text = p.read_text(encoding="utf-8")
    try:
        data = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"{p} is not valid {p.suffix.lstrip('.') or 'YAML'}: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{p} must hold a mapping at the top level, got {type(data).__name__}")
    return data


def _deep_merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _env_overrides(model: type[BaseModel], environ: Mapping[str, str], prefix: str) -> dict:
    """Collect ``PREFIX_FIELD`` / ``PREFIX_SECTION__FIELD`` variables that name real fields."""
    out: dict[str, Any] = {}
    for key, raw in environ.items():
        if not key.startswith(prefix):
            continue
        parts = key[len(prefix) :].lower().split("__")
        if parts[0] not in model.model_fields:
            continue
        value: Any = raw
        if raw[:1] in "[{":
            try:
                value = json.loads(raw)
            except json.JSONDecodeError:
                value = raw
        node = out
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return out


def load_config(
    model: type[M],
    path: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    env_prefix: str = ENV_PREFIX,
) -> M:
    """Build ``model`` from defaults < file < environment < overrides (``None`` values skipped)."""
    data: dict[str, Any] = read_mapping(path) if path is not None else {}
    env = os.environ if environ is None else environ
    data = _deep_merge(data, _env_overrides(model, env, env_prefix))
    if overrides:
        data = _deep_merge(data, {k: v for k, v in overrides.items() if v is not None})
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        where = f" in {path}" if path is not None else ""
        lines = [
            f"  {'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']}"
            for err in exc.errors()
        ]
        raise ConfigError(f"invalid configuration{where}:\n" + "\n".join(lines)) from exc
