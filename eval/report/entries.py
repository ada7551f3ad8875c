"""What every eval's per-entry drill-down view is made of: a trajectory as the page's script
shows it — turns of messages (reasoning, tool calls, tool results with their status) and its
facts. Each eval's own view (its record's line, facts and extras: BFCL's checker diff, τ²'s
user side) is in its package's ``report.py``. Plain JSON; the page renders it as text only.

Tool schemas are left out (their names are kept), and a text longer than :data:`MAX_TEXT`
keeps its head and tail around a marker saying how much was cut. The records have been
validated against their classes (:mod:`eval.rundir`); what those leave untyped (a message's
fields, a tool's schema) is read as whatever it turns out to be.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from eval.report.blocks import Entries, Entry, Page, num
from eval.run import Run

MAX_TEXT = 20_000


def clip(text: Any) -> str:
    text = text if isinstance(text, str) else ("" if text is None else str(text))
    if len(text) <= MAX_TEXT:
        return text
    head, tail = text[: MAX_TEXT * 3 // 4], text[-MAX_TEXT // 4 :]
    return f"{head}\n[… {len(text) - len(head) - len(tail):,} characters not shown …]\n{tail}"


def _content(value: Any) -> str:
    """A message's content: text, or the text parts of a list of parts."""
    if isinstance(value, list):
        value = "\n".join(str(p.get("text", "")) if isinstance(p, dict) else str(p) for p in value)
    return clip(value)


def message_view(m: dict[str, Any], events: dict[str, dict[str, Any]]) -> dict[str, Any]:
    view: dict[str, Any] = {"role": str(m.get("role", "?"))}
    content = _content(m.get("content"))
    if content:
        view["content"] = content
    reasoning = m.get("reasoning_content") or m.get("reasoning")
    if reasoning:
        view["reasoning"] = clip(reasoning)
    calls = []
    raw_calls = m.get("tool_calls")
    for c in raw_calls if isinstance(raw_calls, list) else []:
        fn = c.get("function") if isinstance(c, dict) else None
        if isinstance(fn, dict):
            calls.append([str(fn.get("name", "?")), clip(fn.get("arguments", ""))])
    if calls:
        view["calls"] = calls
    call_id = m.get("tool_call_id")
    if call_id:
        view["call_id"] = str(call_id)
        event = events.get(str(call_id))
        if event:
            view["name"] = str(event.get("name", ""))
            view["status"] = str(event.get("status", ""))
            view["duration_s"] = event.get("duration_s")
    return view


def turns(traj: dict[str, Any] | None) -> list[list[dict[str, Any]]]:
    """The trajectory's messages, one list per turn (a turn starts at a user message that
    follows the model's or a tool's)."""
    if not traj:
        return []
    events = {str(e.get("call_id")): e for e in traj.get("events") or [] if isinstance(e, dict)}
    out: list[list[dict[str, Any]]] = []
    for m in traj.get("messages") or []:
        if not isinstance(m, dict):
            continue
        role = m.get("role")
        starts = role == "user" and (
            not out or any(x["role"] not in ("user", "system") for x in out[-1])
        )
        if starts or not out:
            out.append([])
        out[-1].append(message_view(m, events))
    return out


def tool_name(schema: Any) -> str:
    fn = schema.get("function", schema) if isinstance(schema, dict) else None
    return str(fn.get("name", "")) if isinstance(fn, dict) else "?"


def trajectory_facts(traj: dict[str, Any] | None) -> list[list[str]]:
    if not traj:
        return [["trajectory", "none recorded"]]
    usage, timings = traj.get("usage") or {}, traj.get("timings") or {}
    calls = Counter(str(e.get("status")) for e in traj.get("events") or [] if isinstance(e, dict))
    facts = [
        [
            "termination",
            str(traj.get("termination", ""))
            + (f": {traj['termination_detail']}" if traj.get("termination_detail") else ""),
        ],
        ["model steps", num(traj.get("steps"))],
        ["tool calls", ", ".join(f"{k}={v}" for k, v in calls.items()) or "none"],
        [
            "tokens",
            f"{num(usage.get('prompt_tokens'))} prompt + "
            f"{num(usage.get('completion_tokens'))} completion",
        ],
        [
            "time",
            f"{num(timings.get('total_s'))} s (model {num(timings.get('model_s'))} s, "
            f"tools {num(timings.get('tools_s'))} s)",
        ],
    ]
    names = [tool_name(t) for t in traj.get("tools") or []]
    if names:
        facts.append(["tools offered", ", ".join(names)])
    for change in traj.get("tool_changes") or []:
        added = ", ".join(change.get("added") or []) or "none"
        facts.append([f"tools added at message {change.get('at_message')}", added])
    return facts


View = Callable[[dict[str, Any]], tuple[Entry, dict[str, Any]]]


def entry_list(page: Page, run: Run, view: View) -> Entries:
    """``run``'s records as an entry list: a line each, and its drill-down view (``view``)
    among the page's data."""
    items, views = [], []
    for r in run.records:
        item, v = view(r)
        items.append(item)
        views.append(v)
    return Entries(run.name, page.entries(views), items)
