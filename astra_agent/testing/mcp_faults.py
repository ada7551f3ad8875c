"""MCP servers that misbehave at the protocol level, for tests and benchmarks (stdio only).

    python -m astra_agent.testing.mcp_faults MODE [ARG]

They speak newline-delimited JSON-RPC by hand (no SDK), so that they can send what an SDK
server never would. Modes:

* ``hang-init`` — reads requests, never answers ``initialize``, ignores SIGTERM and stdin EOF.
* ``ref URL [PATH]`` — tools whose input schemas point at ``URL`` (a remote ``$ref``, an
  ``$id`` base, a ``$schema``) and at ``file://PATH``: a client must fetch none of them.
* ``redos`` — tools whose schemas carry patterns with catastrophic backtracking.
* ``rpc-error`` — ``tools/call`` answered with JSON-RPC error objects (codes -32602, -32603,
  -32000, -32001) instead of results; tool ``pid`` answers with the server's process id.
* ``bad-names`` — tools named ``""``, ``"my tool!"``, 100 characters, Unicode; a call answers
  with the name it was called by.
* ``large`` — tool ``blob(size)`` returns a text of ``size`` characters in one message.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Any

RPC_ERRORS = {
    "bad_params": (-32602, "Invalid params: 'x' must be a string"),
    "internal": (-32603, "Internal error: the database is down"),
    "server_error": (-32000, "Server error: quota exceeded"),
    "looks_like_timeout": (-32001, "Upstream request timed out"),
}
BAD_NAMES = ["", "my tool!", "n" * 100, "météo", "日本語", "a.b", "a/b"]
PATTERNS = {
    "nested_plus": {"type": "string", "pattern": "^(a+)+$"},
    "alternation": {"type": "string", "pattern": "^(a|a)+$"},
}


def _tool(name: str, schema: dict[str, Any], description: str = "") -> dict[str, Any]:
    return {"name": name, "description": description or name, "inputSchema": schema}


def _obj(**props: Any) -> dict[str, Any]:
    return {"type": "object", "properties": props}


def tools_for(mode: str, argv: list[str]) -> list[dict[str, Any]]:
    if mode == "ref":
        url = argv[0]
        path = argv[1] if len(argv) > 1 else "/etc/hostname"
        return [
            _tool("ref_http", _obj(q={"$ref": f"{url}/remote.json"})),
            _tool("ref_id", {"$id": f"{url}/base/", **_obj(q={"$ref": "relative.json"})}),
            _tool("ref_schema", {"$schema": f"{url}/meta.json", **_obj(q={"type": "string"})}),
            _tool("ref_file", _obj(q={"$ref": f"file://{path}"})),
            _tool(
                "ref_local", {**_obj(q={"$ref": "#/$defs/s"}), "$defs": {"s": {"type": "string"}}}
            ),
        ]
    if mode == "redos":
        out = [_tool(name, _obj(s=schema)) for name, schema in PATTERNS.items()]
        out.append(_tool("keys", {"type": "object", "patternProperties": {"^(a|a)+$": {}}}))
        out.append(_tool("closed", {"type": "object", "patternProperties": {"^(a|a)+$": {}},
                                    "additionalProperties": False}))  # fmt: skip
        return out
    if mode == "rpc-error":
        return [_tool(name, _obj()) for name in [*RPC_ERRORS, "pid"]]
    if mode == "bad-names":
        return [_tool(name, _obj()) for name in BAD_NAMES]
    if mode == "large":
        return [_tool("blob", {**_obj(size={"type": "integer"}), "required": ["size"]})]
    raise SystemExit(f"mcp_faults: unknown mode {mode!r}")


def _text(text: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "isError": False}


def call(mode: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    """The reply to tools/call: {"result": ...} or {"error": ...}."""
    if mode == "rpc-error" and name in RPC_ERRORS:
        code, message = RPC_ERRORS[name]
        return {"error": {"code": code, "message": message}}
    if name == "pid":
        return {"result": _text(str(os.getpid()))}
    if mode == "large" and name == "blob":
        size = int(args.get("size", 0))
        return {"result": _text("H" * (size // 2) + "T" * (size - size // 2))}
    return {"result": _text(f"called {name!r} with {json.dumps(args, sort_keys=True)}")}


def answer(mode: str, argv: list[str], msg: dict[str, Any]) -> dict[str, Any] | None:
    method, rid = msg.get("method"), msg.get("id")
    if rid is None:
        return None  # a notification
    if method == "initialize":
        if mode == "hang-init":
            return None
        version = msg.get("params", {}).get("protocolVersion", "2025-06-18")
        body: dict[str, Any] = {"result": {
            "protocolVersion": version,
            "capabilities": {"tools": {}},
            "serverInfo": {"name": f"mcp-faults-{mode}", "version": "0"},
        }}  # fmt: skip
    elif method == "tools/list":
        body = {"result": {"tools": tools_for(mode, argv)}}
    elif method == "tools/call":
        params = msg.get("params", {})
        body = call(mode, params.get("name", ""), params.get("arguments") or {})
    elif method == "ping":
        body = {"result": {}}
    else:
        body = {"error": {"code": -32601, "message": f"Method not found: {method}"}}
    return {"jsonrpc": "2.0", "id": rid, **body}


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    mode, argv = sys.argv[1], sys.argv[2:]
    if mode != "hang-init":
        tools_for(mode, argv)  # an unknown mode fails now, not at tools/list
    else:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print(f"mcp_faults: serving mode {mode}", file=sys.stderr, flush=True)
    out = sys.stdout.buffer
    for line in sys.stdin.buffer:
        if not line.strip():
            continue
        reply = answer(mode, argv, json.loads(line))
        if reply is not None:
            out.write(json.dumps(reply, ensure_ascii=False).encode() + b"\n")
            out.flush()
    if mode == "hang-init":
        while True:  # stdin closed: a server that hangs anyway
            time.sleep(3600)


if __name__ == "__main__":
    main()
