"""Process supervision, written once: a child in a process group of its own that dies with
its parent, stopping such a group, and finding what is still alive below a process.

Used by ``serving.server`` (the vLLM child), ``training.verl_job`` (a job's launch script),
``training.table2.experiment`` (a stage) and ``training.verl_launch`` (the supervisor below
verl's trainer). Linux: it calls ``prctl`` and reads ``/proc``.

- :func:`child_setup` and :func:`dies_with` build a ``preexec_fn``: SIGTERM when the parent
  dies, however it dies (``kill -9`` included), and SIGINT's default restored (a shell starts
  background jobs with SIGINT ignored, and an ignored signal stays ignored across exec);
- :func:`stop_group` sends a group a signal, waits until nothing of it is left (reaping the
  leader), and SIGKILLs what is left after the grace period;
- :func:`group_members` and :func:`descendants` list live processes (zombies are not).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


def child_setup(restore_sigint: bool, parent: int | None) -> Callable[[], None] | None:
    """What a child started with ``start_new_session=True`` runs before exec (None: nothing):

    - ``restore_sigint``: SIGINT's default action, so that the child sees a SIGINT sent to
      stop it before it installs handlers of its own;
    - ``parent``: SIGTERM the child when that process dies. Linux delivers it when the
      *thread* that forked exits: ask for it only from a thread that lives as long as the
      child should (the main thread).
    """
    libc = None
    if parent is not None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)  # loaded before fork, not in the child
        except OSError:
            parent = None
    if not restore_sigint and parent is None:
        return None

    def setup() -> None:
        if restore_sigint:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
        if libc is not None and parent is not None:
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
            if os.getppid() != parent:  # it died before prctl took effect
                os._exit(1)

    return setup


def dies_with(parent: int) -> Callable[[], None]:
    """A ``preexec_fn``: the child leads a session (a process group) of its own, takes
    SIGINT's default, and gets SIGTERM when ``parent`` dies (``kill -9`` included)."""
    setup = child_setup(True, parent)
    assert setup is not None  # restore_sigint: always something to do

    def new_group() -> None:
        os.setsid()  # its own process group: stopped as a whole
        setup()

    return new_group


def stop_group(
    proc: subprocess.Popen[Any],
    grace_s: float,
    *,
    sig: int = signal.SIGTERM,
    kill_wait_s: float = 5.0,
    stop_now: threading.Event | None = None,
) -> None:
    """Send ``sig`` to the process group that ``proc`` leads, wait until no process of it is
    left (reaping ``proc``), and SIGKILL the group after ``grace_s`` (at once when
    ``stop_now`` is set, e.g. by a second Ctrl-C); then wait up to ``kill_wait_s`` more."""
    pgid = proc.pid  # a session's leader: its pid is the group's id
    for signum, wait in ((sig, grace_s), (signal.SIGKILL, kill_wait_s)):
        try:
            os.killpg(pgid, signum)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            proc.poll()  # reap the leader so that it does not linger as a zombie
            if not group_members(pgid):
                break
            if signum != signal.SIGKILL and stop_now is not None and stop_now.is_set():
                break
            time.sleep(0.1)
        if not group_members(pgid):
            break
    proc.poll()


def _live() -> dict[int, tuple[int, int]]:
    """pid → (parent pid, process group) of every process that has not exited, from /proc."""
    out: dict[int, tuple[int, int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return out
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and fields[0] not in (b"Z", b"X"):
            out[int(name)] = (int(fields[1]), int(fields[2]))
    return out


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of the process group ``pgid``."""
    return [pid for pid, (_, group) in _live().items() if group == pgid]


def _has_env(pid: int, entry: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return entry in f.read().split(b"\0")
    except OSError:
        return False


def descendants(root: int, env_entry: str | None = None) -> list[int]:
    """Live processes below ``root``, and, with ``env_entry`` (``NAME=value``), those whose
    environment holds it wherever they are (a process that escaped the tree)."""
    parents = {pid: parent for pid, (parent, _) in _live().items()}
    token = env_entry.encode() if env_entry else None
    out = []
    for pid in parents:
        if pid == root:
            continue
        p = pid
        while p in parents and p != root and p > 1:
            p = parents[p]
        if p == root or (token is not None and _has_env(pid, token)):
            out.append(pid)
    return out


def become_subreaper() -> None:
    """Orphans below this process are re-parented to it (to be reaped and found by
    :func:`descendants`), not to init (``PR_SET_CHILD_SUBREAPER``)."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1)
