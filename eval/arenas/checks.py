"""What makes an arena unfit for RL although its reference chain reaches every gold answer:
an environment that would pay a model for something other than doing the task.

``answer_in_arguments``
    a reference call is handed its own gold answer in its arguments (as a whole word or
    number): the model would learn to guess answers into arguments.
``answer_for_other_arguments`` / ``answer_without_arguments``
    the *blind call* still returns a gold answer of its tool. The blind call is the reference
    call made in a fresh sandbox (none of the chain's earlier calls) with every value of the
    task in its arguments replaced (:func:`vary_arguments`: strings and numbers by values no
    mock data holds, booleans negated, an enum's value by another member, inside arrays and
    objects too). The rule: *a sub-question's answer must depend on the task's values in its
    call*. A tool that returns it whatever it is given rewards calling every tool blindly.
    Where the call has nothing to vary (no arguments, or only a one-member enum, ``null``,
    empty arrays), the blind call is the reference call itself in a fresh state:
    ``answer_without_arguments``. So a tool with no parameters ("get the current user") can be
    offered, but cannot be the tool that answers a sub-question; a parameterless tool that
    reads what earlier steps stored is not blind-callable (its fresh state lacks it) and
    passes. Answers are matched as whole words or numbers (:func:`holds_token`: "3" is not in
    "ORD-1234"), so an error message that merely holds digits is not taken for an answer.
``forbidden_operation`` / ``thread_left`` / ``too_much_output``
    the sandbox's :class:`~astra_agent.sandbox.Conduct` report of a call or of a tool's load:
    an operation it refused (network, processes, signals, writes outside ``/tmp``…), even
    where the code caught the error and went on; a thread still running after the call
    returned; more than ``max_printed`` characters printed. Contained, but code that tries
    them is not an environment to train in.

Used by ``astra-eval arenas validate``, and by ``astra-train synth`` (the checker of
generated tools and ``synth arenas``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from astra_agent.arena import AnswerMatch, ArenaEnvironment, ArenaTask, arena_reward
from astra_agent.sandbox import Conduct, Sandbox

_CONDUCT = ("forbidden_operation", "thread_left", "too_much_output")
PROBES = (("zz-no-such-value", 987_654_321), ("qq-other-entry", 123_404_321))
MATCH = AnswerMatch()
MAX_DEPTH = 64


@dataclass(frozen=True)
class Finding:
    """A fixed ``reason`` code and the message (also what a teacher is told on a retry)."""

    reason: str
    message: str


def holds_token(text: str, answer: str) -> bool:
    """Does ``text`` hold ``answer`` as the arena matcher normalises them, and not inside a
    longer word or number ("3" is not in "ORD-1234")?"""
    gold = MATCH.norm(answer.strip(MATCH.strip_chars))
    pattern = rf"(?<![^\W_]){re.escape(gold)}(?![^\W_])"
    return bool(gold) and re.search(pattern, MATCH.norm(text)) is not None


def _vary(value: Any, schema: Any, probe: tuple[str, int], depth: int = 0) -> Any:
    if depth > MAX_DEPTH:  # absurd nesting: left as it is (a blind call proves nothing then)
        return value
    schema = schema if isinstance(schema, dict) else {}
    enum = schema.get("enum")
    if isinstance(enum, list):
        return next((e for e in enum if e != value or type(e) is not type(value)), value)
    if isinstance(value, bool):
        return not value
    if isinstance(value, str):
        return probe[0]
    if isinstance(value, int | float):
        return probe[1]
    if isinstance(value, list):
        return [_vary(v, schema.get("items"), probe, depth + 1) for v in value]
    if isinstance(value, dict):
        props = schema.get("properties")
        props = props if isinstance(props, dict) else {}
        return {k: _vary(v, props.get(k), probe, depth + 1) for k, v in value.items()}
    return value


def vary_arguments(
    parameters: dict[str, Any], arguments: dict[str, Any], probe: int = 0
) -> dict[str, Any]:
    """``arguments`` with every value of the task replaced (see the module); equal to
    ``arguments`` where there is nothing to replace. ``probe`` picks the set of values."""
    return _vary(arguments, parameters, PROBES[probe])


def blind_arguments(
    parameters: dict[str, Any], arguments: dict[str, Any], answers: Sequence[str]
) -> dict[str, Any] | None:
    """The blind call's arguments: the first variation whose own values hold none of
    ``answers`` (None if every one does: such a call would prove nothing)."""
    for probe in range(len(PROBES)):
        other = vary_arguments(parameters, arguments, probe)
        text = json.dumps(other, ensure_ascii=False)
        if not any(holds_token(text, a) for a in answers):
            return other
    return None


def conduct_finding(conduct: Conduct, what: str, max_printed: int) -> Finding | None:
    """What is wrong with ``conduct`` (of ``what``: "calling f(...)", "loading f"), or None."""
    if conduct.refused:
        why = (
            f"{what} tried {', '.join(conduct.refused)}, which the sandbox refused (the error "
            "caught or not): a tool must not try it at all"
        )
        return Finding("forbidden_operation", why)
    if conduct.threads_left:
        why = (
            f"{what} left {conduct.threads_left} thread(s) running after it returned: a "
            "tool must not start threads that outlive it"
        )
        return Finding("thread_left", why)
    if conduct.printed > max_printed:
        why = (
            f"{what} printed {conduct.printed:,} characters (at most {max_printed:,}): a "
            "tool returns its result, it does not print it"
        )
        return Finding("too_much_output", why)
    return None


def answer_in_arguments(arguments: dict[str, Any], answers: Sequence[str]) -> str | None:
    """The answer of ``answers`` that ``arguments`` hold as a whole word or number, or None."""
    text = json.dumps(arguments, ensure_ascii=False)
    return next((a for a in answers if holds_token(text, a)), None)


async def blind_call(
    sandbox: Sandbox,
    name: str,
    parameters: dict[str, Any],
    arguments: dict[str, Any],
    answers: Sequence[str],
    max_printed: int,
) -> Finding | None:
    """Make the blind call of ``name`` (see the module) in a fresh state: what is wrong with
    it (an answer of ``answers`` in its output, or its conduct), or None."""
    other = blind_arguments(parameters, arguments, answers)
    if other is None:
        return None
    await sandbox.reset()
    reply = await sandbox.call(name, other)
    args = json.dumps(other, ensure_ascii=False)
    found = conduct_finding(reply.conduct, f"calling {name}({args})", max_printed)
    if found is not None or not reply.ok:
        return found
    answer = next((a for a in answers if holds_token(reply.text(), a)), None)
    if answer is None:
        return None
    if other == arguments:
        why = (
            f"{name}({args}) returns the sub-answer {answer!r} with nothing of the task in "
            "its call (no argument that can vary), in a fresh state: a sub-question's tool "
            "must need the task's values (an id, a name, a date…) to find its answer"
        )
        return Finding("answer_without_arguments", why)
    why = (
        f"{name}({args}) also returns the sub-answer {answer!r}: the tool must find it from "
        "the right arguments, not return it for any"
    )
    return Finding("answer_for_other_arguments", why)


async def _run_reference(
    task: ArenaTask, env: ArenaEnvironment, max_printed: int, flagged: set[str]
) -> list[str]:
    """Load errors and conduct, each reference call's conduct, the chain's misses; the tools
    whose conduct was wrong are added to ``flagged``."""
    sandbox = env.sandbox
    out = [f"tool {n!r} does not load in the sandbox: {e}" for n, e in sandbox.load_errors.items()]
    for name, conduct in sandbox.load_conduct.items():
        if found := conduct_finding(conduct, f"loading {name}", max_printed):
            out.append(found.message)
            flagged.add(name)
    reference = task.reference or []
    outputs: list[str] = []
    for call in reference:
        name, args = call["name"], dict(call.get("arguments") or {})
        if name in sandbox.load_errors:  # the environment's own error text
            outputs.append((await env.call_tool(name, args)).text)
            continue
        reply = await sandbox.call(name, args)
        outputs.append(reply.text())
        what = f"calling {name}({json.dumps(args, ensure_ascii=False)})"
        if name not in flagged and (found := conduct_finding(reply.conduct, what, max_printed)):
            out.append(found.message)
            flagged.add(name)
    pairs = list(zip(reference, outputs, strict=True))
    reward = arena_reward(task.sub_qa, [(c["name"], o) for c, o in pairs])
    if not reward.fully_solved:
        missing = sorted(set(task.sub_qa) - set(reward.solved))
        shown = "; ".join(f"{c['name']} → {o[:120]!r}" for c, o in pairs if c["name"] in missing)
        out.append(f"reference chain misses {', '.join(missing)}: {shown}")
    return out


async def task_findings(task: ArenaTask, env: ArenaEnvironment, max_printed: int) -> list[str]:
    """Everything wrong with ``task`` (which has a reference chain) in its environment ``env``
    (started): load errors, the reference chain's misses, then the module's checks; each
    tool's misconduct once. One message per problem."""
    flagged: set[str] = set()
    out = await _run_reference(task, env, max_printed, flagged)
    schemas = {t.name: t.parameters for t in task.tools}
    for call in task.reference or []:
        name, args = call["name"], dict(call.get("arguments") or {})
        answers = task.sub_qa.get(name) or []
        if not answers or name in env.sandbox.load_errors:
            continue
        if (given := answer_in_arguments(args, answers)) is not None:
            out.append(f"the arguments of {name}'s reference call hold its answer {given!r}")
            continue
        found = await blind_call(
            env.sandbox, name, schemas.get(name, {}), args, answers, max_printed
        )
        if found is not None and not (found.reason in _CONDUCT and name in flagged):
            out.append(found.message)
    return out
