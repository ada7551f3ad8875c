"""astra_agent.procs: a child that dies with its parent, stopping a group that will not stop,
and the live processes of a group or a tree (zombies are not)."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from astra_agent.procs import child_setup, descendants, group_members, stop_group


def _state(pid: int) -> str | None:
    """``pid``'s state letter (``Z``: a zombie), or None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _wait_until(what: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not what():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _python(code: str, *args: str, **popen: Any) -> subprocess.Popen[str]:
    """``python -c code args…``, its stdout a pipe."""
    return subprocess.Popen(
        [sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True, **popen
    )


# A parent that starts `sleep 60` with the set-up under test, says the child's pid, and waits.
PARENT = """
import os, subprocess, sys, time
from astra_agent.procs import child_setup, dies_with
if sys.argv[1] == "dies_with":
    child = subprocess.Popen(["sleep", "60"], preexec_fn=dies_with(os.getpid()))
else:
    child = subprocess.Popen(["sleep", "60"], start_new_session=True,
                             preexec_fn=child_setup(True, os.getpid()))
print(child.pid, flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("setup", ["dies_with", "child_setup"])
def test_a_child_dies_with_its_parent_killed_by_sigkill(setup: str) -> None:
    parent = _python(PARENT, setup, start_new_session=True)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    try:
        assert os.getpgid(child) == child  # it leads a group of its own
        assert _state(child) not in (None, "Z")
        parent.kill()
        parent.wait(timeout=10)
        assert _wait_until(lambda: _state(child) in (None, "Z")), "the child outlived its parent"
    finally:
        parent.kill()
        parent.wait()
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)


def test_child_setup_without_a_parent_or_sigint_to_restore_is_nothing() -> None:
    assert child_setup(False, None) is None
    assert child_setup(True, None) is not None and child_setup(False, os.getpid()) is not None


# A group leader and its child (`sleep`, in the same group), both ignoring SIGINT and SIGTERM.
STUBBORN = """
import signal, subprocess, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen(["sleep", "60"])  # an ignored signal stays ignored across exec
print(child.pid, flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_group_that_ignores_the_signal_is_killed_after_the_grace(sig: signal.Signals) -> None:
    proc = _python(STUBBORN, start_new_session=True)
    assert proc.stdout is not None
    child = int(proc.stdout.readline())
    assert sorted(group_members(proc.pid)) == sorted([proc.pid, child])
    t0 = time.monotonic()
    stop_group(proc, grace_s=1.0, sig=sig, kill_wait_s=5.0)
    took = time.monotonic() - t0
    assert 1.0 <= took < 1.0 + 5.0  # the grace was waited out, then SIGKILL ended it
    assert proc.returncode == -signal.SIGKILL  # the leader reaped, killed
    assert group_members(proc.pid) == [] and _state(child) in (None, "Z")


def test_a_group_that_stops_on_the_signal_is_not_killed() -> None:
    proc = _python("import time; print(flush=True); time.sleep(60)", start_new_session=True)
    assert proc.stdout is not None
    proc.stdout.readline()
    t0 = time.monotonic()
    stop_group(proc, grace_s=30.0)
    assert time.monotonic() - t0 < 10
    assert proc.returncode == -signal.SIGTERM and group_members(proc.pid) == []
    stop_group(proc, grace_s=30.0)  # a group that is gone: nothing to do, no error


# A leader whose child exits at once and is never reaped: a zombie of the group.
ZOMBIE_PARENT = """
import os, time
pid = os.fork()
if pid == 0:
    os._exit(0)
print(pid, flush=True)
time.sleep(60)
"""


def test_zombies_are_not_members_or_descendants() -> None:
    proc = _python(ZOMBIE_PARENT, start_new_session=True)
    try:
        assert proc.stdout is not None
        zombie = int(proc.stdout.readline())
        assert _wait_until(lambda: _state(zombie) == "Z")
        assert os.getpgid(zombie) == proc.pid  # still in the group, as a zombie
        assert group_members(proc.pid) == [proc.pid]
        below = descendants(os.getpid())
        assert proc.pid in below and zombie not in below
    finally:
        stop_group(proc, grace_s=5.0)
    assert group_members(proc.pid) == []


# A process that escapes the tree (its parent exits: it is re-parented above us).
ESCAPE = """
import os, subprocess, sys
child = subprocess.Popen(["sleep", "60"], start_new_session=True)
print(child.pid, flush=True)
"""


def test_a_process_that_left_the_tree_is_found_by_its_environment() -> None:
    entry = f"ASTRA_PROCS_TEST={secrets.token_hex(8)}"
    name, value = entry.split("=")
    proc = _python(ESCAPE, env={**os.environ, name: value})
    assert proc.stdout is not None
    escaped = int(proc.stdout.readline())
    try:
        proc.wait(timeout=10)
        assert escaped not in descendants(os.getpid())
        assert descendants(os.getpid(), entry) == [escaped]
        assert descendants(os.getpid(), "ASTRA_PROCS_TEST=another") == []
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(escaped, signal.SIGKILL)
