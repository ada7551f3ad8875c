"""The sandbox against a hostile tool author or a reward-hacking policy: the cases below are not
in test_sandbox.py's battery. Most switch the audit hook off first (as any tool code can: it
is a convenience for readable errors, not the isolation) and check what bubblewrap, the uid,
the seccomp filter and the supervisor still hold.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from astra_agent.errors import ConfigError
from astra_agent.sandbox import Sandbox, SandboxLimits
from tests.astra_agent.sandboxes import next_call_survives
from tests.conftest import cancel_inside_pipe_connection, sleep_marker

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="the uid-based isolation needs root"),
]

LIMITS = SandboxLimits(
    wall_seconds_per_call=4,
    cpu_seconds_per_call=3,
    address_space_bytes=768 << 20,
    output_cap_chars=4096,
)
UNHOOK = "    import sys; sys.modules['sandbox_episode']._state['guard'] = False\n"
LIBC = (
    "import ctypes, os\n"
    "def _libc():\n    libc = ctypes.CDLL(None, use_errno=True)\n"
    "    libc.syscall.restype = ctypes.c_long\n    return libc\n"
)
SYS = {"x86_64": (248, 249), "aarch64": (217, 218)}[os.uname().machine]  # add_key, request_key

# ------------------------------------------------ state that outlives processes (the uid's)

KEY_PUT = (
    LIBC + "def key_put():\n" + UNHOOK + "    libc = _libc()\n"
    f"    r = libc.syscall({SYS[0]}, b'user', b'astra-gold', b'GOLD-42', 7, ctypes.c_int(-4))\n"
    "    return [r, ctypes.get_errno()]\n"
)
KEY_GET = (
    LIBC + "def key_get():\n" + UNHOOK + "    libc = _libc()\n"
    f"    r = libc.syscall({SYS[1]}, b'user', b'astra-gold', None, 0)\n"
    "    return [r, ctypes.get_errno()]\n"
)
IPC_PUT = (
    LIBC + "def ipc_put():\n" + UNHOOK + "    libc = _libc()\n"
    "    shm = libc.shmget(0x4242, 4096, 0o1666)\n    msg = libc.msgget(0x4343, 0o1666)\n"
    "    mq = libc.mq_open(b'/astra', 0o100 | 2, 0o666, None)\n    return [shm, msg, mq]\n"
)
IPC_GET = (
    LIBC + "def ipc_get():\n" + UNHOOK + "    libc = _libc()\n"
    "    return [libc.shmget(0x4242, 0, 0), libc.msgget(0x4343, 0),"
    " libc.mq_open(b'/astra', 2)]\n"
)


async def test_kernel_keyrings_carry_nothing_into_the_next_episode() -> None:
    """The user keyring is the uid's and outlives every process (and the sandbox: the next
    lessee of the uid would read it): a key stored in one episode must not be found later."""
    async with Sandbox({"key_put": KEY_PUT, "key_get": KEY_GET}, LIMITS) as sb:
        await sb.call("key_put", {})
        await sb.reset()
        r = await sb.call("key_get", {})
        assert r.ok and r.value[0] == -1, r  # not found (or the syscall refused)
    async with Sandbox({"key_put": KEY_PUT}, LIMITS) as sb:  # refused outright
        r = await sb.call("key_put", {})
        assert r.ok and r.value[0] == -1, r


async def test_ipc_objects_carry_nothing_into_the_next_episode() -> None:
    """SysV shared memory and message queues, POSIX message queues: kernel objects of the
    sandbox's IPC namespace that no process holds, so killing the episode does not free them."""
    async with Sandbox({"ipc_put": IPC_PUT, "ipc_get": IPC_GET}, LIMITS) as sb:
        put = await sb.call("ipc_put", {})
        assert put.ok and put.value == [-1, -1, -1], put  # refused
        await sb.reset()
        r = await sb.call("ipc_get", {})
        assert r.ok and r.value == [-1, -1, -1], r


FILES = (
    "def files(n):\n    made = 0\n    try:\n        for i in range(n):\n"
    "            open(f'/tmp/{i}', 'w').close()\n            made += 1\n"
    "    except OSError as e:\n        return [made, e.errno]\n    return [made, 0]\n"
)


async def test_the_number_of_files_in_tmp_is_bounded() -> None:
    """Empty files take no tmpfs blocks but an inode (~1 KiB of host kernel memory) each:
    without an inode limit, /tmp's size bound does not bound what /tmp costs."""
    limits = LIMITS.model_copy(update={"tmp_files": 1000})
    async with Sandbox({"files": FILES}, limits) as sb:
        r = await sb.call("files", {"n": 20_000})
        assert r.ok and 900 <= r.value[0] < 1000 and r.value[1] == 28, r  # ENOSPC
        await sb.reset()
        again = await sb.call("files", {"n": 900})
        assert again.ok and again.value == [900, 0], again


# --------------------------------------------- what a call leaves for the next call to find

ARM_IN_REPR = (
    "import signal, threading, time, os\n"
    "class Sneaky:\n    def __repr__(self):\n"
    "        def boom(*a):\n            raise RuntimeError('a late alarm')\n"
    "        signal.signal(signal.SIGALRM, boom)\n"
    "        signal.setitimer(signal.ITIMER_REAL, 0.2)\n"
    "        threading.Thread(target=lambda: (time.sleep(0.2), os._exit(3)), daemon=True).start()\n"
    "        return 'sneaky'\n"
    "def arm_in_repr():\n    return Sneaky()\n"
)
ARM_IN_ITEMS = (
    "import signal\nclass Sneaky(dict):\n    def items(self):\n"
    "        def boom(*a):\n            raise RuntimeError('a late alarm')\n"
    "        signal.signal(signal.SIGALRM, boom)\n"
    "        signal.setitimer(signal.ITIMER_REAL, 0.2)\n        return dict.items(self)\n"
    "def arm_in_items():\n    return Sneaky(a=1)\n"
)
SLOW = "import time\ndef slow():\n    time.sleep(0.6)\n    return 'survived'\n"


@pytest.mark.parametrize("arm", ["arm_in_repr", "arm_in_items"])
async def test_converting_the_result_cannot_arm_the_next_call(arm: str) -> None:
    """The result is turned into JSON by calling the tool's own methods (``__repr__``, a dict
    subclass's ``items``): that code runs after the call's clean-up unless the result is
    encoded first."""
    sources = {"arm_in_repr": ARM_IN_REPR, "arm_in_items": ARM_IN_ITEMS, "slow": SLOW}
    async with Sandbox(sources, LIMITS) as sb:
        assert (await next_call_survives(sb, arm)).ok


THREADS_AT_LIMIT = (
    "import os, threading, time\ndef threads_at_limit():\n    threading.stack_size(1 << 16)\n"
    "    def later():\n        while not os.path.exists('/tmp/go'):\n            time.sleep(0.01)\n"
    "        os._exit(3)\n    n = 0\n    try:\n        while True:\n"
    "            threading.Thread(target=later, daemon=True).start()\n            n += 1\n"
    "    except RuntimeError:\n        pass\n    return n\n"
)
GO = (
    "import time\ndef go():\n    open('/tmp/go', 'w').close()\n    time.sleep(0.3)\n"
    "    return 'ok'\n"
)


async def test_threads_left_at_the_process_limit_cannot_break_the_next_call() -> None:
    """The episode drops leftover threads by forking; at the process limit the fork fails and
    the threads stayed, to strike in the next call. Now the call that left them fails."""
    limits = LIMITS.model_copy(update={"processes": 16})
    async with Sandbox({"threads_at_limit": THREADS_AT_LIMIT, "go": GO}, limits) as sb:
        left = await sb.call("threads_at_limit", {})
        assert left.kind == "crash" and "threads" in left.error, left
        r = await sb.call("go", {})
        assert r.ok and r.value == "ok", r


LEAVE_CHILD = (
    "import os, signal, time\ndef leave_child():\n" + UNHOOK + "    def boom(*a):\n"
    "        raise RuntimeError('a late SIGCHLD')\n    signal.signal(signal.SIGCHLD, boom)\n"
    "    parent = os.getpid()\n    if os.fork() == 0:\n        time.sleep(0.2)\n"
    "        os._exit(0)\n    if os.fork() == 0:\n        time.sleep(0.3)\n"
    "        os.kill(parent, signal.SIGKILL)\n        os._exit(0)\n    return 'left'\n"
)


async def test_processes_and_handlers_left_by_a_call_cannot_break_the_next() -> None:
    """Forked children of a call (the hook switched off) outlived it: one that exits later
    fires the call's SIGCHLD handler in the next call; one that waits can kill the episode."""
    async with Sandbox({"leave_child": LEAVE_CHILD, "slow": SLOW}, LIMITS) as sb:
        assert (await next_call_survives(sb, "leave_child")).value == "left"
        assert sb.replacements == 0


# --------------------------------------------------------------------------- uid leases

LEASE = (
    "import asyncio, sys\nfrom astra_agent.sandbox import _UidLease, UID_LOCKS\n"
    "lease = _UidLease()\nprint(UID_LOCKS, lease.uid, flush=True)\nsys.stdin.read()\n"
)


def test_uid_leases_do_not_depend_on_tmpdir(tmp_path: Path) -> None:
    """Two jobs with their own TMPDIR (a batch scheduler's usual setting) must still lease
    distinct uids: the lock directory is one per machine."""
    procs = []
    try:
        for d in ("a", "b"):
            tmpdir = os.path.join(str(tmp_path), d)
            os.mkdir(tmpdir)
            env = {**os.environ, "TMPDIR": tmpdir}
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", LEASE],
                    env=env,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
            )
        seen = [p.stdout.readline().split() for p in procs if p.stdout]
        assert seen[0][0] == seen[1][0] and not seen[0][0].startswith(str(tmp_path)), seen
    finally:
        for p in procs:
            p.kill()
            p.communicate()


async def test_many_sandboxes_at_once_each_get_their_own_uid() -> None:
    src = {"uid": "import os\ndef uid():\n    return os.getuid()\n"}
    boxes = [Sandbox(src, LIMITS) for _ in range(12)]
    try:
        t0 = time.monotonic()
        await asyncio.gather(*(b.start() for b in boxes))
        uids = [(await b.call("uid", {})).value for b in boxes]
        assert len(set(uids)) == len(boxes), uids
        assert time.monotonic() - t0 < 60
    finally:
        await asyncio.gather(*(b.close() for b in boxes))


def test_a_lease_directory_made_by_another_user_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a world-writable parent (/run/lock, /tmp) another user can make the directory
    first, to make two sandboxes share a uid or to deny uids: refused, with the fix."""
    import astra_agent.sandbox as sandbox_mod

    locks = tmp_path / "astra-sandbox-uids"
    locks.mkdir(mode=0o777)
    os.chown(locks, 12345, 12345)
    monkeypatch.setattr(sandbox_mod, "UID_LOCKS", locks)
    with pytest.raises(ConfigError, match="not a private directory") as info:
        sandbox_mod._UidLease()
    assert "rm -r" in (info.value.hint or "")
    os.chown(locks, 0, 0)
    locks.chmod(0o700)
    lease = sandbox_mod._UidLease()  # ours: fine
    lease.release()


MODULE_THREADS = (
    "import threading, time\nthreading.stack_size(1 << 16)\ntry:\n    while True:\n"
    "        threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
    "except RuntimeError:\n    pass\ndef a_threads():\n    return 'a'\n"
)


async def test_module_code_leaving_threads_at_the_limit_disables_only_its_tool() -> None:
    limits = LIMITS.model_copy(update={"processes": 16})
    sources = {
        "a_threads": MODULE_THREADS,
        "b": "def b():\n    return 'b'\n",
        "c": "def c():\n    return 'c'\n",
    }
    async with Sandbox(sources, limits) as sb:
        assert set(sb.load_errors) == {"a_threads"}, sb.load_errors
        assert "threads" in sb.load_errors["a_threads"], sb.load_errors
        assert [(await sb.call(n, {})).value for n in ("b", "c")] == ["b", "c"]


# ---------------------------------------------------------------- the host's side of a call

COUNTER = "STATE = {'n': 0}\ndef counter():\n    STATE['n'] += 1\n    return STATE['n']\n"


async def test_a_cancelled_call_does_not_put_the_next_one_out_of_step() -> None:
    """The loop's own tool timeout (or an RL framework) cancels a call whose request is sent:
    its reply must not be read as the next call's (a crash and a lost state, before)."""
    async with Sandbox({"slow": SLOW, "counter": COUNTER}, LIMITS) as sb:
        assert (await sb.call("counter", {})).value == 1
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(sb.call("slow", {}), 0.2)
        r = await sb.call("counter", {})
        assert r.ok and r.value == 2, r  # the same episode, in step
        assert sb.replacements == 0


async def test_a_cancelled_start_leaves_a_sandbox_that_starts_again() -> None:
    sb = Sandbox({"counter": COUNTER}, LIMITS)
    try:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(sb.start(), 0.01)  # bubblewrap and Python take longer
        r = await sb.call("counter", {})
        assert r.ok and r.value == 1, r
    finally:
        await sb.close()


async def test_a_start_cancelled_while_its_process_starts_ends_and_leaves_no_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Cancelled while asyncio connects the new process's pipes: Python 3.11 then kills only
    that pid and waits for the pipes to close, and bubblewrap killed that early can leave a
    child holding them (a cancelled start hung a CI run). Here the child is made on purpose: a
    ``sleep`` beside bubblewrap, in its process group, holding its stdout."""
    import astra_agent.sandbox as sandbox_mod

    marker = sleep_marker()
    real_command = sandbox_mod.bwrap_command

    def with_a_child(*args: Any, **kwargs: Any) -> list[str]:
        return ["sh", "-c", f'sleep {marker} & exec "$@"', "sh", *real_command(*args, **kwargs)]

    monkeypatch.setattr(sandbox_mod, "bwrap_command", with_a_child)
    sb = Sandbox({"counter": COUNTER}, LIMITS)
    try:
        await cancel_inside_pipe_connection(sb.start, marker, monkeypatch)
        monkeypatch.undo()
        r = await sb.call("counter", {})
        assert r.ok and r.value == 1, r
    finally:
        await sb.close()


# ------------------------------------------------------- memory beyond the sandbox's limits

MEMFD = (
    "import os\ndef memfd():\n    try:\n        fd = os.memfd_create('x')\n"
    "    except OSError as e:\n        return ['refused', e.errno]\n"
    "    os.write(fd, b'x' * (1 << 20))\n    return ['held', 1]\n"
)
USERNS_TMPFS = (
    LIBC + "def userns_tmpfs():\n" + UNHOOK + "    libc = _libc()\n"
    "    if libc.unshare(0x10000000 | 0x00020000):\n"
    "        return ['unshare', ctypes.get_errno()]\n"
    "    os.mkdir('/tmp/m')\n"
    "    if libc.mount(b'none', b'/tmp/m', b'tmpfs', 0, b'size=4g'):\n"
    "        return ['mount', ctypes.get_errno()]\n    return ['mounted', 0]\n"
)
CLONE_NS = (
    LIBC + "def clone_ns():\n" + UNHOOK + "    libc = _libc()\n"
    "    nr = {'x86_64': 56, 'aarch64': 220}[os.uname().machine]\n"
    "    pid = libc.syscall(nr, 0x10000000 | 17, 0, 0, 0, 0)  # CLONE_NEWUSER | SIGCHLD\n"
    "    if pid == 0:\n        os._exit(0)\n    err = ctypes.get_errno()\n"
    "    if pid > 0:\n        os.waitpid(pid, 0)\n"
    "    import threading\n    t = threading.Thread(target=len, args=((),))\n    t.start()\n"
    "    t.join()  # threads still start (clone3 refused, libc falls back to clone)\n"
    "    child = os.fork()\n    if child == 0:\n        os._exit(0)\n    os.waitpid(child, 0)\n"
    "    return [pid, err]\n"
)


async def test_no_memory_outside_the_limits_memfd_and_user_namespaces() -> None:
    """A memfd's pages count against no limit (1 GiB a process: 64 open files of 16 MiB,
    the hook on); a user namespace mounts a tmpfs that ``tmp_bytes`` does not bound."""
    sources = {"memfd": MEMFD, "userns_tmpfs": USERNS_TMPFS, "clone_ns": CLONE_NS}
    async with Sandbox(sources, LIMITS) as sb:
        r = await sb.call("memfd", {})
        assert r.ok and r.value == ["refused", 1], r  # EPERM
        r = await sb.call("userns_tmpfs", {})
        assert r.ok and r.value == ["unshare", 1], r
        r = await sb.call("clone_ns", {})
        assert r.ok and r.value == [-1, 1], r
