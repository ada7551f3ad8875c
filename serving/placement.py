"""A checkpoint directory written beside its destination and renamed into place, with one clear
error for each way the write can fail.

``astra-serve convert`` and ``import-gguf`` both write their output DST into a temporary sibling
``.DST.TAG-PID`` (:func:`astra_agent.runio.building_dir`), verify it, and rename it into place
(an existing DST, with ``--overwrite``, is replaced only once the new one is whole). What can go
wrong on the way is the same for both, and is said the same way: a name with no room for the
temporary sibling's (refused before any work), a folder of DST's path the system refuses, a disk
too small (refused up front) or one that fills during the write, an existing DST that cannot be
renamed aside (immutable, busy, not writable). Each is one :class:`~astra_agent.errors.AstraError`
(a :class:`~astra_agent.errors.ConfigError` where the user's choice of DST is at fault), the
temporary sibling is removed, and an existing DST is left as it was.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from safetensors import SafetensorError

from astra_agent.errors import AstraError, ConfigError
from astra_agent.runio import building_dir

R = TypeVar("R")


def check_free_space(folder: Path, need: int) -> None:
    """Refuse up front what would fill the disk half-way through a write into ``folder``."""
    free = shutil.disk_usage(folder).free
    if need > free:
        raise ConfigError(f"not enough disk space at {folder}: need ≈{need:,} B, {free:,} B free")


def name_max(folder: Path) -> int:
    """The longest file name (in bytes) the filesystem of ``folder`` (or of its nearest
    existing ancestor) takes."""
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


def is_write_error(exc: Exception) -> bool:
    """Whether ``exc`` is a writer's failure: an OSError, or one of the Rust writers' (the
    SafetensorError of safetensors; tokenizers' plain Exception, "No space left on device (os
    error 28)", which carries the OS error in its text only)."""
    return isinstance(exc, OSError | SafetensorError) or type(exc) is Exception


def _free(folder: Path) -> int | None:
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


@dataclass(frozen=True)
class Placement:
    """How one command places its output directory: the ``tag`` of its temporary sibling
    (``.DST.TAG-PID``), and the words its messages use for what it writes (``noun``: "import")
    and for doing it (``verb``: "import")."""

    tag: str
    noun: str
    verb: str

    def sibling(self, dst: Path) -> Path:
        """The temporary sibling this process writes ``dst`` into."""
        return dst.with_name(f".{dst.name}.{self.tag}-{os.getpid()}")

    def check_name(self, dst: Path) -> None:
        """DST's name leaves room for its temporary sibling's (``.DST.TAG-PID``)."""
        limit = name_max(dst.parent)
        temp = self.sibling(dst).name
        size, own = len(temp.encode()), len(dst.name.encode())
        if size > limit:
            shown = temp if len(temp) <= 40 else f"{temp[:12]}…{temp[-20:]}"
            raise ConfigError(
                f"the name of DST is {own} bytes: the {self.noun} is written into a temporary "
                f"sibling {shown} of {size} bytes, over this filesystem's limit of {limit} bytes "
                "a name",
                hint=f"pick a name of at most {own - (size - limit)} bytes",
            )

    @contextmanager
    def creating(self, dst: Path) -> Iterator[None]:
        """Checks of DST run in this block: a name the system refuses (a folder of DST's path
        too long, …) is one ConfigError instead of the OSError."""
        try:
            yield
        except OSError as exc:
            raise ConfigError(f"DST {dst} cannot be created: {exc.strerror or exc}") from None

    def write(self, dst: Path, save: Callable[[Path], R], need: int) -> R:
        """``save(out)`` into a temporary sibling of ``dst``, then renamed into place; a failure
        of either is one error line, the temporary removed and an existing ``dst`` left as it
        was. ``need``: the bytes the write takes (what a full disk's message asks for). Only
        the writers' errors become that line (:func:`is_write_error`); any other error of
        ``save`` passes through, the temporary removed all the same."""
        placing = False
        try:
            with building_dir(dst, self.tag) as out:
                try:
                    result = save(out)
                except Exception as exc:
                    if not is_write_error(exc):
                        raise
                    raise self._write_failed(exc, dst, need, _free(out)) from None
                placing = True  # what fails from here on is the rename into place
        except OSError as exc:  # the temporary's creation, or the rename
            if placing:
                raise self._replace_failed(exc, dst) from None
            raise self._write_failed(exc, dst, need, None) from None
        return result

    def _write_failed(self, exc: Exception, dst: Path, need: int, free: int | None) -> AstraError:
        """A write into DST's temporary sibling that failed (it is removed), as one line. The
        disk filled up where the OS says so (ENOSPC, EDQUOT) and where ``free``, the bytes free
        on it when the write failed, is under ``need`` (there was room before the write began:
        the Rust writers' errors carry the OS's only in their text)."""
        nothing = f"the partial {self.noun} was removed and {dst} left as it was"
        what = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        full = isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)
        if full or (free is not None and free < need):
            return AstraError(
                f"the disk of {dst.parent} filled up while the {self.noun} was written ({what}): "
                f"{nothing}",
                hint=f"the {self.noun} needs ≈{need:,} B there: free some, or {self.verb} to "
                "another disk",
            )
        where = f" ({exc.filename})" if isinstance(exc, OSError) and exc.filename else ""
        return AstraError(f"writing the {self.noun} to {dst} failed: {what}{where}: {nothing}")

    def _replace_failed(self, exc: OSError, dst: Path) -> AstraError:
        """The finished output, verified, could not be renamed into place (the existing DST
        could not be moved aside: immutable, busy, or not writable)."""
        if dst.exists():
            return ConfigError(
                f"the existing {dst} cannot be replaced: renaming it aside failed "
                f"({exc.strerror or exc}); it is left as it was and the new {self.noun} was "
                "removed",
                hint="an immutable (chattr +i), busy or read-only directory: make it writable, "
                f"or {self.verb} to another DST",
            )
        return AstraError(
            f"the {self.noun} could not be renamed into place at {dst} ({exc.strerror or exc}); "
            f"the new {self.noun} was removed",
        )
