"""Sandboxed Python arenas in the ASTRA-RL format: records, their loader, the environment and
ASTRA's trajectory-level reward.

A record has four fields (ASTRA-RL-1k, as published): ``prompt`` (chat messages),
``tool_schema`` (JSON string: OpenAI function schemas, targets and distractors), ``tool_dict``
(JSON string: tool name → Python source of a function of that name) and ``sub_qa_dict`` (JSON
string: tool name → gold answer strings; one sub-question per tool). Ours may add ``task_id``,
``domain`` and ``reference`` (the reference chain of calls, for validation).
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from astra_agent.config import read_text
from astra_agent.environment import ToolResult, ToolSpec
from astra_agent.errors import ConfigError
from astra_agent.pysource import parse
from astra_agent.runio import numbered_lines
from astra_agent.sandbox import Sandbox, SandboxLimits
from astra_agent.trajectory import Trajectory

FIELDS = ("prompt", "tool_schema", "tool_dict", "sub_qa_dict")


@dataclass(frozen=True)
class Problem:
    index: int
    field: str
    message: str
    severity: Literal["error", "warning"] = "error"

    def __str__(self) -> str:
        return f"record {self.index}, {self.field}: {self.message}"


@dataclass
class ArenaTask:
    index: int
    task_id: str
    prompt: list[dict[str, Any]]
    tools: list[ToolSpec]
    sources: dict[str, str]
    sub_qa: dict[str, list[str]]
    reference: list[dict[str, Any]] | None = None
    domain: str = ""
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class LoadReport:
    tasks: list[ArenaTask]
    problems: list[Problem]
    records: int = 0

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "error"]


# --------------------------------------------------------------------------- loading


def _json_field(raw: dict[str, Any], name: str, index: int, out: list[Problem]) -> Any:
    value = raw.get(name)
    if value is None:
        out.append(Problem(index, name, "missing"))
        return None
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError as exc:
            out.append(Problem(index, name, f"invalid JSON: {exc}"))
            return None
    return value  # already decoded (some parquet exports)


def _defines(source: str, name: str) -> str | None:
    """None if ``source`` compiles and defines ``name`` at top level, else the reason."""
    try:
        tree = parse(source)
        compile(tree, f"<tool {name}>", "exec")
    except SyntaxError as exc:
        return f"source of {name!r} does not compile: {exc.msg} (line {exc.lineno})"
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
            return None
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            return None
    return f"source of {name!r} does not define a function named {name!r}"


def _schemas(value: Any, index: int, out: list[Problem]) -> list[ToolSpec]:
    if not isinstance(value, list):
        out.append(Problem(index, "tool_schema", "must be a list of function schemas"))
        return []
    specs: dict[str, ToolSpec] = {}
    for i, schema in enumerate(value):
        try:
            spec = ToolSpec.from_openai(schema)
        except (KeyError, TypeError, AttributeError):
            out.append(Problem(index, "tool_schema", f"entry {i} is not a function schema"))
            continue
        if spec.name in specs:
            out.append(
                Problem(
                    index,
                    "tool_schema",
                    f"{spec.name!r} is listed twice (kept the first)",
                    "warning",
                )
            )
            continue
        specs[spec.name] = spec
    return list(specs.values())


def parse_record(raw: dict[str, Any], index: int) -> tuple[ArenaTask | None, list[Problem]]:
    """Validate one record; every problem is reported with the record's index and field."""
    out: list[Problem] = []
    prompt = _json_field(raw, "prompt", index, out)
    if prompt is not None and not (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(m, dict) and "role" in m and "content" in m for m in prompt)
    ):
        out.append(Problem(index, "prompt", "must be a non-empty list of {role, content}"))
    tools = _schemas(_json_field(raw, "tool_schema", index, out), index, out)
    sources = _json_field(raw, "tool_dict", index, out)
    if sources is not None and not (
        isinstance(sources, dict) and all(isinstance(v, str) for v in sources.values())
    ):
        out.append(Problem(index, "tool_dict", "must map tool names to source strings"))
        sources = None
    sub_qa = _json_field(raw, "sub_qa_dict", index, out)
    if sub_qa is not None:
        if not isinstance(sub_qa, dict):  # empty: no offered tool serves it, see arena_reward
            out.append(Problem(index, "sub_qa_dict", "must be a mapping"))
            sub_qa = None
        else:
            sub_qa = {
                k: [str(a) for a in (v if isinstance(v, list) else [v])] for k, v in sub_qa.items()
            }
    if sources is not None:
        names = {t.name for t in tools}
        for name in names - set(sources):
            out.append(
                Problem(index, "tool_schema", f"{name!r} has no implementation in tool_dict")
            )
        for name, source in sources.items():
            why = _defines(source, name)
            if why:
                out.append(Problem(index, "tool_dict", why))
        for name in set(sources) - names:
            out.append(
                Problem(
                    index,
                    "tool_dict",
                    f"{name!r} has a source but no schema (the model cannot call it)",
                    "warning",
                )
            )
        for name in sub_qa or {}:
            if name not in sources:
                out.append(
                    Problem(index, "sub_qa_dict", f"tool {name!r} has no source in tool_dict")
                )
            elif name not in names:
                out.append(Problem(index, "sub_qa_dict", f"tool {name!r} has no schema"))
    reference = raw.get("reference")
    if isinstance(reference, str):  # parquet exports keep nested fields as JSON text
        try:
            reference = json.loads(reference)
        except json.JSONDecodeError:
            reference = False
    if reference is not None and not (
        isinstance(reference, list)
        and all(isinstance(c, dict) and isinstance(c.get("name"), str) for c in reference)
    ):
        out.append(Problem(index, "reference", "must be a list of {name, arguments}"))
        reference = None
    if any(p.severity == "error" for p in out):
        return None, out
    task = ArenaTask(
        index=index,
        task_id=str(raw.get("task_id") or f"task-{index}"),
        prompt=prompt,
        tools=tools,
        sources=sources,
        sub_qa=sub_qa,
        reference=reference,
        domain=str(raw.get("domain") or ""),
        raw=raw,
    )
    return task, out


def _read_parquet(p: Path) -> list[dict[str, Any]]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise ConfigError("reading parquet needs pyarrow (pip install pyarrow)") from exc
    try:
        return pq.read_table(p).to_pylist()
    except (pa.ArrowException, OSError, ValueError) as exc:
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"{p} is not a readable parquet file: {why}") from None


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """The raw records of a JSONL or parquet file; a file that cannot be read as such (not
    UTF-8, binary, corrupt parquet, a line that is not JSON) is a ConfigError naming the line."""
    p = Path(path)
    if p.is_dir() or not p.is_file():
        raise ConfigError(f"arena data not found: {p}" if not p.exists() else f"{p} is not a file")
    if p.suffix == ".parquet":
        return _read_parquet(p)
    records = []
    for n, line in numbered_lines(read_text(p, "arena data")):
        try:
            records.append(json.loads(line))
        except (ValueError, RecursionError) as exc:  # huge integers, deep nesting too
            raise ConfigError(f"{p}:{n} is not a JSON record: {exc}") from None
    return records


def load_arena_file(path: str | Path) -> LoadReport:
    """JSONL or parquet → valid tasks, plus every problem found (nothing dropped silently)."""
    records = read_records(path)
    tasks, problems = [], []
    for i, raw in enumerate(records):
        if not isinstance(raw, dict):
            problems.append(Problem(i, "<record>", "not a JSON object"))
            continue
        task, found = parse_record(raw, i)
        problems += found
        if task is not None:
            tasks.append(task)
    return LoadReport(tasks, problems, len(records))


# --------------------------------------------------------------------------- reward


@dataclass(frozen=True)
class AnswerMatch:
    """How a tool output is compared with a gold answer (a substring test after normalising).

    Default: case-insensitive, runs of whitespace collapsed to one space, and the gold answer
    stripped of surrounding quotes and spaces.
    """

    case_sensitive: bool = False
    collapse_whitespace: bool = True
    strip_chars: str = " \t\n\"'"

    def norm(self, text: str) -> str:
        if self.collapse_whitespace:
            text = re.sub(r"\s+", " ", text)
        return text if self.case_sensitive else text.lower()

    def found(self, gold: str, output: str) -> bool:
        g = self.norm(gold.strip(self.strip_chars))
        return bool(g) and g in self.norm(output)


@dataclass(frozen=True)
class Reward:
    reward: float
    recall: float
    precision: float
    solved: tuple[str, ...]
    required: int
    tool_calls: int

    @property
    def fully_solved(self) -> bool:
        """Every sub-question solved; with none (no offered tool serves the task), no call."""
        return len(self.solved) == self.required and (self.required > 0 or self.tool_calls == 0)


def arena_reward(
    sub_qa: dict[str, list[str]],
    calls: list[tuple[str, str]],
    *,
    eps: float = 1e-6,
    match: AnswerMatch | None = None,
) -> Reward:
    """ASTRA's trajectory-level reward: F1 of recall = solved/required and
    precision = solved/(tool calls + eps). ``calls`` are (tool name, output text), in order,
    every call the model made (failed ones too). A pure function, for RL and evaluation.

    A task with no sub-question (an empty ``sub_qa``: no offered tool can serve the request,
    the right answer is no call) scores 1.0 when the model made no call and 0.0 when it made
    any: the recall of nothing is 1, the precision of no calls is 1, and that of calls that
    can solve nothing is 0."""
    match = match or AnswerMatch()
    if not sub_qa:
        precision = 0.0 if calls else 1.0
        return Reward(precision, 1.0, precision, (), 0, len(calls))
    solved = tuple(
        tool
        for tool, golds in sub_qa.items()
        if any(name == tool and any(match.found(g, out) for g in golds) for name, out in calls)
    )
    recall = len(solved) / len(sub_qa)
    precision = len(solved) / (len(calls) + eps)
    f1 = 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0
    return Reward(f1, recall, precision, solved, len(sub_qa), len(calls))


def calls_of(traj: Trajectory) -> list[tuple[str, str]]:
    """(tool name, the output the model saw) for every call of a trajectory, in order.

    A call that failed (the tool raised, bad arguments, unknown tool, timeout) counts as a call
    but with no output: an error message echoes what the model sent (``unexpected keyword
    argument 'GOLD'``), so letting it solve a sub-question would reward guessing answers into
    arguments instead of getting them from the tool."""
    outputs = {
        m.get("tool_call_id"): m.get("content") or ""
        for m in traj.messages
        if m.get("role") == "tool"
    }
    return [(e.name, outputs.get(e.call_id, "") if e.status == "ok" else "") for e in traj.events]


def trajectory_reward(task: ArenaTask, traj: Trajectory, **kw: Any) -> Reward:
    return arena_reward(task.sub_qa, calls_of(traj), **kw)


# --------------------------------------------------------------------------- environment


class ArenaEnvironment:
    """An Environment over one task: its tools, executed in a sandbox; fresh state each time
    it is created (or after ``reset()``)."""

    def __init__(
        self,
        task: ArenaTask,
        limits: SandboxLimits | None = None,
        *,
        unsafe_no_sandbox: bool = False,
    ) -> None:
        self.task = task
        self.sandbox = Sandbox(task.sources, limits, unsafe_no_sandbox=unsafe_no_sandbox)

    async def list_tools(self) -> list[ToolSpec]:
        return list(self.task.tools)

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        await self.sandbox.start()
        if name in self.sandbox.load_errors:
            return ToolResult(
                f"Error: tool {name!r} failed to load: {self.sandbox.load_errors[name]}",
                is_error=True,
            )
        reply = await self.sandbox.call(name, arguments)
        return ToolResult(reply.text(), is_error=not reply.ok, structured=reply.value)

    async def reset(self) -> None:
        """The ``Environment`` reset: the sandbox back to the state of a fresh one (the task's
        sources loaded anew, nothing a previous call left behind); the tools stay the task's."""
        await self.sandbox.reset()

    async def close(self) -> None:
        await self.sandbox.close()

    async def __aenter__(self) -> ArenaEnvironment:
        try:
            await self.sandbox.start()
        except BaseException:  # `async with` will not call __aexit__: release here
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def run_reference(task: ArenaTask, env: ArenaEnvironment) -> tuple[Reward, list[str]]:
    """Run the task's reference chain in the sandbox; the reward and each call's output."""
    if not task.reference:
        raise ConfigError(f"task {task.task_id} has no reference chain")
    outputs = []
    for call in task.reference:
        result = await env.call_tool(call["name"], dict(call.get("arguments") or {}))
        outputs.append(result.text)
    calls = [(c["name"], o) for c, o in zip(task.reference, outputs, strict=True)]
    return arena_reward(task.sub_qa, calls), outputs
