"""A scripted OpenAI-compatible chat server (a fake model over real HTTP), for tests and benches.

Each ``POST /v1/chat/completions`` is answered by a script: a function of the request body
returning a :class:`Reply` (or a list of replies served in order). Streaming is supported.

    with ScriptedServer(lambda req: Reply(content="hi")) as srv:
        client = OpenAI(base_url=srv.base_url, api_key="x")
"""

from __future__ import annotations

import contextlib
import itertools
import json
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
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


def sequence(replies: list[Reply]) -> Script:
    """Serve ``replies`` in order (thread-safe); the last one repeats."""
    lock = threading.Lock()
    it = itertools.count()

    def script(_: dict[str, Any]) -> Reply:
        with lock:
            i = next(it)
        return replies[min(i, len(replies) - 1)]

    return script


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
        prompt = reply.prompt_tokens
        if prompt is None:
            prompt = len(json.dumps(body.get("messages", []))) // 4
        completion = reply.completion_tokens
        if completion is None:
            completion = len(json.dumps(_message(reply))) // 4
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }
        if body.get("stream"):
            self._stream(reply, usage)
            return
        self._send(
            200,
            {
                "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": self.server.model,
                "choices": [
                    {"index": 0, "message": _message(reply), "finish_reason": _finish(reply)}
                ],
                "usage": usage,
            },
        )

    def _stream(self, reply: Reply, usage: dict[str, int]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        base = {
            "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": self.server.model,
        }

        def emit(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> None:
            chunk = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
            chunk.update(extra)
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()

        emit({"role": "assistant", "content": ""})
        for piece in _pieces(reply.reasoning):
            emit({reply.reasoning_field: piece})
        for piece in _pieces(reply.content):
            emit({"content": piece})
        for i, call in enumerate(_message(reply).get("tool_calls", [])):
            emit(
                {
                    "tool_calls": [
                        {
                            "index": i,
                            "id": call["id"],
                            "type": "function",
                            "function": {"name": call["function"]["name"]},
                        }
                    ]
                }
            )
            for piece in _pieces(call["function"]["arguments"]):
                emit({"tool_calls": [{"index": i, "function": {"arguments": piece}}]})
        emit({}, _finish(reply), usage=usage)
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True


def _pieces(text: str | None, size: int = 8) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] if text else []


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # many concurrent clients (benchmarks) must not be refused

    def __init__(self, addr: tuple[str, int], script: Script, model: str) -> None:
        super().__init__(addr, _Handler)
        self.script = script
        self.model = model
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()


def http_server(host: str, port: int, script: Script, model: str) -> ThreadingHTTPServer:
    """A server answering with ``script`` on ``host:port``, not yet serving: call its
    ``serve_forever()`` (``serving.hf_server`` puts a real model behind one)."""
    return _HTTPServer((host, port), script, model)


class ScriptedServer:
    """Start on a free loopback port; ``base_url`` ends in ``/v1``."""

    def __init__(self, script: Script | list[Reply], model: str = "scripted") -> None:
        fn = sequence(script) if isinstance(script, list) else script
        self._httpd = _HTTPServer(("127.0.0.1", 0), fn, model)
        self.model = model
        self.base_url = f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def requests(self) -> list[dict[str, Any]]:
        return self._httpd.requests

    def set_script(self, script: Script | list[Reply]) -> None:
        self._httpd.script = sequence(script) if isinstance(script, list) else script

    def start(self) -> ScriptedServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> ScriptedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def tool_then_answer(req: dict[str, Any]) -> Reply:
    """A ready-made script: call the first offered tool with ``{}``-ish arguments, then answer
    with the tool's output once it is in the conversation."""
    last = req["messages"][-1]
    if last["role"] == "tool" or not req.get("tools"):
        return Reply(content=f"done: {str(last.get('content'))[:200]}")
    name = req["tools"][0]["function"]["name"]
    return Reply(reasoning="calling the tool", tool_calls=[(name, '{"text": "x"}')])


@contextlib.contextmanager
def in_subprocess(
    script: str = f"{__name__}:tool_then_answer",
    model: str = "scripted",
    delay_s: float = 0.0,
    cwd: str | None = None,
) -> Iterator[tuple[str, int]]:
    """The scripted server in a process of its own, as a real endpoint would be (the caller's
    CPU then counts the client alone): ``(base URL, pid)`` while the block runs."""
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    cmd = [sys.executable, "-m", __name__, "--port", str(port), "--model", model,
           "--script", script, "--delay", str(delay_s)]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if "scripted server on" not in line:
            raise RuntimeError(f"the scripted server did not start (said {line!r})")
        yield f"http://127.0.0.1:{port}/v1", proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main() -> None:
    """Serve a script from another process: --script module:function."""
    import argparse
    import importlib

    ap = argparse.ArgumentParser(description="Scripted OpenAI-compatible server (a fake model).")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--model", default="scripted")
    ap.add_argument("--script", default=f"{__name__}:tool_then_answer")
    ap.add_argument("--delay", type=float, default=0.0, help="seconds added to every reply")
    args = ap.parse_args()
    mod, fn = args.script.split(":")
    base = getattr(importlib.import_module(mod), fn)

    def script(req: dict[str, Any]) -> Reply:
        reply = base(req)
        reply.delay_s += args.delay
        return reply

    httpd = http_server("127.0.0.1", args.port, script, args.model)
    print(f"scripted server on http://127.0.0.1:{args.port}/v1", flush=True)
    httpd.serve_forever()


if __name__ == "__main__":
    main()
