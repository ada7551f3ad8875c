"""OpenAI's chat completions API over HTTP, with a function of the request behind it.

The HTTP side of a chat server with no model of its own: ``GET /v1/models`` and ``/health``,
``POST /v1/chat/completions`` (plain or streamed, with usage), the model name checked as vLLM
checks it. A :data:`Script` — a function of the request body — answers each request with a
:class:`Reply`, which this module writes out as a chat completion (or as the error body the reply
carries). Standard library only.

The scripted fake model of tests and benchmarks (:mod:`astra_agent.testing.scripted_server`)
serves with it: test equipment, which answers what its script says (faults included) and checks
little of the request. ``astra-serve up --engine hf`` (:mod:`serving.hf_server`) writes its
replies with :func:`completion` and :func:`stream_events` from an aiohttp server that validates
every request.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    """One answer to a chat request: an assistant message (its usage optional), or an error
    status, or a raw ``body``."""

    content: str | None = None
    reasoning: str | None = None
    tool_calls: list[tuple[str, str]] = field(default_factory=list)  # (name, arguments JSON)
    finish_reason: str | None = None  # default: "tool_calls" if calls else "stop"
    status: int = 200  # an HTTP error status answers with an error body instead
    delay_s: float = 0.0
    reasoning_field: str = "reasoning"  # or "reasoning_content" (older vLLM)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    # Sent as the whole response body (with ``status``) instead of a chat completion: bytes
    # as they are (``content_type`` says what they claim to be), anything else as JSON.
    body: Any = None
    content_type: str = "application/json"


Script = Callable[[dict[str, Any]], Reply]
"""What answers a chat request: the request body in, the :class:`Reply` to send out."""


def _message(reply: Reply) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.reasoning is not None:
        msg[reply.reasoning_field] = reply.reasoning
    if reply.tool_calls:
        msg["tool_calls"] = [
            {
                "id": f"call_{uuid.uuid4().hex[:16]}",
                "type": "function",
                "function": {"name": name, "arguments": args},
            }
            for name, args in reply.tool_calls
        ]
    return msg


def _finish(reply: Reply) -> str:
    return reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop")


def usage(reply: Reply, messages: Any) -> dict[str, int]:
    """The reply's token counts; those it leaves out estimated from the JSON's length."""
    prompt = reply.prompt_tokens
    if prompt is None:
        prompt = len(json.dumps(messages or [])) // 4
    completion = reply.completion_tokens
    if completion is None:
        completion = len(json.dumps(_message(reply))) // 4
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def completion(reply: Reply, model: str, use: dict[str, int]) -> dict[str, Any]:
    """The ``chat.completion`` body of ``reply``."""
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": _message(reply), "finish_reason": _finish(reply)}],
        "usage": use,
    }


def stream_events(reply: Reply, model: str, use: dict[str, int]) -> Iterator[bytes]:
    """``reply`` as server-sent events of ``chat.completion.chunk``s (the role, reasoning and
    content in pieces, each tool call's name then its arguments in pieces, the finish reason
    with the usage), then ``data: [DONE]``."""
    base = {
        "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
    }

    def event(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
        chunk = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        chunk.update(extra)
        return f"data: {json.dumps(chunk)}\n\n".encode()

    yield event({"role": "assistant", "content": ""})
    for piece in _pieces(reply.reasoning):
        yield event({reply.reasoning_field: piece})
    for piece in _pieces(reply.content):
        yield event({"content": piece})
    for i, call in enumerate(_message(reply).get("tool_calls", [])):
        head = {"index": i, "id": call["id"], "type": "function",
                "function": {"name": call["function"]["name"]}}  # fmt: skip
        yield event({"tool_calls": [head]})
        for piece in _pieces(call["function"]["arguments"]):
            yield event({"tool_calls": [{"index": i, "function": {"arguments": piece}}]})
    yield event({}, _finish(reply), usage=use)
    yield b"data: [DONE]\n\n"


class _Handler(BaseHTTPRequestHandler):
    server: _HTTPServer
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        # Headers and body go out in separate writes: without this, Nagle's algorithm and
        # delayed ACKs stall every response by ~40 ms.
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, status: int, body: Any, content_type: str = "application/json") -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path.rstrip("/").endswith("/models"):
            self._send(
                200,
                {
                    "object": "list",
                    "data": [{"id": self.server.model, "object": "model", "owned_by": "scripted"}],
                },
            )
        elif self.path == "/health":
            self._send(200, {})
        else:
            self._send(404, {"error": {"message": f"no route {self.path}"}})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", 0))
        body = json.loads(self.rfile.read(length) or b"{}")
        if not self.path.rstrip("/").endswith("/chat/completions"):
            self._send(404, {"error": {"message": f"no route {self.path}"}})
            return
        if self.server.keep_requests:
            with self.server.lock:
                self.server.requests.append(body)
        if body.get("model") != self.server.model:
            self._send(
                404,
                {
                    "error": {
                        "message": f"The model `{body.get('model')}` does not exist.",
                        "type": "NotFoundError",
                    }
                },
            )
            return
        try:
            reply = self.server.script(body)
        except Exception as exc:  # the script's failure is a 500 with its message, as a server's
            msg = f"{type(exc).__name__}: {exc}"
            self._send(500, {"error": {"message": msg, "type": "InternalServerError"}})
            return
        if reply.delay_s:
            time.sleep(reply.delay_s)
        if reply.body is not None:
            self._send(reply.status, reply.body, reply.content_type)
            return
        if reply.status != 200:
            self._send(reply.status, {"error": {"message": f"scripted {reply.status}"}})
            return
        use = usage(reply, body.get("messages"))
        if body.get("stream"):
            self._stream(reply, use)
            return
        self._send(200, completion(reply, self.server.model, use))

    def _stream(self, reply: Reply, use: dict[str, int]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        for data in stream_events(reply, self.server.model, use):
            self.wfile.write(data)
            self.wfile.flush()
        self.close_connection = True


def _pieces(text: str | None, size: int = 8) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] if text else []


class _HTTPServer(ThreadingHTTPServer):
    """Serves ``model`` with ``script``; ``requests`` holds every chat request body received
    (what tests read back) unless ``keep_requests`` is off, as a long-lived server needs."""

    daemon_threads = True
    request_queue_size = 256  # many concurrent clients (benchmarks) must not be refused

    def __init__(
        self, addr: tuple[str, int], script: Script, model: str, *, keep_requests: bool = True
    ) -> None:
        super().__init__(addr, _Handler)
        self.script = script
        self.model = model
        self.keep_requests = keep_requests
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hung up before its answer (it timed out) is no error of the server's;
        anything else is printed, as the standard library does."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def http_server(host: str, port: int, script: Script, model: str) -> ThreadingHTTPServer:
    """A server answering with ``script`` on ``host:port``, not yet serving: call its
    ``serve_forever()``. It keeps no request bodies (it may serve for days)."""
    return _HTTPServer((host, port), script, model, keep_requests=False)
