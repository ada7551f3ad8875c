"""The sandboxed worker: loads tool sources once, then answers calls over a pipe.

Runs as ``python -I -S sandbox_worker.py LIMITS_JSON`` inside bubblewrap (see sandbox.py),
standard library only. Protocol: one JSON object per line on the original stdin/stdout, which
are moved to private descriptors before any tool code runs; fds 0-2 then point at /dev/null,
so nothing a tool writes can corrupt the protocol.

    → {"op": "load", "tools": {"name": "source", ...}}    ← {"ok": true, "errors": {name: msg}}
    → {"op": "call", "name": "t", "args": {...}}   ← {"ok": true, "value": ..., "output": ...}
                                                   ← {"ok": false, "error": "...", ...}
    → {"op": "reset"}  (re-run every source: fresh state) ← {"ok": true, "errors": {...}}

Before tool code runs, the worker applies resource limits and drops to an unprivileged uid, and
an audit hook refuses processes, sockets, ctypes, signals and writes outside /tmp with a clear
message. The isolation itself is bubblewrap's (no network, no host files); the hook only makes
the errors readable.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import resource
import signal
import sys
import traceback
from typing import Any

_BLOCKED = {
    "os.system": "running shell commands",
    "os.exec": "starting programs",
    "os.spawn": "starting programs",
    "os.posix_spawn": "starting programs",
    "os.fork": "creating processes",
    "os.forkpty": "creating processes",
    "subprocess.Popen": "starting programs",
    "socket.__new__": "network access",
    "socket.connect": "network access",
    "socket.bind": "network access",
    "socket.getaddrinfo": "network access",
    "ctypes.dlopen": "loading native code (ctypes)",
    "ctypes.dlsym": "loading native code (ctypes)",
    "ctypes.cdata": "loading native code (ctypes)",
    "os.kill": "sending signals",
    "os.killpg": "sending signals",
    "signal.pthread_kill": "sending signals",
    "sys.addaudithook": "changing the sandbox",
}
_state = {"guard": False}


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if not _state["guard"]:
        return
    why = _BLOCKED.get(event)
    if why is None and event == "open":
        path, mode = args[0], args[1]
        writing = isinstance(mode, str) and any(c in mode for c in "wax+")
        if writing and isinstance(path, str) and not os.path.abspath(path).startswith("/tmp/"):
            why = f"writing outside /tmp ({path})"
    if why is not None:
        raise PermissionError(f"{why} is not allowed in the sandbox")


class _CappedOutput(io.TextIOBase):
    """Collects printed text up to ``cap`` characters and counts the rest."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.parts: list[str] = []
        self.size = 0
        self.dropped = 0

    def write(self, s: str) -> int:
        room = self.cap - self.size
        if room > 0:
            self.parts.append(s[:room])
        self.size += min(len(s), max(room, 0))
        self.dropped += max(0, len(s) - max(room, 0))
        return len(s)

    def text(self) -> str:
        out = "".join(self.parts)
        return out + (f"\n…[{self.dropped} characters of output dropped]" if self.dropped else "")


def _apply_limits(limits: dict[str, int]) -> None:
    pairs = {
        "address_space_bytes": resource.RLIMIT_AS,
        "processes": resource.RLIMIT_NPROC,
        "file_size_bytes": resource.RLIMIT_FSIZE,
        "open_files": resource.RLIMIT_NOFILE,
    }
    for key, res in pairs.items():
        if limits.get(key):
            resource.setrlimit(res, (limits[key], limits[key]))
    total_cpu = limits.get("cpu_seconds_total", 3600)
    resource.setrlimit(resource.RLIMIT_CPU, (total_cpu, total_cpu))


def _drop_privileges(uid: int) -> None:
    if os.getuid() == 0:
        with contextlib.suppress(OSError):
            os.chmod("/tmp", 0o1777)
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)


def _load(sources: dict[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    funcs: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for name, source in sources.items():
        namespace: dict[str, Any] = {"__name__": f"tool_{name}"}
        try:
            code = compile(source, f"<tool {name}>", "exec")
            _state["guard"] = True
            try:
                exec(code, namespace)
            finally:
                _state["guard"] = False
        except BaseException as exc:  # a tool's module code may raise anything
            errors[name] = f"{type(exc).__name__}: {exc}"
            continue
        fn = namespace.get(name)
        if not callable(fn):
            errors[name] = f"the source does not define a function named {name!r}"
            continue
        funcs[name] = fn
    return funcs, errors


def _kill_strays() -> None:
    """Kill any process a tool left behind (we are the only one of our uid in this pid ns)."""
    with contextlib.suppress(OSError):
        os.kill(-1, signal.SIGKILL)


def _call(
    funcs: dict[str, Any], name: str, args: dict[str, Any], cap: int, cpu_s: int, own_pid_ns: bool
) -> dict:
    fn = funcs.get(name)
    if fn is None:
        return {"ok": False, "error": f"no implementation loaded for tool {name!r}"}
    out = _CappedOutput(cap)
    used = int(sum(resource.getrusage(resource.RUSAGE_SELF)[:2])) + 1
    hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
    resource.setrlimit(resource.RLIMIT_CPU, (min(used + cpu_s, hard), hard))
    old = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = out
    _state["guard"] = True
    try:
        value = fn(**args)
        reply: dict[str, Any] = {"ok": True, "value": _jsonable(value)}
    except BaseException as exc:  # the tool's failure is the model's information
        frames = [
            f for f in traceback.extract_tb(exc.__traceback__) if f.filename.startswith("<tool")
        ]
        where = "".join(traceback.format_list(frames[-3:]))
        reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": where}
    finally:
        _state["guard"] = False
        sys.stdout, sys.stderr = old
    if own_pid_ns:  # only inside the sandbox's pid namespace: kill(-1) is ours alone there
        _kill_strays()
    reply["output"] = out.text()
    return reply


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)


def main() -> None:
    config = json.loads(sys.argv[1])
    proto_in = os.fdopen(os.dup(0), "r", encoding="utf-8")
    proto_out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    signal.signal(signal.SIGXCPU, signal.SIG_DFL)
    _apply_limits(config.get("limits", {}))
    if config.get("drop_privileges", True):
        _drop_privileges(int(config.get("uid", 65534)))
    sys.addaudithook(_audit)
    cap = int(config.get("output_cap_chars", 65536))
    cpu_s = int(config.get("cpu_seconds_per_call", 10))
    own_pid_ns = bool(config.get("own_pid_namespace", False))
    sources: dict[str, str] = {}
    funcs: dict[str, Any] = {}
    for line in proto_in:
        try:
            msg = json.loads(line)
            op = msg.get("op")
            if op == "load":
                sources = dict(msg["tools"])
                funcs, errors = _load(sources)
                reply: dict[str, Any] = {"ok": True, "errors": errors}
            elif op == "reset":
                funcs, errors = _load(sources)
                reply = {"ok": True, "errors": errors}
            elif op == "call":
                args = dict(msg.get("args") or {})
                reply = _call(funcs, msg["name"], args, cap, cpu_s, own_pid_ns)
            elif op == "ping":
                reply = {"ok": True}
            else:
                reply = {"ok": False, "error": f"unknown op {op!r}"}
        except Exception as exc:  # a malformed request must not kill the worker
            reply = {"ok": False, "error": f"worker: {type(exc).__name__}: {exc}"}
        data = json.dumps(reply, ensure_ascii=False)
        if len(data) > 8 * cap:
            data = json.dumps({"ok": False, "error": "the tool's result is too large to return"})
        proto_out.write(data + "\n")
        proto_out.flush()


if __name__ == "__main__":
    main()
