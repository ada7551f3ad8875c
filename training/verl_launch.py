"""``python -m training.verl_launch COMMAND…``: run verl's one-node trainer so that nothing it
starts outlives it.

verl's ``main_ppo`` starts a local Ray (its daemons, the dashboard agent, worker processes,
our rollout server actor and its vLLM child), and Ray detaches some of them: when the driver
dies abruptly, stragglers were measured alive a minute later. This supervisor makes itself the
*child subreaper* of everything below it (``PR_SET_CHILD_SUBREAPER``: orphans are re-parented to
it, not to init), runs the command, and when the command ends — or when this supervisor is told
to stop (SIGTERM, SIGINT, SIGHUP; ``astra-train`` asks the kernel to send it SIGTERM should
``astra-train`` die, ``kill -9`` included) — sends SIGTERM to every process still below it,
then SIGKILL to what is left after a grace period. It exits with the command's status.
"""

from __future__ import annotations

import contextlib
import ctypes
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

_PR_SET_CHILD_SUBREAPER = 36
GRACE_S = 10.0


def descendants(root: int) -> list[int]:
    """Live processes below ``root`` (read from /proc)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] not in ("Z", "X"):
            parents[int(stat.parent.name)] = int(fields[1])
    out = []
    for pid in parents:
        p = pid
        while p in parents and p != root and p > 1:
            p = parents[p]
        if p == root and pid != root:
            out.append(pid)
    return out


def _signal_all(pids: list[int], sig: int) -> None:
    import os

    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def reap_below(root: int, grace_s: float = GRACE_S) -> None:
    """SIGTERM everything below ``root``, SIGKILL what is still there after ``grace_s``."""
    import os

    _signal_all(descendants(root), signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while descendants(root) and time.monotonic() < deadline:
        try:
            while os.waitpid(-1, os.WNOHANG)[0] > 0:  # orphans are ours to reap
                pass
        except ChildProcessError:
            pass
        time.sleep(0.2)
    _signal_all(descendants(root), signal.SIGKILL)


def main(argv: list[str]) -> int:
    import os

    if not argv:
        print("usage: python -m training.verl_launch COMMAND [ARG…]", file=sys.stderr)
        return 2
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1)
    child = subprocess.Popen(argv)
    stopped_at: list[float] = []
    why: list[int] = []

    def stop(signum: int, _frame: FrameType | None) -> None:
        if not why:
            why.append(signum)
            stopped_at.append(time.monotonic())
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signal.SIGTERM)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, stop)
    try:
        while True:
            try:
                rc = child.wait(timeout=1.0)
                break
            except subprocess.TimeoutExpired:
                if stopped_at and time.monotonic() - stopped_at[0] > GRACE_S:
                    child.kill()
    finally:
        reap_below(os.getpid())
    return 128 + why[0] if why else rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
