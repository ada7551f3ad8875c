"""Per-entry drill-down views: a record and its trajectory as the page's script shows them —
turns of messages (reasoning, tool calls, tool results with their status), the record's facts,
and for BFCL the checker's verdict and diff. Plain JSON; the page renders it as text only.

Tool schemas are left out (their names are kept), and a text longer than :data:`MAX_TEXT`
keeps its head and tail around a marker saying how much was cut. The records have been
validated against their classes (:mod:`eval.rundir`); what those leave untyped (a message's
fields, a tool's schema) is read as whatever it turns out to be.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from eval.report.blocks import Entry, num

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


def _message(m: dict[str, Any], events: dict[str, dict[str, Any]]) -> dict[str, Any]:
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
        out[-1].append(_message(m, events))
    return out


def _tool_name(schema: Any) -> str:
    fn = schema.get("function", schema) if isinstance(schema, dict) else None
    return str(fn.get("name", "")) if isinstance(fn, dict) else "?"


def _trajectory_facts(traj: dict[str, Any] | None) -> list[list[str]]:
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
    names = [_tool_name(t) for t in traj.get("tools") or []]
    if names:
        facts.append(["tools offered", ", ".join(names)])
    for change in traj.get("tool_changes") or []:
        added = ", ".join(change.get("added") or []) or "none"
        facts.append([f"tools added at message {change.get('at_message')}", added])
    return facts


def bfcl_status(r: dict[str, Any]) -> str:
    return "error" if r.get("error_kind") else ("pass" if r.get("valid") else "fail")


def bfcl_view(r: dict[str, Any]) -> tuple[Entry, dict[str, Any]]:
    """A BFCL record's line and drill-down: turns beside the calls the checker decoded from
    them, the verdict, and the checker's details (the state diff, the missing results)."""
    status = bfcl_status(r)
    error_type = r.get("error_type") or ""
    turn = r.get("failed_turn")
    label = error_type.removeprefix("multi_turn:") + (f" (turn {turn})" if turn is not None else "")
    view = {
        "id": r["id"],
        "status": status,
        "facts": [
            ["category", str(r.get("category", ""))],
            ["verdict", status],
            *([["error type", error_type]] if error_type else []),
            *([["failed turn", str(turn)]] if turn is not None else []),
            *_trajectory_facts(r.get("trajectory")),
        ],
        "error": clip(r.get("error") or ""),
        "turns": turns(r.get("trajectory")),
        "decoded": r.get("decoded") or [],
        "failed_turn": turn,
        "checker": {"error_type": error_type, "details": r.get("details") or {}},
    }
    return Entry(str(r["id"]), status, label or "passed"), view


def arena_status(r: dict[str, Any]) -> str:
    if r.get("error_kind"):
        return "error"
    if r.get("fully_solved"):
        return "pass"
    return "part" if (r.get("reward") or 0) > 0 else "fail"


def arena_view(r: dict[str, Any]) -> tuple[Entry, dict[str, Any]]:
    """An arena record's line and drill-down: the reward's parts and the trajectory."""
    status = arena_status(r)
    solved = r.get("solved") or []
    view = {
        "id": r["id"],
        "status": status,
        "facts": [
            ["domain", str(r.get("domain", ""))],
            ["reward", num(r.get("reward"), 3)],
            ["recall", num(r.get("recall"), 3)],
            ["precision", num(r.get("precision"), 3)],
            [
                "solved",
                f"{', '.join(map(str, solved)) or 'none'} "
                f"({len(solved)} of {r.get('required', '?')})",
            ],
            ["errors", ", ".join(f"{k}={v}" for k, v in (r.get("errors") or {}).items()) or "none"],
            *_trajectory_facts(r.get("trajectory")),
        ],
        "error": clip(r.get("error") or ""),
        "turns": turns(r.get("trajectory")),
    }
    label = f"reward {num(r.get('reward'), 3)}"
    if r.get("error_kind"):
        label += f" · {r['error_kind']} error"
    return Entry(str(r["id"]), status, label), view


_GENERAL_FIELDS = {
    "id",
    "task",
    "index",
    "prompt",
    "response",
    "reasoning",
    "finish_reason",
    "answer",
    "extracted",
    "target",
    "filters",
    "responses",
    "error",
    "error_kind",
    "endpoint_failure",
}


def general_view(r: dict[str, Any]) -> tuple[Entry, dict[str, Any]]:
    """A general-benchmark sample: its prompt and reply, what was extracted against the
    target, its metric values (pass: the first metric is above 0)."""
    metrics = {
        k: v
        for k, v in r.items()
        if k not in _GENERAL_FIELDS and isinstance(v, int | float) and not isinstance(v, bool)
    }
    first = next(iter(metrics.values()), None)
    status = "error" if r.get("error_kind") else ("pass" if first and first > 0 else "fail")
    reply: dict[str, Any] = {"role": "assistant", "content": clip(r.get("response") or "")}
    if r.get("reasoning"):
        reply["reasoning"] = clip(r["reasoning"])
    view = {
        "id": r["id"],
        "status": status,
        "facts": [
            ["task", str(r.get("task", ""))],
            ["extracted", clip(r.get("extracted", ""))],
            ["target", clip(r.get("target", ""))],
            *([k, num(v, 4)] for k, v in metrics.items()),
            ["finish reason", str(r.get("finish_reason") or "")],
        ],
        "error": clip(r.get("error") or ""),
        "turns": [[{"role": "user", "content": clip(r.get("prompt", ""))}, reply]],
    }
    label = (
        f"extracted {str(r.get('extracted', ''))[:40]!r} · target {str(r.get('target', ''))[:40]!r}"
    )
    return Entry(str(r["id"]), status, label), view


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
    view = _message(m, {})
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
    tools = [_tool_name(t) for t in traj.get("tools") or []]
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
