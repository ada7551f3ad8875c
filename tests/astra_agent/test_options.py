"""One set of options for the four CLIs: the same flags, short flags, environment variables
and defaults everywhere, and `--version` on each."""

from __future__ import annotations

from typing import Any

import pytest
import typer
from typer.main import get_command
from typer.testing import CliRunner

from astra_agent.cli import app as agent_app
from astra_agent.model import ModelConfig
from astra_agent.options import API_KEY_ENV, BASE_URL_ENV, MODEL_ENV, model_overrides, version
from eval.cli import app as eval_app
from serving.cli import app as serve_app
from training.cli import app as train_app

APPS = {
    "astra-agent": agent_app,
    "astra-serve": serve_app,
    "astra-eval": eval_app,
    "astra-train": train_app,
}
SHARED = {  # flag: (short flag, environment variables)
    "--base-url": ("-u", BASE_URL_ENV),
    "--api-key": ("-k", API_KEY_ENV),
}
runner = CliRunner()


@pytest.mark.parametrize("name", APPS)
def test_every_cli_prints_its_version(name: str) -> None:
    result = runner.invoke(APPS[name], ["--version"])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == f"{name} {version()}"


def _commands(cmd: Any, path: str = "") -> list[tuple[str, Any]]:
    out = [(path, cmd)]
    for name, sub in getattr(cmd, "commands", {}).items():  # a group (typer vendors click)
        out += _commands(sub, f"{path} {name}".strip())
    return out


def _endpoint_commands() -> list[tuple[str, Any]]:
    found = []
    for name, app in APPS.items():
        for path, cmd in _commands(get_command(app)):
            if any("--base-url" in p.opts for p in cmd.params):
                found.append((f"{name} {path}".strip(), cmd))
    return found


def test_endpoint_options_are_the_same_everywhere() -> None:
    found = _endpoint_commands()
    names = {n for n, _ in found}
    assert {"astra-agent run", "astra-agent chat", "astra-serve check"} <= names, names
    for name, cmd in found:
        params = {opt: p for p in cmd.params for opt in p.opts}
        for flag, (short, env) in SHARED.items():
            p = params[flag]
            assert short in p.opts, (name, flag)
            assert p.envvar == env, (name, flag)
            assert p.default is None, (name, flag)  # the one default lives in ModelConfig
        model = params["--model"]
        assert "-m" in model.opts and model.envvar == MODEL_ENV, name


def test_model_overrides_leave_unset_flags_to_the_config() -> None:
    assert model_overrides(None, "m", None, 0.2, max_tokens=None) == {
        "model": "m",
        "temperature": 0.2,
    }
    cfg = ModelConfig(**model_overrides(base_url="http://h/v1"))
    assert (cfg.base_url, cfg.temperature, cfg.top_p, cfg.top_k) == ("http://h/v1", 0.6, 0.95, 20)


def test_common_callback_gives_verbose_and_version() -> None:
    from astra_agent.options import common_callback

    app = typer.Typer()
    common_callback(app, "astra-x")

    @app.command()
    def hello() -> None:
        typer.echo("hi")

    @app.command()
    def bye() -> None:
        typer.echo("bye")

    assert runner.invoke(app, ["--version"]).stdout.strip() == f"astra-x {version()}"
    assert runner.invoke(app, ["-v", "hello"]).stdout.strip() == "hi"


def test_errors_print_brackets_literally() -> None:
    from astra_agent.console import cli_errors
    from astra_agent.errors import ConfigError
    from astra_agent.options import common_callback

    app = typer.Typer()
    common_callback(app, "astra-x")

    @app.command()
    @cli_errors
    def boom() -> None:
        raise ConfigError("no checkpoint at /data/[v1]/ckpt", hint="see [bold]docs[/bold]")

    result = runner.invoke(app, ["boom"])
    assert result.exit_code == 2
    assert "error: no checkpoint at /data/[v1]/ckpt" in result.stderr  # not eaten as markup
    assert "hint: see [bold]docs[/bold]" in result.stderr
