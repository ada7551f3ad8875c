"""Reading a file of a run directory that may hold anything, without hanging or running out of
memory: only a regular file is read (a FIFO, a device such as ``/dev/zero`` — also behind a
symlink — a socket or a directory in a file's place is refused, without blocking on it), at most
a bounded number of bytes, and a symlink loop is a reason like any other.

The readers of :mod:`eval.rundir` (the report, comparisons) read through here; the evals' own
writers and ``--resume`` readers work on files they made.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import BinaryIO

JSON_LIMIT = 64 << 20  # summary.json, config.json, astra-*.json: a few kB when ours
JSONL_LIMIT = 2 << 30  # results.jsonl, metrics.jsonl: trajectories make them large
_MISSING = (errno.ENOENT, errno.ENOTDIR)


class UnreadableFile(Exception):
    """``path`` is there but cannot be read as a regular file; ``reason`` says why, for
    people (``"not a regular file (a FIFO)"``, ``"a symlink loop"``, ``"3 GB, over the …"``)."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


def _what(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a plain file"


def _oserror(path: Path, exc: OSError) -> UnreadableFile:
    if exc.errno == errno.ELOOP:
        return UnreadableFile(path, "a symlink loop")
    return UnreadableFile(path, exc.strerror or str(exc))


def _regular(path: Path, mode: int) -> None:
    if not stat.S_ISREG(mode):
        raise UnreadableFile(path, f"not a regular file ({_what(mode)})")


def open_regular(path: Path) -> BinaryIO | None:
    """``path`` (symlinks followed) opened for reading when it is a regular file; None when it
    does not exist (a dangling symlink included); :class:`UnreadableFile` otherwise. What is
    not a regular file is refused from its ``stat`` before it is opened, and the open itself
    cannot block (``O_NONBLOCK``: it may have been swapped for a FIFO in between)."""
    try:
        _regular(path, os.stat(path).st_mode)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in _MISSING:
            return None
        raise _oserror(path, exc) from None
    try:
        _regular(path, os.fstat(fd).st_mode)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def read_bounded(path: Path, limit: int) -> bytes | None:
    """The bytes of the regular file ``path`` (None: it does not exist); a file over ``limit``
    bytes is refused (:class:`UnreadableFile`) without being read, one that grows past it
    while being read too."""
    f = open_regular(path)
    if f is None:
        return None
    with f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise UnreadableFile(path, f"{size:,} bytes, over the limit of {limit:,}")
        try:
            data = f.read(limit + 1)
        except OSError as exc:
            raise _oserror(path, exc) from None
    if len(data) > limit:
        raise UnreadableFile(path, f"grew past the limit of {limit:,} bytes while read")
    return data


def read_line(path: Path, limit: int) -> bytes | None:
    """The first non-blank line of a regular file (None: missing, empty, or a first line
    longer than ``limit`` bytes); :class:`UnreadableFile` as :func:`open_regular`."""
    f = open_regular(path)
    if f is None:
        return None
    with f:
        for _ in range(1000):  # blank lines before the first record
            try:
                raw = f.readline(limit + 1)
            except OSError as exc:
                raise _oserror(path, exc) from None
            if not raw or len(raw) > limit:
                return None
            if raw.strip():
                return raw
    return None


def dir_problem(path: Path) -> str | None:
    """Why ``path`` is not a directory that can be read (None: it is one): missing, a symlink
    loop, a file or something else in its place."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        if exc.errno in _MISSING:
            return "not found"
        return _oserror(path, exc).reason
    if stat.S_ISDIR(mode):
        return None
    return "a file, not a directory" if stat.S_ISREG(mode) else f"{_what(mode)}, not a directory"


def safe_resolve(path: Path) -> Path:
    """``path`` made absolute with its symlinks resolved, or only made absolute where they
    cannot be (a loop: Python 3.11 raises RuntimeError there, later ones OSError)."""
    try:
        return Path(path).resolve()
    except (OSError, RuntimeError):
        return Path(os.path.abspath(path))
