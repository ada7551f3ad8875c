"""The episode side of the sandbox: the audit hook, loading and calling the tools, the zygote.

Imported by ``sandbox_worker.py`` (the supervisor; see its docstring for the design) and bound
beside it inside bubblewrap; standard library only. Everything here runs in the zygote or in an
episode process, never in the supervisor (except ``encode_line`` and ``drop_privileges``).
"""

from __future__ import annotations

import _signal
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
import time
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
# Every signal's disposition before any tool code ran: restored after each call. The C module's
# functions: the ``signal`` module's wrappers convert to enums (~0.3 ms a call for all signals).
_SIGNALS = frozenset(int(s) for s in signal.valid_signals()) - {signal.SIGKILL, signal.SIGSTOP}
_PRISTINE = {sig: h for sig in sorted(_SIGNALS) if (h := _signal.getsignal(sig)) is not None}
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
            if not _drop_threads():  # threads it left at the process limit: disable this tool
                os._exit(STUCK_EXIT)
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


def _settle(rep: int, alone: bool) -> bool:
    """Leave nothing of this call armed: handlers, timers, threads, processes, pending signals.

    ``alone``: the sandbox's uid and pid namespace are the episode's own, so ``kill(-1)``
    reaches exactly the processes the call left (the caller excepted). False if this could not
    be done: threads left that the fork dropping them has no room for (at the process limit),
    or anything else the tool broke; the episode is then replaced."""
    for _ in range(3):  # a handler the tool set may still run (and raise) until replaced
        with contextlib.suppress(BaseException):
            _signal.pthread_sigmask(_signal.SIG_BLOCK, _SIGNALS)
            _restore_handlers()
            break
    try:
        for timer in (signal.ITIMER_REAL, signal.ITIMER_VIRTUAL, signal.ITIMER_PROF):
            signal.setitimer(timer, 0)
        dropped = _drop_threads()
        if alone:
            with contextlib.suppress(OSError):
                os.kill(-1, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                while os.waitpid(-1, 0)[0]:  # zombies count against the process limit
                    pass
        for sig in _signal.sigpending():  # ignoring a signal discards it; then as it was
            _signal.signal(sig, _signal.SIG_IGN)
        _restore_handlers()
        signal.set_wakeup_fd(-1)
        with contextlib.suppress(OSError):
            os.set_blocking(rep, True)
        _signal.pthread_sigmask(_signal.SIG_SETMASK, ())
    except BaseException:  # whatever the tool broke, the episode is not trusted any more
        return False
    return dropped


def _restore_handlers() -> None:
    for sig, handler in _PRISTINE.items():
        if _signal.getsignal(sig) is not handler:
            _signal.signal(sig, handler)


def _drop_threads() -> bool:
    """A fork keeps only this thread; the old process exits with the rest."""
    try:  # procfs counts a process's threads in the link count of its task directory
        threads = os.stat("/proc/self/task").st_nlink - 2
    except OSError:
        threads = threading.active_count()
    if threads <= 1:
        return True
    parent = os.getpid()
    try:
        if os.fork() != 0:
            os._exit(0)
    except OSError:
        return False
    for _ in range(2000):  # reparented once every thread of the old process has ended, so
        if os.getppid() != parent:  # none of them can write to the channel any more
            break
        time.sleep(0.001)
    return True


def _encoded(reply: dict[str, Any], cap: int) -> bytes:
    """The reply's line; converting the value may run the tool's code (``__repr__``, a dict
    subclass's ``items``): under the hook, and before the clean-up."""
    _state["guard"] = True
    try:
        return _reply_bytes(reply, cap)
    except BaseException as exc:
        error = f"the tool's result cannot be converted: {exc_text(exc)}"
        return encode_line({"seq": reply.get("seq"), "kind": "error", "error": error})
    finally:
        _state["guard"] = False


STUCK = "left the sandbox in a state it cannot clean up (e.g. threads at the process limit)"
STUCK_EXIT = 70  # the episode's exit code when module code did that


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
    alone = cfg.get("uid") is not None and bool(cfg.get("own_pid_namespace"))
    errors = _load(codes, set(first.get("skip") or ()), rep, cpu_s)
    if not _settle(rep, alone):
        os._exit(STUCK_EXIT)  # the supervisor disables the tool that was loading
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
        data = _encoded(reply, cap)
        if not _settle(rep, alone):  # the call, not the next one, fails (and ends the episode)
            data = encode_line({"seq": seq, "kind": "crash", "error": STUCK})
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
