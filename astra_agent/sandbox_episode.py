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
# What the hook refused since the last report (a caught PermissionError leaves no other trace).
_refused: list[str] = []
_REFUSED_KEPT = 16
THREAD_GRACE_S = 0.2  # a thread that was joined has ended at the OS level well within this


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if not _state["guard"]:
        return
    why = _BLOCKED.get(event)
    if why is None and event == "open":
        path, mode = args[0], args[1]
        writing = isinstance(mode, str) and any(c in mode for c in "wax+")
        if writing and isinstance(path, str) and not os.path.abspath(path).startswith("/tmp/"):
            why = f"writing outside /tmp ({path[:200]})"
    if why is not None:
        if why not in _refused and len(_refused) < _REFUSED_KEPT:
            _refused.append(why)
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


def _threads() -> int:
    """This process's threads (procfs counts them in the link count of its task directory)."""
    try:
        return os.stat("/proc/self/task").st_nlink - 2
    except OSError:
        return threading.active_count()


def _threads_left() -> int:
    """Threads besides this one still running. The kernel's count holds every live thread, and
    for a moment also one that was joined (its Python state is gone first) or one just started
    (its Python state has no frame yet): only while the two counts differ, wait (briefly)."""
    deadline = time.monotonic() + THREAD_GRACE_S
    while True:
        alive = _threads() - 1
        running = len(sys._current_frames()) - 1
        if alive <= running or time.monotonic() >= deadline:
            return max(alive, 0)
        time.sleep(0.001)


def _conduct(printed: int) -> dict[str, Any]:
    """What the tool code did that the sandbox contained without an error to show for it:
    operations the hook refused (since the last report) and characters printed (kept or
    not); ``threads_left`` is added by :func:`_settle`. Empty when there is nothing."""
    report: dict[str, Any] = {}
    if _refused:
        report["refused"] = list(_refused)
        _refused.clear()
    if printed:
        report["printed"] = printed
    return report


def _load(
    codes: dict[str, Any], skip: set[str], rep: int, cpu_s: int
) -> tuple[dict[str, str], dict[str, dict[str, Any]]]:
    """Run each tool's module code (announcing it first, so a hang is pinned on the tool);
    the load errors and each tool's conduct (see :func:`_conduct`) while it loaded."""
    errors: dict[str, str] = {}
    conduct: dict[str, dict[str, Any]] = {}
    _funcs.clear()
    for name, code in codes.items():
        if name in skip:
            continue
        os.write(rep, encode_line({"loading": name}))
        namespace: dict[str, Any] = {"__name__": f"tool_{name}"}
        _cpu_budget(cpu_s)
        _refused.clear()
        sunk = _SINK.dropped
        _state["guard"] = True
        try:
            exec(code, namespace)
        except BaseException as exc:  # a tool's module code may raise anything
            errors[name] = exc_text(exc)
            continue
        finally:
            _state["guard"] = False
            report = _conduct(_SINK.dropped - sunk)
            if threads := _threads_left():
                report["threads_left"] = threads
            if report:
                conduct[name] = report
            if not _drop_threads():  # threads it left at the process limit: disable this tool
                os._exit(STUCK_EXIT)
        fn = namespace.get(name)
        if callable(fn):
            _funcs[name] = fn
        else:
            errors[name] = f"the source does not define a function named {name!r}"
    return errors, conduct


_funcs: dict[str, Any] = {}
_SINK = _CappedOutput(0)


def _call(msg: dict[str, Any], cap: int, cpu_s: int) -> dict[str, Any]:
    name = msg.get("name")
    fn = _funcs.get(name) if isinstance(name, str) else None
    if fn is None:
        return {"kind": "error", "error": f"no implementation loaded for tool {name!r}"}
    out = _CappedOutput(cap)
    _cpu_budget(cpu_s)
    _refused.clear()
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
    reply["printed"] = out.size + out.dropped  # replaced by the conduct report before sending
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


def _settle(rep: int, alone: bool, report: dict[str, Any] | None = None) -> bool:
    """Leave nothing of this call armed: handlers, timers, threads, processes, pending signals.

    ``alone``: the sandbox's uid and pid namespace are the episode's own, so ``kill(-1)``
    reaches exactly the processes the call left (the caller excepted). False if this could not
    be done: threads left that the fork dropping them has no room for (at the process limit),
    or anything else the tool broke; the episode is then replaced. ``report`` (the call's
    conduct) gets ``threads_left``, counted once signals are blocked and timers cancelled."""
    for _ in range(3):  # a handler the tool set may still run (and raise) until replaced
        with contextlib.suppress(BaseException):
            _signal.pthread_sigmask(_signal.SIG_BLOCK, _SIGNALS)
            _restore_handlers()
            break
    try:
        for timer in (signal.ITIMER_REAL, signal.ITIMER_VIRTUAL, signal.ITIMER_PROF):
            signal.setitimer(timer, 0)
        if report is not None and (threads := _threads_left()):
            report["threads_left"] = threads
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
    if _threads() <= 1:
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


def _with_conduct(data: bytes, report: dict[str, Any]) -> bytes:
    """The reply line ``data`` with the conduct report added (rare: decoded again)."""
    try:
        return encode_line({**json.loads(data), "conduct": report})
    except BaseException:  # not a JSON object line: cannot happen for our own encoding
        return data


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
    errors, conduct = _load(codes, set(first.get("skip") or ()), rep, cpu_s)
    if not _settle(rep, alone):
        os._exit(STUCK_EXIT)  # the supervisor disables the tool that was loading
    os.write(rep, encode_line({"ready": True, "errors": errors, "conduct": conduct}))
    for line in inp:
        seq = None
        sunk = _SINK.dropped
        try:
            msg = json.loads(line)
            seq = msg.get("seq")
            reply = _call(msg, cap, cpu_s)
        except BaseException as exc:  # a malformed request must not end the episode
            reply = {"kind": "error", "error": f"worker: {exc_text(exc)}"}
        reply["seq"] = seq
        printed = reply.pop("printed", 0)
        data = _encoded(reply, cap)  # may run tool code (and print to the sink)
        report = _conduct(printed + _SINK.dropped - sunk)
        # the call, not the next one, fails (and ends the episode)
        if not _settle(rep, alone, report):
            data = encode_line({"seq": seq, "kind": "crash", "error": STUCK})
        elif report:
            data = _with_conduct(data, report)
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
