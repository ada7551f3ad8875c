"""The model client: any OpenAI-compatible chat endpoint, with Qwen3's contract handled.

Start here for models: :class:`Model` is what the episode loop needs of one (a protocol:
``complete(messages, tools) -> ModelTurn``); :class:`ChatModel` implements it for an HTTP
endpoint configured by :class:`ModelConfig` (vLLM's, or any OpenAI-compatible one), and the
token-level policy of RL rollouts (``training/rl/policy.py``) implements the same protocol.
What a reply becomes — :class:`~astra_agent.reply.ModelTurn`, the pure parsing and the Qwen3
rules — is in :mod:`astra_agent.reply`; the HTTP is in :mod:`astra_agent.http_client`; this
module joins them, with the retries and the error messages. ChatModel:

* reads reasoning from ``reasoning`` (newer vLLM) or ``reasoning_content``;
* sends the current tool loop's reasoning back and drops earlier turns', as Qwen3's chat
  template does. vLLM 0.32 reads an assistant message's ``reasoning`` (and hands it to the
  template as both ``reasoning`` and ``reasoning_content``) but ignores ``reasoning_content``
  in requests, while older servers read ``reasoning_content``: by default both are sent
  (``reasoning_field``);
* recovers ``<tool_call>{…}</tool_call>`` blocks that the server's parser left in ``content``
  or in the reasoning as calls (a malformed one becomes a call whose arguments fail to parse,
  so the model is told) and counts them, never silently losing one (``recover_calls``);
* takes a finished reply whose only text came back as reasoning (a model that does not think,
  served with a reasoning parser) as the answer, and marks the turn so that the trajectory
  counts it (``answer_in_reasoning``); with ``recover_calls`` off it is marked, not moved;
* retries with exponential backoff on 429, 5xx and dropped connections; a refused connection
  is retried for about a second, then reported with what to do; the start-up check
  (``check_model``, also run by ``async with``) has a short timeout of its own, so that a port
  that accepts connections but never answers fails in seconds, not after ``request_timeout_s``
  times the retries. Failures are :class:`EndpointError` with a ``kind`` to branch on; a
  streamed reply that fails part-way is one too, not retried (its pieces were shown);
* posts the body as built and reads the reply as plain JSON
  (:class:`~astra_agent.http_client.JSONClient`, aiohttp): no SDK models in between, a third
  of the client CPU per reply (``bench/client.py``).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Literal, Protocol, Self, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, field_validator

from astra_agent.errors import ConfigError, ServerError
from astra_agent.http_client import BodyEncoder, HTTPFailure, JSONClient, NotJSON
from astra_agent.reply import (
    DeltaHook,
    ModelTurn,
    ToolCall,
    answer_from_reasoning,
    collect_stream,
    prepare_messages,
    reasoning_field,
    recover,
    recover_tool_calls,
    turn_of,
)
from astra_agent.trajectory import FailureKind

# Imported from here by the rest of the project: the reply's types and the Qwen3 contract live
# in astra_agent.reply, the client of the endpoint here.
__all__ = [
    "DEFAULT_BASE_URL",
    "ChatModel",
    "DeltaHook",
    "EndpointError",
    "Model",
    "ModelConfig",
    "ModelTurn",
    "ToolCall",
    "prepare_messages",
    "reasoning_field",
    "recover",
    "recover_tool_calls",
    "retry_delay",
]

log = logging.getLogger(__name__)

DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"


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


class RetrySettings(Protocol):
    """How a client of an endpoint retries (:class:`ModelConfig`'s fields)."""

    @property
    def max_retries(self) -> int: ...
    @property
    def connect_retry_s(self) -> float: ...
    @property
    def retry_backoff_s(self) -> float: ...


def retry_delay(
    s: RetrySettings, kind: FailureKind, retryable: bool, attempt: int, elapsed: float
) -> float | None:
    """Seconds before the next try of a request that failed (``kind``; attempt ``attempt``,
    ``elapsed`` seconds after the first), or None to give up: never after ``max_retries``
    retries; a refused connection every quarter of ``connect_retry_s`` until that has passed;
    another failure, where ``retryable``, after an exponential backoff from
    ``retry_backoff_s`` with jitter (×0.5–1.5)."""
    if attempt >= s.max_retries:
        return None
    if kind == "unreachable":
        step = s.connect_retry_s / 4
        return step if elapsed + step <= s.connect_retry_s else None
    if not retryable:
        return None
    return float(s.retry_backoff_s * 2**attempt * (0.5 + random.random()))


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
        self._bodies = BodyEncoder("tools")  # an episode's tools are encoded once

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
        kind = exc.kind
        if kind == "status":
            code = exc.status or 0
            retryable = code == 429 or code >= 500
        else:
            retryable = not (kind == "other" or (kind == "timeout" and probe))
        return retry_delay(self.config, kind, retryable, attempt, elapsed)

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
        user: str | None = None,
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
        if user is not None:
            body["user"] = user
        body.update(c.extra_body)
        return body

    async def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        on_delta: DeltaHook | None = None,
        *,
        user: str | None = None,
    ) -> ModelTurn:
        """One model call. With ``on_delta`` the reply is streamed: ``on_delta(kind, text)``
        gets each piece of ``reasoning`` and ``content`` as it arrives. ``user`` is sent as the
        request's ``user`` (OpenAI's end-user tag; τ² names the conversation there)."""
        model = await self.model_name()
        stream = on_delta is not None
        messages = prepare_messages(messages, self.config.reasoning_field)
        body = self._body(model, messages, tools, stream, user)
        t0 = time.monotonic()
        timeout = self.config.request_timeout_s
        try:
            data = self._bodies.encode(body)
            if stream:
                assert on_delta is not None
                # A streamed reply may take long: each read must come within the timeout.
                events = await self._with_retries(
                    lambda: _first_event(self._http.stream("/chat/completions", data, timeout))
                )
                turn = await collect_stream(events, on_delta)
            else:
                # A plain reply must arrive within request_timeout_s in all.
                r = await self._with_retries(
                    lambda: self._http.post("/chat/completions", data, timeout)
                )
                turn = turn_of(r)
        except HTTPFailure as exc:  # mid-stream: what was shown cannot be taken back
            raise self._error(exc, probe=False) from exc
        except (ValueError, TypeError, AttributeError, KeyError) as exc:
            raise ServerError(
                f"{self.config.base_url} returned a malformed chat completion "
                f"({type(exc).__name__}: {str(exc)[:200]})"
            ) from exc
        turn.latency_s = time.monotonic() - t0
        return recover(turn) if self.config.recover_calls else answer_from_reasoning(turn, False)

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
