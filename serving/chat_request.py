"""The chat request ``astra-serve up --engine hf`` accepts, and the error body it answers with.

:class:`ChatRequest` is vLLM's ``ChatCompletionRequest`` in shape and bounds, for the fields
this server reads: ``messages`` (OpenAI's roles; content a string, a list of text parts, or
null for an assistant's tool calls), ``max_tokens`` and ``max_completion_tokens`` ≥ 1,
``temperature`` finite in [0, 2], ``top_p`` in (0, 1], ``top_k`` ≥ -1, ``seed`` a 64-bit
signed integer, ``n`` 1, ``tools`` each a function whose ``parameters`` is an object,
``tool_choice`` consistent with them (vLLM's ``check_tool_usage``), ``stream_options`` only
with ``stream``, ``chat_template_kwargs`` an object. Other fields are accepted and ignored, as
vLLM's ``extra="allow"`` does (``stop``, ``logprobs``… are not implemented by this server).

Every refusal is a :class:`RequestError`: an HTTP status and vLLM's ``ErrorResponse`` body
(``{"error": {"message", "type", "param", "code"}}``) whose ``param`` and message name the
field.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
_REPORTED_ERRORS = 5  # a body with thousands of bad items gets a bounded message


class RequestError(Exception):
    """A request answered with an error: ``status`` and vLLM's error body (see :meth:`body`).
    A client's error is a 4xx; the one 5xx is what the server could not do for a valid request
    (a ``tool_choice`` its model did not meet: :mod:`serving.hf_server`)."""

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        status: int = 400,
        type: str = "BadRequestError",
    ) -> None:
        super().__init__(message)
        self.message, self.param, self.status, self.type = message, param, status, type

    def body(self) -> dict[str, Any]:
        return error_body(self.message, type=self.type, param=self.param, code=self.status)


def error_body(message: str, *, type: str, code: int, param: str | None = None) -> dict[str, Any]:
    """vLLM's ``ErrorResponse``: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


class _Open(BaseModel):
    """Unknown fields are kept and ignored, as in vLLM's ``OpenAIBaseModel``."""

    model_config = ConfigDict(extra="allow")


class TextPart(_Open):
    type: Literal["text"]
    text: str


Content = str | list[TextPart]


class CalledFunction(_Open):
    name: str
    arguments: str


class ToolCall(_Open):
    id: str | None = None
    type: Literal["function"] = "function"
    function: CalledFunction


Role = Literal["system", "developer", "user", "assistant", "tool", "function"]


class Message(_Open):
    """One message, in one of OpenAI's roles. (vLLM also takes any other role, as a custom-role
    message, and leaves it to the template: Qwen3's drops it from the prompt without a word.
    Here that is a 400 naming the role.)"""

    role: Role
    content: Content | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning: str | None = None

    def for_template(self) -> dict[str, Any]:
        """The message as the chat template reads it: text parts joined into one string (the
        "string" content format vLLM renders text-only models with), fields as sent."""
        out = self.model_dump(exclude_unset=True)
        if isinstance(self.content, list):
            out["content"] = "\n".join(p.text for p in self.content)
        return out


class FunctionDefinition(_Open):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Open):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(_Open):
    name: str


class NamedToolChoice(_Open):
    type: Literal["function"] = "function"
    function: NamedFunction


Finite = Field(allow_inf_nan=False)


class ChatRequest(_Open):
    """A ``POST /v1/chat/completions`` body, validated (see the module's docstring)."""

    messages: list[Message] = Field(min_length=1)
    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    n: int | None = 1
    temperature: Annotated[float, Finite, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Finite, Field(gt=0, le=1)] | None = None
    top_k: int | None = Field(None, ge=-1)
    min_p: Annotated[float, Finite, Field(ge=0, le=1)] | None = None
    seed: int | None = Field(None, ge=INT64_MIN, le=INT64_MAX)
    stream: bool | None = False
    stream_options: dict[str, Any] | None = None
    ignore_eos: bool = False
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    @field_validator("n")
    @classmethod
    def _one_choice(cls, n: int | None) -> int | None:
        if n not in (None, 1):
            raise ValueError("this server samples one choice a request (n=1)")
        return n

    @field_validator("tools")
    @classmethod
    def _tools_not_empty(cls, tools: list[Tool] | None) -> list[Tool] | None:
        if tools == []:
            raise ValueError("`tools` must not be an empty array; omit it instead")
        return tools

    @model_validator(mode="after")
    def _consistent(self) -> ChatRequest:
        for i, m in enumerate(self.messages):
            if m.content is None and m.role in ("system", "developer", "user", "tool"):
                msg = f"a {m.role} message needs `content`"
                raise RequestError(msg, param=f"messages.{i}.content")
        if self.stream_options and not self.stream:
            msg = "`stream_options` is only allowed with `stream: true`"
            raise RequestError(msg, param="stream_options")
        choice = self.tool_choice
        if choice is None or choice == "none":
            return self
        if not self.tools:
            msg = "When using `tool_choice`, `tools` must be set."
            raise RequestError(msg, param="tool_choice")
        if isinstance(choice, NamedToolChoice) and choice.function.name not in {
            t.function.name for t in self.tools
        }:
            raise RequestError(
                f"The tool specified in `tool_choice` ({choice.function.name!r}) does not match "
                "any of the specified `tools`",
                param="tool_choice",
            )
        return self

    @property
    def asked_tokens(self) -> int | None:
        """The reply's bound the request sets (``max_completion_tokens`` over ``max_tokens``)."""
        return self.max_completion_tokens or self.max_tokens


def parse_chat_request(body: Any) -> ChatRequest:
    """``body`` (decoded JSON) as a :class:`ChatRequest`, or the :class:`RequestError` naming
    the first field at fault (and how many more are)."""
    if not isinstance(body, dict):
        raise RequestError(f"the body must be a JSON object, not {_json_type(body)}")
    try:  # a RequestError of a consistency check passes through pydantic as it is
        return ChatRequest.model_validate(body)
    except ValidationError as exc:
        raise _request_error(exc) from None


def _request_error(exc: ValidationError) -> RequestError:
    errors = exc.errors(include_url=False)
    param = _param(errors[0]["loc"])
    lines = [f"{_param(e['loc']) or 'body'}: {_summary(e)}" for e in errors[:_REPORTED_ERRORS]]
    if len(errors) > _REPORTED_ERRORS:
        lines.append(f"...and {len(errors) - _REPORTED_ERRORS} more")
    n = len(errors)
    message = f"{n} validation error{'s' if n > 1 else ''}: " + "; ".join(lines)
    return RequestError(message, param=param or None)


def _param(loc: tuple[int | str, ...]) -> str:
    """A pydantic location as a dotted field path, union branches left out:
    ``('messages', 0, 'content', 'str')`` → ``messages.0.content``."""
    return ".".join(str(p) for p in loc if not _union_branch(str(p)))


def _union_branch(segment: str) -> bool:
    return "[" in segment or segment in _BRANCHES


def _summary(err: Any) -> str:
    """pydantic's message, with the value at fault when it is a scalar (cut short)."""
    msg = str(err["msg"]).removeprefix("Value error, ")
    value = err.get("input")
    if isinstance(value, str | int | float | bool):
        shown = repr(value)
        msg += f" (got {shown if len(shown) <= 60 else shown[:57] + '...'})"
    return msg


def _json_type(value: Any) -> str:
    names = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")


_BRANCHES = {"str", "int", "float", "bool", TextPart.__name__, NamedToolChoice.__name__}
