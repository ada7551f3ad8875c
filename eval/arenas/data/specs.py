"""The arena set's data files: their shapes (pydantic, unknown keys refused) and readers.

Layout: README.md beside this file. ``load_pool`` assembles each tool's source from
``helpers/``, ``constants.py`` (parsed, never run) and ``tools/<name>.py``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from astra_agent.errors import ConfigError

Pool = dict[str, tuple[dict[str, Any], str]]  # tool name -> (OpenAI schema, source)


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Ref(_Spec):
    """``{from: TOOL.FIELD}``: a field (dotted path) of TOOL's output in this chain."""

    from_: str = Field(alias="from", pattern=r"^\w+(\.\w+)*$")


class Step(_Spec):
    tool: str
    arguments: dict[str, Any] = {}  # values: literals, or {from: ...} as a mapping
    gold: str | Ref | list[str | Ref]  # a string: an unquoted YAML number is refused


class TaskSpec(_Spec):
    id: str
    split: Literal["train", "heldout"]
    prompt: str
    chain: list[Step]
    distractors: list[str] = []


class ToolEntry(_Spec):
    description: str
    parameters: dict[str, dict[str, Any]] = {}  # name -> JSON schema keys, plus `optional`
    helpers: list[str] = []
    constants: list[str] = []


def _yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc


def validated(model: type[_Spec], raw: Any, where: str) -> Any:
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        errs = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise ConfigError(f"{where}: {errs}") from None


def _constants(path: Path) -> dict[str, str]:
    """NAME -> the line ``NAME = <repr>`` embedded in sources; the file is parsed, not run."""
    out = {}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            try:
                out[name] = f"{name} = {ast.literal_eval(node.value)!r}"
            except ValueError:
                raise ConfigError(f"{path}: {name} is not a literal") from None
    return out


def _schema(name: str, spec: ToolEntry) -> dict[str, Any]:
    params = spec.parameters
    props = {p: {k: v for k, v in d.items() if k != "optional"} for p, d in params.items()}
    required = [p for p, d in params.items() if not d.get("optional")]
    parameters = {"type": "object", "properties": props, "required": required}
    function = {"name": name, "description": spec.description, "parameters": parameters}
    return {"type": "function", "function": function}


def load_pool(data: Path, domain: str) -> Pool:
    """One domain's tools: schema from tools.yaml, source = helpers + constants + tools/NAME.py."""
    ddir = data / "domains" / domain
    consts = _constants(ddir / "constants.py")
    pool: Pool = {}
    for name, raw in (_yaml(ddir / "tools.yaml") or {}).items():
        spec = validated(ToolEntry, raw, f"{domain}/tools.yaml, tool {name}")
        try:
            helpers = [data / "helpers" / f"{h}.py" for h in spec.helpers]
            parts = [h.read_text(encoding="utf-8").strip() for h in helpers]
            parts += [consts[c] for c in spec.constants]
            parts.append((ddir / "tools" / f"{name}.py").read_text(encoding="utf-8").strip())
        except (OSError, KeyError) as exc:
            raise ConfigError(f"{domain}/tools.yaml, tool {name}: missing {exc}") from exc
        pool[name] = (_schema(name, spec), "\n\n\n".join(parts) + "\n")
    return pool


def task_specs(data: Path) -> Iterator[tuple[str, Any]]:
    """(domain, the raw task entry), in the order of arenas.yaml and of each tasks.yaml."""
    for domain in _yaml(data / "arenas.yaml")["domains"]:
        for raw in _yaml(data / "domains" / domain / "tasks.yaml") or []:
            yield domain, raw
