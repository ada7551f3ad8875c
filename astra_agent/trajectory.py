"""Trajectories: what an episode did, as JSONL records directly usable as SFT data.

``messages`` are OpenAI-format chat messages; assistant messages carry their thinking in
``reasoning_content`` (the field Qwen3's chat template reads) and their calls in ``tool_calls``
with JSON-string arguments; ``tools`` are the OpenAI function schemas that were offered. So
``tokenizer.apply_chat_template(record["messages"], tools=record["tools"])`` renders a record.

``tools`` is the *first* offer. When a later call of the loop on the same trajectory offers a
different set (BFCL's ``miss_func`` adds held-out functions at a later turn), ``tool_changes``
records it: from message ``at_message`` on, the tools in ``removed`` were no longer offered and
those in ``added`` were (their schemas in ``schemas``). :meth:`Trajectory.tools_at` gives the
offer in force for any message, e.g. the ``tools=`` with which the prompt of that message's
model call renders; ``tools_at(len(messages))`` is the last offer.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from astra_agent.errors import ConfigError

# the JSONL primitives live in runio; these names stay importable from here
from astra_agent.runio import append_jsonl as append_jsonl
from astra_agent.runio import drop_torn_tail as drop_torn_tail
from astra_agent.runio import dumps_json, jsonl_lines

Termination = Literal[
    "stop",  # the model answered without calling a tool
    "max_steps",
    "max_tokens",
    "max_time",
    "length",  # the model's reply was cut by its token limit
    "empty_reply",
    "model_error",  # the endpoint failed after retries
    "undecodable",  # a call's arguments were not a JSON object (CallPolicy.end_on_undecodable)
    "error",  # the episode could not run (an evaluation records the cause)
]
# How the model call failed when termination is "model_error" (EndpointError.kind).
FailureKind = Literal["unreachable", "timeout", "dropped", "status", "other"]
CallStatus = Literal["ok", "tool_error", "invalid_json", "unknown_tool", "schema_error", "timeout"]


class CallEvent(BaseModel):
    """One tool call: what was asked, how it went, how long it took."""

    step: int
    call_id: str
    name: str
    arguments: str
    status: CallStatus
    duration_s: float
    output_chars: int = 0
    truncated: bool = False
    recovered: bool = False  # parsed by us from text the server's parser left behind


class Usage(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class Timings(BaseModel):
    total_s: float = 0.0
    model_s: float = 0.0
    tools_s: float = 0.0


class ToolChange(BaseModel):
    """The tools offered changed at ``messages[at_message]`` (a tool whose schema changed is
    both removed and added)."""

    at_message: int
    added: list[str] = Field(default_factory=list)
    removed: list[str] = Field(default_factory=list)
    schemas: list[dict[str, Any]] = Field(default_factory=list)  # of ``added``, in order


def _tool_name(schema: dict[str, Any]) -> str:
    return str(schema.get("function", schema).get("name", ""))


def tool_change(
    before: list[dict[str, Any]], after: list[dict[str, Any]], at_message: int
) -> ToolChange | None:
    """What changed from one offer to the next (None: nothing)."""
    old = {_tool_name(t): t for t in before}
    new = {_tool_name(t): t for t in after}
    removed = [n for n, t in old.items() if new.get(n) != t]
    added = [t for n, t in new.items() if old.get(n) != t]
    if not removed and not added:
        return None
    names = [_tool_name(t) for t in added]
    return ToolChange(at_message=at_message, added=names, removed=removed, schemas=added)


class TokenRecord(BaseModel):
    """The tokens of an episode as a token-level policy sampled them (RL rollouts).

    ``prompt_ids`` render the messages before the first model call (with the generation
    prompt); ``response_ids`` are everything after, in order: sampled tokens (mask 1) and the
    template's tokens for tool results and turn headers (mask 0). ``logprobs`` has one entry per
    response token: the sampler's log-probability for sampled tokens, 0.0 for masked ones.
    ``rerender_match`` says whether the chat template, re-rendering the final messages, gives
    exactly ``prompt_ids + response_ids`` (None: not checked); ``rerender_diff`` says where
    they first differ. A mismatch is reported, never fixed: the trained ids are the sampled
    ones."""

    prompt_ids: list[int] = Field(default_factory=list)
    response_ids: list[int] = Field(default_factory=list)
    response_mask: list[int] = Field(default_factory=list)
    logprobs: list[float] = Field(default_factory=list)
    rerender_match: bool | None = None
    rerender_diff: str = ""

    @property
    def sampled_tokens(self) -> int:
        return sum(self.response_mask)


class Trajectory(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str = Field(default_factory=lambda: uuid.uuid4().hex)
    created: str = Field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))
    model: str = ""
    messages: list[dict[str, Any]] = Field(default_factory=list)
    tools: list[dict[str, Any]] = Field(default_factory=list)
    steps: int = 0
    usage: Usage = Field(default_factory=Usage)
    timings: Timings = Field(default_factory=Timings)
    termination: Termination = "stop"
    termination_detail: str = ""
    model_failure: FailureKind | None = None  # how the model call failed (model_error)
    tool_changes: list[ToolChange] = Field(default_factory=list)
    events: list[CallEvent] = Field(default_factory=list)
    recovered_calls: int = 0
    # replies whose answer came back only as reasoning (astra_agent.reply.only_in_reasoning)
    answers_in_reasoning: int = 0
    metadata: dict[str, Any] = Field(default_factory=dict)
    tokens: TokenRecord | None = None  # set by a token-level policy (RL rollouts)

    @property
    def final_answer(self) -> str:
        for m in reversed(self.messages):
            if m.get("role") == "assistant" and not m.get("tool_calls"):
                return m.get("content") or ""
        return ""

    def tools_at(self, message_index: int) -> list[dict[str, Any]]:
        """The tools offered when ``messages[message_index]`` was reached: the first offer,
        with every change at or before that index applied (added tools last, in order)."""
        offer = list(self.tools)
        for change in self.tool_changes:
            if change.at_message > message_index:
                break
            gone = set(change.removed)
            offer = [t for t in offer if _tool_name(t) not in gone] + list(change.schemas)
        return offer

    def offer_tools(self, schemas: list[dict[str, Any]]) -> None:
        """Record ``schemas`` as the offer from the next message on: the first offer of an
        empty trajectory, else a :class:`ToolChange` if it differs from the offer in force."""
        if not self.messages and not self.tools and not self.tool_changes:
            self.tools = list(schemas)
            return
        at = len(self.messages)
        change = tool_change(self.tools_at(at), schemas, at)
        if change is not None:
            self.tool_changes.append(change)

    def counts(self) -> dict[str, int]:
        """Tool-call events by status, plus recoveries and answers found only as reasoning."""
        out: dict[str, int] = {}
        for e in self.events:
            out[e.status] = out.get(e.status, 0) + 1
        if self.recovered_calls:
            out["recovered"] = self.recovered_calls
        if self.answers_in_reasoning:
            out["answer_in_reasoning"] = self.answers_in_reasoning
        return out

    def to_json_line(self) -> str:
        return dumps_json(self.model_dump(mode="json"), ensure_ascii=False) + "\n"


def read_jsonl(path: str | Path) -> Iterator[Trajectory]:
    """Read trajectories; a torn last line (a killed writer) is skipped, others are errors."""
    p = Path(path)
    lines = jsonl_lines(p.read_text(encoding="utf-8"))
    while lines and not lines[-1].strip():
        lines.pop()
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            yield Trajectory.model_validate_json(line)
        except ValueError as exc:
            if i == len(lines) - 1:
                return
            raise ConfigError(f"{p}:{i + 1} is not a trajectory record: {exc}") from exc
