"""Benchmark: `astra-eval report` on a full-size BFCL run and 1,000 arena tasks (issue 11).

Synthesised with the real record classes (``BFCLRecord``, ``ArenaRecord``, ``Trajectory``)
and written as their evals write them (``results.jsonl``, ``summary.json`` from the evals'
own ``summarize``, ``config.json``):

* BFCL: all 800 entries of the four categories, each on its real questions, its real tool
  schemas (with held-out functions offered at their turn) and its ground-truth calls as the
  model's steps, a reasoning of 200–2,000 characters per step, tool results sized as in a
  full replay run through the official backends (median ≈60 characters; long_context: one in
  five of 2,000–20,000), and the failures a model makes — about a third of the entries, with
  the checker's error types and a state diff or the missing results;
* arenas: 1,000 tasks cycled over our 36 arena tasks (their prompts, tool schemas and
  reference chains), rewards spread over 0–1, tool errors and terminations of every kind.

Measured: load + build in-process (``load_run`` ×2, ``build_report``), the CLI as a user runs
it (a fresh process, imports included), the file's size, and the page in headless Chromium
(the system ``chromium``): until the first screen's charts are drawn (entry lists are built as
they come near the screen), and until every chart is drawn and every entry list built.
Baseline, same browser, same run: a page holding only plotly.js (inline, as plotly's own
``to_html`` embeds it) and one chart: the part of the cost that is plotly's. Targets: build
< 5 s, file < 10 MB, open < 2 s.

    .venv/bin/python bench/report.py            # ≈1 min on 2 cores
    .venv/bin/python bench/report.py --keep DIR # keep the runs and the report in DIR
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from astra_agent.arena import load_arena_file
from astra_agent.trajectory import CallEvent, Timings, Trajectory, Usage, append_jsonl
from eval.arenas import DATA_DIR
from eval.arenas.runner import ArenaRecord
from eval.arenas.runner import summarize as summarize_arenas
from eval.bfcl.official import CATEGORIES, Entry, held_out_tools, load_category, openai_tools
from eval.bfcl.replay import json_calls
from eval.bfcl.runner import HELD_OUT_MESSAGE, PUBLISHED, BFCLRecord
from eval.bfcl.runner import summarize as summarize_bfcl
from eval.results import CONFIG, RESULTS, SUMMARY, RunMeta, write_json_atomic

ROOT = Path(__file__).resolve().parents[1]
TARGETS = {"build_s": 5.0, "size_mb": 10.0, "open_s": 2.0}
BFCL_ERRORS = (
    ("multi_turn:instance_state_mismatch", 0.55),
    ("multi_turn:execution_response_mismatch", 0.2),
    ("multi_turn:empty_turn_model_response", 0.15),
    ("multi_turn:force_terminated", 0.07),
    ("multi_turn:inference_error", 0.03),
)


_SENTENCES: list[str] = []


def prose(rng: random.Random, chars: int) -> str:
    """English of about ``chars`` characters: sentences of the BFCL questions, in random
    order (it compresses as English does, not as a repeated phrase would)."""
    if not _SENTENCES:
        for c in CATEGORIES:
            for e in load_category(c):
                for turn in e.question:
                    for m in turn:
                        _SENTENCES.extend(x.strip() + "." for x in m["content"].split(". "))
    out: list[str] = []
    size = 0
    while size < chars:
        out.append(rng.choice(_SENTENCES))
        size += len(out[-1]) + 1
    return " ".join(out)[:chars]


def tool_result(rng: random.Random, long: bool) -> str:
    """Sizes as the official backends' results of a full replay run: median ≈60 characters,
    one in ten above 140; long_context: one in five of 2,000–31,000 (measured mean 2.3k)."""
    if long and rng.random() < 0.2:
        size = rng.randint(2_000, 20_000)
    else:
        size = rng.randint(20, 150) if rng.random() < 0.9 else rng.randint(150, 1_500)
    return json_rows(rng, size)


def json_rows(rng: random.Random, size: int) -> str:
    rows: list[str] = []
    while sum(map(len, rows)) < size:
        rows.append(
            json.dumps(
                {
                    "name": prose(rng, 12),
                    "size": rng.randint(1, 99_999),
                    "id": rng.randint(1, 10**6),
                }
            )
        )
    return '{"result": [' + ", ".join(rows) + "]}"


def step_message(rng: random.Random, calls: list[tuple[str, str]], n: int) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": "",
        "reasoning_content": prose(rng, rng.randint(200, 2_000)),
        "tool_calls": [
            {
                "id": f"call_{n}_{i}",
                "type": "function",
                "function": {"name": name, "arguments": args},
            }
            for i, (name, args) in enumerate(calls)
        ],
    }


# ------------------------------------------------------------------ BFCL


def bfcl_entry(entry: Entry, rng: random.Random) -> BFCLRecord:
    """One entry answered with its ground truth (or, a third of the time, failed)."""
    from eval.bfcl.backend import method_table, new_instances

    table = method_table(new_instances(entry))
    traj = Trajectory(model="astra-14b")
    traj.offer_tools(openai_tools(entry))
    error = None
    if rng.random() < 0.33:
        error = rng.choices([e for e, _ in BFCL_ERRORS], [w for _, w in BFCL_ERRORS])[0]
    failed_turn = rng.randrange(len(entry.question)) if error else None
    decoded = []
    for t, question in enumerate(entry.question):
        if str(t) in entry.missed_function:
            traj.offer_tools(openai_tools(entry) + held_out_tools(entry, t))
        traj.messages += question or [{"role": "user", "content": HELD_OUT_MESSAGE}]
        empty = t == failed_turn and error == "multi_turn:empty_turn_model_response"
        calls = [] if empty else json_calls(entry.ground_truth[t], table)
        if calls:
            add_step(traj, rng, calls, entry.long_context)
        traj.messages.append(
            {
                "role": "assistant",
                "content": prose(rng, rng.randint(20, 400)),
                "reasoning_content": prose(rng, rng.randint(100, 800)),
            }
        )
        traj.steps += 1
        decoded.append([entry.ground_truth[t]] if calls else [])
    traj.usage = Usage(prompt_tokens=rng.randint(8_000, 60_000), completion_tokens=traj.steps * 400)
    traj.timings = Timings(total_s=traj.steps * 2.1, model_s=traj.steps * 2.0, tools_s=0.1)
    inference = error == "multi_turn:inference_error"
    return BFCLRecord(
        id=entry.id,
        category=entry.category,
        valid=error is None,
        error_type=error,
        failed_turn=failed_turn,
        details=checker_details(entry, error, rng),
        decoded=decoded,
        trajectory=traj,
        error="inference error: HTTP 500" if inference else None,
        error_kind="inference" if inference else None,
    )


def add_step(
    traj: Trajectory, rng: random.Random, calls: list[tuple[str, str]], long: bool
) -> None:
    """One model step of parallel calls and their results."""
    n = traj.steps
    traj.messages.append(step_message(rng, calls, n))
    for i, (name, args) in enumerate(calls):
        out = tool_result(rng, long)
        traj.messages.append({"role": "tool", "tool_call_id": f"call_{n}_{i}", "content": out})
        traj.events.append(
            CallEvent(
                step=n,
                call_id=f"call_{n}_{i}",
                name=name,
                arguments=args,
                status="ok",
                duration_s=round(rng.uniform(0.001, 0.05), 4),
                output_chars=len(out),
            )
        )
    traj.steps += 1


def checker_details(entry: Entry, error: str | None, rng: random.Random) -> dict[str, Any]:
    """What the checker records for an error type: a state diff, or the missing results."""
    if error == "multi_turn:instance_state_mismatch":
        return {
            "class": entry.involved_classes[0],
            "differences": {
                "current_dir": {"model": "documents", "ground_truth": "archive"},
                "files": {
                    "model": {"report.pdf": prose(rng, 300)},
                    "ground_truth": {"report.pdf": prose(rng, 300), "notes.txt": "draft"},
                },
            },
        }
    if error == "multi_turn:execution_response_mismatch":
        return {"missing_items": [tool_result(rng, False)]}
    return {}


# ------------------------------------------------------------------ arenas


def arena_task(task: Any, i: int, rng: random.Random) -> ArenaRecord:
    """One task's episode: its reference chain, cut short or erring some of the time."""
    traj = Trajectory(model="astra-14b", tools=[t.to_openai() for t in task.tools])
    traj.messages = list(task.prompt)
    ref = task.reference or []
    done = len(ref) if rng.random() < 0.55 else rng.randrange(len(ref) + 1)
    status_pool = ["ok"] * 12 + ["tool_error", "invalid_json", "unknown_tool", "timeout"]
    for n, call in enumerate(ref[:done]):
        args = json.dumps(call.get("arguments") or {})
        traj.messages.append(step_message(rng, [(call["name"], args)], n))
        status = rng.choice(status_pool)
        out = json_rows(rng, rng.randint(100, 800))  # our arenas' results: 100-800 characters
        traj.messages.append({"role": "tool", "tool_call_id": f"call_{n}_0", "content": out})
        traj.events.append(
            CallEvent(
                step=n,
                call_id=f"call_{n}_0",
                name=call["name"],
                arguments=args,
                status=status,
                duration_s=0.01,
                output_chars=len(out),
            )
        )
    termination = rng.choice(["stop"] * 9 + ["max_steps"])
    traj.messages.append({"role": "assistant", "content": prose(rng, 200)})
    traj.termination = termination  # type: ignore[assignment]
    required = len(task.sub_qa)
    solved = list(task.sub_qa)[: round(required * done / max(len(ref), 1))]
    recall = len(solved) / required if required else 0.0
    precision = 1.0 if done else 0.0
    reward = 2 * recall * precision / (recall + precision) if recall + precision else 0.0
    errors = {k: v for k, v in traj.counts().items() if k != "ok"}
    return ArenaRecord(
        id=f"{task.task_id}@{i}",
        index=i,
        task_id=task.task_id,
        domain=task.domain,
        reward=round(reward, 6),
        recall=recall,
        precision=precision,
        solved=solved,
        required=required,
        tool_calls=done,
        fully_solved=len(solved) == required,
        termination=termination,
        errors=errors,
        trajectory=traj,
    )


# ------------------------------------------------------------------ runs on disk


def write_run(out: Path, records: list[Any], summary: dict[str, Any], fp: dict[str, Any]) -> None:
    out.mkdir(parents=True)
    write_json_atomic(out / CONFIG, RunMeta(fingerprint={"model": "astra-14b", **fp}).model_dump())
    for r in records:
        append_jsonl(out / RESULTS, r, fsync=False)
    write_json_atomic(
        out / SUMMARY,
        {
            **summary,
            "total": len(records),
            "complete": True,
            "wall_s": 1234.5,
            "model": "astra-14b",
        },
    )


def make_runs(root: Path) -> tuple[Path, Path]:
    rng = random.Random(0)
    entries = [e for c in CATEGORIES for e in load_category(c)]
    bfcl = [bfcl_entry(e, rng) for e in entries]
    write_run(
        root / "bfcl",
        bfcl,
        {**summarize_bfcl(bfcl).written(), "published": PUBLISHED},
        {"categories": list(CATEGORIES), "ids": None, "limit": None},
    )
    tasks = load_arena_file(DATA_DIR / "train.jsonl").tasks
    tasks += load_arena_file(DATA_DIR / "heldout.jsonl").tasks
    arenas = [arena_task(tasks[i % len(tasks)], i, rng) for i in range(1000)]
    write_run(
        root / "arenas", arenas, summarize_arenas(arenas).written(), {"data_sha256": "0" * 64}
    )
    return root / "bfcl", root / "arenas"


# ------------------------------------------------------------------ measuring


def build_in_process(runs: list[Path], out: Path) -> float:
    from eval.page import build_report
    from eval.rundir import load_runs

    t0 = time.perf_counter()
    build_report(load_runs(runs), out, overwrite=True)
    return time.perf_counter() - t0


def build_cli(runs: list[Path], out: Path) -> float:
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "eval", "report", *map(str, runs), "--out", str(out), "--overwrite"],
        check=True,
        capture_output=True,
        cwd=ROOT,
    )
    return time.perf_counter() - t0


def open_times(page_file: Path, rounds: int) -> tuple[list[float], list[float]]:
    """Seconds until the first screen's charts are drawn, and until every chart is drawn and
    every entry list built."""
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium")
    if chromium is None:
        raise SystemExit("no chromium on PATH (apt-get install chromium)")
    first, full = [], []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, headless=True)
        for _ in range(rounds):
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            t0 = time.perf_counter()
            page.goto(page_file.as_uri())
            page.wait_for_function("document.body.dataset.ready === '1'", timeout=60_000)
            first.append(time.perf_counter() - t0)
            page.evaluate("window.astraReport && window.astraReport.buildAll()")
            page.evaluate("window.astraReport ? window.astraReport.drawAll() : null")
            page.wait_for_function("document.body.dataset.charts === 'rendered'", timeout=60_000)
            full.append(time.perf_counter() - t0)
            page.close()
        browser.close()
    return first, full


def plotly_only(out: Path) -> Path:
    """The baseline page: plotly.js (as the report embeds it) and one chart."""
    from eval.page import plotly_js

    out.write_text(
        '<!DOCTYPE html><html><head><meta charset="utf-8"></head><body><div id="c"></div>'
        f"<script>{plotly_js()}</script><script>Plotly.newPlot('c', [{{x: [1, 2], y: [3, 1]}}])"
        ".then(function () { document.body.dataset.ready = '1';"
        " document.body.dataset.charts = 'rendered'; });</script></body></html>",
        encoding="utf-8",
    )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3, help="builds and page opens each")
    ap.add_argument("--keep", type=Path, help="write the runs and the report here (kept)")
    args = ap.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="astra-bench-report-"))
    if args.keep and root.exists():
        shutil.rmtree(root)
    t0 = time.perf_counter()
    runs = list(make_runs(root))
    sizes = {p.name: (p / RESULTS).stat().st_size / 1e6 for p in runs}
    print(
        f"synthesised in {time.perf_counter() - t0:.1f} s: bfcl 800 entries "
        f"({sizes['bfcl']:.1f} MB results.jsonl), arenas 1,000 tasks "
        f"({sizes['arenas']:.1f} MB)\n"
    )
    report = root / "report.html"
    inproc = [build_in_process(runs, report) for _ in range(args.rounds)]
    cli = [build_cli(runs, report) for _ in range(args.rounds)]
    size_mb = report.stat().st_size / 1e6
    first, full = open_times(report, args.rounds)
    base_first, _ = open_times(plotly_only(root / "plotly-only.html"), args.rounds)

    def row(what: str, values: list[float], target: float, unit: str) -> str:
        med = statistics.median(values)
        runs_ = " ".join(f"{v:.2f}" for v in values)
        return f"| {what} | {med:.2f} {unit} | {runs_} | {target:g} {unit} | {med / target:.2f}× |"

    print("| measure | median | runs | target | ratio to target |")
    print("|---|---:|---|---:|---:|")
    print(row("build, in process (load 2 runs + render + write)", inproc, TARGETS["build_s"], "s"))
    print(row("build, `astra-eval report` CLI (fresh process)", cli, TARGETS["build_s"], "s"))
    print(row("file size", [size_mb], TARGETS["size_mb"], "MB"))
    print(row("open in Chromium, first screen drawn", first, TARGETS["open_s"], "s"))
    print(row("open in Chromium, every chart and list", full, TARGETS["open_s"], "s"))
    print(row("baseline: plotly.js alone + 1 chart", base_first, TARGETS["open_s"], "s"))
    ratio = statistics.median(first) / statistics.median(base_first)
    print(f"\nfirst screen vs the plotly.js-only page: {ratio:.2f}× (same browser, same run)")
    if args.keep:
        print(f"runs and report: {root}")
    else:
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
