"""The options every CLI shares, declared once: the endpoint (`--base-url`, `--model`,
`--api-key`, the same environment variables everywhere), sampling, `--verbose` and `--version`.

Each option defaults to ``None`` so that the one place that holds a default is the config model
(``ModelConfig``); :func:`model_overrides` turns the flags into the override mapping that
``load_config`` takes (``None`` values are skipped there).
"""

# No `from __future__ import annotations` here: typer evaluates string annotations in the
# module's globals, where common_callback's closure (the CLI's name) is not visible.
import difflib
import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from importlib import metadata
from types import UnionType
from typing import Annotated, Any, TypeVar, Union, get_args, get_origin

import typer
import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from astra_agent.console import console, setup_logging
from astra_agent.errors import ConfigError
from astra_agent.model import DEFAULT_BASE_URL, ModelConfig

BASE_URL_ENV = ["ASTRA_BASE_URL", "OPENAI_BASE_URL"]
MODEL_ENV = "ASTRA_MODEL"
API_KEY_ENV = ["ASTRA_API_KEY", "OPENAI_API_KEY"]
R = TypeVar("R")


def _default(field: str) -> Any:
    """A sampling default as ModelConfig holds it: the help text quotes the one source."""
    return ModelConfig.model_fields[field].default


BaseUrlOpt = Annotated[
    str | None,
    typer.Option(
        "--base-url",
        "-u",
        help=f"OpenAI-compatible endpoint (default {DEFAULT_BASE_URL}, where `astra-serve up` "
        "listens). Env: ASTRA_BASE_URL, OPENAI_BASE_URL.",
        envvar=BASE_URL_ENV,
        show_default=False,
    ),
]
ModelOpt = Annotated[
    str | None,
    typer.Option(
        "--model",
        "-m",
        help="Served model name (default: the first the endpoint lists). Env: ASTRA_MODEL.",
        envvar=MODEL_ENV,
        show_default=False,
    ),
]
ApiKeyOpt = Annotated[
    str | None,
    typer.Option(
        "--api-key",
        "-k",
        help="API key of the endpoint. Env: ASTRA_API_KEY, OPENAI_API_KEY.",
        envvar=API_KEY_ENV,
        show_default=False,
    ),
]


def _temperature_opt(default: float) -> Any:
    """``--temperature``, its help quoting ``default`` (a command whose config samples
    otherwise than Qwen3's thinking mode, as τ² at 0, says so)."""
    why = ", Qwen3's thinking mode" if default == _default("temperature") else " for this command"
    return Annotated[
        float | None,
        typer.Option(
            "--temperature",
            "-t",
            help=f"Sampling temperature (default {default}{why}; top-p {_default('top_p')}, "
            f"top-k {_default('top_k')} as Qwen3 recommends).",
            show_default=False,
        ),
    ]


TemperatureOpt = _temperature_opt(_default("temperature"))


def model_overrides(
    base_url: str | None = None,
    model: str | None = None,
    api_key: str | None = None,
    temperature: float | None = None,
    **more: Any,
) -> dict[str, Any]:
    """The ``model:`` section of a config override from the shared flags (unset ones left out)."""
    values = {
        "base_url": base_url,
        "model": model,
        "api_key": api_key,
        "temperature": temperature,
        **more,
    }
    return {k: v for k, v in values.items() if v is not None}


def version() -> str:
    try:
        return metadata.version("astra-harness")
    except metadata.PackageNotFoundError:  # a source tree that was not installed
        return "0+unknown"


def _print_version(name: str) -> Any:
    def callback(value: bool) -> None:
        if value:
            console.print(f"{name} {version()}", highlight=False)
            raise typer.Exit(0)

    return callback


def common_callback(app: typer.Typer, name: str) -> None:
    """Give ``app`` the top-level options every CLI has: ``--verbose/-v`` and ``--version``."""

    @app.callback()
    def _main(
        verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging.")] = False,
        _version: Annotated[
            bool,
            typer.Option(
                "--version",
                help="Print the version and exit.",
                is_eager=True,
                callback=_print_version(name),
            ),
        ] = False,
    ) -> None:
        setup_logging(verbose)


# Options from a config model: each flag is the model's field, declared once (type, default,
# description); `--set section.key=value` reaches every other key, nested sections included.

SET_HELP = (
    "Any key of the config as KEY=VALUE, dotted for a section (e.g. --set verl.device=cpu); "
    "VALUE is read as YAML (1e-5, true, \\[a, b]). Repeatable; the flags above win over it."
)


def comma_names(text: str, flag: str, example: str) -> list[str]:
    """The names of the comma-separated flag ``flag``: blanks dropped; one that names nothing
    (``,``, blanks) or names one thing twice is a ConfigError (a usage error, exit 2)."""
    names = [c.strip() for c in text.split(",") if c.strip()]
    if not names:
        raise ConfigError(f"{flag} {text!r:.200} names nothing", hint=f"e.g. {flag} {example}")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(
            f"{flag} names {', '.join(map(repr, twice))} more than once",
            hint=f"e.g. {flag} {example}",
        )
    return names


def parse_set(items: Sequence[str] | None) -> dict[str, Any]:
    """``["a.b=1", "c=x"]`` → ``{"a": {"b": 1}, "c": "x"}`` (values read as YAML scalars,
    lists or mappings); a malformed item is a ConfigError naming it."""
    out: dict[str, Any] = {}
    for item in items or []:
        key, eq, text = item.partition("=")
        path = key.strip().split(".")
        if not eq or not all(p.strip() for p in path):
            raise ConfigError(
                f"--set {item!r:.200}: expected KEY=VALUE", hint="e.g. --set verl.device=cpu"
            )
        try:
            value = yaml.safe_load(text) if text.strip() else ""
        except yaml.YAMLError as exc:
            reason = " ".join(str(getattr(exc, "problem", None) or exc).split())
            raise ConfigError(f"--set {item!r:.200}: the value is not YAML ({reason})") from None
        except RecursionError:
            raise ConfigError(f"--set {item!r:.200}: the value is nested too deeply") from None
        node = out
        for part in path[:-1]:
            nxt = node.setdefault(part.strip(), {})
            if not isinstance(nxt, dict):
                raise ConfigError(f"--set {item!r:.200}: {part.strip()} is set to a value above")
            node = nxt
        node[path[-1].strip()] = value
    return out


def _flag_type(name: str, annotation: Any) -> Any:
    """The option's type for a field: its annotation without ``None`` (lists stay lists)."""
    args = [a for a in get_args(annotation) if a is not type(None)]
    if get_origin(annotation) in (Union, UnionType):
        if len(args) != 1:
            raise TypeError(f"config flag {name}: a union of {args} has no single option type")
        return _flag_type(name, args[0])
    return annotation


def _flag_help(info: FieldInfo, help_text: str | None) -> str:
    text = help_text or info.description or ""
    text = text[:1].upper() + text[1:]
    default = info.get_default(call_default_factory=True)
    if info.is_required() or default is None or default in ([], {}, ""):  # nothing to show
        return text
    shown = str(default).lower() if isinstance(default, bool) else default
    return f"{text} (default {shown})" if text else f"Default {shown}."


def _field(model: type[BaseModel], dotted: str) -> FieldInfo:
    """The field ``a.b`` of ``model``: field ``b`` of the model that field ``a`` holds."""
    *sections, name = dotted.split(".")
    for section in sections:
        model = _flag_type(dotted, model.model_fields[section].annotation)
    return model.model_fields[name]


def _key_path(model: type[BaseModel], dotted: str) -> str:
    """``dotted`` with each field named as the config's data names it (its alias, if any):
    a file's ``toolTimeout`` and a flag's value must land on the same key."""
    out, node = [], model
    for part in dotted.split("."):
        info = node.model_fields[part]
        out.append(info.alias or part)
        node = _flag_type(part, info.annotation)
    return ".".join(out)


def _set_keys(model: Any, values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``--set``'s values with each key as the config's data names it (a field's alias, as
    a file writes it); a key that names no field is a ConfigError with a did-you-mean. Below a
    field that is not a section (a mapping, a plain value) the keys are the model's to check."""
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        return dict(values)
    fields = {a: f for n, f in model.model_fields.items() for a in (n, f.alias) if a}
    out: dict[str, Any] = {}
    for key, value in values.items():
        field = fields.get(key)
        if field is None:
            close = difflib.get_close_matches(key, sorted(fields), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            where = prefix.rstrip(".") or "the config"
            raise ConfigError(f"--set {prefix}{key}: {where} has no key {key!r}{hint}")
        name = field.alias or next(n for n, f in model.model_fields.items() if f is field)
        if isinstance(value, dict) and value:
            try:
                section = _flag_type(key, field.annotation)
            except TypeError:  # a union of several types: the model checks what is below
                section = None
            value = _set_keys(section, value, f"{prefix}{key}.")
        out[name] = value
    return out


def _param(name: str, annotation: Any) -> inspect.Parameter:
    return inspect.Parameter(
        name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=annotation
    )


ENDPOINT_FLAGS = {
    "base_url": BaseUrlOpt,
    "model": ModelOpt,
    "api_key": ApiKeyOpt,
    "temperature": TemperatureOpt,
}


def _endpoint_flags(model: type[BaseModel]) -> dict[str, Any]:
    """The shared endpoint flags, ``--temperature``'s help with ``model``'s own default."""
    section = model.model_fields.get("model")
    default = section.get_default(call_default_factory=True) if section else None
    temperature = getattr(default, "temperature", _default("temperature"))
    return {**ENDPOINT_FLAGS, "temperature": _temperature_opt(temperature)}


def config_flags(
    model: type[BaseModel],
    fields: Sequence[str],
    *,
    flags: Mapping[str, str] | None = None,
    helps: Mapping[str, str] | None = None,
    endpoint: bool = False,
) -> Callable[[Callable[..., R]], Callable[..., R]]:
    """Give a typer command one option per field of ``model`` named in ``fields`` (its type,
    default and description are the model's; ``section.key`` names a field of a section, its
    option is ``--key``), and ``--set KEY=VALUE`` (a key the model does not have is an error,
    even where the model keeps unknown keys). The command itself takes ``overrides``: what was
    given, as the mapping ``load_config`` takes.

    ``flags`` renames a field's option (``train_files`` → ``train_file``, as a repeatable flag
    reads); ``helps`` replaces a description that reads badly as help; ``endpoint`` adds the
    shared endpoint flags (``--base-url``, ``--model``, ``--api-key``, ``--temperature``) into
    the ``model`` section.
    """
    flags, helps = dict(flags or {}), dict(helps or {})
    names = {name: flags.get(name, name.rpartition(".")[2]) for name in fields}
    keys = {name: _key_path(model, name) for name in fields}  # as a config file writes it

    def decorate(fn: Callable[..., R]) -> Callable[..., R]:
        own = inspect.signature(fn, eval_str=True)
        kept = [p for p in own.parameters.values() if p.name != "overrides"]
        generated = [_param(n, t) for n, t in _endpoint_flags(model).items()] if endpoint else []
        for name, flag in names.items():
            info = _field(model, name)
            kind = _flag_type(name, info.annotation)
            option = typer.Option(help=_flag_help(info, helps.get(name)), show_default=False)
            generated.append(_param(flag, Annotated[kind | None, option]))
        set_option = typer.Option("--set", help=SET_HELP, metavar="KEY=VALUE", show_default=False)
        generated.append(_param("set_", Annotated[list[str] | None, set_option]))
        taken = [p.name for p in kept + generated]
        if len(set(taken)) != len(taken):
            raise TypeError(f"{fn.__name__}: two options named alike in {taken}")

        @functools.wraps(fn)
        def command(**kwargs: Any) -> R:
            overrides = _set_keys(model, parse_set(kwargs.pop("set_")))
            given = {keys[name]: kwargs.pop(flag) for name, flag in names.items()}
            if endpoint:
                endpoint_values = {k: kwargs.pop(k) for k in ENDPOINT_FLAGS}
                given |= {f"model.{k}": v for k, v in model_overrides(**endpoint_values).items()}
            for path, value in given.items():
                if value is None or value == []:
                    continue
                *sections, key = path.split(".")
                node = overrides
                for section in sections:
                    if not isinstance(node.get(section), dict):  # a flag wins over --set
                        node[section] = {}
                    node = node[section]
                node[key] = value
            return fn(**kwargs, overrides=overrides)

        params = kept + generated
        command.__signature__ = own.replace(parameters=params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command

    return decorate
