"""Stage B.5, merging: one tool for the sub-questions of a record that need the same kind of
tool (two lookups of the same kind of entity), re-validated against every call it serves.

Two ways, in this order:

``rule``
    tools with the same name and identical parameters. Same source: one tool. Different
    sources (the same lookup over different mock data): a *dispatcher*, each source run in
    a namespace of its own at load time, the call given to each in turn and the first result
    that is not a miss (an exception, ``None`` or a dict with an ``"error"`` key) returned.
``teacher``
    the teacher sees every tool of the record (schemas, sources, the calls each serves) and
    proposes merged tools (``prompts/merge.v1.jinja``) with new reference arguments per
    sub-question; every proposal is checked as a written tool is
    (:func:`~training.synth.envs.sandboxed.check_tool`, each served call in turn), with
    bounded retries that feed the failures back. Proposals that still fail are dropped (the
    tools stay apart) and reported as ``merge_failed``.

A merge that fails its checks never costs the record: its tools are kept as they were. Tools
that keep a shared name are renamed ``<name>_2``, ``<name>_3``… (an alias line appended to the
source), so that every name in a record is unique.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from training.synth.envs.sandboxed import NAME_PATTERN, Call, EnvStep, EnvTool, Failure, cut
from training.synth.teacher import Teacher

MERGE = "merge"  # the prompt template

Check = Callable[[EnvTool, Sequence[Call]], Awaitable["list[str] | Failure"]]


@dataclass
class MergeOutcome:
    tools: list[EnvTool]
    steps: list[EnvStep]
    failures: list[str]  # why proposals were dropped (one line each)
    rounds: int = 0  # teacher calls made for merging


# ------------------------------------------------------------------ the rule

DISPATCH = """_SOURCES = {sources}


def _load(source):
    namespace = {{"__name__": "variant"}}
    exec(compile(source, "<variant of {name}>", "exec"), namespace)
    return namespace[{name!r}]


_VARIANTS = [_load(s) for s in _SOURCES]


def _miss(value):
    return value is None or (isinstance(value, dict) and "error" in value)


def {name}(**arguments):
    last = None
    for variant in _VARIANTS:
        try:
            value = variant(**arguments)
        except Exception as exc:
            last = {{"error": type(exc).__name__ + ": " + str(exc)}}
            continue
        if not _miss(value):
            return value
        last = value
    return last
"""


def dispatcher(name: str, sources: Sequence[str]) -> str:
    """The source of one tool ``name`` that tries each of ``sources`` (each defining ``name``)
    in turn and returns the first result that is not a miss."""
    return DISPATCH.format(name=name, sources=repr(list(sources)))


def _signature(tool: EnvTool) -> str:
    return json.dumps([tool.name, tool.parameters], sort_keys=True)


async def merge_by_rule(
    tools: list[EnvTool], steps: list[EnvStep], check: Check
) -> tuple[list[EnvTool], list[str]]:
    """Merge the tools of identical schema (name and parameters), each merge checked against
    every call it serves; the tools after it and why merges failed."""
    groups: dict[str, list[EnvTool]] = {}
    for t in tools:
        groups.setdefault(_signature(t), []).append(t)
    out: list[EnvTool] = []
    failures: list[str] = []
    for group in groups.values():
        if len(group) == 1:
            out.append(group[0])
            continue
        sources = list(dict.fromkeys(t.source for t in group))
        first = group[0]
        source = sources[0] if len(sources) == 1 else dispatcher(first.name, sources)
        serves = [sid for t in group for sid in t.serves]
        merged = first.model_copy(update={"source": source, "serves": serves, "merged": "rule"})
        calls = [s.call() for s in steps if s.subquestion in serves]
        result = await check(merged, calls)
        if isinstance(result, Failure):
            failures.append(f"rule merge of {first.name} ({', '.join(serves)}): {result.message}")
            out += group
            continue
        _outputs(steps, calls, result)
        out.append(merged)
    return out, failures


def _outputs(steps: list[EnvStep], calls: Sequence[Call], outputs: Sequence[str]) -> None:
    by_sub = {c.subquestion: o for c, o in zip(calls, outputs, strict=True)}
    for s in steps:
        if s.subquestion in by_sub:
            s.output = by_sub[s.subquestion]


def unique_names(tools: list[EnvTool], steps: list[EnvStep]) -> list[EnvTool]:
    """Rename the second and later tools of a shared name (``<name>_2``: an alias line)."""
    taken = {t.name for t in tools}
    seen: set[str] = set()
    out: list[EnvTool] = []
    for t in tools:
        if t.name not in seen:
            seen.add(t.name)
            out.append(t)
            continue
        k = 2
        while f"{t.name}_{k}" in taken:
            k += 1
        new = f"{t.name}_{k}"
        taken.add(new)
        seen.add(new)
        out.append(
            t.model_copy(update={"name": new, "source": f"{t.source}\n\n{new} = {t.name}\n"})
        )
        for s in steps:
            if s.subquestion in t.serves:
                s.tool = new
    return out


# ------------------------------------------------------------------ the teacher


class MergeProposal(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tools: list[str] = Field(min_length=2, max_length=16)  # the names it replaces
    name: str = Field(pattern=NAME_PATTERN)
    description: str = Field(min_length=1, max_length=2000)
    parameters: dict[str, Any]
    code: str = Field(min_length=1, max_length=60_000)
    arguments: dict[str, dict[str, Any]]  # sub-question id → the new reference arguments


class MergeReply(BaseModel):
    model_config = ConfigDict(extra="forbid")

    merges: list[MergeProposal] = Field(max_length=16)


def tools_view(tools: Sequence[EnvTool], steps: Sequence[EnvStep]) -> str:
    """The record's tools as the merge prompt shows them: one line of JSON."""
    by_sub = {s.subquestion: s for s in steps}
    view = [
        {
            "name": t.name,
            "description": t.description,
            "parameters": t.parameters,
            "code": t.source,
            "calls": [
                {"subquestion": sid, "question": by_sub[sid].question,
                 "arguments": by_sub[sid].arguments, "answer": by_sub[sid].answer}
                for sid in t.serves
            ],
        }
        for t in tools
    ]  # fmt: skip
    return json.dumps(view, ensure_ascii=False)


def _proposal_problem(p: MergeProposal, tools: dict[str, EnvTool], used: set[str]) -> str | None:
    unknown = [n for n in p.tools if n not in tools]
    if unknown:
        return f"merge of {p.tools}: no tool named {', '.join(unknown)}"
    if len(set(p.tools)) != len(p.tools) or used & set(p.tools):
        return f"merge of {p.tools}: a tool is named twice (in this merge or in another)"
    if p.name in tools and p.name not in p.tools:
        return f"merge of {p.tools}: the name {p.name!r} is another tool's"
    serves = [sid for n in p.tools for sid in tools[n].serves]
    if set(p.arguments) != set(serves):
        return (f"merge of {p.tools}: arguments must be given for exactly the sub-questions "
                f"{serves} (got {sorted(p.arguments)})")  # fmt: skip
    return None


async def _try(
    proposals: Sequence[MergeProposal],
    tools: dict[str, EnvTool],
    steps: list[EnvStep],
    check: Check,
) -> tuple[list[tuple[MergeProposal, EnvTool, list[EnvStep]]], list[str]]:
    """Check each proposal: the ones that pass (with their re-targeted steps) and failures."""
    used: set[str] = set()
    names: set[str] = set()
    passed: list[tuple[MergeProposal, EnvTool, list[EnvStep]]] = []
    failures: list[str] = []
    for p in proposals:
        problem = _proposal_problem(p, tools, used)
        if problem is None and p.name in names:
            problem = f"merge of {p.tools}: the name {p.name!r} is taken by another merge"
        if problem:
            failures.append(problem)
            continue
        used |= set(p.tools)
        serves = [sid for n in p.tools for sid in tools[n].serves]
        tool = EnvTool(name=p.name, description=p.description, parameters=p.parameters,
                       source=p.code, serves=serves, merged="teacher")  # fmt: skip
        new_steps = [
            s.model_copy(
                update={"tool": p.name, "arguments": p.arguments[s.subquestion], "output": ""}
            )
            for s in steps
            if s.subquestion in serves
        ]
        result = await check(tool, [s.call() for s in new_steps])
        if isinstance(result, Failure):
            failures.append(f"merge of {p.tools} into {p.name}: {result.message}")
            continue
        for s, o in zip(new_steps, result, strict=True):
            s.output = o
        names.add(p.name)
        passed.append((p, tool, new_steps))
    return passed, failures


async def merge_by_teacher(
    teacher: Teacher,
    tools: list[EnvTool],
    steps: list[EnvStep],
    check: Check,
    *,
    rounds: int,
    feedback_chars: int = 6000,
) -> MergeOutcome:
    """Ask for merges (at most ``rounds`` times, each failure fed back); apply the proposals
    that pass. A TeacherRejected (no usable JSON) propagates."""
    by_name = {t.name: t for t in tools}
    view = tools_view(tools, steps)
    previous, error = "", ""
    passed: list[tuple[MergeProposal, EnvTool, list[EnvStep]]] = []
    failures: list[str] = []
    n = 0
    for n in range(1, rounds + 1):
        answer = await teacher.ask(
            MERGE, MergeReply, tools_json=view, attempt=n, attempts=rounds,
            previous=previous, error=error,
        )  # fmt: skip
        passed, failures = await _try(answer.value.merges, by_name, steps, check)
        if not failures:
            break
        previous = cut(answer.value.model_dump_json(), feedback_chars)
        error = "; ".join(failures)
    gone = {name for p, _, _ in passed for name in p.tools}
    out = [t for t in tools if t.name not in gone] + [tool for _, tool, _ in passed]
    replaced = {s.subquestion: s for _, _, new in passed for s in new}
    new_steps = [replaced.get(s.subquestion, s) for s in steps]
    return MergeOutcome(out, new_steps, failures, n)
