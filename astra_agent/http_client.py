"""The HTTP client of the model's endpoint: JSON over aiohttp, as lean as a bare POST.

:class:`JSONClient` posts a body as built and decodes the reply with the standard library:
no typed request or response models in between. The OpenAI SDK did that walk on every
request and reply, and cost 1.1–3.6 ms of client CPU per reply where a bare aiohttp POST of
the same body costs 0.3–0.5 ms (``bench/client.py``); it also built an SSL context for every
client, plain-http ones included.

One attempt either returns the decoded JSON or raises :class:`HTTPFailure`, whose ``kind``
says how it failed — ``unreachable`` (refused, no route, no such host), ``timeout``,
``dropped`` (closed mid-request), ``status`` (an HTTP error: ``status``), ``other`` — or
:class:`NotJSON` for a reply that is not JSON. Retries are the caller's
(:class:`~astra_agent.model.ChatModel` retries with backoff and its own messages).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from astra_agent.runio import dumps_json, loads_text
from astra_agent.trajectory import FailureKind

_JSON = {"Content-Type": "application/json", "Accept": "application/json"}
_MAX_ERROR_CHARS = 300
MAX_BODY_BYTES = 256 * 2**20  # a reply, or one streamed event: far above any chat completion


class HTTPFailure(Exception):
    """One request that failed: ``kind`` (see the module doc), ``what`` (one line) and the
    HTTP ``status`` when the server answered with an error."""

    def __init__(self, kind: FailureKind, what: str, status: int | None = None) -> None:
        super().__init__(what)
        self.kind: FailureKind = kind
        self.what = what
        self.status = status


class NotJSON(ValueError):
    """The endpoint answered (2xx) with a body that is not JSON text."""


def error_message(raw: bytes) -> str:
    """An error reply's text: the server's ``{"error": {"message": …}}`` (or ``"error": "…"``,
    ``"message": "…"``), else the start of the body."""
    text = raw.decode("utf-8", errors="replace")
    try:
        obj = json.loads(text)
    except ValueError:
        return text.strip()[:_MAX_ERROR_CHARS]
    if isinstance(obj, dict):
        err = obj.get("error")
        msg = err.get("message") if isinstance(err, dict) else err or obj.get("message")
        if isinstance(msg, str) and msg:
            return msg[:_MAX_ERROR_CHARS]
    return text.strip()[:_MAX_ERROR_CHARS]


def decode(raw: bytes) -> Any:
    """A reply body as JSON, a lone surrogate in its strings (``"\\ud800"``: not Unicode, so
    no record holding it could be written) replaced by U+FFFD; :class:`NotJSON` saying why it is
    not JSON. The one rule for every client of an endpoint (synthesis, the evals): a body that
    is not UTF-8 is not a reply, whatever charset it claims (``json.loads`` of bytes would take
    UTF-16 or 32, and a surrogate encoded as UTF-8; ``requests`` would put U+FFFD in it)."""
    try:
        raw.decode("utf-8")  # strictly, before json.loads picks an encoding of its own
        return loads_text(raw)
    except UnicodeDecodeError as exc:
        raise NotJSON("the body is not UTF-8 text") from exc
    except ValueError as exc:
        if not raw.strip():
            raise NotJSON("the body is empty") from exc
        raise NotJSON(f"the body is not JSON: {str(exc)[:200]}; it starts {raw[:80]!r}") from exc


def failure_of(exc: BaseException) -> HTTPFailure:
    """What a transport exception means (``TimeoutError`` is a request over its time)."""
    if isinstance(exc, TimeoutError | aiohttp.ServerTimeoutError):
        return HTTPFailure("timeout", "request timed out")
    if isinstance(exc, aiohttp.ClientConnectorError):  # refused, no route, DNS (a subclass)
        return HTTPFailure("unreachable", f"cannot connect ({exc.os_error or exc})")
    if isinstance(
        exc,
        aiohttp.ServerDisconnectedError
        | aiohttp.ClientPayloadError
        | aiohttp.ClientOSError
        | ConnectionError,
    ):
        return HTTPFailure("dropped", f"connection failed ({type(exc).__name__}: {exc})")
    return HTTPFailure("other", f"{type(exc).__name__}: {str(exc)[:_MAX_ERROR_CHARS]}")


_TRANSPORT_ERRORS = (aiohttp.ClientError, TimeoutError, OSError)


class BodyEncoder:
    """A JSON object body as ``json.dumps`` writes it, byte for byte, with the text of one
    member (``key``) kept from an earlier body while its value is the same object, or a list
    of the same objects, and still equal to what was encoded. A chat request's ``tools`` are
    most of the request's encoding (dozens of small objects), while its messages change: the
    same list at every step of an episode, and, where the tools' schemas are built once (BFCL),
    a new list of the same schemas at every turn. The texts of the last ``keep`` values are
    kept (an episode in flight each, 64 by default: a long tool list is ~100 kB, held with its
    text and a decoded copy); a kept value (a list's items) is held, so that its ``id`` is not
    another object's. Not seen: a change in place to an equal value of another JSON type
    (``1`` for ``true``)."""

    def __init__(self, key: str, keep: int = 64) -> None:
        self.key, self.keep = key, keep
        self._kept: dict[tuple[int, ...], tuple[Any, Any, str]] = {}  # ids → (held, decoded, text)

    def encode(self, body: dict[str, Any]) -> bytes:
        value = body.get(self.key)
        if not value or not all(isinstance(k, str) for k in body):
            return dumps_json(body).encode()
        held = tuple(value) if type(value) is list else value
        ids = tuple(map(id, held)) if type(value) is list else (id(value),)
        kept = self._kept.get(ids)
        if kept is None or kept[1] != value:  # new, or changed in place since
            text = dumps_json(value)
            kept = (held, json.loads(text), text)
            self._kept.pop(ids, None)
            if len(self._kept) >= self.keep:
                del self._kept[next(iter(self._kept))]
            self._kept[ids] = kept
        members = (
            f"{dumps_json(k)}: {kept[2] if k == self.key else dumps_json(v)}"
            for k, v in body.items()
        )
        return ("{" + ", ".join(members) + "}").encode()


def _data(body: dict[str, Any] | bytes) -> bytes:
    return body if isinstance(body, bytes) else dumps_json(body).encode()


class JSONClient:
    """JSON requests to ``base_url`` (``…/v1``) over one aiohttp session, opened on first use
    in the running event loop; ``api_key`` goes as a bearer token. ``close`` is idempotent."""

    def __init__(self, base_url: str, api_key: str | None = None, max_connections: int = 0):
        self.base_url = base_url.rstrip("/")
        self._headers = dict(_JSON)
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._limit = max_connections  # 0: no limit (the caller bounds its concurrency)
        self._session: aiohttp.ClientSession | None = None
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def _open(self) -> aiohttp.ClientSession:
        if self._closed:
            raise HTTPFailure("other", "the client is closed")
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._limit),
                headers=self._headers,
                timeout=aiohttp.ClientTimeout(total=None),  # each request says its own
            )
        return self._session

    async def get(self, path: str, timeout_s: float) -> Any:
        """GET ``path``; the decoded reply (:class:`HTTPFailure`, :class:`NotJSON`)."""
        return await self._request("GET", path, None, timeout_s)

    async def post(self, path: str, body: dict[str, Any] | bytes, timeout_s: float) -> Any:
        """POST ``body`` (JSON, or its text already encoded); the decoded reply, which must
        arrive within ``timeout_s`` in all, even one that trickles (:class:`HTTPFailure`,
        :class:`NotJSON`)."""
        return await self._request("POST", path, _data(body), timeout_s)

    async def _request(self, method: str, path: str, data: bytes | None, timeout_s: float) -> Any:
        try:
            async with asyncio.timeout(timeout_s):
                async with self._open().request(method, self.base_url + path, data=data) as r:
                    raw = await _read_bounded(r)
                    status = r.status
        except _TRANSPORT_ERRORS as exc:
            raise failure_of(exc) from exc
        if status >= 400:
            raise HTTPFailure("status", f"HTTP {status}: {error_message(raw)}", status)
        return decode(raw)

    async def stream(
        self, path: str, body: dict[str, Any] | bytes, read_timeout_s: float
    ) -> AsyncIterator[Any]:
        """POST ``body`` and yield the JSON events of the server-sent event stream it answers
        with, up to ``data: [DONE]``; each read must come within ``read_timeout_s``. An error
        before the first event is an :class:`HTTPFailure` like :meth:`post`'s; an event that
        is ``{"error": …}`` is one of kind ``other``."""
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=read_timeout_s, sock_read=read_timeout_s
        )
        data = _data(body)
        try:
            async with self._open().post(self.base_url + path, data=data, timeout=timeout) as r:
                if r.status >= 400:
                    raw = await _read_bounded(r)
                    raise HTTPFailure("status", f"HTTP {r.status}: {error_message(raw)}", r.status)
                pending: list[bytes] = []  # the line so far, joined once (no quadratic copying)
                size = 0
                async for piece in r.content.iter_any():
                    start = 0
                    while (nl := piece.find(b"\n", start)) != -1:
                        pending.append(piece[start:nl])
                        line, pending, size = b"".join(pending), [], 0
                        start = nl + 1
                        event = _event(line)
                        if event is _DONE:
                            return
                        if event is not None:
                            yield event
                    if start < len(piece):
                        pending.append(piece[start:])
                        size += len(piece) - start
                        if size > MAX_BODY_BYTES:
                            raise HTTPFailure(
                                "other", f"an event over {MAX_BODY_BYTES // 2**20} MiB"
                            )
                if (event := _event(b"".join(pending))) is not None and event is not _DONE:
                    yield event
        except _TRANSPORT_ERRORS as exc:
            raise failure_of(exc) from exc

    async def close(self) -> None:
        self._closed = True
        session, self._session = self._session, None
        if session is not None:
            await session.close()


_DONE = object()


async def _read_bounded(r: aiohttp.ClientResponse) -> bytes:
    """The whole body, or :class:`HTTPFailure` once it passes ``MAX_BODY_BYTES``."""
    if (r.content_length or 0) > MAX_BODY_BYTES:
        raise HTTPFailure(
            "other", f"a reply of {r.content_length:,} bytes (over {MAX_BODY_BYTES // 2**20} MiB)"
        )
    parts: list[bytes] = []
    size = 0
    async for piece in r.content.iter_any():
        size += len(piece)
        if size > MAX_BODY_BYTES:
            raise HTTPFailure("other", f"a reply over {MAX_BODY_BYTES // 2**20} MiB")
        parts.append(piece)
    return b"".join(parts)


def _event(line: bytes) -> Any:
    """One line of a server-sent event stream: its JSON data, ``_DONE``, or None (a comment,
    a blank line, another field)."""
    line = line.strip()
    if not line.startswith(b"data:"):
        return None
    data = line[5:].strip()
    if data == b"[DONE]":
        return _DONE
    event = decode(data)
    if isinstance(event, dict) and event.get("error") is not None:
        raise HTTPFailure("other", f"the stream reported an error: {error_message(data)}")
    return event
