"""The error hierarchy shared by every package.

Each subclass says who is at fault, so that the CLIs can print one clear message and pick
the exit code: 2 for the user's input or configuration, 1 for a run that failed.
"""

from __future__ import annotations


class AstraError(Exception):
    """Root of all errors the harness raises on purpose."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message}\n  hint: {self.hint}" if self.hint else self.message


class ConfigError(AstraError):
    """The user's input is wrong: a missing path, a bad flag, an invalid config file."""

    exit_code = 2


class CheckpointError(ConfigError):
    """A checkpoint on disk is missing, incomplete or corrupt."""


class ModelBehaviorError(AstraError):
    """The model produced output that cannot be parsed or used."""


class ToolError(AstraError):
    """A tool failed to run (inside an episode this becomes a tool result instead)."""


class ServerError(AstraError):
    """A server we started or called failed: did not start, died, or does not answer."""
