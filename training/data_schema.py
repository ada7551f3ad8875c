"""The shape of a conversation that can be trained on, checked before anything renders it.

``astra-train data sft`` rejects a record with the first problem found, by name:

* **field types** (:class:`Message`, :func:`tools_problem`) — ``invalid_messages``: a role other
  than system/user/assistant/tool; content that is not a string or a list of text parts (a
  dict or a number would be rendered as its Python text, an image part silently dropped); null
  content except on an assistant message that carries tool calls (anything else would train an
  empty reply); reasoning that is not a string; ``tool_calls`` that are not a list of objects,
  or on a message that is not the assistant's; a ``tool_call_id`` that is not a string.
  ``invalid_tools``: a tool that is not an object with a function name. Fields the template
  does not read are tolerated.
* **order** (:func:`order_problem`) — what no model-driven conversation holds:
  ``misplaced_system`` a system message anywhere but first; ``consecutive_user`` /
  ``consecutive_assistant`` two messages of one side in a row (tool results in between make
  them a tool loop, which is fine); ``unanswered_tool_call`` a call with no result before the
  conversation goes on, or only some of parallel calls answered; ``orphan_tool_result`` a
  result with no call before it, more results than calls, or a ``tool_call_id`` that names no
  call of that assistant message (or one already answered). Results answer calls by
  ``tool_call_id`` where the calls have ids, else in order. Calls left unanswered by the *last*
  message are fine: the episode (or a truncation at a turn boundary) ended at a call.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator

Problem = tuple[str, str]  # (reason, detail)


ROLES = ("system", "user", "assistant", "tool")


class Message(BaseModel):
    """One chat message as the chat template reads it (validation only: records keep their
    own dicts, so what is written is what was read)."""

    model_config = ConfigDict(extra="allow", strict=True)

    role: Literal["system", "user", "assistant", "tool"]
    content: Any = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None

    @field_validator("role", mode="before")
    @classmethod
    def _role(cls, value: Any) -> Any:
        if value not in ROLES:
            raise ValueError(f"role {str(value)[:40]!r} is not system, user, assistant or tool")
        return value

    @field_validator("content", mode="before")
    @classmethod
    def _content(cls, value: Any) -> Any:
        if value is None or isinstance(value, str):
            return value
        if not isinstance(value, list):
            raise ValueError(
                f"content must be a string or a list of text parts, not {type(value).__name__}"
            )
        for k, part in enumerate(value):
            if not (
                isinstance(part, dict)
                and part.get("type") == "text"
                and isinstance(part.get("text"), str)
            ):
                raise ValueError(
                    f"content part {k} is not a text part ({{'type': 'text', 'text': …}}): "
                    "the template renders nothing else"
                )
        return value

    @field_validator("tool_calls", mode="before")
    @classmethod
    def _calls(cls, value: Any) -> Any:
        if value is None:
            return value
        if not isinstance(value, list):
            raise ValueError(f"tool_calls must be a list, not {type(value).__name__}")
        for k, call in enumerate(value):
            if not isinstance(call, dict):
                raise ValueError(f"tool call {k} must be an object, not {type(call).__name__}")
        return value

    @model_validator(mode="after")
    def _content_and_calls(self) -> Message:
        if self.tool_calls and self.role != "assistant":
            raise ValueError(f"a {self.role} message with tool_calls: only the assistant calls")
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError(
                "content is null or missing (only an assistant message with tool_calls may "
                "have none)"
            )
        return self

    def call_ids(self) -> list[str | None]:
        """Each call's id (None where it has none)."""
        ids = [c.get("id") for c in self.tool_calls or []]
        return [i if isinstance(i, str) and i else None for i in ids]


def _error_text(exc: ValidationError) -> str:
    first = exc.errors()[0]
    if first["type"] == "value_error":
        return str(first["ctx"]["error"])
    where = ".".join(str(p) for p in first["loc"])
    return f"{where}: {first['msg']}" if where else str(first["msg"])


def parse_messages(raw: list[Any]) -> list[Message] | Problem:
    """The messages validated, or the first ``invalid_messages`` problem."""
    if not raw:
        return "invalid_messages", "no messages"
    out: list[Message] = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict):
            return "invalid_messages", f"message {i} must be an object, not {type(m).__name__}"
        try:
            out.append(Message.model_validate(m))
        except ValidationError as exc:
            return "invalid_messages", f"message {i}: {_error_text(exc)}"[:300]
    return out


def tools_problem(tools: list[Any]) -> Problem | None:
    """``invalid_tools`` if a tool is not an object with a function name."""
    for k, tool in enumerate(tools):
        if not isinstance(tool, dict):
            return "invalid_tools", f"tool {k} must be an object, not {type(tool).__name__}"
        fn = tool.get("function", tool)
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str) or not name:
            return "invalid_tools", f"tool {k} has no function name"
    return None


class _Calls:
    """The calls of one assistant message, answered one tool result at a time."""

    def __init__(self, at: int, message: Message) -> None:
        self.at = at
        self.ids = message.call_ids()
        self.waiting: list[int] = list(range(len(self.ids)))  # indices of unanswered calls
        self.by_id = any(i is not None for i in self.ids)

    def answer(self, index: int, result: Message) -> Problem | None:
        cid = result.tool_call_id
        if self.by_id and cid is not None:
            match = [k for k in self.waiting if self.ids[k] == cid]
            if match:
                self.waiting.remove(match[0])
                return None
            how = "answers a call already answered" if cid in self.ids else "names no call"
            return (
                "orphan_tool_result",
                f"message {index}: tool_call_id {cid[:60]!r} {how} of message {self.at}",
            )
        if not self.waiting:
            return (
                "orphan_tool_result",
                f"message {index}: more tool results than the {len(self.ids)} calls of "
                f"message {self.at}",
            )
        self.waiting.pop(0)
        return None

    def unanswered(self, before: int | None) -> Problem:
        n, left = len(self.ids), len(self.waiting)
        when = f" before message {before}" if before is not None else ""
        return (
            "unanswered_tool_call",
            f"message {self.at}: {left} of its {n} tool calls got no result{when}",
        )


def order_problem(messages: list[Message]) -> Problem | None:
    """The first message out of the order a model-driven conversation has (see the module)."""
    calls: _Calls | None = None  # the assistant message whose calls the next results answer
    prev = ""
    for i, m in enumerate(messages):
        if m.role == "tool":
            if calls is None:
                return "orphan_tool_result", f"message {i}: a tool result with no call before it"
            problem = calls.answer(i, m)
            if problem:
                return problem
        else:
            if calls is not None and calls.waiting:
                return calls.unanswered(i)
            calls = None
            if m.role == "system" and i > 0:
                return "misplaced_system", f"message {i}: a system message after the start"
            if m.role == prev and m.role in ("user", "assistant"):
                detail = f"messages {i - 1} and {i} are both {m.role} messages"
                return f"consecutive_{m.role}", detail
            if m.role == "assistant" and m.tool_calls:
                calls = _Calls(i, m)
        prev = m.role
    if calls is not None and calls.waiting and len(calls.waiting) < len(calls.ids):
        return calls.unanswered(None)  # some of parallel calls answered, the rest never
    return None


def conversation_problem(raw: list[Any], tool_lists: list[list[Any]]) -> Problem | None:
    """The first shape or order problem of a record's messages and tools (None: none)."""
    messages = parse_messages(raw)
    if isinstance(messages, tuple):
        return messages
    for tools in tool_lists:
        problem = tools_problem(tools)
        if problem:
            return problem
    return order_problem(messages)
