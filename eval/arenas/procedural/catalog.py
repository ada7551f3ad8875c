"""The services of the general task families (``services.yaml``): functions with typed
parameters, their OpenAI schemas, and their tool sources (the shared :mod:`runtime` plus the
function's ``SPEC`` and signature).

A parameter with a ``default`` is optional; one without is required. ``SPEC`` holds what the
runtime checks (types, ranges, enum members, list sizes and order, object fields, defaults);
the wording fields (``say``, ``when_true``, ``when_false``, ``form``, ``pool``…) stay on
the generator's side.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from astra_agent.errors import ConfigError
from eval.arenas.procedural.runtime import BadArgument, norm
from eval.arenas.procedural.values import VALUE_KINDS

SERVICES_FILE = Path(__file__).with_name("services.yaml")
RUNTIME_SOURCE = Path(__file__).with_name("runtime.py").read_text(encoding="utf-8")
ParamType = Literal["text", "int", "float", "bool", "enum", "date", "time", "list", "object"]
_JSON_TYPES = {
    "text": "string",
    "int": "integer",
    "float": "number",
    "bool": "boolean",
    "enum": "string",
    "date": "string",
    "time": "string",
    "list": "array",
    "object": "object",
}
_NAME = r"^[a-z][a-z0-9_]*$"


class Param(BaseModel):
    """One parameter (or list item, or object field) of a function."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(pattern=_NAME)
    type: ParamType
    doc: str
    say: list[str] = Field(default_factory=list)
    when_true: list[str] = Field(default_factory=list)
    when_false: list[str] = Field(default_factory=list)
    default: Any = None
    optional: bool = False  # set from the presence of `default` in the file
    pool: str | None = None
    pattern: str | None = None
    quote: bool = False
    values: list[str] = Field(default_factory=list)
    title: bool = False
    min: float | None = None
    max: float | None = None
    step: float | None = None
    items: Param | None = None
    min_items: int = 1
    max_items: int = 3
    ordered: bool = False
    fields: list[Param] = Field(default_factory=list)
    form: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _optional(cls, data: Any) -> Any:
        if isinstance(data, dict) and "default" in data:
            data = {**data, "optional": True}
        return data

    @model_validator(mode="after")
    def _complete(self) -> Param:
        need = {
            "text": self.pool is not None or self.pattern is not None,
            "enum": bool(self.values),
            "int": self.min is not None and self.max is not None,
            "float": self.min is not None and self.max is not None,
            "list": self.items is not None,
            "object": bool(self.fields) and self.form is not None,
            "bool": not self.say,
        }
        if not need.get(self.type, True):
            raise ValueError(f"parameter {self.name!r} of type {self.type} is incomplete")
        return self

    def runtime_spec(self) -> dict[str, Any]:
        """What the tool's runtime checks (plain JSON-able data)."""
        out: dict[str, Any] = {"name": self.name, "type": self.type}
        if self.optional:
            out["default"] = self.default
        if self.type == "enum":
            out["values"] = list(self.values)
        if self.type in ("int", "float"):
            out["min"], out["max"] = self.min, self.max
        if self.type == "list":
            assert self.items is not None
            out["items"] = self.items.runtime_spec()
            out["min_items"], out["max_items"] = self.min_items, self.max_items
            out["ordered"] = self.ordered
        if self.type == "object":
            out["fields"] = [f.runtime_spec() for f in self.fields]
        return out

    def json_schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": _JSON_TYPES[self.type], "description": self.description()}
        if self.type == "enum":
            out["enum"] = list(self.values)
        if self.type == "list":
            assert self.items is not None
            out["items"] = self.items.json_schema()
        if self.type == "object":
            out["properties"] = {f.name: f.json_schema() for f in self.fields}
            out["required"] = [f.name for f in self.fields]
        return out

    def description(self) -> str:
        text = self.doc[0].upper() + self.doc[1:]
        if self.type == "date":
            text += ", as YYYY-MM-DD"
        elif self.type == "time":
            text += ", 24-hour HH:MM"
        elif self.type == "list" and not self.ordered:
            text += " (any order)"
        if self.type in ("int", "float") and self.min is not None:
            text += f", {_num(self.min)} to {_num(self.max)}"
        if self.optional:
            text += f" (optional, default {'none' if self.default is None else self.default})"
        return text + "."


def _num(v: float | None) -> str:
    return f"{v:g}" if v is not None else ""


class Function(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(pattern=_NAME)
    does: str
    ask: list[str] = Field(min_length=1)
    status: str
    receipt: str = Field(pattern=_NAME)
    params: list[Param] = Field(min_length=2)

    @property
    def required(self) -> list[Param]:
        return [p for p in self.params if not p.optional]

    @property
    def optional(self) -> list[Param]:
        return [p for p in self.params if p.optional]

    def runtime_spec(self) -> dict[str, Any]:
        params = [p.runtime_spec() for p in self.params]
        return {"name": self.name, "status": self.status, "receipt": self.receipt, "params": params}

    def openai_schema(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.does,
                "parameters": {
                    "type": "object",
                    "properties": {p.name: p.json_schema() for p in self.params},
                    "required": [p.name for p in self.required],
                },
            },
        }

    def source(self) -> str:
        """The tool's Python source: the runtime, the SPEC, and the function itself."""
        sig = ", ".join(
            p.name if not p.optional else f"{p.name}={p.default!r}"
            for p in [*self.required, *self.optional]
        )
        return (
            f"{RUNTIME_SOURCE}\n\nSPEC = {self.runtime_spec()!r}\n_SEEN: list = []\n\n\n"
            f"def {self.name}({sig}):\n    return answer(SPEC, _SEEN, locals())\n"
        )


class Service(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(pattern=r"^[a-z]+$")
    heldout: bool = False
    functions: list[Function] = Field(min_length=2)

    def words(self) -> set[str]:
        """The words of its function names, the first (the verb) aside."""
        return {w for f in self.functions for w in f.name.split("_")[1:]}


class Catalog(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    pools: dict[str, list[str]]
    services: list[Service]

    def function(self, name: str) -> Function:
        return self.by_name()[name][1]

    def service_of(self, name: str) -> Service:
        return self.by_name()[name][0]

    def by_name(self) -> dict[str, tuple[Service, Function]]:
        return {f.name: (s, f) for s in self.services for f in s.functions}


def _check_pools(catalog: Catalog) -> None:
    def walk(p: Param, where: str) -> None:
        if p.pool is not None and p.pool not in catalog.pools and p.pool not in VALUE_KINDS:
            raise ConfigError(f"{where}: unknown pool {p.pool!r}")
        if p.type == "object":
            slots = set(re.findall(r"{(\w+)}", p.form or ""))
            if slots != {f.name for f in p.fields}:
                raise ConfigError(f"{where}: its form must name each field once")
        for sub in [*([p.items] if p.items else []), *p.fields]:
            walk(sub, f"{where}.{sub.name}")
        if p.type == "bool" and (not p.when_true or not p.when_false):
            raise ConfigError(f"{where}: a boolean needs `when_true` and `when_false` phrases")
        if p.type != "bool" and where.count(".") == 1 and not p.say:
            raise ConfigError(f"{where}: a parameter needs `say` phrases")
        if p.optional and p.default is not None:
            try:
                norm(p.runtime_spec(), p.default, where)
            except BadArgument as exc:
                raise ConfigError(f"{where}: its default is not a valid value: {exc}") from None

    for s in catalog.services:
        for f in s.functions:
            for p in f.params:
                walk(p, f"{f.name}.{p.name}")


@cache
def load_catalog(path: Path = SERVICES_FILE) -> Catalog:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    try:
        catalog = Catalog.model_validate(data)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{path}: not a services file: {exc}") from exc
    names = [f.name for s in catalog.services for f in s.functions]
    if len(set(names)) != len(names) or len({s.name for s in catalog.services}) != len(
        catalog.services
    ):
        raise ConfigError(f"{path}: a service or function name is used twice")
    _check_pools(catalog)
    return catalog


def split_services(
    catalog: Catalog, train_words: set[str], held_words: set[str]
) -> tuple[list[Service], list[Service]]:
    """(training services, held-out services); refused when a held-out service shares a word
    of its function names with a training function (of a service, or of a chain domain:
    ``train_words``), or a training service one with a held-out chain domain (``held_words``)."""
    train = [s for s in catalog.services if not s.heldout]
    held = [s for s in catalog.services if s.heldout]
    if not train or not held:
        raise ConfigError("services.yaml needs training and held-out services")
    seen = train_words.union(*(s.words() for s in train))
    unseen = held_words.union(*(s.words() for s in held))
    shared = sorted(seen & unseen)
    if shared:
        raise ConfigError(
            f"held-out and training function names share the words {shared}: split c's "
            "functions would be seen in training",
            hint="give held-out services and domains words of their own",
        )
    return train, held
