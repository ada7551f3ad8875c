"""Run untrusted tool code (LLM-written environments) in a persistent bubblewrap sandbox.

One sandbox per environment instance: a bubblewrap container whose supervisor loads the tool
sources once and answers calls over a pipe; the tool code itself runs in an *episode* process
forked from a pristine template, so ``reset()`` is a fork, not a new interpreter
(``sandbox_worker.py`` explains the three processes and why tool code cannot reach or forge the
reply channel). Inside bubblewrap there is no network, a read-only system, a private ``/tmp``
bounded in size and files (a tmpfs of ``SandboxLimits.tmp_bytes`` and ``tmp_files``), its own
pid namespace, none of the host's files beyond the Python runtime, resource limits (CPU, address
space, processes, file size, open files), a seccomp filter (no keyrings, IPC objects, memfds or
namespaces: nothing that outlives an episode's processes), and as root on the host a uid of its
own (leased from a range, so that one sandbox's processes never count against another's
process limit).

Every call has a wall-clock deadline that covers writing the request as well as reading the
reply; a reply that is not exactly the call's own (not JSON, another call's, out of step) is an
error result. After a crash, a timeout, a limit breach or a forged reply the call gets an error
result and the episode is replaced (fresh state); the host never dies, hangs or raises.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import random
import shutil
import signal
import stat
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from astra_agent.errors import ConfigError
from astra_agent.runio import loads_text
from astra_agent.sandbox_episode import encode_line
from astra_agent.sandbox_seccomp import seccomp_filter

log = logging.getLogger(__name__)

WORKER = Path(__file__).with_name("sandbox_worker.py")
EPISODE = Path(__file__).with_name("sandbox_episode.py")  # imported by the worker, beside it
# Sandbox uids: one per live sandbox, leased with a lock file (valid across host processes).
# One directory per machine, whatever TMPDIR says (batch jobs often get a TMPDIR each).
UID_BASE = 1_900_000_000
UID_SLOTS = 65536
UID_LOCKS = (
    next((Path(d) for d in ("/run/lock", "/var/lock") if os.path.isdir(d)), Path("/tmp"))
    / "astra-sandbox-uids"
)
# The supervisor enforces the deadlines; the host waits this much longer before killing it.
HOST_SLACK_S = 1.0
_warned_unsafe = False
_KINDS = ("ok", "error", "timeout", "crash")


class SandboxLimits(BaseModel):
    model_config = ConfigDict(extra="forbid")

    wall_seconds_per_call: float = Field(10.0, gt=0)
    cpu_seconds_per_call: int = Field(10, ge=1)
    address_space_bytes: int = Field(1 << 30, ge=64 << 20)
    processes: int = Field(64, ge=1)
    file_size_bytes: int = Field(16 << 20, ge=0)
    open_files: int = Field(64, ge=16)
    output_cap_chars: int = Field(65536, ge=256)
    startup_seconds: float = Field(15.0, gt=0)
    # The size of the sandbox's /tmp (a tmpfs: host memory, at most this much per sandbox).
    tmp_bytes: int = Field(64 << 20, ge=1 << 20)
    # At most this many files and directories in /tmp (each ~1 KiB of kernel memory more).
    tmp_files: int = Field(16384, ge=16)
    # A tool whose module code runs longer than this is disabled with a load error.
    load_seconds_per_tool: float = Field(10.0, gt=0)


ReplyKind = Literal["ok", "error", "timeout", "crash"]


@dataclass(frozen=True)
class Conduct:
    """What tool code did that the sandbox contained without an error to show for it (one
    call, or one tool's load): operations refused (``"network access"``, ``"starting
    programs"``…: each once, even where the code caught the error), threads still running when
    it returned, characters printed (kept or dropped). Reported by the episode process itself:
    for judging generated code, not a security boundary."""

    refused: tuple[str, ...] = ()
    threads_left: int = 0
    printed: int = 0

    @classmethod
    def parse(cls, raw: Any) -> Conduct:
        if not isinstance(raw, dict):
            return cls()
        refused = raw.get("refused")
        refused = refused if isinstance(refused, list) else []

        counts = [raw.get("threads_left"), raw.get("printed")]
        threads, printed = (n if type(n) is int and n > 0 else 0 for n in counts)
        return cls(tuple(str(r)[:300] for r in refused[:16]), threads, printed)


@dataclass(frozen=True)
class SandboxReply:
    kind: ReplyKind
    value: Any = None
    output: str = ""
    error: str = ""
    conduct: Conduct = Conduct()

    @property
    def ok(self) -> bool:
        return self.kind == "ok"

    def text(self) -> str:
        """What the model reads: the return value (and anything printed), or the error."""
        if not self.ok:
            return f"Error: {self.error}" + (f"\n{self.output}" if self.output else "")
        if isinstance(self.value, str):
            value = self.value
        else:
            value = json.dumps(self.value, ensure_ascii=False, default=str)
        return f"{self.output}\n{value}" if self.output else value


def bwrap_available() -> bool:
    return shutil.which("bwrap") is not None


def _python() -> tuple[str, str]:
    """The real interpreter (not a venv shim) and the prefix it needs bound in."""
    exe = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    return exe, os.path.realpath(sys.base_prefix)


def bwrap_command(
    config: dict[str, Any], *, tmp_bytes: int = 64 << 20, seccomp_fd: int | None = None
) -> list[str]:
    """The bubblewrap command line; ``seccomp_fd`` is a readable fd holding the filter."""
    exe, prefix = _python()
    cmd = ["bwrap", "--die-with-parent", "--new-session"]
    if seccomp_fd is not None:
        cmd += ["--seccomp", str(seccomp_fd)]
    if os.geteuid() == 0:
        # As root: every namespace but the user one, so that the worker can drop to a real
        # unprivileged uid (a uid mapped inside a user namespace would still count as root
        # for the process limit).
        cmd += [
            "--unshare-ipc",
            "--unshare-pid",
            "--unshare-net",
            "--unshare-uts",
            "--unshare-cgroup-try",
        ]
    else:
        cmd += ["--unshare-all"]
    cmd += ["--ro-bind", "/usr", "/usr"]
    for d in ("lib", "lib64", "bin", "sbin"):
        p = Path("/") / d
        if p.is_symlink():
            cmd += ["--symlink", os.readlink(p), f"/{d}"]
        elif p.is_dir():
            cmd += ["--ro-bind", str(p), f"/{d}"]
    if not prefix.startswith("/usr/"):
        # Its parents may be private on the host (/root is 0700): make them traversable for
        # the unprivileged uid; only the prefix itself is bound in.
        for parent in reversed(Path(prefix).parents[:-1]):
            cmd += ["--perms", "0755", "--dir", str(parent)]
        cmd += ["--ro-bind", prefix, prefix]
    cmd += ["--ro-bind", str(WORKER), "/sandbox/worker.py"]
    cmd += ["--ro-bind", str(EPISODE), "/sandbox/sandbox_episode.py"]
    cmd += ["--proc", "/proc", "--dev", "/dev"]
    cmd += ["--perms", "1777", "--size", str(tmp_bytes), "--tmpfs", "/tmp", "--chdir", "/tmp"]
    cmd += ["--clearenv", "--setenv", "PATH", "/usr/bin", "--setenv", "HOME", "/tmp"]
    cmd += ["--setenv", "PYTHONDONTWRITEBYTECODE", "1"]
    config = {**config, "own_pid_namespace": True, "wipe_tmp": True}
    return [*cmd, exe, "-I", "-S", "/sandbox/worker.py", json.dumps(config)]


def _private_dir(path: Path) -> None:
    """``path`` as a directory of this user's alone (in a world-writable parent another user
    could have made it first, to share or deny the leases)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise ConfigError(
            f"{path} is not a private directory of this user, so sandbox uids cannot be leased",
            hint=f"remove it (it is recreated): rm -r {path}",
        )


class _UidLease:
    """A uid no other live sandbox on this machine holds (a lock file per uid slot)."""

    def __init__(self) -> None:
        _private_dir(UID_LOCKS)
        start = random.randrange(UID_SLOTS)
        flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        for i in range(UID_SLOTS):
            slot = (start + i) % UID_SLOTS
            f = os.fdopen(os.open(UID_LOCKS / str(slot), flags, 0o600), "w")
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                f.close()
                continue
            self.uid, self._file = UID_BASE + slot, f
            return
        raise ConfigError(f"all {UID_SLOTS} sandbox uids are in use")

    def release(self) -> None:
        self._file.close()


def _decode_reply(line: bytes, seq: int) -> dict[str, Any] | None:
    """The reply to request ``seq``, or None for anything else (garbage, another call's)."""
    try:
        obj = loads_text(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict) or type(obj.get("seq")) is not int or obj["seq"] != seq:
        return None
    return obj if obj.get("kind") in _KINDS else None


def _str_dict(value: Any) -> dict[str, str]:
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}


class Sandbox:
    """A persistent sandbox holding one set of tool sources; ``reset()`` gives fresh state."""

    def __init__(
        self,
        sources: dict[str, str],
        limits: SandboxLimits | None = None,
        *,
        unsafe_no_sandbox: bool = False,
    ) -> None:
        self.sources = dict(sources)
        self.limits = limits or SandboxLimits()
        self.unsafe = unsafe_no_sandbox
        self.load_errors: dict[str, str] = {}
        self.load_conduct: dict[str, Conduct] = {}  # per tool, of the latest load (see Conduct)
        self.replacements = 0  # how many times state was discarded after a failed call
        self._skip: dict[str, str] = {}  # tools whose module code hung or crashed the load
        self._proc: asyncio.subprocess.Process | None = None
        self._lease: _UidLease | None = None
        self._seq = 0
        self._inflight: asyncio.Future[dict[str, Any]] | None = None
        self._lock = asyncio.Lock()
        if not self.unsafe and not bwrap_available():
            raise ConfigError(
                "bubblewrap (bwrap) is not installed, so tool code cannot be isolated",
                hint="install it (apt-get install bubblewrap), or pass --unsafe-no-sandbox to "
                "run tool code without isolation (only for code you trust)",
            )
        global _warned_unsafe
        if self.unsafe and not _warned_unsafe:
            _warned_unsafe = True
            log.warning("UNSAFE: running tool code without a sandbox (no bubblewrap isolation)")

    def _config(self) -> dict[str, Any]:
        lim = self.limits
        if not self.unsafe and os.geteuid() == 0 and self._lease is None:
            self._lease = _UidLease()
        return {
            "limits": {
                "address_space_bytes": lim.address_space_bytes,
                "processes": lim.processes,
                "file_size_bytes": lim.file_size_bytes,
                "open_files": lim.open_files,
            },
            "cpu_seconds_per_call": lim.cpu_seconds_per_call,
            "wall_seconds_per_call": lim.wall_seconds_per_call,
            "load_seconds_per_tool": lim.load_seconds_per_tool,
            "output_cap_chars": lim.output_cap_chars,
            "tmp_files": lim.tmp_files,
            "uid": self._lease.uid if self._lease else None,
        }

    def _load_timeout(self) -> float:
        per_tool = self.limits.load_seconds_per_tool
        return self.limits.startup_seconds + per_tool * (len(self.sources) + 1) + HOST_SLACK_S

    async def _spawn(self) -> None:
        filt = None if self.unsafe else seccomp_filter()
        fds = os.pipe() if filt else None
        if fds:
            os.write(fds[1], filt or b"")  # a few hundred bytes: the pipe holds them
            os.close(fds[1])
        try:
            if self.unsafe:
                cmd = [_python()[0], "-I", "-S", str(WORKER), json.dumps(self._config())]
            else:
                cmd = bwrap_command(
                    self._config(),
                    tmp_bytes=self.limits.tmp_bytes,
                    seccomp_fd=fds[0] if fds else None,
                )
        except BaseException:
            if fds:
                os.close(fds[0])
            raise
        # The start itself is never cancelled: Python 3.11's asyncio, cancelled while it
        # connects a new process's pipes, kills only that pid and then waits for the pipes to
        # close, and bubblewrap killed that early can leave its child behind holding them (a
        # cancelled start hung a CI run for 50 minutes). A cancelled caller's process is killed
        # as a group once it exists.
        spawn = asyncio.ensure_future(
            asyncio.create_subprocess_exec(
                *cmd,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.DEVNULL,
                start_new_session=True,
                limit=64 * self.limits.output_cap_chars + (1 << 20),
                pass_fds=fds[:1] if fds else (),
            )
        )
        if fds:
            spawn.add_done_callback(lambda _: os.close(fds[0]))
        try:
            self._proc = await asyncio.shield(spawn)
        except asyncio.CancelledError:
            spawn.add_done_callback(_kill_spawned)
            raise
        msg = {"op": "load", "tools": self.sources, "skip": self._skip}
        try:
            reply = await self._request(self._next(msg), self._load_timeout())
        except asyncio.CancelledError:  # nothing to keep: the next call starts anew
            self._kill_now()
            raise
        if reply["kind"] != "ok":
            await self._kill()
            raise ConfigError(f"the sandbox worker did not start: {reply.get('error')}")
        self._take_load(reply)

    def _take_load(self, reply: dict[str, Any]) -> None:
        self.load_errors = _str_dict(reply.get("errors"))
        raw = reply.get("conduct")
        conduct = raw if isinstance(raw, dict) else {}
        self.load_conduct = {str(k): Conduct.parse(v) for k, v in conduct.items()}
        self._skip = _str_dict(reply.get("skip"))

    async def start(self) -> dict[str, str]:
        """Start the worker and load the sources; returns per-tool load errors."""
        async with self._lock:
            await self._ready()
        return self.load_errors

    def _next(self, msg: dict[str, Any]) -> bytes:
        """The request's line, numbered (the reply must carry the same number)."""
        self._seq += 1
        return encode_line({**msg, "seq": self._seq})

    async def _request(self, data: bytes, timeout: float) -> dict[str, Any]:
        """One request and its reply, carried to the end even if the caller is cancelled (an
        unread reply would be taken for the next request's); the next one waits for it."""
        task = asyncio.ensure_future(self._exchange(data, timeout))
        self._inflight = task
        return await asyncio.shield(task)

    async def _ready(self) -> None:
        """Under the lock: the exchange a cancelled caller left has ended; a worker runs."""
        if self._inflight is not None and not self._inflight.done():
            await asyncio.wait({self._inflight})
        if self._proc is None:
            await self._spawn()

    async def _exchange(self, data: bytes, timeout: float) -> dict[str, Any]:
        """One request and its reply, all under ``timeout`` (the write included)."""
        proc = self._proc
        assert proc is not None and proc.stdin is not None and proc.stdout is not None
        try:
            async with asyncio.timeout(timeout):
                proc.stdin.write(data)
                await proc.stdin.drain()
                line = await proc.stdout.readline()
        except TimeoutError:
            await self._kill()
            return {"kind": "timeout", "error": f"timed out after {timeout - HOST_SLACK_S:g} s"}
        except (ConnectionError, asyncio.LimitOverrunError, ValueError) as exc:
            await self._kill()
            return {"kind": "crash", "error": f"the worker failed: {type(exc).__name__}"}
        if not line:
            return {"kind": "crash", "error": _describe_exit(await self._kill())}
        reply = _decode_reply(line, self._seq)
        if reply is None:
            await self._kill()
            return {"kind": "crash", "error": "the worker sent something other than its reply"}
        return reply

    async def call(self, name: str, arguments: dict[str, Any]) -> SandboxReply:
        async with self._lock:
            await self._ready()
            try:
                data = self._next({"op": "call", "name": name, "args": arguments})
            except (TypeError, ValueError, RecursionError) as exc:
                why = f"the arguments cannot be sent to the tool: {type(exc).__name__}: {exc}"
                return SandboxReply("error", error=why)
            t0 = time.monotonic()
            r = await self._request(data, self.limits.wall_seconds_per_call + HOST_SLACK_S)
        kind: ReplyKind = r["kind"]
        error, output = str(r.get("error") or ""), str(r.get("output") or "")
        if kind == "timeout" or kind == "crash":
            self.replacements += 1
            error = f"tool '{name}' {error} (the sandbox was replaced)"
        elif kind == "error" and r.get("traceback"):
            error = error + "\n" + str(r["traceback"]).strip()
        log.debug("sandbox call %s: %s in %.1f ms", name, kind, (time.monotonic() - t0) * 1e3)
        return SandboxReply(kind, r.get("value"), output, error, Conduct.parse(r.get("conduct")))

    async def reset(self) -> dict[str, str]:
        """Fresh state: a new episode forked from the pristine template, /tmp emptied."""
        async with self._lock:
            if self._inflight is not None and not self._inflight.done():
                await asyncio.wait({self._inflight})
            if self._proc is None:
                await self._spawn()
                return self.load_errors
            try:
                r = await self._request(self._next({"op": "reset"}), self._load_timeout())
            except asyncio.CancelledError:  # fresh state is what was asked: the next call
                self._kill_now()  # starts a new sandbox
                raise
            if r["kind"] == "ok":
                self._take_load(r)
            else:
                await self._kill()
                await self._spawn()
        return self.load_errors

    def _kill_now(self) -> None:
        """Kill the worker without waiting (its transport reaps it)."""
        proc, self._proc = self._proc, None
        if proc is not None:
            _kill_group(proc)

    async def _kill(self) -> int | None:
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        _kill_group(proc)
        with contextlib.suppress(Exception):
            return await asyncio.wait_for(proc.wait(), 5)
        return None

    async def close(self) -> None:
        await self._kill()
        if self._lease is not None:
            self._lease.release()
            self._lease = None

    async def __aenter__(self) -> Sandbox:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL the worker's whole process group (bubblewrap and any child it has made), then
    close its stdin: a worker that outlived the signal reads the end of its input and exits."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    _close_stdin(proc)


def _kill_spawned(spawn: asyncio.Future[asyncio.subprocess.Process]) -> None:
    """A start whose caller was cancelled: its process, once started, is killed."""
    if not spawn.cancelled() and spawn.exception() is None:
        _kill_group(spawn.result())


def _close_stdin(proc: asyncio.subprocess.Process | None) -> None:
    """Close a killed worker's stdin pipe now: left to the garbage collector, its transport
    may be finalised after the event loop closed ("Event loop is closed" printed at exit)."""
    if proc is not None and proc.stdin is not None and not proc.stdin.is_closing():
        proc.stdin.close()


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "stopped answering"
    if code > 128 and code - 128 in signal.valid_signals():
        code = 128 - code  # bubblewrap (pid 1) reports a child killed by signal N as 128+N
    if code < 0:
        sig = signal.Signals(-code)
        why = {
            signal.SIGXCPU: " (CPU time limit)",
            signal.SIGKILL: " (killed: memory?)",
            signal.SIGSEGV: " (segmentation fault)",
        }.get(sig, "")
        return f"crashed: signal {sig.name}{why}"
    return f"crashed: the worker exited with code {code}"
