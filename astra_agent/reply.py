"""A model's reply as the episode loop sees it, and Qwen3's contract on the wire.

:class:`ModelTurn` — one assistant turn: content, reasoning, tool calls, usage — is what every
:class:`~astra_agent.model.Model` returns. The functions here are the pure part of the
client, no I/O: :func:`prepare_messages` (what is sent: the current tool loop's reasoning kept,
earlier turns' dropped), :func:`turn_of` and :func:`collect_stream` (a chat completion, plain
or streamed, as a turn; anything malformed is a ValueError/TypeError), :func:`recover` and
:func:`recover_tool_calls` (``<tool_call>`` blocks the server's parser left in the text taken
as calls), :func:`stop_token_ids` (the ids that end a turn, for those who sample tokens).
:class:`~astra_agent.model.ChatModel` does the HTTP around them.
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

TOOL_CALL_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
END_OF_TURN = "<|im_end|>"

DeltaHook = Callable[[str, str], None]
"""``on_delta(kind, text)``: a piece of ``"reasoning"`` or ``"content"`` as it arrives."""


@dataclass
class ToolCall:
    """One call of a tool as the model made it (``recovered``: taken from its text)."""

    id: str
    name: str
    arguments: str  # raw JSON text, as the model wrote it
    recovered: bool = False

    def to_message(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass
class ModelTurn:
    """One assistant turn; ``raw`` carries what a model adds (a token policy's ids, log-probs)."""

    content: str
    reasoning: str
    tool_calls: list[ToolCall]
    finish_reason: str | None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    recovered: int = 0
    answer_in_reasoning: bool = False  # the answer came as reasoning (see only_in_reasoning)
    latency_s: float = 0.0
    raw: dict[str, Any] = field(default_factory=dict)

    def to_message(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.reasoning:
            msg["reasoning_content"] = self.reasoning
        if self.tool_calls:
            msg["tool_calls"] = [c.to_message() for c in self.tool_calls]
        return msg


def _new_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def recover_tool_calls(text: str) -> tuple[str, list[ToolCall]]:
    """Pull ``<tool_call>`` blocks out of ``text``; return the rest and the calls found.

    A block that is not JSON with a name still becomes a call (name ``?`` if unknown, the raw
    text as arguments), so the episode loop reports it to the model instead of dropping it.
    """
    if "<tool_call>" not in text:
        return text, []
    calls: list[ToolCall] = []
    for m in TOOL_CALL_BLOCK.finditer(text):
        body = m.group(1).strip()
        try:
            obj = json.loads(body)
            name = obj["name"]
            args = obj.get("arguments", obj.get("parameters", {}))
            if not isinstance(name, str):
                raise TypeError("name is not a string")
            arguments = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
            found = re.search(r'"name"\s*:\s*"([^"]+)"', body)
            name, arguments = (found.group(1) if found else "?"), body
        calls.append(ToolCall(_new_id(), name, arguments, recovered=True))
    rest = TOOL_CALL_BLOCK.sub("", text).strip()
    return rest, calls


def parse_wire_reply(text: str, *, thinks: bool = True) -> tuple[str, str, list[ToolCall]]:
    """(reasoning, content, calls) of a reply's text as Qwen3's contract reads it: vLLM's
    ``qwen3`` reasoning parser (``thinks``: ``<think>…</think>`` is reasoning; off, as with no
    reasoning parser, all of it is content) and its ``hermes`` tool parser (``<tool_call>`` blocks
    are calls, a malformed one still a call whose error the model then reads)."""
    reasoning, content = "", text
    if thinks and THINK_CLOSE in text:
        before, _, content = text.partition(THINK_CLOSE)
        reasoning = before.split(THINK_OPEN, 1)[-1]
    elif thinks and text.lstrip().startswith(THINK_OPEN):  # unclosed: all of it is reasoning
        reasoning, content = text.split(THINK_OPEN, 1)[1], ""
    reasoning, content = reasoning.strip("\n"), content.strip("\n")
    rest, calls = recover_tool_calls(content)
    if not calls and THINK_CLOSE not in text and "<tool_call>" in reasoning:
        reasoning, calls = recover_tool_calls(reasoning)  # a call inside an unclosed <think>
    for c in calls:
        c.recovered = False  # parsed as the server's parsers would, not a recovery
    return reasoning, (rest if calls else content), calls


def stop_token_ids(tokenizer: Any, eos_ids: int | list[int] | None = None) -> tuple[int, ...]:
    """The ids that end an assistant turn: ``<|im_end|>``, the tokenizer's eos, and ``eos_ids``
    (a generation config's ``eos_token_id``, one id or a list). One answer for the two places that
    sample turns, ``serving.hf_server`` and RL's ``training.rl.policy``, so they stop alike. A
    checkpoint without ``<|im_end|>`` in its vocabulary gets no id for it (not the unknown
    token's, which ``convert_tokens_to_ids`` answers)."""
    ids: set[int] = set()
    end = tokenizer.convert_tokens_to_ids(END_OF_TURN)
    if isinstance(end, int) and end != getattr(tokenizer, "unk_token_id", None):
        ids.add(end)
    for i in [tokenizer.eos_token_id, *(eos_ids if isinstance(eos_ids, list) else [eos_ids])]:
        if isinstance(i, int) and i >= 0:
            ids.add(i)
    return tuple(sorted(ids))


def reasoning_field(obj: Any) -> tuple[str, str | None]:
    """The reasoning of a message or delta (a decoded JSON object, or an OpenAI SDK object)
    and the field it came in: ``reasoning`` (newer vLLM) or ``reasoning_content``; ("", None)
    if there is none."""
    if isinstance(obj, dict):
        found = {k: obj.get(k) for k in ("reasoning", "reasoning_content")}
    else:
        extra = getattr(obj, "model_extra", None) or {}
        found = {
            k: getattr(obj, k, None) or extra.get(k) for k in ("reasoning", "reasoning_content")
        }
    for key, value in found.items():
        if value:
            if not isinstance(value, str):
                raise TypeError(f"{key} is a {type(value).__name__}")
            return value, key
    return "", None


def _reasoning_of(obj: Any) -> str:
    return reasoning_field(obj)[0]


def prepare_messages(
    messages: list[dict[str, Any]], reasoning_field: str = "both"
) -> list[dict[str, Any]]:
    """What is sent: reasoning kept only after the last user message (the current tool loop),
    under ``reasoning`` and/or ``reasoning_content``."""
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    out = []
    for i, m in enumerate(messages):
        m = dict(m)
        if m.get("role") == "assistant":
            reasoning = m.pop("reasoning_content", None) or m.pop("reasoning", None)
            m.pop("reasoning", None)
            if reasoning and i > last_user:
                for key in ("reasoning", "reasoning_content"):
                    if reasoning_field in ("both", key):
                        m[key] = reasoning
            if m.get("content") is None:
                m["content"] = ""
        out.append(m)
    return out


def _text(value: Any) -> str:
    """A message's text field: a string, None, or (from some servers) a list of text parts."""
    if value is None or isinstance(value, str):
        return value or ""
    if isinstance(value, list):
        return "".join(p.get("text") or "" if isinstance(p, dict) else str(p) for p in value)
    raise TypeError(f"a text field is a {type(value).__name__}")


def _tokens(usage: Any, key: str) -> int:
    value = usage.get(key, 0) if isinstance(usage, dict) else 0
    return value if isinstance(value, int) and value >= 0 else 0


def _call_of(id_: Any, name: Any, arguments: Any) -> ToolCall:
    """A tool call as received; a name or arguments of another type than text become text
    (the loop then reports them to the model), never an exception."""
    if not isinstance(arguments, str):
        arguments = "{}" if arguments is None else json.dumps(arguments, ensure_ascii=False)
    name = name if isinstance(name, str) else ("" if name is None else str(name))
    return ToolCall(id_ if isinstance(id_, str) and id_ else _new_id(), name, arguments or "{}")


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TypeError(f"{what} is a {type(value).__name__}, not an object")
    return value


def _finish(choice: dict[str, Any]) -> str | None:
    reason = choice.get("finish_reason")
    return reason if isinstance(reason, str) else None


def turn_of(r: Any) -> ModelTurn:
    """A non-streamed chat completion (decoded JSON) as a turn (ValueError/TypeError:
    malformed)."""
    choices = _object(r, "the reply").get("choices")
    if not choices or not isinstance(choices, list):
        raise ValueError("no choices")
    choice = _object(choices[0], "a choice")
    msg = choice.get("message")
    if msg is None:
        raise ValueError("a choice without a message")
    msg = _object(msg, "a message")
    raw_calls = msg.get("tool_calls") or []
    if not isinstance(raw_calls, list):
        raise TypeError(f"tool_calls is a {type(raw_calls).__name__}")
    calls = [
        _call_of(tc.get("id"), tc["function"].get("name"), tc["function"].get("arguments"))
        for tc in raw_calls
        if isinstance(tc, dict) and isinstance(tc.get("function"), dict)
    ]
    usage = r.get("usage")
    return ModelTurn(
        content=_text(msg.get("content")),
        reasoning=_reasoning_of(msg),
        tool_calls=calls,
        finish_reason=_finish(choice),
        prompt_tokens=_tokens(usage, "prompt_tokens"),
        completion_tokens=_tokens(usage, "completion_tokens"),
        # whether the reply carried a tool_calls list (vLLM sends [] with a text reply): a
        # benchmark that stores replies as the official handlers do needs the difference
        raw={"tool_calls_list": isinstance(msg.get("tool_calls"), list)},
    )


async def collect_stream(events: AsyncIterator[Any], on_delta: DeltaHook) -> ModelTurn:
    """A streamed chat completion's events (decoded JSON chunks) as a turn."""
    turn = ModelTurn(content="", reasoning="", tool_calls=[], finish_reason=None)
    parts: dict[int, list[str]] = {}  # index → [id, name, arguments]
    async for chunk in events:
        chunk = _object(chunk, "a chunk")
        if usage := chunk.get("usage"):
            turn.prompt_tokens = _tokens(usage, "prompt_tokens")
            turn.completion_tokens = _tokens(usage, "completion_tokens")
        choices = chunk.get("choices")
        if not choices or not isinstance(choices, list):
            continue
        choice = _object(choices[0], "a choice")
        delta = _object(choice.get("delta") or {}, "a delta")
        reasoning = _reasoning_of(delta)
        if reasoning:
            turn.reasoning += reasoning
            on_delta("reasoning", reasoning)
        if delta.get("content"):
            text = _text(delta["content"])
            turn.content += text
            on_delta("content", text)
        for tc in delta.get("tool_calls") or []:
            tc = _object(tc, "a tool call delta")
            index = tc.get("index", 0)
            slot = parts.setdefault(index if isinstance(index, int) else 0, ["", "", ""])
            slot[0] = tc.get("id") or slot[0]
            function = tc.get("function")
            if isinstance(function, dict):
                slot[1] += function.get("name") or ""
                slot[2] += function.get("arguments") or ""
        turn.finish_reason = _finish(choice) or turn.finish_reason
    turn.tool_calls = [_call_of(*p) for _, p in sorted(parts.items())]
    return turn


def only_in_reasoning(content: str, reasoning: str, calls: int, finish: str | None) -> bool:
    """A finished reply whose answer can only be found in its reasoning: no content, no call,
    reasoning text, stopped (not cut off). vLLM's ``qwen3`` reasoning parser returns exactly
    this for a model that does not think (all text before a ``</think>`` that never comes is
    reasoning): serve such a model without a reasoning parser (profile ``instruct-cpu``)."""
    return not content.strip() and not calls and bool(reasoning.strip()) and finish == "stop"


def answer_from_reasoning(turn: ModelTurn, take: bool) -> ModelTurn:
    """Mark a turn whose answer is only in its reasoning (:func:`only_in_reasoning`), and with
    ``take`` move that text to its content: the answer reaches the user, and the trajectory
    and its counts say where it was found (``answer_in_reasoning``)."""
    if only_in_reasoning(turn.content, turn.reasoning, len(turn.tool_calls), turn.finish_reason):
        turn.answer_in_reasoning = True
        if take:
            log.warning(
                "the answer came back as reasoning, with no content: is a model that does "
                "not think served with a reasoning parser? (taken as the answer, counted)"
            )
            turn.content, turn.reasoning = turn.reasoning.strip(), ""
    return turn


def recover(turn: ModelTurn) -> ModelTurn:
    """Recover calls the server's parsers missed, from content first, then from reasoning,
    and an answer that came back only as reasoning (:func:`answer_from_reasoning`)."""
    if turn.tool_calls:
        return turn
    content, calls = recover_tool_calls(turn.content)
    if calls:
        turn.content = content
    else:
        reasoning, calls = recover_tool_calls(turn.reasoning)
        if calls:
            turn.reasoning = reasoning.replace("</think>", "").strip()
    if calls:
        log.info("recovered %d tool call(s) the server's parser left in text", len(calls))
        turn.tool_calls, turn.recovered = calls, len(calls)
        if turn.finish_reason == "stop":
            turn.finish_reason = "tool_calls"
        return turn
    return answer_from_reasoning(turn, take=True)
