"""A new eval is one package and one registration: this module is that package. It defines
an eval kind of its own ("quiz": records, summary, report section and entry view, pairing, CLI
table), registers it (`eval.kinds.register`), runs it twice through the one runner against
scripted models over real HTTP, and gets the summary, the report, the comparison and the CLI
table from the generic code, touching no shared module."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.table import Table
from typer.testing import CliRunner

from astra_agent.console import console
from astra_agent.model import ChatModel
from astra_agent.testing.scripted_server import Reply, ScriptedServer
from eval.cli import app, run_eval_command
from eval.kinds import comparable, get_kind, register, registry, unregister
from eval.page import render_report
from eval.report.blocks import Cell, Entry, Page, Section, num
from eval.report.blocks import Table as Grid
from eval.report.entries import entry_list
from eval.results import SUMMARY, EvalRecord
from eval.run import EvalKind, Guess, Run
from eval.rundir import load_run
from eval.runner import EvalSpec, RunConfig, run_eval
from eval.stats import Pairing, Row, Tested, presence, verdict_change, verdict_tests
from eval.summaries import EvalSummary

pytestmark = pytest.mark.integration

QUESTIONS = {"q1": ("2+2", "4"), "q2": ("3+3", "6"), "q3": ("capital of France", "Paris")}


# ------------------------------------------------------------------ the package


class QuizRecord(EvalRecord):
    question: str
    answer: str
    correct: bool


class QuizSummary(EvalSummary):
    entries: int | None = None
    accuracy: float | None = None


def summarize(records: list[QuizRecord]) -> QuizSummary:
    graded = [r for r in records if r.error_kind is None]
    right = sum(r.correct for r in graded)
    return QuizSummary(entries=len(records), accuracy=right / len(graded) if graded else None)


def view(r: dict[str, Any]) -> tuple[Entry, dict[str, Any]]:
    status = "pass" if r.get("correct") else "fail"
    facts = [["question", str(r.get("question"))], ["answer", str(r.get("answer"))]]
    return Entry(str(r["id"]), status, f"answered {r.get('answer')!r}"), {
        "id": r["id"], "status": status, "facts": facts, "error": "", "turns": [],
    }  # fmt: skip


def section(runs: list[Run], page: Page) -> Section:
    rows = [
        [Cell(r.name), Cell(num((r.summary or {}).get("accuracy"), 3), "accuracy", r.name, "num")]
        for r in runs
    ]
    blocks = [Grid(["run", "accuracy"], rows, "Quiz accuracy")]
    entries = [entry_list(page, r, view) for r in runs]
    return Section("quiz", "Quiz (a test-defined eval)", "quiz", list(blocks), list(entries))


def row(id_: str, ra: Any, rb: Any) -> Row:
    change = presence(ra, rb) or verdict_change(ra.correct, rb.correct)
    a = None if ra is None else ra.correct
    b = None if rb is None else rb.correct
    return Row(id_, change, "quiz", a, b)


def paired_tests(rows: list[Row]) -> Tested:
    return verdict_tests(rows), []


def show(summary: QuizSummary) -> None:
    table = Table(title=f"Quiz: {summary.entries} questions, {summary.model}")
    table.add_column("accuracy")
    table.add_row(f"{summary.accuracy:.3f}")
    console.print(table)


QUIZ = EvalKind(
    name="quiz",
    title="Quiz",
    counted_by="entries",
    record=QuizRecord,
    summary=QuizSummary,
    summarize=lambda typed, raw, fp: summarize(typed).written(),
    section=section,
    show=show,
    guess=Guess(),
    pairing=Pairing(what="quiz", noun="a quiz", row=row, tests=paired_tests),
    score=lambda r: None if r.get("error_kind") else float(bool(r.get("correct"))),
)


async def one(qid: str, model: ChatModel) -> QuizRecord:
    question, gold = QUESTIONS[qid]
    answer = (await model.complete([{"role": "user", "content": question}])).content
    return QuizRecord(id=qid, question=question, answer=answer, correct=answer.strip() == gold)


def spec() -> EvalSpec[str, QuizRecord, QuizSummary]:
    return EvalSpec(
        items=list(QUESTIONS), key=lambda q: q, record=QuizRecord, fingerprint={"quiz": 1},
        summarize=summarize, one=one, kind="quiz",
    )  # fmt: skip


# ------------------------------------------------------------------ the tests


@pytest.fixture
def quiz() -> Iterator[EvalKind]:
    register(QUIZ)
    yield QUIZ
    unregister(QUIZ)


def answering(answers: dict[str, str], name: str) -> ScriptedServer:
    def reply(req: dict[str, Any]) -> Reply:
        question = req["messages"][-1]["content"]
        return Reply(content=next(a for q, a in answers.items() if q == question))

    return ScriptedServer(reply, model=name)


@pytest.fixture
def two_runs(quiz: EvalKind, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> list[Path]:
    """Run A: one right answer of three; run B: all three. Each through the CLI's generic
    path (the progress bar, the kind's table)."""
    weak = {"2+2": "4", "3+3": "5", "capital of France": "Lyon"}
    strong = {"2+2": "4", "3+3": "6", "capital of France": "Paris"}
    out = []
    for name, answers in (("weak", weak), ("strong", strong)):
        with answering(answers, f"{name}-model") as srv:
            overrides = {"out": tmp_path / name, "model": {"base_url": srv.base_url}}

            async def evaluate(cfg: RunConfig, hook: Any) -> QuizSummary:
                return (await run_eval(cfg, spec(), hook))[0]

            run_eval_command(quiz, RunConfig, overrides, evaluate)
        out.append(tmp_path / name)
    shown = " ".join(capsys.readouterr().out.split())  # the kind's tables, one per run
    assert shown.count("Quiz: 3 questions,") == 2 and "weak-model" in shown
    assert shown.index("0.333") < shown.index("strong-model") < shown.index("1.000")
    return out


def test_a_registered_kind_is_seen_by_every_reader_and_leaves_with_unregister() -> None:
    register(QUIZ)
    try:
        assert get_kind("quiz") is QUIZ and registry()[-1] is QUIZ and QUIZ in comparable()
        with pytest.raises(ValueError, match="registered already"):
            register(QUIZ)
    finally:
        unregister(QUIZ)
    assert QUIZ not in registry()
    with pytest.raises(ValueError, match="registered already"):  # a training kind's name
        register(EvalKind(**{**QUIZ.__dict__, "name": "sft"}))


def test_its_runs_are_read_and_summarised_by_the_generic_reader(two_runs: list[Path]) -> None:
    weak, strong = two_runs
    run = load_run(weak)
    assert run.eval_kind is QUIZ and run.kind == "quiz" and not run.partial
    assert run.summary is not None and run.summary["accuracy"] == pytest.approx(1 / 3)
    (strong / SUMMARY).unlink()  # no summary.json: computed from the records by the kind
    computed = load_run(strong)
    assert computed.partial and computed.summary is not None
    assert computed.summary["accuracy"] == 1.0 and computed.summary["model"] == "strong-model"


def test_its_runs_are_compared_and_reported_by_the_generic_code(
    two_runs: list[Path], tmp_path: Path
) -> None:
    weak, strong = two_runs
    cli = CliRunner()
    got = cli.invoke(app, ["compare", str(weak), str(strong), "--json", str(tmp_path / "c.json")])
    assert got.exit_code == 0, got.output
    data = json.loads((tmp_path / "c.json").read_text())
    assert data["kind"] == "quiz" and data["counts"]["fixed"] == 2
    assert data["counts"]["both_pass"] == 1
    html = render_report([load_run(weak, "weak"), load_run(strong, "strong")])
    assert "Quiz (a test-defined eval)" in html and "Quiz accuracy" in html
    assert "Comparison: weak (A) → strong (B)" in html  # the generic comparison blocks
    got = cli.invoke(app, ["report", str(weak), str(strong), "--out", str(tmp_path / "r.html")])
    assert got.exit_code == 0, got.output
    assert "loaded weak (quiz): 3 records" in got.output


def test_an_unregistered_kinds_run_is_refused_by_name(two_runs: list[Path]) -> None:
    unregister(QUIZ)
    cli = CliRunner()
    got = cli.invoke(app, ["compare", str(two_runs[0]), str(two_runs[1])])
    assert got.exit_code == 2 and "unknown eval kind 'quiz'" in got.output
