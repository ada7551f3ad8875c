"""The procedural arenas (``eval.arenas.procedural``): deterministic, valid in the sandbox,
no held-out domain, signature or start value in training, and bad specs refused; the
experiment's run directory refuses another config and names the stage a missing input needs."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from astra_agent.arena import ArenaEnvironment, load_arena_file, run_reference
from astra_agent.errors import ConfigError
from eval.arenas import validate_arenas
from eval.arenas.procedural.generator import (
    SPLITS,
    GenSpec,
    generate,
    load_domains,
    signature_heldout,
    split_domains,
    write_arenas,
)
from training.cli import app as train_app
from training.table2.config import ExperimentConfig
from training.table2.experiment import run_experiment

SMALL = GenSpec(seed=3, train_tasks=40, eval_tasks=8)


def _tools(records: list[dict]) -> set[str]:
    return {t["function"]["name"] for r in records for t in json.loads(r["tool_schema"])}


def test_generation_is_deterministic_and_the_seed_matters() -> None:
    assert generate(SMALL) == generate(SMALL)
    other = generate(SMALL.model_copy(update={"seed": 4}))
    assert other["train"] != generate(SMALL)["train"]


def test_no_held_out_domain_signature_or_start_reaches_training() -> None:
    splits = generate(GenSpec(seed=1, train_tasks=300, eval_tasks=40))
    train, held = split_domains(GenSpec(), load_domains())
    held_names = {d.name for d in held}
    assert {r["domain"] for r in splits["train"]} <= {d.name for d in train}
    assert {r["domain"] for r in splits["c"]} <= held_names
    assert not any(signature_heldout(r["signature"], 20) for r in splits["train"])
    assert all(signature_heldout(r["signature"], 20) for r in splits["b"])
    train_sigs = {r["signature"] for r in splits["train"]}
    assert not train_sigs & {r["signature"] for r in splits["b"]}
    # split a: the training signatures, from start entities no training task starts at
    starts = {next(iter(r["reference"][0]["arguments"].values())) for r in splits["train"]}
    assert not starts & {next(iter(r["reference"][0]["arguments"].values())) for r in splits["a"]}
    # split c: no tool name, entity or field word of it was offered in training
    words = {w for t in _tools(splits["train"]) for w in t.split("_")[1:]}
    for t in _tools(splits["c"]):
        assert not set(t.split("_")[1:]) & words, t
    for split in ("a", "b", "c"):
        assert len(splits[split]) == 40
    kinds = {r["kind"] for r in splits["train"]}
    assert kinds == {"attr", "hop", "hop2", "both", "pair"}


def test_every_generated_task_validates_and_its_reference_solves_it(tmp_path: Path) -> None:
    paths = write_arenas(tmp_path / "gen", SMALL)
    for split, path in paths.items():
        report, failures, warnings = asyncio.run(validate_arenas(path))
        assert report.records == len(report.tasks) and not report.problems, split
        assert not failures and not warnings, (split, failures[:3], warnings[:3])

    async def solve(path: Path) -> list[bool]:
        out = []
        for task in load_arena_file(path).tasks:
            async with ArenaEnvironment(task) as env:
                out.append((await run_reference(task, env))[0].fully_solved)
        return out

    assert all(asyncio.run(solve(paths["c"])))


@pytest.mark.parametrize(
    ("update", "message"),
    [
        ({"heldout_domains": ["atlantis"]}, "unknown held-out domain"),
        ({"heldout_domains": ["retail"]}, "shares the words"),
        ({"heldout_domains": [d.name for d in load_domains()]}, "at least one training"),
    ],
)
def test_a_split_that_would_leak_into_training_is_refused(update: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        generate(GenSpec(**update))


def test_a_directory_of_another_spec_is_refused_and_the_same_spec_kept(tmp_path: Path) -> None:
    paths = write_arenas(tmp_path, SMALL)
    before = {s: p.stat().st_mtime_ns for s, p in paths.items()}
    write_arenas(tmp_path, SMALL)
    assert {s: p.stat().st_mtime_ns for s, p in paths.items()} == before
    with pytest.raises(ConfigError, match=r"another spec .*seed"):
        write_arenas(tmp_path, SMALL.model_copy(update={"seed": 4}))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--heldout-domains", "astronomy,astronomy"], "more than once"),
        (["--eval-tasks", "0"], "eval_tasks: Input should be greater than or equal to 1"),
        (["--signature-holdout-pct", "0"], "signature_holdout_pct: Input should be greater"),
        (["--train-tasks", "20001"], "train_tasks: Input should be less than or equal to 20000"),
        (["--heldout-domains", "retail"], "shares the words"),
    ],
)
def test_generate_cli_refuses_bad_input_with_one_line(
    tmp_path: Path, args: list[str], message: str, wide_consoles: None
) -> None:
    res = CliRunner().invoke(train_app, ["table2", "generate", "--out", str(tmp_path / "g"), *args])
    assert res.exit_code == 2, res.output
    assert message in res.output and "Traceback" not in res.output
    assert not (tmp_path / "g").exists()


@pytest.mark.parametrize("command", ["generate", "run"])
def test_an_out_that_cannot_be_a_directory_is_one_line(
    command: str, tmp_path: Path, wide_consoles: None
) -> None:
    (tmp_path / "file").write_text("x")
    for out, says in ((tmp_path / "file", "is a file"), (tmp_path / "file" / "x", "cannot be")):
        extra = ["--stages", "arenas"] if command == "run" else []
        res = CliRunner().invoke(train_app, ["table2", command, "--out", str(out), *extra])
        assert res.exit_code == 2 and says in res.output, res.output
        assert "Traceback" not in res.output


def test_generate_cli_writes_the_splits(tmp_path: Path) -> None:
    args = [
        "table2",
        "generate",
        "--out",
        str(tmp_path),
        "--train-tasks",
        "12",
        "--eval-tasks",
        "3",
    ]
    res = CliRunner().invoke(train_app, args)
    assert res.exit_code == 0, res.output
    counts = json.loads((tmp_path / "arenas.json").read_text())["counts"]
    assert counts == {"train": 12, "a": 3, "b": 3, "c": 3}


def test_experiment_refuses_another_config_and_names_a_missing_stage(tmp_path: Path) -> None:
    cfg = ExperimentConfig(out=tmp_path / "x", arenas=SMALL)
    run_experiment(cfg, ["arenas"])
    assert (tmp_path / "x" / "arenas" / "train.jsonl").is_file()
    with pytest.raises(ConfigError, match=r"another config: .*seed"):
        run_experiment(cfg.model_copy(update={"arenas": GenSpec(seed=9)}), ["arenas"])
    with pytest.raises(ConfigError, match=r"another config: .*max_steps"):
        run_experiment(cfg.model_copy(update={"sft": {"max_steps": 3}}), ["arenas"])
    with pytest.raises(ConfigError, match="written by the 'replay' stage"):
        run_experiment(cfg, ["data"])
    with pytest.raises(ConfigError, match="written by the 'sft' stage"):
        run_experiment(cfg, ["rl"])
    with pytest.raises(ConfigError, match="unknown stage"):
        run_experiment(cfg, ["bogus"])


# sha256 of generate(spec)'s four splits, concatenated in split order as write_arenas writes
# them, measured before the general families existed: the chain-only output (the default spec,
# the CI slice's, the shipped CPU recipe's) must stay byte for byte what it was.
PINNED = (
    (GenSpec(), "2ce4c9d7c1063657b3f3db977aafc87ce3158078cff46ad9042cb8fdaa3b967a"),
    (
        GenSpec(seed=0, train_tasks=64, eval_tasks=30),
        "2b1466972aec417d04977eeddc7662ec214c3eb2bcd7f65fc6c1b4b755c981f5",
    ),
)


@pytest.mark.parametrize(("spec", "sha"), PINNED, ids=["default", "ci-slice"])
def test_the_chain_only_output_is_pinned(spec: GenSpec, sha: str) -> None:
    import hashlib

    splits = generate(spec)
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for s in SPLITS for r in splits[s])
    assert hashlib.sha256(text.encode()).hexdigest() == sha
    assert spec.model_dump() == {
        "seed": spec.seed,
        "train_tasks": spec.train_tasks,
        "eval_tasks": spec.eval_tasks,
        "heldout_domains": None,
        "signature_holdout_pct": 20,
    }  # no `families` key: arenas.json and experiment fingerprints as before


GENERAL_RECIPE = Path(__file__).resolve().parents[2] / "training/recipes/table2-general-cpu.yaml"


def test_the_general_recipe_generates_every_family(tmp_path: Path, wide_consoles: None) -> None:
    from eval.arenas.procedural.generator import FAMILIES

    args = ["-c", str(GENERAL_RECIPE), "--out", str(tmp_path), "--stages", "arenas"]
    res = CliRunner().invoke(train_app, ["table2", "run", *args])
    assert res.exit_code == 0, res.output
    manifest = json.loads((tmp_path / "arenas" / "arenas.json").read_text())
    assert manifest["spec"]["families"] == list(FAMILIES)
    assert manifest["counts"] == {"train": 400, "a": 60, "b": 60, "c": 60}
    train = load_arena_file(tmp_path / "arenas" / "train.jsonl")
    assert len(train.tasks) == 400 and not train.problems
    assert {t.raw["kind"] for t in train.tasks} == set(FAMILIES)


def test_the_replay_of_general_tasks_solves_every_one_through_the_loop(tmp_path: Path) -> None:
    """The experiment's replay stage on the general families: follow-up prompts (user,
    assistant, user) go through the episode loop as they are, no-call tasks are solved by
    answering without a call, a parallel task by its calls one after another."""
    from eval.arenas.procedural.families import GENERAL
    from training.replay import replay_arenas

    spec = GenSpec(seed=4, train_tasks=28, eval_tasks=2, families=list(GENERAL))
    data = write_arenas(tmp_path / "gen", spec)["train"]
    results, summary = asyncio.run(replay_arenas(data, tmp_path / "replay", reasoning=False))
    assert summary.tasks == 28 and summary.fully_solved == 1.0
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    tasks = {r["task_id"]: r for r in map(json.loads, data.read_text().splitlines())}
    for row in rows:
        task = tasks[row["task_id"]]
        assert row["tool_calls"] == len(task["reference"]) and row["fully_solved"]
        assert (row["tool_calls"] == 0) == (task["kind"] == "none")
        roles = [m["role"] for m in row["trajectory"]["messages"]]
        assert roles[: len(task["prompt"])] == [m["role"] for m in task["prompt"]]
    assert {tasks[r["task_id"]]["kind"] for r in rows} == set(GENERAL)
