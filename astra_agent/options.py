"""The options every CLI shares, declared once: the endpoint (`--base-url`, `--model`,
`--api-key`, the same environment variables everywhere), sampling, `--verbose` and `--version`.

Each option defaults to ``None`` so that the one place that holds a default is the config model
(``ModelConfig``); :func:`model_overrides` turns the flags into the override mapping that
``load_config`` takes (``None`` values are skipped there).
"""

# No `from __future__ import annotations` here: typer evaluates string annotations in the
# module's globals, where common_callback's closure (the CLI's name) is not visible.
from importlib import metadata
from typing import Annotated, Any

import typer

from astra_agent.console import console, setup_logging
from astra_agent.model import DEFAULT_BASE_URL, ModelConfig

BASE_URL_ENV = ["ASTRA_BASE_URL", "OPENAI_BASE_URL"]
MODEL_ENV = "ASTRA_MODEL"
API_KEY_ENV = ["ASTRA_API_KEY", "OPENAI_API_KEY"]


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
TemperatureOpt = Annotated[
    float | None,
    typer.Option(
        "--temperature",
        "-t",
        help=f"Sampling temperature (default {_default('temperature')}, Qwen3's thinking mode; "
        f"top-p {_default('top_p')}, top-k {_default('top_k')} as Qwen3 recommends).",
        show_default=False,
    ),
]


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
