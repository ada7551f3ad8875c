"""The model client: any OpenAI-compatible chat endpoint, with Qwen3's contract handled.

* reasoning is read from ``reasoning`` (newer vLLM) or ``reasoning_content``;
* the current tool loop's reasoning is sent back; earlier turns' reasoning is dropped, as
  Qwen3's chat template does. vLLM 0.32 reads an assistant message's ``reasoning`` (and hands
  it to the template as both ``reasoning`` and ``reasoning_content``) but ignores
  ``reasoning_content`` in requests, while older servers read ``reasoning_content``: by default
  both are sent (``reasoning_field``);
* ``<tool_call>{…}</tool_call>`` blocks that the server's parser left in ``content`` or in the
  reasoning are recovered as calls (a malformed one becomes a call whose arguments fail to
  parse, so the model is told) and counted, never silently lost;
* retries with exponential backoff on 429, 5xx and dropped connections; a refused connection
  is retried for about a second, then reported with what to do; the start-up check
  (``check_model``, also run by ``async with``) has a short timeout of its own, so that a port
  that accepts connections but never answers fails in seconds, not after ``request_timeout_s``
  times the retries. Failures are :class:`EndpointError` with a ``kind`` to branch on; a
  streamed reply that fails part-way is one too, not retried (its pieces were shown);
* the body is posted as built and the reply read as plain JSON
  (:class:`~astra_agent.http_client.JSONClient`, aiohttp): no SDK models in between, a third
  of the client CPU per reply (``bench/client.py``).

:class:`Model` is what the episode loop needs of a model; :class:`ChatModel` implements it for
an HTTP endpoint, and a token-level policy (RL rollouts) implements the same protocol.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, Self, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, field_validator

from astra_agent.errors import ConfigError, ServerError
from astra_agent.http_client import HTTPFailure, JSONClient, NotJSON
from astra_agent.trajectory import FailureKind

log = logging.getLogger(__name__)

DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"
TOOL_CALL_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)


class ModelConfig(BaseModel):
    """Endpoint and sampling. Defaults: the local server `astra-serve up` starts, and Qwen3's
    recommended thinking-mode sampling."""

    model_config = ConfigDict(extra="forbid")

    base_url: str = DEFAULT_BASE_URL
    api_key: str | None = None
    model: str | None = None  # None: the first model the endpoint lists
    temperature: float = Field(0.6, ge=0.0, le=2.0)
    top_p: float = Field(0.95, gt=0.0, le=1.0)
    top_k: int | None = 20
    min_p: float | None = 0.0
    max_tokens: int | None = Field(None, ge=1)
    request_timeout_s: float = Field(600.0, gt=0)
    probe_timeout_s: float = Field(
        10.0, gt=0, description="timeout of the start-up check (`check_model`), not retried"
    )
    max_retries: int = Field(4, ge=0)
    retry_backoff_s: float = Field(0.5, ge=0)
    connect_retry_s: float = Field(
        1.0, ge=0, description="how long a refused connection is retried before giving up"
    )
    extra_body: dict[str, Any] = Field(default_factory=dict)
    reasoning_field: Literal["both", "reasoning", "reasoning_content"] = "both"
    recover_calls: bool = Field(
        True,
        description="take <tool_call> blocks the server's parser left in the text as calls "
        "(off where the reply must be scored as the server returned it: BFCL)",
    )

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        """An http(s) URL with a host: anything else would fail only after the retries."""
        from urllib.parse import urlsplit

        try:
            url = urlsplit(value)
            ok = url.scheme in ("http", "https") and bool(url.hostname) and url.port != 0
        except ValueError:  # a port that is not a number, or out of range
            ok = False
        if not ok:
            raise ValueError(f"{value!r} is not an http(s) URL, e.g. {DEFAULT_BASE_URL}")
        return value

    def fingerprint(self) -> dict[str, Any]:
        """What decides a run's results (endpoint, model, sampling): --resume must match it."""
        return {
            "base_url": self.base_url,
            "model": self.model,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "max_tokens": self.max_tokens,
        }


@dataclass
class ToolCall:
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
    content: str
    reasoning: str
    tool_calls: list[ToolCall]
    finish_reason: str | None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    recovered: int = 0
    latency_s: float = 0.0
    raw: dict[str, Any] = field(default_factory=dict)

    def to_message(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.reasoning:
            msg["reasoning_content"] = self.reasoning
        if self.tool_calls:
            msg["tool_calls"] = [c.to_message() for c in self.tool_calls]
        return msg


DeltaHook = Callable[[str, str], None]


@runtime_checkable
class Model(Protocol):
    """What :func:`~astra_agent.episode.run_episode` needs of a model, and all it uses.

    ``complete`` takes the episode's OpenAI-format messages and tool schemas and returns one
    assistant turn; ``on_delta(kind, text)``, when given, receives pieces of ``"reasoning"``
    and ``"content"`` as they are produced (an implementation that cannot stream may ignore
    it). A failure that should end the episode as ``model_error`` is raised as
    :class:`~astra_agent.errors.ServerError` (an :class:`EndpointError` carries its ``kind``);
    anything else propagates. ``name`` is recorded in the trajectory (empty until known).
    Extra per-turn data (token ids, log-probs of a token-level policy) rides on
    ``ModelTurn.raw``. Subclass this protocol to inherit ``async with`` (enter: nothing,
    exit: ``close``).
    """

    @property
    def name(self) -> str: ...

    async def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        on_delta: DeltaHook | None = None,
    ) -> ModelTurn: ...

    async def close(self) -> None:
        """Release connections and processes. Safe to call twice."""
        ...

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class EndpointError(ServerError):
    """A call to the model's endpoint failed (after its retries). ``kind`` says how —
    ``unreachable`` (refused, no route), ``timeout``, ``dropped`` (closed mid-request),
    ``status`` (an HTTP error: ``status_code``), ``other`` — for code that must branch on it."""

    def __init__(
        self,
        message: str,
        *,
        kind: FailureKind,
        url: str,
        status_code: int | None = None,
        hint: str | None = None,
    ) -> None:
        super().__init__(message, hint=hint)
        self.kind: FailureKind = kind
        self.url = url
        self.status_code = status_code


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


class ChatModel(Model):
    """Async client for an OpenAI-compatible chat endpoint (vLLM first), over
    :class:`~astra_agent.http_client.JSONClient`.

    Use it as ``async with ChatModel(cfg) as model:`` — entering checks the endpoint
    (:meth:`check_model`), leaving closes its HTTP session — or call :meth:`close` yourself.
    """

    def __init__(self, config: ModelConfig | None = None, **overrides: Any) -> None:
        self.config = (config or ModelConfig()).model_copy(update=overrides)
        # Sent as before with the OpenAI SDK: a bearer token even where none is configured.
        self._http = JSONClient(self.config.base_url, api_key=self.config.api_key or "EMPTY")
        self._model = self.config.model

    @property
    def name(self) -> str:
        """The model's name once known (configured, or the first one the endpoint lists)."""
        return self._model or ""

    @property
    def closed(self) -> bool:
        return self._http.closed

    async def _served(self) -> list[str]:
        """The ids the endpoint serves; a short timeout (``probe_timeout_s``), not retried."""
        timeout = self.config.probe_timeout_s
        models = await self._with_retries(lambda: self._http.get("/models", timeout), probe=True)
        data = models.get("data") if isinstance(models, dict) else None
        ids = (
            [m.get("id") if isinstance(m, dict) else None for m in data]
            if isinstance(data, list)
            else [None]
        )
        if not all(isinstance(i, str) and i for i in ids):
            raise ServerError(
                f"{self.config.base_url}/models did not return a model list",
                hint="is this an OpenAI-compatible endpoint?",
            )
        return [str(i) for i in ids]

    async def model_name(self) -> str:
        if self._model is None:
            self._adopt(await self._served())
        assert self._model is not None
        return self._model

    def _adopt(self, ids: list[str]) -> None:
        """No model configured: take the first one served."""
        if not ids:
            raise ServerError(f"{self.config.base_url} serves no model")
        self._model = ids[0]

    async def check_model(self) -> str:
        """Fail early if the endpoint does not answer (:class:`EndpointError`, in seconds) or
        does not serve the configured model (:class:`ConfigError`); return the model's name."""
        ids = await self._served()
        if self._model is not None and self._model not in ids:
            raise ConfigError(
                f"model {self._model!r} is not served at {self.config.base_url}; "
                f"served: {', '.join(ids) or 'none'}"
            )
        if self._model is None:
            self._adopt(ids)
        return await self.model_name()

    async def __aenter__(self) -> Self:
        try:
            await self.check_model()
        except BaseException:
            await self.close()
            raise
        return self

    async def _with_retries(self, call: Callable[[], Awaitable[Any]], probe: bool = False) -> Any:
        attempt, t0 = 0, time.monotonic()
        while True:
            try:
                return await call()
            except NotJSON as exc:
                url = self.config.base_url
                raise EndpointError(
                    f"{url}: the reply is not a valid response ({exc})",
                    kind="other",
                    url=url,
                    hint="is this an OpenAI-compatible endpoint?",
                ) from exc
            except HTTPFailure as exc:
                delay = self._retry_delay(exc, attempt, time.monotonic() - t0, probe)
                if delay is None:
                    raise self._error(exc, probe) from exc
                log.warning("%s; retry %d in %.1f s", exc.what, attempt + 1, delay)
                attempt += 1
                await asyncio.sleep(delay)

    def _retry_delay(
        self, exc: HTTPFailure, attempt: int, elapsed: float, probe: bool
    ) -> float | None:
        """Seconds before the next try, or None to give up. A refused connection is retried
        for ``connect_retry_s`` only; the start-up check's timeout is not retried."""
        c, kind = self.config, exc.kind
        if attempt >= c.max_retries:
            return None
        if kind == "unreachable":
            step = c.connect_retry_s / 4
            return step if elapsed + step <= c.connect_retry_s else None
        if kind == "status":
            code = exc.status or 0
            if not (code == 429 or code >= 500):
                return None
        elif kind == "other" or (kind == "timeout" and probe):
            return None
        return float(c.retry_backoff_s * 2**attempt * (0.5 + random.random()))

    def _error(self, exc: HTTPFailure, probe: bool) -> EndpointError:
        url = self.config.base_url
        hint = None
        what = exc.what
        if exc.kind == "unreachable":
            hint = f"is a server running at {url}? start one with `astra-serve up`"
        elif exc.kind == "timeout" and probe:
            what = f"request timed out: no answer within {self.config.probe_timeout_s:g} s"
            hint = (
                f"something accepts connections at {url} but does not answer: is the server "
                "still starting, or is another program listening there?"
            )
        return EndpointError(
            f"{url}: {what}", kind=exc.kind, url=url, status_code=exc.status, hint=hint
        )

    def _body(
        self,
        model: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        stream: bool,
    ) -> dict[str, Any]:
        """The request's JSON body: sampling settings, then ``extra_body`` (which wins)."""
        c = self.config
        body: dict[str, Any] = {
            "model": model,
            "messages": messages,
            "temperature": c.temperature,
            "top_p": c.top_p,
            "stream": stream,
        }
        if c.max_tokens is not None:
            body["max_tokens"] = c.max_tokens
        if c.top_k is not None:
            body["top_k"] = c.top_k
        if c.min_p is not None:
            body["min_p"] = c.min_p
        if tools:
            body["tools"] = tools
        if stream:
            body["stream_options"] = {"include_usage": True}
        body.update(c.extra_body)
        return body

    async def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        on_delta: DeltaHook | None = None,
    ) -> ModelTurn:
        """One model call. With ``on_delta`` the reply is streamed: ``on_delta(kind, text)``
        gets each piece of ``reasoning`` and ``content`` as it arrives."""
        model = await self.model_name()
        stream = on_delta is not None
        body = self._body(
            model, prepare_messages(messages, self.config.reasoning_field), tools, stream
        )
        t0 = time.monotonic()
        timeout = self.config.request_timeout_s
        try:
            if stream:
                assert on_delta is not None
                # A streamed reply may take long: each read must come within the timeout.
                events = await self._with_retries(
                    lambda: _first_event(self._http.stream("/chat/completions", body, timeout))
                )
                turn = await _collect_stream(events, on_delta)
            else:
                # A plain reply must arrive within request_timeout_s in all.
                r = await self._with_retries(
                    lambda: self._http.post("/chat/completions", body, timeout)
                )
                turn = _turn_of(r)
        except HTTPFailure as exc:  # mid-stream: what was shown cannot be taken back
            raise self._error(exc, probe=False) from exc
        except (ValueError, TypeError, AttributeError, KeyError) as exc:
            raise ServerError(
                f"{self.config.base_url} returned a malformed chat completion "
                f"({type(exc).__name__}: {str(exc)[:200]})"
            ) from exc
        turn.latency_s = time.monotonic() - t0
        return recover(turn) if self.config.recover_calls else turn

    async def close(self) -> None:
        await self._http.close()


async def _first_event(events: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """``events`` once its first event has arrived (so that a failure to connect or an HTTP
    error is retried like a plain request's), with that event put back in front."""
    try:
        first = await anext(events)
    except StopAsyncIteration:
        first = None

    async def again() -> AsyncIterator[Any]:
        if first is not None:
            yield first
            async for event in events:
                yield event

    return again()


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


def _turn_of(r: Any) -> ModelTurn:
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
    )


async def _collect_stream(events: AsyncIterator[Any], on_delta: DeltaHook) -> ModelTurn:
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


def recover(turn: ModelTurn) -> ModelTurn:
    """Recover calls the server's parsers missed, from content first, then from reasoning."""
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
