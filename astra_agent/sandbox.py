"""Run untrusted tool code (LLM-written environments) in a persistent bubblewrap sandbox.

One worker process per environment instance: it loads the tool sources once and answers calls
over a pipe (``sandbox_worker.py``). Inside bubblewrap it has no network, a read-only system,
a private ``/tmp``, its own pid namespace, none of the host's files beyond the Python runtime,
and resource limits (CPU, address space, processes, file size, open files), as an unprivileged
uid. Every call has a wall-clock timeout and a cap on output. After a crash, a timeout or a
limit breach the call gets an error result and the worker is replaced on the next call; the
host never dies or hangs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from astra_agent.errors import ConfigError

log = logging.getLogger(__name__)

WORKER = Path(__file__).with_name("sandbox_worker.py")
_warned_unsafe = False


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


ReplyKind = Literal["ok", "error", "timeout", "crash"]


@dataclass(frozen=True)
class SandboxReply:
    kind: ReplyKind
    value: Any = None
    output: str = ""
    error: str = ""

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


def bwrap_command(config: dict[str, Any]) -> list[str]:
    exe, prefix = _python()
    cmd = ["bwrap", "--die-with-parent", "--new-session"]
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
    cmd += [
        "--ro-bind",
        str(WORKER),
        "/sandbox/worker.py",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--tmpfs",
        "/tmp",
        "--chdir",
        "/tmp",
        "--clearenv",
        "--setenv",
        "PATH",
        "/usr/bin",
        "--setenv",
        "HOME",
        "/tmp",
        "--setenv",
        "PYTHONDONTWRITEBYTECODE",
        "1",
        exe,
        "-I",
        "-S",
        "/sandbox/worker.py",
        json.dumps({**config, "own_pid_namespace": True}),
    ]
    return cmd


class Sandbox:
    """A persistent sandboxed worker holding one set of tool sources."""

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
        self.replacements = 0
        self._proc: asyncio.subprocess.Process | None = None
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
        return {
            "limits": {
                "address_space_bytes": lim.address_space_bytes,
                "processes": lim.processes,
                "file_size_bytes": lim.file_size_bytes,
                "open_files": lim.open_files,
            },
            "cpu_seconds_per_call": lim.cpu_seconds_per_call,
            "output_cap_chars": lim.output_cap_chars,
            "drop_privileges": os.geteuid() == 0,
        }

    async def _spawn(self) -> None:
        if self.unsafe:
            cmd = [_python()[0], "-I", "-S", str(WORKER), json.dumps(self._config())]
        else:
            cmd = bwrap_command(self._config())
        self._proc = await asyncio.create_subprocess_exec(
            *cmd,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            start_new_session=True,
            limit=64 * self.limits.output_cap_chars + (1 << 20),
        )
        reply = await self._request(
            {"op": "load", "tools": self.sources}, self.limits.startup_seconds
        )
        if reply.get("kind") != "ok":
            raise ConfigError(f"the sandbox worker did not start: {reply.get('error')}")
        self.load_errors = dict(reply.get("errors") or {})

    async def start(self) -> dict[str, str]:
        """Start the worker and load the sources; returns per-tool load errors."""
        async with self._lock:
            if self._proc is None:
                await self._spawn()
        return self.load_errors

    async def _request(self, msg: dict[str, Any], timeout: float) -> dict[str, Any]:
        proc = self._proc
        assert proc is not None and proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write((json.dumps(msg) + "\n").encode())
            await proc.stdin.drain()
            line = await asyncio.wait_for(proc.stdout.readline(), timeout)
        except TimeoutError:
            await self._kill()
            return {"kind": "timeout", "error": f"timed out after {timeout:g} s"}
        except (ConnectionError, asyncio.LimitOverrunError, ValueError) as exc:
            await self._kill()
            return {"kind": "crash", "error": f"the worker failed: {type(exc).__name__}"}
        if not line:
            code = await self._kill()
            return {"kind": "crash", "error": _describe_exit(code)}
        reply = json.loads(line)
        reply["kind"] = "ok" if reply.get("ok") else "error"
        return reply

    async def call(self, name: str, arguments: dict[str, Any]) -> SandboxReply:
        async with self._lock:
            if self._proc is None:
                self.replacements += 1
                await self._spawn()
            t0 = time.monotonic()
            r = await self._request(
                {"op": "call", "name": name, "args": arguments}, self.limits.wall_seconds_per_call
            )
        kind: ReplyKind = r["kind"]
        error = r.get("error", "")
        if kind == "timeout" or kind == "crash":
            error = f"tool '{name}' {error} (the sandbox was replaced)"
        elif kind == "error" and r.get("traceback"):
            error = error + "\n" + r["traceback"].strip()
        log.debug("sandbox call %s: %s in %.1f ms", name, kind, (time.monotonic() - t0) * 1e3)
        return SandboxReply(kind, r.get("value"), r.get("output", ""), error)

    async def reset(self) -> dict[str, str]:
        """Fresh state: re-run every source in the same worker (or start one)."""
        async with self._lock:
            if self._proc is None:
                await self._spawn()
                return self.load_errors
            r = await self._request({"op": "reset"}, self.limits.startup_seconds)
            if r["kind"] != "ok":
                await self._spawn()
            else:
                self.load_errors = dict(r.get("errors") or {})
        return self.load_errors

    async def _kill(self) -> int | None:
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            return await asyncio.wait_for(proc.wait(), 5)
        return None

    async def close(self) -> None:
        await self._kill()

    async def __aenter__(self) -> Sandbox:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


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
