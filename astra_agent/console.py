"""What every CLI shares: one error printer, one exit-code policy, one rich console."""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import typer
from rich.console import Console
from rich.logging import RichHandler
from rich.markup import escape

from astra_agent.errors import AstraError

P = ParamSpec("P")
R = TypeVar("R")

console = Console()
# Messages (errors, warnings, what was skipped) are not wrapped at the console's width: one
# message is one line, for grep, logs and tests; a terminal folds it for the eye.
err_console = Console(stderr=True, soft_wrap=True)


def setup_logging(verbose: bool = False) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(message)s",
        handlers=[RichHandler(console=err_console, show_path=False, show_time=False)],
        force=True,
    )
    for noisy in (
        "httpx",
        "httpx2",
        "httpcore",
        "httpcore2",
        "openai",
        "mcp",
        "inspect_ai",
        "inspect_evals",
    ):
        logging.getLogger(noisy).setLevel(logging.DEBUG if verbose else logging.WARNING)


def fail(exc: AstraError) -> typer.Exit:
    """Print ``exc`` as one clear message and return the Exit to raise."""
    # Escaped: a path or a server's words may hold brackets that rich would take as markup.
    err_console.print(f"[bold red]error:[/] {escape(exc.message)}", highlight=False)
    if exc.hint:
        err_console.print(f"[yellow]hint:[/] {escape(exc.hint)}", highlight=False)
    return typer.Exit(exc.exit_code)


def cli_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Decorator for typer commands: AstraError → message + exit code, Ctrl-C → 130."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except AstraError as exc:
            raise fail(exc) from None
        except KeyboardInterrupt:
            err_console.print("[yellow]interrupted[/]")
            sys.stderr.flush()
            raise typer.Exit(130) from None

    return wrapper
