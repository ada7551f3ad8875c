"""The CLIs load lean: importing one, and every ``--help`` page of it, pulls in none of the
heavy stacks (torch alone is seconds); the commands import them when they run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "vllm", "trl", "verl", "inspect_ai", "inspect_evals")

# In a fresh interpreter: import the CLI module (checked), then show every command's --help
# (checked again); prints, as JSON, the heavy modules loaded at each point and the pages shown.
PROBE = """
import json, sys
heavy = {heavy!r}
import {module} as cli
loaded = [m for m in heavy if m in sys.modules]
import typer
from typer.testing import CliRunner

def paths(command, path):
    yield path
    for name, sub in (getattr(command, "commands", None) or {{}}).items():
        yield from paths(sub, [*path, name])

runner = CliRunner()
pages = 0
for path in paths(typer.main.get_command(cli.app), []):
    result = runner.invoke(cli.app, [*path, "--help"])
    assert result.exit_code == 0, (path, result.output)
    pages += 1
after = [m for m in heavy if m in sys.modules]
print(json.dumps({{"import": loaded, "help": after, "pages": pages}}))
"""


@pytest.mark.parametrize("module", ["serving.cli", "astra_agent.cli", "eval.cli", "training.cli"])
def test_cli_and_its_help_load_no_heavy_stack(module: str) -> None:
    code = PROBE.format(heavy=HEAVY, module=module)
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        cwd=ROOT,
    )
    loaded = json.loads(out.stdout)
    assert loaded["import"] == [], f"import {module} loads {loaded['import']}"
    assert loaded["help"] == [], f"the --help pages of {module} load {loaded['help']}"
    assert loaded["pages"] > 1  # the commands' pages were shown, not only the top one
