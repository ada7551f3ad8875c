"""A scripted OpenAI-compatible chat server (a fake model over real HTTP), for tests and benches.

Each ``POST /v1/chat/completions`` is answered by a script: a function of the request body
returning a :class:`Reply` (or a list of replies served in order). Streaming is supported. The
HTTP side is :mod:`astra_agent.openai_http` (``serving.hf_server`` serves a real model with it);
this module adds what scripts a fake model, and names that module's ``Reply``, ``Script``,
``http_server`` and ``_HTTPServer`` for the tests, benches and replays that import them here.

    with ScriptedServer(lambda req: Reply(content="hi")) as srv:
        client = OpenAI(base_url=srv.base_url, api_key="x")
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import threading
from collections.abc import Iterator
from typing import Any

from astra_agent.openai_http import Reply, Script, _HTTPServer, http_server

__all__ = [
    "Reply",
    "Script",
    "ScriptedServer",
    "_HTTPServer",
    "http_server",
    "in_subprocess",
    "main",
    "sequence",
    "tool_then_answer",
]


def sequence(replies: list[Reply]) -> Script:
    """Serve ``replies`` in order (thread-safe); the last one repeats."""
    lock = threading.Lock()
    it = itertools.count()

    def script(_: dict[str, Any]) -> Reply:
        with lock:
            i = next(it)
        return replies[min(i, len(replies) - 1)]

    return script


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
