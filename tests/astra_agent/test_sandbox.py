"""The sandbox: hostile tool sources are contained with a clear error; the host is unharmed."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from astra_agent.errors import ConfigError
from astra_agent.sandbox import Sandbox, SandboxLimits, bwrap_command

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
MARKER = Path("/var/tmp/astra-sandbox-escape-marker")  # outside /tmp wherever the repo lies

HOSTILE = {
    "socket_": (
        "def socket_():\n    import socket\n    s = socket.socket()\n"
        "    s.connect(('1.1.1.1', 80))\n    return 'connected'\n",
        "network access is not allowed",
    ),
    "read_host": (
        f"def read_host():\n    return open({str(README)!r}).read()\n",
        "No such file or directory",
    ),
    "write_outside": (
        f"def write_outside():\n    open({str(MARKER)!r}, 'w').write('x')\n",
        "writing outside /tmp",
    ),
    "fork_bomb": (
        "def fork_bomb():\n    import os\n    while True:\n        os.fork()\n",
        "creating processes is not allowed",
    ),
    "memory_bomb": (
        "def memory_bomb():\n    x = bytearray(10**11)\n    return len(x)\n",
        "MemoryError",
    ),
    # The wall clock or the CPU limit, whichever strikes first (it depends on the load).
    "infinite_loop": (
        "def infinite_loop():\n    while True:\n        pass\n",
        ("timed out after", "CPU time limit"),
    ),
    "kill_parent": (
        "def kill_parent():\n    import os, signal\n    os.kill(os.getppid(), signal.SIGKILL)\n",
        "sending signals",
    ),
    "system": (
        "def system():\n    import os\n    return os.system('echo hi > /tmp/x')\n",
        "running shell commands is not allowed",
    ),
    "subprocess_": (
        "def subprocess_():\n    import subprocess\n"
        "    return subprocess.run(['ls', '/'], capture_output=True).stdout\n",
        "starting programs is not allowed",
    ),
    "ctypes_": (
        "def ctypes_():\n    import ctypes\n    return ctypes.CDLL(None).getpid()\n",
        "loading native code (ctypes) is not allowed",
    ),
    "exits": ("def exits():\n    import os\n    os._exit(7)\n", "crashed"),
    "raises": ("def raises():\n    raise ValueError('bad input')\n", "ValueError: bad input"),
}
GOOD = {
    "double": "def double(x):\n    print('doubling', x)\n    return {'x': x * 2}\n",
    "counter": "STATE = {'n': 0}\ndef counter():\n    STATE['n'] += 1\n    return STATE['n']\n",
    "huge_print": "def huge_print():\n    print('p' * 10**7)\n    return 'done'\n",
    "huge_value": "def huge_value():\n    return 'v' * 10**8\n",
    "tmp_ok": (
        "def tmp_ok():\n    open('/tmp/f', 'w').write('ok')\n    return open('/tmp/f').read()\n"
    ),
}
LIMITS = SandboxLimits(
    wall_seconds_per_call=3,
    cpu_seconds_per_call=2,
    address_space_bytes=768 << 20,
    output_cap_chars=4096,
)


@pytest.fixture
async def sandbox() -> AsyncIterator[Sandbox]:
    sources = {**{k: v for k, (v, _) in HOSTILE.items()}, **GOOD}
    async with Sandbox(sources, LIMITS) as sb:
        yield sb


@pytest.mark.parametrize("name", sorted(HOSTILE))
async def test_hostile_tool_is_contained(sandbox: Sandbox, name: str) -> None:
    t0 = time.monotonic()
    reply = await sandbox.call(name, {})
    assert not reply.ok, reply
    expected = HOSTILE[name][1]
    assert any(
        e in reply.text() for e in (expected if isinstance(expected, tuple) else (expected,))
    ), reply.text()
    assert time.monotonic() - t0 < LIMITS.wall_seconds_per_call + 5
    after = await sandbox.call("double", {"x": 21})  # the next call works
    assert after.ok and after.value == {"x": 42}
    assert README.is_file() and not MARKER.exists()


async def test_values_printed_output_and_state(sandbox: Sandbox) -> None:
    r = await sandbox.call("double", {"x": 2})
    assert r.ok and r.value == {"x": 4} and r.output.strip() == "doubling 2"
    assert r.text() == 'doubling 2\n\n{"x": 4}'
    assert [(await sandbox.call("counter", {})).value for _ in range(3)] == [1, 2, 3]
    await sandbox.reset()  # fresh state: sources re-run
    assert (await sandbox.call("counter", {})).value == 1
    assert (await sandbox.call("tmp_ok", {})).value == "ok"


async def test_huge_output_is_capped(sandbox: Sandbox) -> None:
    r = await sandbox.call("huge_print", {})
    assert r.ok and len(r.output) < 5000 and "characters of output dropped" in r.output
    r = await sandbox.call("huge_value", {})
    assert not r.ok and "too large" in r.error


async def test_worker_replaced_after_timeout_with_fresh_state(sandbox: Sandbox) -> None:
    assert (await sandbox.call("counter", {})).value == 1
    assert (await sandbox.call("infinite_loop", {})).kind in ("timeout", "crash")
    assert (await sandbox.call("counter", {})).value == 1  # a new worker
    assert sandbox.replacements == 1


async def test_bad_arguments_and_unknown_tools(sandbox: Sandbox) -> None:
    r = await sandbox.call("double", {"y": 1})
    assert not r.ok and "TypeError" in r.error
    r = await sandbox.call("nope", {})
    assert not r.ok and "no implementation" in r.error


async def test_load_errors_are_reported_per_tool() -> None:
    sources = {
        "bad": "def bad(:\n",
        "other": "def something_else():\n    pass\n",
        "boom": "raise RuntimeError('at import')\ndef boom():\n    pass\n",
        "fine": "def fine():\n    return 1\n",
    }
    async with Sandbox(sources, LIMITS) as sb:
        errors = sb.load_errors
        assert "SyntaxError" in errors["bad"]
        assert "does not define a function named 'other'" in errors["other"]
        assert "RuntimeError: at import" in errors["boom"]
        assert "fine" not in errors and (await sb.call("fine", {})).value == 1


def test_missing_bubblewrap_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ConfigError, match="bubblewrap"):
        Sandbox({"f": "def f():\n    return 1\n"})


async def test_unsafe_flag_runs_without_isolation(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import astra_agent.sandbox as sandbox_mod

    monkeypatch.setattr(sandbox_mod, "_warned_unsafe", False)
    monkeypatch.setenv("PATH", "/nonexistent")
    with caplog.at_level("WARNING"):
        sb = Sandbox({"f": "def f():\n    return 7\n"}, unsafe_no_sandbox=True)
    assert "UNSAFE" in caplog.text
    async with sb:
        assert (await sb.call("f", {})).value == 7


# ------------------------------------------------------------- the isolation itself (no hook)


def raw(code: str) -> subprocess.CompletedProcess[str]:
    """Run Python in the same bubblewrap sandbox, limits and uid, without the audit hook."""
    cmd = bwrap_command({})
    cmd[-3:] = [
        "-I",
        "-S",
        "-c",
        (
            "import os, resource\n"
            "resource.setrlimit(resource.RLIMIT_NPROC, (16, 16))\n"
            "if os.getuid() == 0:\n"
            "    os.setgroups([]); os.setgid(65534); os.setuid(65534)\n" + code
        ),
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def test_no_network_without_the_hook() -> None:
    out = raw(
        "import socket\ntry:\n    socket.create_connection(('1.1.1.1', 53), 2)\n"
        "except OSError as e:\n    print('blocked', e.errno)\n"
    )
    assert "blocked" in out.stdout, out.stderr


def test_no_host_files_and_read_only_system_without_the_hook() -> None:
    target = REPO / "escape-marker"
    out = raw(
        f"import os\nprint(os.path.exists({str(README)!r}), os.path.exists('/etc/passwd'),"
        " os.path.exists('/work'))\n"
        "for path in ['/usr/x', " + repr(str(target)) + "]:\n"
        "    try:\n        open(path, 'w').write('x')\n"
        "    except OSError as e:\n        print('refused', e.errno)\n"
    )
    assert out.stdout.split("\n")[0] == "False False False", out.stderr
    assert out.stdout.count("refused") == 2, out.stdout
    assert not target.exists()


def test_process_limit_and_pid_namespace_without_the_hook() -> None:
    out = raw(
        "import os, time\nn = 0\ntry:\n    for _ in range(100):\n"
        "        if os.fork() == 0:\n            time.sleep(5); os._exit(0)\n        n += 1\n"
        "except OSError as e:\n    print('limited at', n)\nprint('pid', os.getpid())\n"
    )
    assert "limited at" in out.stdout, out.stdout + out.stderr
    assert int(out.stdout.split("limited at")[1].split()[0]) < 20
    assert "pid 2" in out.stdout or "pid 1" in out.stdout  # its own pid namespace


def test_host_processes_survive_a_kill_everything_tool() -> None:
    """A tool that signals every pid it can think of (the host's included) harms nothing."""
    sentinel = subprocess.Popen(["sleep", "60"])
    try:
        pids = sorted({*range(1, 3000), sentinel.pid, os.getpid(), os.getppid()})
        out = raw(
            f"import os, signal\nfor pid in {pids!r}:\n    try:\n"
            "        os.kill(pid, signal.SIGKILL)\n    except OSError:\n        pass\n"
            "print('tried')\n"
        )
        assert out.returncode in (0, -9, 137), out.stderr
        assert sentinel.poll() is None  # the host's process is untouched
    finally:
        sentinel.kill()
        sentinel.wait()
