"""``python -m training.verl_launch COMMAND…``: run verl's one-node trainer so that nothing it
starts outlives it.

verl's ``main_ppo`` starts a local Ray (its daemons, the dashboard agent, worker processes,
our rollout server actor and its vLLM child), and Ray detaches some of them: when the driver
dies abruptly, stragglers were measured alive a minute later. This supervisor

- makes itself the *child subreaper* of everything below it (``PR_SET_CHILD_SUBREAPER``:
  orphans are re-parented to it, not to init);
- starts the command in a process group of its own, so that nothing below can signal the
  supervisor with its group (``killpg``), and marks the command's environment with
  ``ASTRA_LAUNCH_ID`` (inherited by everything below unless a process clears its environment);
- when the command ends, or when the supervisor is told to stop (SIGTERM, SIGINT, SIGHUP;
  ``astra-train`` asks the kernel to send it SIGTERM should ``astra-train`` die, ``kill -9``
  included), sends SIGTERM to every process below it or bearing its mark, SIGKILL to what is
  left after a grace period, and sweeps again until nothing is left (a process that escaped
  the tree is still found by its mark).

It exits with the command's status. What it stopped is written to ``$ASTRA_LAUNCH_LOG`` when
that is set (its own stderr may be a pipe whose reader is gone).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from types import FrameType

from astra_agent import procs

GRACE_S = 10.0
MARK = "ASTRA_LAUNCH_ID"


def descendants(root: int, mark: str | None = None) -> list[int]:
    """Live processes below ``root``, and, with ``mark``, those whose environment holds
    ``ASTRA_LAUNCH_ID=mark`` wherever they are."""
    return procs.descendants(root, f"{MARK}={mark}" if mark else None)


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, sig)


def _reap_zombies() -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:  # orphans are ours to reap
            pass


def reap_below(root: int, grace_s: float = GRACE_S, mark: str | None = None) -> list[int]:
    """SIGTERM everything below ``root`` (or bearing ``mark``), SIGKILL what is still there
    after ``grace_s``, and keep sweeping with SIGKILL (what a dying daemon started meanwhile)
    until nothing is left or ``grace_s`` more has passed. The pids it signalled."""
    seen = descendants(root, mark)
    _signal_all(seen, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        _reap_zombies()
        left = descendants(root, mark)
        if not left:
            break
        seen += [p for p in left if p not in seen]
        time.sleep(0.2)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        left = descendants(root, mark)
        if not left:
            break
        seen += [p for p in left if p not in seen]
        _signal_all(left, signal.SIGKILL)
        time.sleep(0.1)
        _reap_zombies()
    return seen


def _log(text: str) -> None:
    path = os.environ.get("ASTRA_LAUNCH_LOG")
    with contextlib.suppress(OSError, ValueError):
        if path:
            with open(path, "a", encoding="utf-8") as f:
                f.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {text}\n")


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m training.verl_launch COMMAND [ARG…]", file=sys.stderr)
        return 2
    procs.become_subreaper()
    mark = f"{os.getpid()}-{secrets.token_hex(8)}"
    child = subprocess.Popen(argv, env={**os.environ, MARK: mark}, process_group=0)
    stopped_at: list[float] = []
    why: list[int] = []

    def stop(signum: int, _frame: FrameType | None) -> None:
        if not why:
            why.append(signum)
            stopped_at.append(time.monotonic())
            with contextlib.suppress(OSError):
                child.send_signal(signal.SIGTERM)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, stop)
    rc = 1
    try:
        while True:
            try:
                rc = child.wait(timeout=1.0)
                break
            except subprocess.TimeoutExpired:
                if stopped_at and time.monotonic() - stopped_at[0] > GRACE_S:
                    with contextlib.suppress(OSError):
                        child.kill()
    finally:
        why_text = signal.Signals(why[0]).name if why else f"the command ended ({rc})"
        _log(f"stopping what is left below {argv[0]!r}: {why_text}")
        stopped = reap_below(os.getpid(), mark=mark)
        _log(f"stopped {len(stopped)} process(es); left: {descendants(os.getpid(), mark)}")
    if why:
        return 128 + why[0]
    return 128 - rc if rc < 0 else rc  # killed by a signal: the shell's convention


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
