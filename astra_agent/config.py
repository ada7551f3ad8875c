"""One way to load configuration for every entry point.

Precedence, lowest first: the model's defaults, a YAML or JSON file, ``ASTRA_*`` environment
variables, then explicit overrides (the CLI's flags). Nested fields are reached from the
environment with a double underscore: ``ASTRA_SAMPLING__TEMPERATURE=0.6``.
"""

from __future__ import annotations

import difflib
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from astra_agent.errors import ConfigError
from astra_agent.runio import creation_problem

M = TypeVar("M", bound=BaseModel)

ENV_PREFIX = "ASTRA_"


def read_text(path: str | Path, what: str = "file") -> str:
    """A UTF-8 text file the user named, or a ConfigError that says what is wrong with it."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"{what} {p} is a directory, not a file")
    if not p.is_file():
        raise ConfigError(f"{what} not found: {p}")
    try:
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        line = p.read_bytes()[: exc.start].count(b"\n") + 1
        raise ConfigError(
            f"{p} is not UTF-8 text (byte {exc.start}, line {line}: {exc.reason})",
            hint="it must be UTF-8 text: is it the right file?",
        ) from None
    except OSError as exc:
        raise ConfigError(f"cannot read {p}: {exc.strerror or exc}") from None


def astra_home() -> Path:
    """Where the harness keeps its state: logs, the demo, bundled models (``$ASTRA_HOME``,
    default ``~/.cache/astra``)."""
    return Path(os.environ.get("ASTRA_HOME", Path.home() / ".cache" / "astra"))


def check_writable(path: str | Path, what: str, *, kind: Literal["file", "dir"] = "file") -> Path:
    """Fail now, before any work, if ``path`` cannot be written later: an existing file that
    cannot be opened for appending, a directory in its place, or no writable directory to
    create it in. ``kind="dir"``: ``path`` is a directory that will be created (or replaced)."""
    p = Path(path)
    if kind == "file" and p.is_dir():
        raise ConfigError(f"{what} {p} is a directory", hint="name a file")
    if kind == "file" and p.exists():
        try:
            os.close(os.open(p, os.O_WRONLY | os.O_APPEND))
        except OSError as exc:
            raise ConfigError(f"{what} {p} is not writable: {exc.strerror}") from None
        return p
    parent, problem = creation_problem(p.absolute().parent)
    if isinstance(problem, NotADirectoryError):
        raise ConfigError(f"{what} {p} cannot be created: {parent} is not a directory")
    if problem is not None:
        raise ConfigError(
            f"{what} {p} cannot be created: {parent} is not writable ({problem.strerror})",
            hint="pick a path in a writable directory",
        )
    return p


# YAML aliases share one object, so a few lines can stand for billions of values ("billion
# laughs") that validation would then walk: a config may expand to this many values at most.
MAX_CONFIG_VALUES = 1_000_000


def expanded_size(data: Any, limit: int = MAX_CONFIG_VALUES) -> int:
    """How many values ``data`` holds with every shared (aliased) container counted each time
    it appears; ValueError past ``limit`` or for a container that contains itself."""
    sizes: dict[int, int] = {}
    busy: set[int] = set()

    def size(node: Any) -> int:
        if not isinstance(node, dict | list):
            return 1
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in busy:
            raise ValueError("an alias refers to a mapping or list that contains it")
        busy.add(key)
        items = [*node.keys(), *node.values()] if isinstance(node, dict) else node
        total = 1
        for item in items:
            total += size(item)
            if total > limit:
                raise ValueError(f"it expands to more than {limit:,} values (aliases)")
        busy.discard(key)
        sizes[key] = total
        return total

    return size(data)


def _one_line(exc: BaseException) -> str:
    """A parser's error on one line: YAML's own spans several (the problem, where it was found,
    a caret under a copy of the line); this keeps the position and the problem."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}"
        context = f" ({exc.context})" if exc.context else ""
        return f"{where}: {exc.problem}{context}"
    return " ".join(str(exc).split())[:500]


def read_mapping(path: str | Path) -> dict[str, Any]:
    """Read a YAML or JSON file that must hold a mapping (of a bounded expanded size)."""
    p = Path(path)
    text = read_text(p, "config file")
    try:
        data = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
        expanded_size(data)
    except (ValueError, RecursionError, yaml.YAMLError) as exc:
        # ValueError: JSONDecodeError, and integers of over 4,300 digits; RecursionError: nesting
        kind = p.suffix.lstrip(".") or "YAML"
        raise ConfigError(f"{p} is not valid {kind}: {_one_line(exc)}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{p} must hold a mapping at the top level, got {type(data).__name__}")
    return data


def unknown_keys(
    data: Mapping[str, Any], model: type[BaseModel], *, allowed: Iterable[str] = ()
) -> list[str]:
    """One message per top-level key of ``data`` that neither ``model`` (its fields and their
    aliases) nor ``allowed`` names, with a "did you mean" where a known key is close."""
    known = set(allowed)
    for name, info in model.model_fields.items():
        known |= {name, info.alias} if info.alias else {name}
    by_lower = {k.lower(): k for k in sorted(known)}
    out = []
    for key in map(str, data):
        if key in known:
            continue
        close = difflib.get_close_matches(key.lower(), by_lower, n=1, cutoff=0.7)
        out.append(
            f"unknown key {key!r}" + (f" (did you mean {by_lower[close[0]]!r}?)" if close else "")
        )
    return out


def deep_merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``extra`` over it, section by section (mappings merged at every depth)."""
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
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
    data = deep_merge(data, _env_overrides(model, env, env_prefix))
    if overrides:
        data = deep_merge(data, {k: v for k, v in overrides.items() if v is not None})
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        where = f" in {path}" if path is not None else ""
        from_env = _env_names(model, env, env_prefix)
        given = set(_leaf_paths(overrides or {}))
        lines = []
        for err in exc.errors():
            loc = ".".join(str(p) for p in err["loc"])
            var = next(
                (v for k, v in from_env.items() if loc == k or loc.startswith(k + ".")), None
            )
            flag = any(loc == k or loc.startswith(k + ".") for k in given)
            source = " (from the command line)" if flag else f" (from ${var})" if var else ""
            lines.append(f"  {loc or '<root>'}: {err['msg']}{source}")
        raise ConfigError(f"invalid configuration{where}:\n" + "\n".join(lines)) from exc


def _leaf_paths(data: Mapping[str, Any], prefix: str = "") -> list[str]:
    """The dotted paths of the values in ``data`` (sections walked into)."""
    out = []
    for k, v in data.items():
        if v is None:
            continue
        path = f"{prefix}{k}"
        out.extend(_leaf_paths(v, path + ".") if isinstance(v, Mapping) and v else [path])
    return out


def _env_names(model: type[BaseModel], environ: Mapping[str, str], prefix: str) -> dict[str, str]:
    """Dotted field path → the environment variable that set it."""
    return {
        ".".join(key[len(prefix) :].lower().split("__")): key
        for key in environ
        if key.startswith(prefix)
        and key[len(prefix) :].lower().split("__")[0] in model.model_fields
    }
