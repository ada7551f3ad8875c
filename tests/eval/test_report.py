"""`astra-eval report` (eval/report): the page from every kind of run, escaping of arbitrary
model output, --overwrite and atomic writes, bad run directories; and in headless Chromium
(integration): a report of real `astra-eval bfcl` and `astra-eval arenas` runs against the
scripted server, with training logs written by the trainers' own writers — no console or page
errors, the summaries' numbers read back from the DOM, every chart drawn, a drill-down opened,
a screenshot taken (also to docs/report.png when ASTRA_UPDATE_SCREENSHOT=1)."""

from __future__ import annotations

import base64
import gzip
import json
import math
import os
import re
import shutil
import zlib
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from astra_agent.arena import load_arena_file
from astra_agent.config import load_config
from astra_agent.testing.scripted_server import Reply, Script, ScriptedServer
from astra_agent.trajectory import CallEvent, append_jsonl
from eval.arenas import DATA_DIR
from eval.arenas.replay import replay_script as arena_replay
from eval.bfcl import CATEGORIES, load_category
from eval.bfcl.replay import replay_script as bfcl_replay
from eval.cli import app
from eval.general.tasks import TASKS_DIR
from eval.page import build_report, render_report
from eval.results import RESULTS, SUMMARY, write_json_atomic
from eval.rundir import load_run
from tests.conftest import run_module
from tests.eval.test_rundir import (
    arena_record,
    bfcl_record,
    bfcl_run,
    rl_step,
    sft_step,
    training_run,
    write_eval,
)

ROOT = Path(__file__).parents[2]
ATTACK = '</script><img src=x onerror="window.__pwned=1"><!-- \u2028\u2029 ü 漢 <b>bold</b>'
CHROMIUM = shutil.which("chromium")
ARITH = {
    d["question"]: d["answer"]
    for d in map(json.loads, (TASKS_DIR / "astra_arith.jsonl").read_text().splitlines())
}


class Tags(HTMLParser):
    """The tags of a page as a browser's tokenizer sees them, and any event-handler
    attribute (``on…``) among them."""

    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()
        self.handlers: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.names.add(tag)
        self.handlers += [f"{tag} {k}" for k, _ in attrs if k.startswith("on")]


def entry_views(html: str) -> list[list[dict[str, Any]]]:
    """The page's drill-down views per entry list, decoded as the page's script decodes them
    (blocks ``astra-entries-LIST-CHUNK``, gzip + base64)."""
    blocks = re.findall(
        r'<script type="application/octet-stream" id="astra-entries-(\d+)-(\d+)">'
        r"(.*?)</script>",
        html,
        re.S,
    )
    out: dict[int, list[dict[str, Any]]] = {}
    for slot, _, data in sorted(blocks, key=lambda b: (int(b[0]), int(b[1]))):
        out.setdefault(int(slot), []).extend(json.loads(gzip.decompress(base64.b64decode(data))))
    return [out[k] for k in sorted(out)]


def figures(html: str) -> dict[str, Any]:
    block = re.search(
        r'<script type="application/json" id="astra-figures">(.*?)</script>', html, re.S
    )
    assert block is not None
    return dict(json.loads(block.group(1)))


def attacked_runs(root: Path) -> list[Path]:
    """A BFCL and an arena run whose model output, error types and domains carry HTML and
    script terminators."""
    rec = bfcl_record(0, valid=False)
    assert rec.trajectory is not None
    rec.trajectory.messages += [
        {
            "role": "assistant",
            "content": ATTACK,
            "reasoning_content": ATTACK,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "ls", "arguments": json.dumps({"a": ATTACK})},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": ATTACK},
    ]
    rec.trajectory.events.append(
        CallEvent(step=1, call_id="c1", name="ls", arguments="{}", status="ok", duration_s=0.1)
    )
    rec = rec.model_copy(update={"error_type": ATTACK, "details": {"x": ATTACK}})
    bfcl = write_eval(root / "bfcl", [rec, bfcl_record(1)], {"categories": ["base"]}, True)
    arena = arena_record(0).model_copy(update={"domain": ATTACK, "errors": {ATTACK: 1}})
    arenas = write_eval(root / "arenas", [arena, arena_record(1, 0.5)], {"data_sha256": ""}, True)
    return [bfcl, arenas]


# ------------------------------------------------------------------ the page, without a browser


def test_every_kind_renders_side_by_side(tmp_path: Path) -> None:
    general = tmp_path / "general"
    general.mkdir()
    write_json_atomic(
        general / SUMMARY,
        {
            "kind": "general",
            "model": "m",
            "samples": 2,
            "tasks": {"aime24": {"exact_match": 0.5}, "astra_arith": {"exact_match": 1.0}},
            "published": {
                "AIME": {
                    "figures": [73.4, 73.45],
                    "models": ["A", "Q"],
                    "assignment_confirmed": False,
                }
            },
        },
    )
    for i, task in enumerate(["aime24", "astra_arith"]):
        sample = {
            "id": f"{task}/{i}",
            "task": task,
            "index": i,
            "prompt": "1+1?",
            "response": "2",
            "answer": "2",
            "extracted": "2",
            "target": "2",
            "exact_match": 1.0,
        }
        append_jsonl(general / RESULTS, sample, fsync=False)
    dirs = [
        bfcl_run(tmp_path / "b1"),
        bfcl_run(tmp_path / "b2", n=6),
        general,
        training_run(tmp_path / "sft", "sft"),
        training_run(tmp_path / "rl", "rl"),
    ]
    html = render_report([load_run(d) for d in dirs], title="T")
    for kind in ("bfcl", "general", "sft", "rl"):
        assert f'data-kind="{kind}"' in html
    assert 'data-metric="accuracy.base" data-run="b1"' in html
    assert 'data-metric="tasks.aime24.exact_match" data-run="general">0.5000<' in html
    assert "73.40 / 73.45 (A / Q)" in html  # the paper's figures beside the task
    assert "Comparison: b1 (A) → b2 (B)" in html  # two runs of one eval: compared
    assert "(partial)" in html  # one category of four: the overall is partial
    figs = figures(html)["figures"]
    assert figs and all(f["data"] for f in figs.values())
    assert len(entry_views(html)) == 3  # b1, b2 and the general samples


def test_model_output_cannot_inject_html_or_end_a_script(tmp_path: Path) -> None:
    html = render_report([load_run(d) for d in attacked_runs(tmp_path)], title=ATTACK)
    tags = Tags()
    tags.feed(html)
    assert "img" not in tags.names and not tags.handlers  # parsed as HTML: no tag, no handler
    # Our own script blocks end where they should: one </script> per <script.
    assert html.count("</script>") == html.count("<script")
    blocks = {
        n: html.split(f'id="{n}">')[1].split("</script>")[0]
        for n in ("astra-figures", "astra-index-0", "astra-index-1")
    }
    for block in blocks.values():  # JSON for a script: nothing that ends it or reads as HTML
        assert "\u2028" not in block and "<" not in block
    assert json.loads(blocks["astra-index-0"])[0][2] == f"{ATTACK} (turn 0)"  # a line's label
    # The drill-down data round-trips the text exactly (the page shows it as text nodes).
    views = entry_views(html)
    msgs = [m for v in views[0] for t in v["turns"] for m in t]
    assert any(m.get("content") == ATTACK and m.get("reasoning") == ATTACK for m in msgs)
    assert any(m.get("role") == "tool" and m.get("content") == ATTACK for m in msgs)
    assert views[0][0]["checker"]["details"] == {"x": ATTACK}
    # Chart labels are escaped for plotly's own pseudo-HTML.
    names = json.dumps(figures(html))
    assert "<b>" not in names and "&lt;b&gt;" in names


def test_nan_metrics_and_long_outputs_stay_valid(tmp_path: Path) -> None:
    run = training_run(tmp_path / "sft", "sft")
    append_jsonl(
        run / "metrics.jsonl", {"step": 4, "loss": math.nan, "grad_norm": math.inf}, fsync=False
    )
    rec = bfcl_record(0)
    assert rec.trajectory is not None
    rec.trajectory.messages.append({"role": "tool", "content": "x" * 100_000})
    bfcl = write_eval(tmp_path / "b", [rec], {"categories": ["base"]}, True)
    html = render_report([load_run(run), load_run(bfcl)])
    assert "NaN" not in html.split('id="astra-figures">')[1].split("</script>")[0]
    tool = entry_views(html)[0][0]["turns"][0][-1]["content"]
    assert len(tool) < 25_000 and "characters not shown" in tool


def test_out_is_refused_if_it_exists_unless_overwrite(tmp_path: Path) -> None:
    runs = [load_run(bfcl_run(tmp_path / "b"))]
    out = tmp_path / "r" / "report.html"
    assert build_report(runs, out) == out and out.stat().st_size > 1_000_000  # plotly inside
    out.write_text("mine")
    cli = CliRunner()
    refused = cli.invoke(app, ["report", str(tmp_path / "b"), "--out", str(out)])
    assert refused.exit_code == 2 and "already exists" in refused.output
    assert "--overwrite" in refused.output and out.read_text() == "mine"
    done = cli.invoke(app, ["report", str(tmp_path / "b"), "--out", str(out), "--overwrite"])
    assert done.exit_code == 0, done.output
    assert "loaded b (bfcl): 4 records" in done.output and out.read_text().startswith("<!DOCTYPE")
    assert sorted(p.name for p in out.parent.iterdir()) == ["report.html"]  # no temp left
    assert cli.invoke(app, ["report", str(tmp_path / "b"), "--out", str(tmp_path)]).exit_code == 2


def test_bad_run_directories_are_named_and_nothing_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "notes.txt").write_text("hello")
    cli = CliRunner()
    out = tmp_path / "report.html"
    mixed = cli.invoke(
        app,
        [
            "report",
            str(bfcl_run(tmp_path / "b")),
            str(tmp_path / "foreign"),
            str(tmp_path / "missing"),
            "--out",
            str(out),
        ],
    )
    assert mixed.exit_code == 0, mixed.output
    assert f"{tmp_path / 'foreign'} is not a run directory" in mixed.output.replace("\n", "")
    assert "run directory not found" in mixed.output and out.is_file()
    none = cli.invoke(app, ["report", str(tmp_path / "foreign"), "--out", str(tmp_path / "x")])
    assert none.exit_code == 2 and "nothing to report" in none.output
    assert not (tmp_path / "x").exists()


def test_general_samples_without_a_usable_reply_are_noted(tmp_path: Path) -> None:
    general = tmp_path / "general"
    general.mkdir()
    base = {
        "task": "t",
        "prompt": "1+1?",
        "response": "",
        "answer": "",
        "extracted": "",
        "target": "2",
    }
    append_jsonl(
        general / RESULTS, {**base, "id": "t/0", "index": 0, "exact_match": 1.0}, fsync=False
    )
    error = {
        "error": "the reply is not a chat completion (no choices: {})",
        "error_kind": "inference",
        "endpoint_failure": "other",
    }
    append_jsonl(general / RESULTS, {**base, "id": "t/1", "index": 1, **error}, fsync=False)
    write_json_atomic(
        general / SUMMARY,
        {
            "kind": "general",
            "tasks": {"t": {"exact_match": 1.0}},
            "samples": 2,
            "scored": 1,
            "errors": 1,
            "notes": ["t: <b>a note</b>"],
        },
    )
    html = render_report([load_run(general)])
    assert "general: 1 of 2 samples got no usable reply (inference errors)" in html
    assert "general: t: &lt;b&gt;a note&lt;/b&gt;" in html
    (views,) = entry_views(html)
    assert [v["status"] for v in views] == ["pass", "error"]
    assert "not a chat completion" in views[1]["error"]


def test_half_written_runs_are_reported_as_partial(tmp_path: Path) -> None:
    run = bfcl_run(tmp_path / "b", summary=False)
    with (run / RESULTS).open("a") as f:
        f.write('{"id": "multi_turn_base_9", "categ')
    html = render_report([load_run(run)])
    assert '<span class="badge partial">partial</span>' in html
    assert "no summary.json (the run did not finish)" in html and "last line is cut off" in html


# ------------------------------------------------------------------ in Chromium, from real runs


def planted_bfcl(req: dict[str, Any], base: Script) -> Reply:
    """The BFCL replay, with failures planted: the conversation that starts "I am alex"
    answers its first turn with text (HTML and a script terminator) instead of calls; the one
    that moves final_report.pdf, while a function is held out (miss_func: 31 of its 32 tools
    offered), loses the last call of each step."""
    users = [m["content"] for m in req["messages"] if m["role"] == "user"]
    reply = base(req)
    if users and users[0].startswith("I am alex") and len(users) == 1 and reply.tool_calls:
        return Reply(content=ATTACK, reasoning="I will answer without tools.")
    held_out = len(req.get("tools") or []) == 31
    if users and "final_report.pdf" in users[0] and held_out and len(reply.tool_calls) > 1:
        return Reply(tool_calls=reply.tool_calls[:-1], reasoning="Skipping one call.")
    return reply


def planted_arenas(tasks: list[Any]) -> Script:
    """The arena replay, stopping early on a third of the tasks (partial rewards)."""
    base = arena_replay(tasks)

    def script(req: dict[str, Any]) -> Reply:
        prompt = next(m["content"] for m in req["messages"] if m["role"] == "user")
        done = sum(1 for m in req["messages"] if m["role"] == "tool")
        if zlib.crc32(prompt.encode()) % 3 == 0 and done >= 1:
            return Reply(content="Done early.")
        return base(req)

    return script


def planted_general(req: dict[str, Any]) -> Reply:
    """astra_arith answered right two times in three (the reasoning split off by the server),
    wrong otherwise, with HTML in the reasoning."""
    question = req["messages"][-1]["content"].split("\n")[0]
    answer = ARITH[question]
    if zlib.crc32(question.encode()) % 3 == 0:
        return Reply(content=f"Answer: {int(answer) + 1}", reasoning=ATTACK)
    return Reply(content=f"Answer: {answer}", reasoning=f"It is {answer}.")


def eval_cli(*args: str, cwd: Path = ROOT) -> None:
    out = run_module("eval", *args, timeout=300, env={"COLUMNS": "200"}, cwd=cwd)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]


def sft_log(out: Path) -> Path:
    """An SFT run directory as `astra-train sft` (TRL) leaves it, by its own writers: the
    fingerprint (prepare_run_dir), one metrics record per logging step (MetricsLog, the fields
    of the TRL metrics callback), final/."""
    from training.metrics import MetricsLog, SFTStep
    from training.run import prepare_run_dir
    from training.sft.config import SFTConfig

    recipe = ROOT / "training" / "recipes" / "sft-tiny-cpu.yaml"
    cfg = load_config(SFTConfig, recipe, {"output_dir": out, "max_steps": 40})
    prepare_run_dir(cfg)
    log = MetricsLog[SFTStep](out / "metrics.jsonl")
    for step in range(1, 41):
        log.append(
            sft_step(
                step,
                loss=7.6 * math.exp(-step / 12) + 0.05,
                learning_rate=3e-3 * min(1.0, step / 2) * (1 - step / 41),
                grad_norm=3.0 / math.sqrt(step),
                tokens=2000 + 37 * step,
                padding_tokens=0,
                trained_tokens=300,
                tokens_per_s=2400.0 + step,
                trained_tokens_per_s=380.0,
                epoch=step / 24,
                elapsed_s=0.8 * step,
            )
        )
    (out / "final").mkdir()
    return out


def rl_log(out: Path) -> Path:
    """An RL run directory as `astra-train rl` (TRL) leaves it mid-run: fingerprint, the
    step records of its metrics callback (rollout statistics, ABF, held-out evaluations every
    2 steps), no final/ yet."""
    from training.metrics import MetricsLog, RLStep
    from training.rl.config import RLConfig
    from training.rl.run import RUN_FILE
    from training.run import prepare_run_dir

    recipe = ROOT / "training" / "recipes" / "rl-tiny-cpu.yaml"
    cfg = load_config(RLConfig, recipe, {"output_dir": out, "steps": 12})
    prepare_run_dir(cfg, RUN_FILE, "astra-train rl")
    log = MetricsLog[RLStep](out / "metrics.jsonl")
    for step in range(1, 9):
        held = {"eval_reward": 0.4 + 0.05 * step, "eval_solved": 0.25, "eval_tasks": 12}
        log.append(
            rl_step(
                step,
                heldout=held if step % 2 == 1 else None,
                reward_mean=0.5 + 0.03 * step,
                solved=0.4 + 0.02 * step,
                episode_errors=0,
                sampled_tokens=6400,
                rerender_mismatches=step % 3,
                rerender_checked=32,
                abf={
                    "step": step,
                    "sampled": 5,
                    "valid": 4,
                    "dropped_flat": 1,
                    "from_buffer": step % 2,
                    "dropped_stale": 0,
                    "buffered": 1,
                    "rounds": 1,
                },
                rollout_s=12.0,
                update={
                    "loss": 0.1 + 0.01 * step,
                    "grad_norm": 0.5,
                    "learning_rate": 2e-4,
                    "clip_fraction": 0.01,
                    "logp_gap": 1.3e-6,
                    "update_s": 7.0,
                },
            )
        )
    return out


@pytest.fixture(scope="module")
def real_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("runs")
    entries = [e for c in CATEGORIES for e in list(load_category(c))[:2]]
    base = bfcl_replay(entries)
    with ScriptedServer(lambda req: planted_bfcl(req, base)) as srv:
        eval_cli(
            "bfcl",
            "--limit",
            "2",
            "--concurrency",
            "4",
            "--base-url",
            srv.base_url,
            "--out",
            str(root / "bfcl"),
        )
    tasks = load_arena_file(DATA_DIR / "heldout.jsonl").tasks
    with ScriptedServer(planted_arenas(tasks)) as srv:
        eval_cli(
            "arenas",
            "--data",
            str(DATA_DIR / "heldout.jsonl"),
            "--concurrency",
            "4",
            "--base-url",
            srv.base_url,
            "--out",
            str(root / "arenas"),
        )
    runs = {"bfcl": root / "bfcl", "arenas": root / "arenas"}
    # `astra-eval general` runs lm-eval (the [train] extra, installed by make setup)
    with ScriptedServer(planted_general) as srv:
        eval_cli("general", "--base-url", srv.base_url, "--out", str(root / "general"))
    runs["general"] = root / "general"
    runs |= {"sft": sft_log(root / "sft"), "rl": rl_log(root / "rl")}
    # from the runs' parent, as a user would: the page (and the screenshot) shows those paths
    names = (str(p.relative_to(root)) for p in runs.values())
    eval_cli("report", *names, "--out", "report.html", cwd=root)
    return runs | {"report": root / "report.html"}


@pytest.fixture(scope="module")
def browser_page(real_runs: dict[str, Path]) -> Iterator[tuple[Any, list[str]]]:
    """The report open in headless Chromium, and what went wrong there (console errors and
    warnings, page errors, dialogs)."""
    assert CHROMIUM is not None, "no chromium on PATH: scripts/setup-system.sh installs Debian's"
    from playwright.sync_api import sync_playwright

    problems: list[str] = []

    def console(msg: Any) -> None:
        if msg.type in ("error", "warning"):
            problems.append(f"console {msg.type}: {msg.text}")

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.on("console", console)
        page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
        page.on("dialog", lambda d: problems.append(f"dialog: {d.message}"))
        page.goto(real_runs["report"].as_uri())
        page.wait_for_function("document.body.dataset.ready === '1'", timeout=30_000)
        yield page, problems
        browser.close()


@pytest.mark.integration
def test_report_of_real_runs_in_chromium(
    real_runs: dict[str, Path], browser_page: tuple[Any, list[str]], tmp_path: Path
) -> None:
    page, problems = browser_page
    bfcl = json.loads((real_runs["bfcl"] / SUMMARY).read_text())
    arenas = json.loads((real_runs["arenas"] / SUMMARY).read_text())
    assert not bfcl["overall_partial"] and bfcl["errors"]  # four categories, planted failures
    assert 0 < arenas["mean_reward"] < 1

    def cell(metric: str, run: str) -> str:
        return str(page.inner_text(f'td[data-metric="{metric}"][data-run="{run}"]'))

    assert cell("overall", "bfcl") == f"{bfcl['overall']:.2f}"
    for c, acc in bfcl["accuracy"].items():
        assert cell(f"accuracy.{c}", "bfcl") == f"{acc:.2f}"
    assert cell("mean_reward", "arenas") == f"{arenas['mean_reward']:.4f}"
    assert cell("fully_solved", "arenas") == f"{100 * arenas['fully_solved']:.1f} %"
    last = json.loads((real_runs["sft"] / "metrics.jsonl").read_text().splitlines()[-1])
    assert cell("loss.last", "sft") == f"{last['loss']:.4f}"
    assert "8 of 12 (not finished)" in cell("steps", "rl")
    general = json.loads((real_runs["general"] / SUMMARY).read_text())
    exact = general["tasks"]["astra_arith"]["exact_match"]
    assert 0 < exact < 1 and cell("tasks.astra_arith.exact_match", "general") == f"{exact:.4f}"

    # Every chart drawn by plotly, with its traces in the SVG.
    page.evaluate("window.astraReport.drawAll()")
    page.wait_for_function("document.body.dataset.charts === 'rendered'", timeout=30_000)
    traces = page.eval_on_selector_all(
        "div.chart", "els => els.map(e => e.querySelectorAll('svg.main-svg g.trace').length)"
    )
    assert len(traces) >= 15 and all(n > 0 for n in traces), traces

    # A failed BFCL entry opens on its turns, tool calls and the checker's verdict.
    page.evaluate("window.astraReport.buildAll()")
    entries = '.entries[data-run="bfcl"] details.entry'
    failed = page.locator(f'{entries}[data-status="fail"]:not([data-key^="multi_turn_base_1 "])')
    failed = failed.first
    failed.locator(":scope > summary").click()
    failed.locator(".call").first.wait_for(timeout=10_000)
    assert failed.locator(".call-name").count() > 0
    assert "Checker: multi_turn:" in failed.locator(".checker").inner_text()

    # The planted HTML is shown as text, and nothing of it ran.
    planted = page.locator(f'{entries}[data-key^="multi_turn_base_1 "]')
    planted.locator(":scope > summary").click()
    planted.locator(".msg.assistant").first.wait_for(timeout=10_000)
    assert "</script><img src=x" in planted.inner_text()
    assert page.evaluate("document.querySelectorAll('img').length") == 0
    assert page.evaluate("window.__pwned") is None

    # The filter narrows the list.
    bar = page.locator('.entries[data-run="arenas"]')
    bar.locator("select.status").select_option("part")
    shown = bar.locator(".shown").inner_text()
    assert shown == f"{sum(1 for _ in _records(real_runs['arenas'], 'part'))} shown"

    assert problems == []
    page.evaluate("window.scrollTo(0, 0)")
    shot = tmp_path / "report.png"
    page.screenshot(path=str(shot))
    assert shot.stat().st_size > 10_000
    if os.environ.get("ASTRA_UPDATE_SCREENSHOT") == "1":
        (ROOT / "docs").mkdir(exist_ok=True)
        shutil.copy(shot, ROOT / "docs" / "report.png")


def _records(run: Path, status: str) -> Iterator[dict[str, Any]]:
    from eval.arenas.report import arena_status

    for line in (run / RESULTS).read_text().splitlines():
        rec = json.loads(line)
        if arena_status(rec) == status:
            yield rec
