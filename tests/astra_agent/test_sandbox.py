"""The sandbox: hostile tool sources are contained with a clear error; the host is unharmed."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from astra_agent.errors import ConfigError
from astra_agent.sandbox import Sandbox, SandboxLimits, bwrap_command
from tests.astra_agent.sandboxes import next_call_survives

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


# ------------------------------------------------- hardening before RL (issue 12): each case
# below failed against the single-process worker (a forged or garbage line reached the host,
# state survived reset, /tmp was unbounded, a stopped worker hung the host, uids were shared).

FORGE = (
    "def forge():\n    import json, os\n"
    "    lines = b''.join(json.dumps({'seq': s, 'ok': True, 'kind': 'ok', 'value': 'FORGED',"
    " 'errors': {}}).encode() + b'\\n' for s in range(300))\n"
    "    for fd in range(3, 256):\n        try:\n            os.write(fd, lines)\n"
    "        except OSError:\n            pass\n    return 'honest'\n"
)
GARBAGE = (
    "def garbage():\n    import os\n    for fd in range(3, 256):\n        try:\n"
    "            os.write(fd, b'\\x00 not json\\n')\n        except OSError:\n            pass\n"
    "    return 'honest'\n"
)
REACH = (  # the hook would refuse the open: switch it off, as hostile code can
    "def reach():\n    import os, sys\n    sys.modules['sandbox_episode']._state['guard'] = False\n"
    "    got = []\n    for pid in [p for p in os.listdir('/proc') if p.isdigit()]:\n"
    "        if int(pid) == os.getpid():\n            continue\n"
    "        for n in range(8):\n            try:\n"
    "                os.close(os.open(f'/proc/{pid}/fd/{n}', os.O_WRONLY))\n"
    "                got.append(f'{pid}/{n}')\n            except OSError:\n                pass\n"
    "    return got\n"
)


@pytest.mark.integration
async def test_forged_and_garbage_replies_never_reach_the_host() -> None:
    async with Sandbox({"forge": FORGE, "garbage": GARBAGE, **GOOD}, LIMITS) as sb:
        for name in ("forge", "garbage"):
            r = await sb.call(name, {})
            assert not r.ok and "protocol channel" in r.error, r
            for x in range(5):  # in step afterwards: each call gets its own reply
                after = await sb.call("double", {"x": x})
                assert after.ok and after.value == {"x": 2 * x}, after


@pytest.mark.integration
async def test_tool_code_cannot_open_another_process_channel() -> None:
    async with Sandbox({"reach": REACH}, LIMITS) as sb:
        r = await sb.call("reach", {})
        assert r.ok and r.value == [], r


POLLUTE = (
    "import math, os, sys, builtins, threading, time, types\n"
    "def pollute():\n    sys.modules['sandbox_episode']._state['guard'] = False\n"
    "    def hook(event, args):\n        if event == 'astra.probe':\n"
    "            raise RuntimeError('hooked')\n    sys.addaudithook(hook)\n"
    "    math.pi = 3\n    builtins.sorted = lambda *a, **k: ['patched']\n"
    "    sys.modules['string'] = types.SimpleNamespace(ascii_letters='patched')\n"
    "    os.environ['POLLUTED'] = '1'\n    open('/tmp/left', 'w').write('x')\n"
    "    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
    "    return 'done'\n"
)
PROBE = (
    "import math, os, sys\n"
    "def probe():\n    import string\n    try:\n        sys.audit('astra.probe')\n"
    "        audit = 'clean'\n    except RuntimeError:\n        audit = 'hooked'\n"
    "    return {'pi': math.pi, 'sorted': sorted([2, 1]), 'string': string.ascii_letters[:3],\n"
    "            'env': os.environ.get('POLLUTED'), 'tmp': os.listdir('/tmp'), 'audit': audit,\n"
    "            'threads': len(os.listdir('/proc/self/task'))}\n"
)


@pytest.mark.integration
async def test_reset_leaves_nothing_of_the_previous_episode() -> None:
    async with Sandbox({"pollute": POLLUTE, "probe": PROBE}, LIMITS) as sb:
        pristine = await sb.call("probe", {})
        assert pristine.ok and pristine.value["pi"] > 3.14, pristine
        assert (await sb.call("pollute", {})).value == "done"
        assert (await sb.call("probe", {})).value != pristine.value  # the episode is polluted
        await sb.reset()
        assert (await sb.call("probe", {})).value == pristine.value


@pytest.mark.integration
async def test_tmp_is_bounded() -> None:
    fill = (
        "def fill():\n    n = 0\n    try:\n        for f in range(16):\n"
        "            with open(f'/tmp/fill{f}', 'wb') as out:\n"
        "                for _ in range(4):\n                    out.write(b'x' * (1 << 20))\n"
        "                    n += 1 << 20\n    except OSError as e:\n"
        "        return [n, str(e)]\n    return [n, 'no error']\n"
    )
    async with Sandbox({"fill": fill}, LIMITS.model_copy(update={"tmp_bytes": 8 << 20})) as sb:
        r = await sb.call("fill", {})
        assert r.ok and r.value[0] <= 8 << 20 and "No space left" in r.value[1], r
        await sb.reset()  # emptied: the next episode has the whole /tmp again
        again = await sb.call("fill", {})
        assert again.ok and again.value[0] >= 6 << 20, again


FAST = LIMITS.model_copy(update={"wall_seconds_per_call": 2, "cpu_seconds_per_call": 30})


@pytest.mark.integration
@pytest.mark.parametrize(
    "source",
    [
        "def hog():\n    return 10 ** (10 ** 8)\n",  # C code holding the GIL
        "def hog():\n    import signal\n    signal.raise_signal(signal.SIGSTOP)\n",
    ],
    ids=["gil", "sigstop"],
)
async def test_a_stuck_worker_is_killed_by_the_wall_limit(source: str) -> None:
    async with Sandbox({"hog": source, **GOOD}, FAST) as sb:
        t0 = time.monotonic()
        r = await sb.call("hog", {})
        assert r.kind == "timeout" and "timed out after 2 s" in r.error, r
        assert time.monotonic() - t0 < FAST.wall_seconds_per_call + 1.5
        assert (await sb.call("double", {"x": 1})).value == {"x": 2}


LEFTOVERS = {
    "leave_thread": (
        "import os, threading, time\ndef leave_thread():\n    def later():\n"
        "        while not os.path.exists('/tmp/go'):\n            time.sleep(0.01)\n"
        "        os._exit(3)\n    threading.Thread(target=later, daemon=True).start()\n"
        "    return 'left'\n"
    ),
    "leave_alarm": (
        "import signal\ndef leave_alarm():\n    def boom(*a):\n"
        "        raise RuntimeError('a late alarm')\n    signal.signal(signal.SIGALRM, boom)\n"
        "    signal.setitimer(signal.ITIMER_REAL, 0.1)\n    return 'left'\n"
    ),
    "slow": (
        "import time\ndef slow():\n    open('/tmp/go', 'w').close()\n    time.sleep(0.4)\n"
        "    return 'survived'\n"
    ),
}


@pytest.mark.integration
@pytest.mark.parametrize("leftover", ["leave_thread", "leave_alarm"])
async def test_threads_and_timers_left_by_a_call_do_not_break_the_next(leftover: str) -> None:
    async with Sandbox(LEFTOVERS, LIMITS) as sb:
        assert (await next_call_survives(sb, leftover)).value == "left"


HOG = (
    "import threading, time\ndef hog():\n    threading.stack_size(1 << 18)\n"
    "    stop, ts = threading.Event(), []\n"
    "    try:\n        while True:\n            t = threading.Thread(target=stop.wait)\n"
    "            t.start()\n            ts.append(t)\n    except RuntimeError:\n        pass\n"
    "    time.sleep(4)\n    stop.set()\n    for t in ts:\n        t.join()\n    return len(ts)\n"
)
NEEDS_THREADS = (
    "import os, threading, time\ndef needs_threads():\n    time.sleep(1)\n"
    "    ts = [threading.Thread(target=len, args=([],)) for _ in range(8)]\n"
    "    for t in ts:\n        t.start()\n    for t in ts:\n        t.join()\n"
    "    return os.getuid()\n"
)


@pytest.mark.integration
@pytest.mark.skipif(os.geteuid() != 0, reason="distinct uids need bubblewrap as root")
async def test_one_sandbox_cannot_starve_another() -> None:
    update = {"wall_seconds_per_call": 10, "processes": 32, "address_space_bytes": 8 << 30}
    limits = LIMITS.model_copy(update=update)
    sources = {"hog": HOG, "needs_threads": NEEDS_THREADS}
    async with Sandbox(sources, limits) as a, Sandbox(sources, limits) as b:
        hogged, other = await asyncio.gather(a.call("hog", {}), b.call("needs_threads", {}))
        assert hogged.ok and hogged.value >= 24, hogged  # a reached its own process limit
        assert other.ok, other  # while b still started its threads
        mine = await a.call("needs_threads", {})
        assert mine.ok and mine.value != other.value  # one uid per sandbox


ODD_TEXT = {
    "echo": "def echo(s):\n    print(s)\n    return s\n",
    "odd_value": (
        "def odd_value():\n    print('\\ud800 printed')\n    return {'\\udcff': ['\\ud83d']}\n"
    ),
    "odd_error": "def odd_error():\n    raise ValueError('bad \\udc80')\n",
}


@pytest.mark.integration
async def test_lone_surrogates_are_replaced_not_fatal() -> None:
    async with Sandbox(ODD_TEXT, LIMITS) as sb:
        r = await sb.call("echo", {"s": "a\ud800b"})
        assert r.ok and r.value == "a\ufffdb" and r.output.strip() == "a\ufffdb", r
        r = await sb.call("odd_value", {})
        assert r.ok and r.value == {"\ufffd": ["\ufffd"]} and "\ufffd printed" in r.output
        r = await sb.call("odd_error", {})
        assert not r.ok and "bad \ufffd" in r.error
        for reply in [r, await sb.call("echo", {"s": "\udfff"})]:
            reply.text().encode("utf-8")  # what goes to the model and the JSONL is valid text


@pytest.mark.integration
async def test_a_module_level_hang_fails_the_load_once() -> None:
    sources = {
        "spins": "while True:\n    pass\ndef spins():\n    return 1\n",
        "computes": "X = 10 ** (10 ** 8)\ndef computes():\n    return 1\n",
        "fine": "def fine():\n    return 'fine'\n",
    }
    limits = FAST.model_copy(update={"load_seconds_per_tool": 1.0})
    async with Sandbox(sources, limits) as sb:
        for name in ("spins", "computes"):
            assert "did not finish within 1 s" in sb.load_errors[name], sb.load_errors
        assert (await sb.call("fine", {})).value == "fine"
        t0 = time.monotonic()
        errors = await sb.reset()  # the hung tools are not run again
        assert time.monotonic() - t0 < 0.9 and set(errors) == {"spins", "computes"}
        r = await sb.call("spins", {})
        assert not r.ok and "no implementation" in r.error


# ------------------------------------------------ the host against a worker that misbehaves

FAKE_WORKER = """
import json, os, signal, sys
for line in sys.stdin.buffer:
    msg = json.loads(line)
    seq = msg.get("seq")
    if msg.get("op") == "load":
        sys.stdout.write(json.dumps({"seq": seq, "kind": "ok", "ok": True, "errors": {}}) + "\\n")
        sys.stdout.flush()
        if "stop" in msg["tools"]:
            os.kill(os.getpid(), signal.SIGSTOP)
        continue
    out = {
        "not_json": b"this is not json",
        "wrong_seq": json.dumps({"seq": seq + 1, "ok": True, "kind": "ok", "value": 1}).encode(),
        "no_seq": json.dumps({"ok": True, "kind": "ok", "value": 1}).encode(),
        "big_int": b'{"ok": true, "kind": "ok", "seq": %d, "value": 1%s}' % (seq, b"0" * 5000),
        "deep": b"[" * 100000 + b"]" * 100000,
        "bad_kind": json.dumps({"seq": seq, "ok": True, "kind": "great"}).encode(),
        "bad_utf8": b'{"ok": true, "kind": "ok", "seq": %d, "value": "\\xff"}' % seq,
        "surrogate": json.dumps({"seq": seq, "kind": "ok", "value": "\\ud800!"}).encode(),
    }[msg["name"]]
    sys.stdout.buffer.write(out + b"\\n")
    sys.stdout.flush()
"""


@pytest.fixture
def fake_worker(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import astra_agent.sandbox as sandbox_mod

    path = tmp_path / "fake_worker.py"
    path.write_text(FAKE_WORKER)
    monkeypatch.setattr(sandbox_mod, "WORKER", path)
    monkeypatch.setattr(sandbox_mod, "_warned_unsafe", True)


@pytest.mark.integration
@pytest.mark.parametrize(
    "name", ["not_json", "wrong_seq", "no_seq", "big_int", "deep", "bad_kind", "bad_utf8"]
)
async def test_host_survives_a_worker_that_sends_garbage(fake_worker: None, name: str) -> None:
    async with Sandbox({name: ""}, LIMITS, unsafe_no_sandbox=True) as sb:
        r = await sb.call(name, {})
        assert r.kind == "crash" and "other than its reply" in r.error, r
        assert sb.replacements == 1 and sb._proc is None  # the next call starts a new worker
        assert (await sb.call("surrogate", {})).value == "\ufffd!"


@pytest.mark.integration
async def test_the_write_to_a_stopped_worker_is_under_the_deadline(fake_worker: None) -> None:
    async with Sandbox({"stop": ""}, FAST, unsafe_no_sandbox=True) as sb:
        t0 = time.monotonic()
        call = sb.call("stop", {"blob": "x" * (8 << 20)})  # far more than a pipe holds
        r = await asyncio.wait_for(call, FAST.wall_seconds_per_call + 5)
        assert r.kind == "timeout", r
        assert time.monotonic() - t0 < FAST.wall_seconds_per_call + 1.5
