"""The eval kinds as plugins (eval/kinds.py, eval/*/kind.py): a lookup of an unknown kind is a
clear error, runs record their kind and old run directories without it still read, every eval
package's kind is registered, the product packages have no import circle, and the modules
every eval shares import none of them."""

from __future__ import annotations

import ast
import importlib
import json
from pathlib import Path
from typing import Any

import pytest

from astra_agent.arena import load_arena_file
from astra_agent.errors import ConfigError
from astra_agent.testing.scripted_server import ScriptedServer
from eval.arenas import DATA_DIR, ArenaEvalConfig, evaluate_arenas, replay_script
from eval.kinds import KINDS, get_kind, names, registry
from eval.results import CONFIG, RESULTS, SUMMARY, RunMeta, write_json_atomic
from eval.run import EvalKind
from eval.rundir import detect_kind, load_run
from tests.eval.test_rundir import arena_run, bfcl_run

ROOT = Path(__file__).resolve().parents[2]
EVAL = ROOT / "eval"
PRODUCT = ("astra_agent", "serving", "eval", "training")


def test_an_unknown_kind_is_a_config_error_naming_the_known_ones() -> None:
    with pytest.raises(ConfigError) as exc:
        get_kind("mmlu")
    assert exc.value.message == (
        "unknown eval kind 'mmlu': this astra-eval knows bfcl, arenas, general, tau2"
    )
    assert exc.value.hint and "eval/kinds.py" in exc.value.hint
    assert get_kind("tau2") is KINDS["tau2"]


def test_a_run_directory_naming_an_unknown_kind_is_refused_clearly(tmp_path: Path) -> None:
    run = bfcl_run(tmp_path / "b")
    config = json.loads((run / CONFIG).read_text())
    write_json_atomic(run / CONFIG, {**config, "kind": "mmlu"})
    with pytest.raises(ConfigError, match="unknown eval kind 'mmlu'"):
        detect_kind(run)


def test_a_run_without_kind_writes_config_json_as_before() -> None:
    meta = RunMeta(fingerprint={"model": "m"}, base_url="http://x/v1")
    assert json.dumps(meta.written()) == (
        '{"format": 2, "fingerprint": {"model": "m"}, "base_url": "http://x/v1"}'
    )
    meta = RunMeta(kind="bfcl", fingerprint={"model": "m"})
    assert list(meta.written()) == ["format", "kind", "fingerprint", "base_url"]


@pytest.mark.parametrize("kind", ["bfcl", "arenas"])
def test_an_old_run_directory_without_kind_still_reads(kind: str, tmp_path: Path) -> None:
    run = (bfcl_run if kind == "bfcl" else arena_run)(tmp_path / kind)
    old = json.loads((run / CONFIG).read_text())
    del old["kind"]  # as written before runs recorded their kind
    write_json_atomic(run / CONFIG, old)
    assert detect_kind(run) == kind
    loaded = load_run(run)
    assert loaded.kind == kind and loaded.records and not loaded.partial
    (run / SUMMARY).unlink()  # half-written: by its fingerprint, figures from the records
    loaded = load_run(run)
    assert loaded.kind == kind and loaded.partial and loaded.summary
    count = get_kind(kind).counted_by
    assert loaded.summary[count] == len(loaded.records)


def test_a_run_is_read_by_the_kind_its_config_names(tmp_path: Path) -> None:
    # Nothing else in the directory says what it is: config.json's kind does.
    run = tmp_path / "r"
    run.mkdir()
    write_json_atomic(run / CONFIG, RunMeta(kind="tau2", fingerprint={}).written())
    assert detect_kind(run) == "tau2"
    write_json_atomic(run / CONFIG, RunMeta(fingerprint={}).written())
    with pytest.raises(ConfigError, match="not a run directory"):
        detect_kind(run)


@pytest.mark.integration
async def test_an_eval_run_records_its_kind(tmp_path: Path) -> None:
    heldout = DATA_DIR / "heldout.jsonl"
    tasks = load_arena_file(heldout).tasks
    out = tmp_path / "run"
    with ScriptedServer(replay_script(tasks)) as srv:
        cfg = ArenaEvalConfig.model_validate(
            {"data": heldout, "out": out, "limit": 2, "model": {"base_url": srv.base_url}}
        )
        await evaluate_arenas(cfg)
    config = json.loads((out / CONFIG).read_text())
    assert config["kind"] == "arenas" and list(config)[:2] == ["format", "kind"]
    assert len((out / RESULTS).read_text().splitlines()) == 2
    assert load_run(out).kind == "arenas"


def _kinds_in(module: Any) -> list[EvalKind]:
    return [v for v in vars(module).values() if isinstance(v, EvalKind)]


def test_every_eval_package_kind_is_registered_once_under_its_runner_name() -> None:
    packages = sorted(p.parent.name for p in EVAL.glob("*/kind.py"))
    assert packages == sorted(names())
    for name in packages:
        (kind,) = _kinds_in(importlib.import_module(f"eval.{name}.kind"))
        assert kind in registry() and kind.name == name
        assert name == importlib.import_module(f"eval.{name}.runner").NAME
    assert len(set(names())) == len(registry())


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The product modules ``path`` imports, anywhere in it (functions and TYPE_CHECKING too);
    ``from package import submodule`` counts as the submodule only."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in modules}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            subs = {f"{node.module}.{a.name}" for a in node.names}
            names = subs if subs <= modules else subs | {node.module}
            out |= names & modules
    return out


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _graph() -> dict[str, set[str]]:
    paths = {_module_name(p): p for pkg in PRODUCT for p in (ROOT / pkg).rglob("*.py")}
    return {m: _imports(p, set(paths)) - {m} for m, p in paths.items()}


def test_the_product_packages_have_no_import_circle() -> None:
    """astra_agent, serving, eval and training, module by module, counting the imports inside
    functions and under TYPE_CHECKING (an import a package's ``__init__`` implies is not
    counted: Python runs it first, whoever imports)."""
    graph = _graph()
    done: set[str] = set()

    def visit(m: str, path: list[str]) -> None:
        if m in path:
            raise AssertionError("import circle: " + " → ".join([*path[path.index(m) :], m]))
        if m in done:
            return
        for n in sorted(graph[m]):
            visit(n, [*path, m])
        done.add(m)

    for m in sorted(graph):
        visit(m, [])


def test_the_shared_eval_modules_import_no_eval_package() -> None:
    """What every eval shares (the runner, records, summaries, statistics, the run as read, the
    report's toolkit) knows no eval: each eval package, and the registry above them, import it,
    never the other way."""
    graph = _graph()
    evals = tuple(f"eval.{name}" for name in names())
    shared = [
        m
        for m in graph
        if m in ("eval.run", "eval.runner", "eval.results", "eval.summaries", "eval.stats")
        or m.startswith("eval.report")
    ]
    assert "eval.report.blocks" in shared and "eval.summaries" in shared
    for m in shared:
        bad = sorted(n for n in graph[m] if n == "eval.kinds" or n.startswith(evals))
        assert not bad, f"{m} imports {', '.join(bad)}"
