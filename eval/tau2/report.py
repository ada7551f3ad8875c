"""The τ²-bench section of a report: per domain pass^1..pass^k and errors beside the paper's
published pass^1, every run's τ² data version and user simulator named (figures compare only
where both agree), each run's conversations with their drill-down, and the per-task part of a
comparison of two τ² runs; and the entry view of a conversation (the agent's turns, the
user simulator's side, the scorer's explanation)."""

from __future__ import annotations

from typing import Any

from eval.report import charts
from eval.report.blocks import (
    Block,
    Cell,
    Charts,
    Entry,
    Heading,
    Note,
    Page,
    Section,
    Table,
    num,
)
from eval.report.entries import clip, entry_list, message_view, tool_name, turns
from eval.run import Run
from eval.tau2.runner import PUBLISHED
from eval.tau2.runs import (
    SAME,
    TASK_CHANGES,
    TaskRow,
    changed_tasks,
    describe,
    passes,
    run_setting,
)

CHANGED_TASKS = 300  # tasks listed in a comparison


def _setting(run: Run, key: str) -> Any:
    fp = (run.config or {}).get("fingerprint")
    return run_setting(fp if isinstance(fp, dict) else {}, run.summary or {}, key)


def _domains(run: Run) -> dict[str, dict[str, Any]]:
    domains = (run.summary or {}).get("domains")
    return {str(d): v for d, v in domains.items() if isinstance(v, dict)} if domains else {}


def _k(row: dict[str, Any], k: str) -> float | None:
    """pass^k × 100 (None: not computed)."""
    value = (row.get("pass_hat_k") or {}).get(k)
    return 100 * value if isinstance(value, int | float) else None


def tau2_section(runs: list[Run], page: Page) -> Section:
    """What each run was run with, pass^1 per domain beside the paper's, pass^k and errors
    per domain, and each run's conversations."""
    # the paper's domains always (its figures beside the runs'), and any other a run has
    names = sorted({"retail", "telecom", *(d for r in runs for d in _domains(r))}, key=_paper_first)
    blocks: list[Block] = [_settings(runs), *_setting_notes(runs)]
    blocks.append(_pass1_table(runs, names, PUBLISHED))
    x = [*names, "overall"]
    series: list[tuple[str, list[Any]]] = [
        (r.name, [_k(_domains(r).get(d) or {}, "1") for d in names] + [_overall(r)]) for r in runs
    ]
    series += [(f"{m} (published)", [row.get(d) for d in x]) for m, row in PUBLISHED.items()]
    ids = [page.figure(charts.bars("pass^1 by domain (× 100)", x, series, ytitle="pass^1 × 100"))]
    ks = _ks(runs)
    if len(ks) > 1:
        curves = [
            (f"{r.name} · {d}", [_k(row, k) for k in ks])
            for r in runs
            for d, row in _domains(r).items()
        ]
        xk = [f"pass^{k}" for k in ks]
        ids.append(page.figure(charts.bars("pass^k by domain (× 100)", xk, curves)))
    blocks += [Charts(ids), _domain_table(runs, ks), *_error_notes(runs)]
    blocks.append(
        Note(
            "Published: the ASTRA paper's Table 1 (pass^1 × 100; retail and telecom, 4 trials, "
            "temperature 0, user simulator GPT-5.1, the τ² task set of its time). pass^k is over "
            "the tasks whose every trial was scored; conversations that could not be played "
            "are errors, never failures."
        )
    )
    entries: list[Block] = []
    for run in runs:
        if run.records:
            entries += [Heading(f"Conversations of {run.name}"), entry_list(page, run, tau2_view)]
    return Section("tau2", "τ²-bench", "tau2", blocks, entries)


def _paper_first(domain: str) -> tuple[int, str]:
    order = ("retail", "telecom", "airline")
    return (order.index(domain), "") if domain in order else (len(order), domain)


def _overall(run: Run) -> float | None:
    value = (run.summary or {}).get("overall_pass_1")
    return 100 * value if isinstance(value, int | float) else None


def _ks(runs: list[Run]) -> list[str]:
    ks = [int(k) for r in runs for row in _domains(r).values() for k in row.get("pass_hat_k") or {}]
    most = max(ks, default=1)
    return [str(k) for k in range(1, most + 1)]


def _settings(runs: list[Run]) -> Table:
    rows = []
    for run in runs:
        s = run.summary or {}
        rows.append(
            [
                Cell(run.name, cls="run"),
                Cell(run.model),
                *(Cell(describe(key, _setting(run, key)), key, run.name) for key, _ in SAME),
                Cell(num(s.get("trials")), "trials", run.name, "num"),
                Cell(num(s.get("conversations")), "conversations", run.name, "num"),
                Cell(num(s.get("errors")), "errors", run.name, "num"),
            ]
        )
    cols = ["run", "model", "τ² data", "user simulator", "trials", "conversations", "errors"]
    return Table(cols, rows, "What each run was run with")


def _setting_notes(runs: list[Run]) -> list[Block]:
    notes: list[Block] = []
    for key, what in SAME:
        values = {r.name: _setting(r, key) for r in runs}
        unknown = [name for name, v in values.items() if v is None]
        if unknown:
            notes.append(Note(f"{', '.join(unknown)}: the {what} is not recorded", "warn"))
        if len({describe(key, v) for v in values.values() if v is not None}) > 1:
            notes.append(
                Note(
                    f"These runs differ in their {what}: their figures are not comparable "
                    "(τ² scores move with the task version and the user simulator).",
                    "warn",
                )
            )
    return notes


def _pass1_table(runs: list[Run], names: list[str], published: dict[str, Any]) -> Table:
    rows = []
    for run in runs:
        ds = _domains(run)
        rows.append(
            [
                Cell(run.name, cls="run"),
                Cell(run.model),
                *(
                    Cell(num(_k(ds.get(d) or {}, "1")), f"pass1.{d}", run.name, "num")
                    for d in names
                ),
                Cell(num(_overall(run)), "pass1.overall", run.name, "num", "mean of the domains"),
            ]
        )
    for model, row in published.items():
        rows.append(
            [
                Cell(f"{model} (published)", cls="published"),
                Cell("paper, Table 1"),
                *(Cell(num(row.get(d)), cls="num") for d in names),
                Cell(num(row.get("overall")), cls="num"),
            ]
        )
    return Table(
        ["run", "model", *names, "overall"],
        rows,
        "pass^1 × 100 per domain, beside the paper's published figures",
    )


def _domain_table(runs: list[Run], ks: list[str]) -> Table:
    rows = []
    for run in runs:
        for d, row in sorted(_domains(run).items(), key=lambda i: _paper_first(i[0])):
            key = f"domains.{d}"
            rows.append(
                [
                    Cell(run.name, cls="run"),
                    Cell(d),
                    *(
                        Cell(num(row.get(f)), f"{key}.{f}", run.name, "num")
                        for f in ("tasks", "conversations", "scored", "errors")
                    ),
                    Cell(num(row.get("mean_reward"), 4), f"{key}.mean_reward", run.name, "num"),
                    *(Cell(num(_k(row, k)), f"{key}.pass_hat_k.{k}", run.name, "num") for k in ks),
                    Cell(num(row.get("tasks_with_all_trials")), cls="num"),
                ]
            )
    cols = ["run", "domain", "tasks", "conversations", "scored", "errors", "mean reward"]
    cols += [*(f"pass^{k}" for k in ks), "tasks with every trial scored"]
    return Table(cols, rows, "Per domain: pass^k × 100 and errors (not scored)")


def _error_notes(runs: list[Run]) -> list[Block]:
    notes: list[Block] = []
    for run in runs:
        errors = [r for r in run.records if r.get("error_kind")]
        if errors:
            kinds = sorted({str(r["error_kind"]) for r in errors})
            notes.append(
                Note(
                    f"{run.name}: {len(errors)} of {len(run.records)} conversations could not be "
                    f"played ({', '.join(kinds)} errors): not scored, left out of pass^k; "
                    "`astra-eval tau2 --retry-errors` reruns them",
                    "warn",
                )
            )
    return notes


# ------------------------------------------------------------------ comparison


def task_blocks(data: dict[str, Any]) -> list[Block]:
    """The per-task part of a τ² comparison (``Comparison.to_dict``): tasks by change per
    domain, and the tasks that moved with their passes in A and B."""
    counts = data.get("task_counts") or {}
    if not counts:
        return []
    rows = [
        [
            Cell(str(d)),
            *(Cell(num(c.get(k)), f"compare.tasks.{d}.{k}", cls="num") for k in TASK_CHANGES),
        ]
        for d, c in counts.items()
    ]
    blocks: list[Block] = [
        Table(["domain", *TASK_CHANGES], rows, "Tasks by change (pass rate over their trials)")
    ]
    tasks = [TaskRow(**t) for t in data.get("tasks") or []]
    moved = changed_tasks(tasks)
    if moved:
        shown = [
            [
                Cell(t.id),
                Cell(t.change, cls="broken" if t.change == "worse" else "fixed"),
                Cell(passes(t.a_passed, t.a_trials), cls="num"),
                Cell(passes(t.b_passed, t.b_trials), cls="num"),
            ]
            for t in moved[:CHANGED_TASKS]
        ]
        more = f" (the first {CHANGED_TASKS} of {len(moved)})" if len(moved) > CHANGED_TASKS else ""
        blocks.append(
            Table(["task", "change", "A passed", "B passed"], shown, f"Changed tasks{more}")
        )
    return blocks


def tau2_status(r: dict[str, Any]) -> str:
    if r.get("error_kind") or r.get("reward") is None:
        return "error"
    return "pass" if r.get("reward") == 1.0 else "fail"


def _tokens(usage: Any, side: str) -> str:
    u = usage.get(side) if isinstance(usage, dict) else None
    u = u if isinstance(u, dict) else {}
    return (
        f"{num(u.get('prompt_tokens'))} prompt + {num(u.get('completion_tokens'))} completion "
        f"({num(u.get('calls'))} calls)"
    )


def _simulator(m: Any) -> dict[str, Any] | None:
    """A message of the user simulator's side: its own replies are ``simulator``'s."""
    if not isinstance(m, dict):
        return None
    view = message_view(m, {})
    if view["role"] == "assistant":
        view["role"] = "simulator"
    return view


def tau2_view(r: dict[str, Any]) -> tuple[Entry, dict[str, Any]]:
    """A τ² conversation's line and drill-down: the agent's side as turns (the simulator's
    words as user messages, the agent's reasoning, tool calls and results), the simulator's
    own side (its prompt with the scenario, its replies, its tool calls on the phone), and the
    scorer's explanation."""
    status = tau2_status(r)
    traj = r.get("trajectory") or {}
    tools = [tool_name(t) for t in traj.get("tools") or []]
    reward = r.get("reward")
    view = {
        "id": r["id"],
        "status": status,
        "facts": [
            ["domain", str(r.get("domain", ""))],
            ["task", str(r.get("task_id", ""))],
            ["trial", num(r.get("trial"))],
            ["reward", num(reward, 1) if reward is not None else "none (not scored: an error)"],
            ["termination", str(r.get("termination", ""))],
            ["user simulator turns", num(r.get("turns"))],
            [
                "tool calls",
                f"agent {num(r.get('tool_calls'))}, user {num(r.get('user_tool_calls'))}",
            ],
            ["agent tokens", _tokens(r.get("usage"), "agent")],
            ["user simulator tokens", _tokens(r.get("usage"), "user")],
            ["agent tools offered", ", ".join(tools) or "none"],
        ],
        "error": clip(r.get("error") or ""),
        "explanation": clip(r.get("explanation") or ""),
        "turns": turns(traj),
        "user_side": [v for m in r.get("user_side") or [] if (v := _simulator(m))],
    }
    if status == "error":
        label = f"{r.get('error_kind') or 'run'} error: {str(r.get('error') or '')[:80]}"
    else:
        first = (str(r.get("explanation") or "").strip().splitlines() or [""])[0]
        label = f"reward {num(reward, 1)} · {r.get('termination', '')}"
        label += f" · {first[:100]}" if status == "fail" and first else ""
    return Entry(str(r["id"]), status, label), view
