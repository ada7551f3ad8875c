"""The episode side of the sandbox: the audit hook, loading and calling the tools, the zygote.

Imported by ``sandbox_worker.py`` (the supervisor; see its docstring for the design) and bound
beside it inside bubblewrap; standard library only. Everything here runs in the zygote or in an
episode process, never in the supervisor (except ``encode_line`` and ``drop_privileges``).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import resource
import signal
import socket
import sys
import threading
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
# Signals a call may leave armed (alarms, timers, user signals): ignored between calls.
_QUIET = [signal.SIGALRM, signal.SIGVTALRM, signal.SIGPROF, signal.SIGUSR1, signal.SIGUSR2]
_QUIET += [signal.SIGINT, signal.SIGHUP, signal.SIGTERM]
_SURROGATE = re.compile("[\ud800-\udfff]")
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


def encode_line(obj: Any) -> bytes:
    """One protocol line in UTF-8; lone surrogates (not encodable) become U+FFFD."""
    text = json.dumps(obj, ensure_ascii=False)
    try:
        return text.encode() + b"\n"
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", text).encode() + b"\n"


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
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    total_cpu = limits.get("cpu_seconds_total", 3600)
    resource.setrlimit(resource.RLIMIT_CPU, (total_cpu, total_cpu))


def drop_privileges(uid: int) -> None:
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)


def _cpu_budget(seconds: int) -> None:
    used = int(sum(resource.getrusage(resource.RUSAGE_SELF)[:2])) + 1
    hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
    resource.setrlimit(resource.RLIMIT_CPU, (min(used + seconds, hard), hard))


def exc_text(exc: BaseException) -> str:
    try:
        return f"{type(exc).__name__}: {exc}"
    except BaseException:  # a tool's exception whose __str__ fails
        return f"{type(exc).__name__}: <unprintable>"


def _load(codes: dict[str, Any], skip: set[str], rep: int, cpu_s: int) -> dict[str, str]:
    """Run each tool's module code (announcing it first, so a hang is pinned on the tool)."""
    errors: dict[str, str] = {}
    _funcs.clear()
    for name, code in codes.items():
        if name in skip:
            continue
        os.write(rep, encode_line({"loading": name}))
        namespace: dict[str, Any] = {"__name__": f"tool_{name}"}
        _cpu_budget(cpu_s)
        _state["guard"] = True
        try:
            exec(code, namespace)
        except BaseException as exc:  # a tool's module code may raise anything
            errors[name] = exc_text(exc)
            continue
        finally:
            _state["guard"] = False
        fn = namespace.get(name)
        if callable(fn):
            _funcs[name] = fn
        else:
            errors[name] = f"the source does not define a function named {name!r}"
    return errors


_funcs: dict[str, Any] = {}
_SINK = _CappedOutput(0)


def _call(msg: dict[str, Any], cap: int, cpu_s: int) -> dict[str, Any]:
    name = msg.get("name")
    fn = _funcs.get(name) if isinstance(name, str) else None
    if fn is None:
        return {"kind": "error", "error": f"no implementation loaded for tool {name!r}"}
    out = _CappedOutput(cap)
    _cpu_budget(cpu_s)
    sys.stdout = sys.stderr = out
    _state["guard"] = True
    try:
        value = fn(**(msg.get("args") or {}))
        reply: dict[str, Any] = {"kind": "ok", "value": value}
    except BaseException as exc:  # the tool's failure is the model's information
        reply = {"kind": "error", "error": exc_text(exc), "traceback": _where(exc)}
    finally:
        _state["guard"] = False
        sys.stdout = sys.stderr = _SINK
    reply["output"] = out.text()
    return reply


def _where(exc: BaseException) -> str:
    try:
        tb = traceback.extract_tb(exc.__traceback__)
        frames = [f for f in tb if f.filename.startswith("<tool")]
        return "".join(traceback.format_list(frames[-3:]))
    except BaseException:
        return ""


def _reply_bytes(reply: dict[str, Any], cap: int) -> bytes:
    too_large = "the tool's result is too large to return"
    value: Any = reply.get("value")
    if type(value) in (str, bytes, list, dict) and len(value) > 8 * cap:  # skip encoding it
        return encode_line({"seq": reply["seq"], "kind": "error", "error": too_large})
    try:
        data = encode_line(reply)
    except (TypeError, ValueError, RecursionError):  # not JSON: the model reads its repr
        try:
            reply["value"] = repr(reply.get("value"))
        except BaseException as exc:
            reply = {"seq": reply["seq"], "kind": "error", "error": f"unprintable: {exc!r}"}
        data = encode_line(reply)
    if len(data) > 8 * cap:
        data = encode_line({"seq": reply["seq"], "kind": "error", "error": too_large})
    return data


def _settle() -> None:
    """Leave nothing of this call armed: timers, handlers, masks, threads."""
    for _ in range(3):  # a tool's handler may still fire (and raise) while we undo it
        with contextlib.suppress(BaseException):
            for timer in (signal.ITIMER_REAL, signal.ITIMER_VIRTUAL, signal.ITIMER_PROF):
                signal.setitimer(timer, 0)
            for sig in _QUIET:
                signal.signal(sig, signal.SIG_IGN)  # also discards pending ones
            signal.signal(signal.SIGXCPU, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_SETMASK, ())
            break
    try:
        threads = len(os.listdir("/proc/self/task"))
    except OSError:
        threads = threading.active_count()
    if threads > 1:  # a fork keeps only this thread; the old process exits with the rest
        with contextlib.suppress(OSError):
            if os.fork() != 0:
                os._exit(0)


def _episode(req: int, rep: int, codes: dict[str, Any], cfg: dict[str, Any]) -> None:
    """In a fresh fork of the zygote: isolate, load, serve (no tool code has run yet)."""
    os.setpgid(0, 0)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    hi, lo = max(req, rep), min(req, rep)
    os.closerange(3, lo)
    os.closerange(lo + 1, hi)
    os.closerange(hi + 1, 1 << 16)
    _apply_limits(cfg.get("limits", {}))
    if cfg.get("uid") is not None:
        drop_privileges(int(cfg["uid"]))
    sys.stdout = sys.stderr = _SINK
    sys.addaudithook(_audit)
    cap = int(cfg.get("output_cap_chars", 65536))
    cpu_s = int(cfg.get("cpu_seconds_per_call", 10))
    inp = os.fdopen(req, "rb")
    first = json.loads(inp.readline())
    errors = _load(codes, set(first.get("skip") or ()), rep, cpu_s)
    _settle()
    os.write(rep, encode_line({"ready": True, "errors": errors}))
    for line in inp:
        seq = None
        try:
            msg = json.loads(line)
            seq = msg.get("seq")
            reply = _call(msg, cap, cpu_s)
        except BaseException as exc:  # a malformed request must not end the episode
            reply = {"kind": "error", "error": f"worker: {exc_text(exc)}"}
        reply["seq"] = seq
        _settle()
        data = _reply_bytes(reply, cap)
        view = memoryview(data)
        while view:
            view = view[os.write(rep, view) :]


def zygote(sock: socket.socket, codes: dict[str, Any], cfg: dict[str, Any]) -> None:
    """Fork an episode per request; reap the ended ones (whose status the supervisor read)."""
    while True:
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        try:
            msg, fds, _, _ = socket.recv_fds(sock, 16, 2)
        except OSError:
            return
        if not msg or len(fds) != 2:
            return
        pid = os.fork()
        if pid == 0:
            sock.close()
            try:
                _episode(fds[0], fds[1], codes, cfg)
            finally:
                os._exit(0)
        for fd in fds:
            os.close(fd)
        sock.sendall(b"%d\n" % pid)
