"""The inside of the sandbox: a supervisor, a pristine template (zygote) and an episode process.

Runs as ``python -I -S sandbox_worker.py CONFIG_JSON`` inside bubblewrap (see sandbox.py),
standard library only. The process that runs tool code never holds the host's channel:

    host ══ stdin/stdout ══ supervisor ──socketpair── zygote ──fork per episode──┐
                                │                                                 │
                                └────────── two pipes (this episode only) ── episode process

- The **supervisor** owns the host channel (fds 0/1 moved to private descriptors, then made
  non-dumpable so that no other process can open them through ``/proc/PID/fd`` or ptrace). It
  compiles the sources, imports the standard-library modules they name, forks the zygote before
  any call has been relayed, and from then on only relays, validates and kills. It never runs
  tool code. It enforces every deadline (load, call, writes included) with non-blocking pipes.
- The **zygote** has compiled everything and run nothing: on each request it forks an episode
  process (receiving the episode's two pipe ends with SCM_RIGHTS) and goes back to waiting. It
  holds no host descriptor and has seen no call, so a fork of it is a fresh state: no module,
  builtin, monkeypatch, audit hook, thread, timer or signal handler of an earlier episode.
- The **episode** process closes everything but its own two pipes, applies the rlimits, drops to
  the sandbox's own uid (one per sandbox: the process limit is per uid), installs the audit hook,
  runs the module code of each tool, then answers calls. After each call (its result already
  encoded: that may run the tool's ``__repr__``) it cancels timers, kills every other process
  of its uid (``kill(-1)``: the call's children), restores every signal disposition and drops
  pending signals, and if threads are left, forks itself and lets the old process (with the
  threads) exit, so that nothing a call left behind can act in the next one. Where that cannot
  be done (threads at the process limit) the call itself fails and the episode is replaced.
- A **seccomp filter** (sandbox_seccomp.py) refuses what would outlive the processes or lift
  the bounds: keyrings, SysV and POSIX IPC, memfds, new namespaces. ``/tmp`` is bounded in
  size by bubblewrap and in files (inodes) by the supervisor's remount.

Tool code controls its own return value by definition; what it cannot control: the host channel
(another process, another uid, non-dumpable), the results of other calls (a reply is exactly one
line carrying the call's sequence number; a line out of turn, for another call, or not JSON makes
the call a ``crash`` and the episode is discarded), another episode (killed, ``/tmp`` wiped,
re-forked from the zygote), and the verdict on timeouts, crashes and limits (the supervisor's).

Wire protocol (one JSON object per line):

    host → {"op": "load", "seq": n, "tools": {name: source}, "skip": {name: error}}
    host → {"op": "reset", "seq": n}       ← {"seq": n, "kind": "ok", "errors": {}, "skip": {},
                                                  "conduct": {name: report}}
    host → {"op": "call", "seq": n, "name": "t", "args": {...}}
         ← {"seq": n, "kind": "ok", "value": ..., "output": "...", "conduct"?: report}
         ← {"seq": n, "kind": "error" | "timeout" | "crash", "error": "...", "output": "..."}

The isolation itself is bubblewrap's and the uid's (no network, no host files, no signals to
others); the audit hook (processes, sockets, ctypes, signals, writes outside /tmp) only makes the
errors readable. What tool code tried and the sandbox contained without an error reaching the
host (a refused operation inside ``try/except``, a thread left running, output beyond the cap)
comes back as a ``conduct`` report (``refused``, ``threads_left``, ``printed``) of each call and
of each tool's load: a report by code in the same process, for judging honest code (a checker
of generated tools), not a security boundary.
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import os
import select
import shutil
import signal
import socket
import sys
import time
from typing import Any

if __name__ == "__main__":  # run as a script inside the sandbox: the episode module is beside us
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from sandbox_episode import STUCK, STUCK_EXIT, drop_privileges, encode_line, exc_text, zygote
else:
    from astra_agent.sandbox_episode import (
        STUCK,
        STUCK_EXIT,
        drop_privileges,
        encode_line,
        exc_text,
        zygote,
    )

# Standard-library modules never imported ahead of the tools (side effects at import).
_NO_PREIMPORT = {"antigravity", "this", "__hello__", "__phello__", "idlelib", "tkinter"}
_NO_PREIMPORT |= {"turtle", "turtledemo", "webbrowser", "pydoc", "ensurepip", "venv", "test"}


class _Timeout(Exception):
    pass


class _Broken(Exception):
    pass


def _write_all(fd: int, data: bytes, deadline: float) -> None:
    """Write to a non-blocking pipe, giving up at ``deadline`` (a stopped reader cannot hang us)."""
    view = memoryview(data)
    while view:
        with contextlib.suppress(BlockingIOError):
            view = view[os.write(fd, view) :]
        if view:
            left = deadline - time.monotonic()
            if left <= 0:
                raise _Timeout
            select.select([], [fd], [], left)


# --------------------------------------------------------------------------- the supervisor


class _Episode:
    def __init__(self, pid: int, req: int, rep: int) -> None:
        self.pid, self.req, self.rep = pid, req, rep
        self.buf = bytearray()

    def read_line(self, deadline: float, limit: int) -> bytes | None:
        """The next line (None at end of file), within ``deadline`` and ``limit`` bytes."""
        start = 0
        while True:
            i = self.buf.find(b"\n", start)
            if i >= 0:
                line = bytes(self.buf[: i + 1])
                del self.buf[: i + 1]
                return line
            if len(self.buf) > limit:
                raise _Broken("sent a line over the size limit")
            start = len(self.buf)
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.rep], [], [], left)[0]:
                raise _Timeout
            chunk = os.read(self.rep, 1 << 16)
            if not chunk:
                return None
            self.buf += chunk

    def pending(self) -> bool:
        return bool(self.buf) or bool(select.select([self.rep], [], [], 0)[0])


def _stat_exit(pid: int) -> tuple[str, int] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[-1])


def _exit_reason(pid: int) -> str:
    """Why an episode process ended, from its zombie's exit code (if it is readable)."""
    for _ in range(40):
        st = _stat_exit(pid)
        if st is None:
            break
        state, code = st
        if code or state in "ZX":
            sig = code & 0x7F
            if sig:
                why = {
                    signal.SIGXCPU: " (CPU time limit)",
                    signal.SIGKILL: " (killed: memory?)",
                    signal.SIGSEGV: " (segmentation fault)",
                }.get(signal.Signals(sig), "")
                return f"crashed: signal {signal.Signals(sig).name}{why}"
            if code >> 8 == STUCK_EXIT:
                return f"crashed: {STUCK}"
            return f"crashed: the worker exited with code {code >> 8}"
        time.sleep(0.005)
    return "crashed: the worker ended"


class Supervisor:
    def __init__(self, cfg: dict[str, Any], out: int) -> None:
        self.cfg, self.out = cfg, out
        self.uid: int | None = cfg.get("uid")
        self.wall = float(cfg.get("wall_seconds_per_call", 10))
        self.load_s = float(cfg.get("load_seconds_per_tool", 10))
        self.max_line = 8 * int(cfg.get("output_cap_chars", 65536)) + 4096
        self.codes: dict[str, Any] = {}
        self.compile_errors: dict[str, str] = {}
        self.skip: dict[str, str] = {}
        self.zygote: socket.socket | None = None
        self.ep: _Episode | None = None

    def serve(self, inp: io.BufferedReader) -> None:
        for line in inp:
            seq = None
            try:
                msg = json.loads(line)
                seq, op = msg.get("seq"), msg.get("op")
                reply: dict[str, Any] | bytes
                if op == "call":
                    reply = self.call(seq, line)
                elif op == "reset":
                    reply = self.renew()
                elif op == "load" and self.zygote is None:
                    reply = self.load(dict(msg["tools"]), dict(msg.get("skip") or {}))
                else:
                    reply = {"kind": "error", "error": f"unknown op {op!r}"}
            except _Broken as exc:
                reply = {"kind": "crash", "error": str(exc)}
            except Exception as exc:  # a malformed request must not kill the supervisor
                reply = {"kind": "error", "error": f"supervisor: {type(exc).__name__}: {exc}"}
            data = encode_line({**reply, "seq": seq}) if isinstance(reply, dict) else reply
            view = memoryview(data)
            while view:
                view = view[os.write(self.out, view) :]
        self.discard()

    def load(self, tools: dict[str, str], skip: dict[str, str]) -> dict[str, Any]:
        names: set[str] = set()
        for name, source in tools.items():
            try:
                tree = ast.parse(source, f"<tool {name}>")
                self.codes[name] = compile(tree, f"<tool {name}>", "exec")
            except BaseException as exc:  # SyntaxError, ValueError (NUL), RecursionError
                self.compile_errors[name] = exc_text(exc)
                continue
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    names.update(a.name.split(".")[0] for a in node.names)
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    names.add(node.module.split(".")[0])
        for mod in sorted((names & sys.stdlib_module_names) - _NO_PREIMPORT):
            with contextlib.suppress(BaseException):
                __import__(mod)  # standard library only: imported once, shared by every fork
        self.skip = {k: v for k, v in skip.items() if k in self.codes}
        a, b = socket.socketpair()
        pid = os.fork()
        if pid == 0:
            a.close()
            os.close(self.out)
            os.close(self.cfg["_in"])
            try:
                zygote(b, self.codes, self.cfg)
            finally:
                os._exit(0)
        b.close()
        a.settimeout(10)
        self.zygote = a
        return self.renew()

    def renew(self) -> dict[str, Any]:
        """Kill the episode, wipe /tmp, fork a fresh one and load the tools in it."""
        self.discard()
        self._wipe_tmp()
        errors, conduct = self._start_episode()
        all_errors = {**self.compile_errors, **self.skip, **errors}
        return {"kind": "ok", "errors": all_errors, "skip": self.skip, "conduct": conduct}

    def _fork_episode(self) -> _Episode:
        assert self.zygote is not None
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        try:
            socket.send_fds(self.zygote, [b"f"], [req_r, rep_w])
            data = b""
            while not data.endswith(b"\n"):
                chunk = self.zygote.recv(64)
                if not chunk:
                    raise _Broken("the sandbox's template process ended")
                data += chunk
        except OSError as exc:
            raise _Broken(f"the sandbox's template process failed: {exc}") from None
        finally:
            os.close(req_r)
            os.close(rep_w)
        os.set_blocking(req_w, False)
        os.set_blocking(rep_r, False)
        self.ep = _Episode(int(data), req_w, rep_r)
        return self.ep

    def _start_episode(self) -> tuple[dict[str, str], dict[str, Any]]:
        """A loaded episode: its load errors and the tools' conduct while loading."""
        for _ in range(len(self.codes) + 1):
            ep = self._fork_episode()
            current, why = None, ""
            try:
                first = encode_line({"op": "load", "skip": sorted(self.skip)})
                _write_all(ep.req, first, time.monotonic() + self.load_s)
            except (_Timeout, OSError):
                why = "did not start"
            deadline = time.monotonic() + self.load_s
            while not why:
                try:
                    line = ep.read_line(deadline, self.max_line)
                except _Timeout:
                    why = f"did not finish within {self.load_s:g} s"
                    break
                except _Broken as exc:
                    why = str(exc)
                    break
                if line is None:
                    why = _exit_reason(ep.pid)
                    break
                msg = _parse(line)
                if isinstance(msg.get("loading"), str) and msg["loading"] in self.codes:
                    current, deadline = msg["loading"], time.monotonic() + self.load_s
                elif msg.get("ready") is True and isinstance(msg.get("errors"), dict):
                    conduct = msg.get("conduct")
                    errors = {str(k): str(v) for k, v in msg["errors"].items()}
                    return errors, conduct if isinstance(conduct, dict) else {}
                else:
                    why = "wrote to the protocol channel"
            self.discard()
            if current is None:
                raise _Broken(f"the sandbox could not start an episode ({why})")
            self.skip[current] = f"the module code {why}; the tool is disabled"
        raise _Broken("the sandbox could not start an episode")

    def call(self, seq: Any, raw: bytes) -> dict[str, Any] | bytes:
        if self.ep is None:
            self.renew()
        ep = self.ep
        assert ep is not None
        if ep.pending():  # anything before the request is not a reply to it
            ended = not ep.buf and not os.read(ep.rep, 1)
            reason = _exit_reason(ep.pid) if ended else "wrote to the protocol channel"
            self.discard()
            return {"kind": "crash", "error": f"{reason} (between calls)"}
        deadline = time.monotonic() + self.wall
        try:
            _write_all(ep.req, raw, deadline)
            line = ep.read_line(deadline, self.max_line)
        except _Timeout:
            self.discard()
            return {"kind": "timeout", "error": f"timed out after {self.wall:g} s"}
        except (_Broken, OSError) as exc:
            self.discard()
            return {"kind": "crash", "error": f"crashed: {exc}"}
        if line is None:
            reason = _exit_reason(ep.pid)
            self.discard()
            return {"kind": "crash", "error": reason}
        msg = _parse(line)
        if type(msg.get("seq")) is not int or msg["seq"] != seq or ep.buf:
            self.discard()
            return {"kind": "crash", "error": "wrote something other than its reply on the "
                    "protocol channel"}  # fmt: skip
        if msg.get("kind") == "crash":  # the episode gave up (see _settle): replace it
            self.discard()
            return {"kind": "crash", "error": str(msg.get("error"))}
        if msg.get("kind") not in ("ok", "error"):
            self.discard()
            return {"kind": "crash", "error": "sent a reply of an unknown kind"}
        return line

    def discard(self) -> None:
        """Kill every process of the episode (by uid inside the sandbox, else its group)."""
        ep, self.ep = self.ep, None
        if ep is None:
            return
        os.close(ep.req)
        os.close(ep.rep)
        if self.uid is None:
            with contextlib.suppress(OSError):
                os.killpg(ep.pid, signal.SIGKILL)
            return
        pid = os.fork()
        if pid == 0:  # as the episode's uid, kill(-1) reaches exactly its processes
            try:
                drop_privileges(self.uid)
                for _ in range(3):
                    os.kill(-1, signal.SIGKILL)
            finally:
                os._exit(0)
        os.waitpid(pid, 0)

    def _wipe_tmp(self) -> None:
        if not self.cfg.get("wipe_tmp"):
            return
        try:
            for entry in os.scandir("/tmp"):
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path)
                else:
                    os.unlink(entry.path)
        except (OSError, RecursionError) as exc:
            raise _Broken(f"could not clear /tmp: {exc}") from None


def _parse(line: bytes) -> dict[str, Any]:
    try:
        msg = json.loads(line)
    except (ValueError, RecursionError):
        return {}
    return msg if isinstance(msg, dict) else {}


def _harden(tmp_files: int | None) -> None:
    """No other process of the sandbox may open our fds via /proc or ptrace us; /tmp holds at
    most ``tmp_files`` inodes (bubblewrap bounds its size only: an empty file costs no block
    but ~1 KiB of kernel memory). Both as root in the sandbox's own mount namespace."""
    with contextlib.suppress(Exception):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0
        if tmp_files:  # MS_REMOUNT | MS_NOSUID | MS_NODEV, as bubblewrap mounted it
            libc.mount(b"tmpfs", b"/tmp", b"tmpfs", 32 | 2 | 4, b"nr_inodes=%d" % tmp_files)


def main() -> None:
    cfg = json.loads(sys.argv[1])
    proto_in, proto_out = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)
    if cfg.get("uid") is not None:
        with contextlib.suppress(OSError):
            os.chmod("/tmp", 0o1777)
    _harden(cfg.get("tmp_files") if cfg.get("wipe_tmp") else None)
    cfg["_in"] = proto_in
    Supervisor(cfg, proto_out).serve(os.fdopen(proto_in, "rb"))


if __name__ == "__main__":
    main()
