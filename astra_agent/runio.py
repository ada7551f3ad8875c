"""Files of a run directory, whole whatever is killed when: the one I/O layer of eval, training
and serving.

* A file is written whole or not at all: into a temporary sibling (hidden, named after the
  file, this process and thread), then renamed over the file; the temporary is removed when the
  write fails. ``fsync`` also survives a power cut. :func:`write_atomic_with` is the same for
  a writer that takes a path (parquet, torch).
* A directory is built whole: :func:`building_dir` hands out a temporary sibling to fill and
  swaps it into place (:func:`swap_into_place`: the old one, if any, goes only once the new
  one is there).
* A JSONL file grows by whole records (:func:`append_jsonl`: one write on an ``O_APPEND``
  descriptor), and its readers split at ``\\n`` only (:func:`jsonl_lines`) and cut or skip the
  torn last line a killed writer leaves (:func:`drop_torn_tail`, :func:`read_json_lines`).
* :func:`config_differences` says how the config of a run on disk differs from this one's (for
  the refusal of another config, ``--resume`` or not); :func:`file_sha256` fingerprints an
  input file by content.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic import BaseModel

# ------------------------------------------------------------------ whole files


def probe_writable(directory: Path) -> None:
    """Create and remove a hidden file in ``directory``: an OSError now, before any work, if
    nothing can be written there later."""
    with tempfile.TemporaryFile(dir=directory, prefix=".astra-write-check-"):
        pass


def creation_problem(path: Path) -> tuple[Path, OSError | None]:
    """Can ``path`` be created as a directory (``mkdir(parents=True)``), reading nothing but
    its ancestors? Returns the nearest of ``path`` and its ancestors that exists (where the
    first directory would be created) and the problem: NotADirectoryError when that is not a
    directory, the OSError of :func:`probe_writable` when nothing can be written in it, None
    when it can."""
    parent = path
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        return parent, NotADirectoryError(f"{parent} is not a directory")
    try:
        probe_writable(parent)
    except OSError as exc:
        return parent, exc
    return parent, None


def _temp_name(path: Path) -> Path:
    """Unique to this process and thread; the name cut so that a file name near the system's
    limit (255 bytes) still has a temporary beside it."""
    stem = path.name.encode()[:160].decode(errors="ignore")
    return path.with_name(f".{stem}.tmp-{os.getpid()}-{threading.get_ident()}")


def fsync_dir(path: Path) -> None:
    """Make a rename in ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic_with(
    path: str | Path, write: Callable[[Path], Any], *, fsync: bool = False
) -> None:
    """``write(tmp)`` writes the file at a temporary path beside ``path``, which is then
    renamed over ``path``: a reader sees the old file or the new one, never half of one. The
    temporary is removed if ``write`` (or the rename) fails."""
    path = Path(path)
    tmp = _temp_name(path)
    try:
        write(tmp)
        if fsync:
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if fsync:
        fsync_dir(path.parent)


def write_bytes_atomic(path: str | Path, data: bytes, *, fsync: bool = False) -> None:
    """Write ``data`` to ``path`` whole (see :func:`write_atomic_with`)."""
    write_atomic_with(path, lambda tmp: tmp.write_bytes(data), fsync=fsync)


def write_text_atomic(path: str | Path, text: str, *, fsync: bool = False) -> None:
    """Write ``text`` as UTF-8 to ``path`` whole, its line ends as given."""
    write_bytes_atomic(path, text.encode("utf-8"), fsync=fsync)


def write_lines_atomic(path: str | Path, lines: Iterable[str], *, fsync: bool = False) -> None:
    """Write ``lines`` (each with its own ``\\n``) as UTF-8 to ``path`` whole, as they come."""

    def write(tmp: Path) -> None:
        with tmp.open("w", encoding="utf-8", newline="") as f:
            for line in lines:
                f.write(line)

    write_atomic_with(path, write, fsync=fsync)


def write_json_atomic(path: str | Path, data: Any) -> None:
    """Write ``data`` to ``path`` whole as JSON: indented by 2, non-ASCII as is, no final
    newline (``config.json``, ``summary.json`` of the evals)."""
    write_text_atomic(path, json.dumps(data, indent=2, ensure_ascii=False))


# ------------------------------------------------------------------ whole directories


def swap_into_place(ready: Path, dst: Path) -> None:
    """Rename the finished directory ``ready`` to ``dst``, replacing an older ``dst`` only once
    the new one is in place (a crash leaves the old or the new, never a mix)."""
    old = dst.parent / f".{dst.name}.old-{os.getpid()}"
    if dst.exists():
        dst.rename(old)
    try:
        ready.rename(dst)
    except OSError:
        if old.exists() and not dst.exists():
            old.rename(dst)  # the old one back where it was: nothing lost
        raise
    shutil.rmtree(old, ignore_errors=True)


def remove_stale_siblings(dst: Path, tag: str) -> None:
    """Remove the temporary siblings ``.NAME.TAG-PID`` of ``dst`` whose process is gone."""
    for stale in dst.parent.glob(f".{dst.name}.{tag}-*"):
        pid = stale.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(stale, ignore_errors=True)


@contextmanager
def building_dir(dst: Path, tag: str = "partial") -> Iterator[Path]:
    """A fresh, empty temporary sibling of ``dst`` to fill; when the block ends normally it
    replaces ``dst`` (:func:`swap_into_place`), and whatever happens it is gone afterwards.
    Siblings of the same ``tag`` left by processes that are gone (a ``kill -9``) are removed."""
    tmp = dst.with_name(f".{dst.name}.{tag}-{os.getpid()}")
    remove_stale_siblings(dst, tag)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
        swap_into_place(tmp, dst)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ------------------------------------------------------------------ JSONL


_ENCODERS = {a: json.JSONEncoder(check_circular=False, ensure_ascii=a) for a in (True, False)}


def dumps_json(obj: Any, *, ensure_ascii: bool = True) -> str:
    """``json.dumps(obj, ensure_ascii=ensure_ascii)``, the same text at about half the CPU of a
    request body or a trajectory: the encoder's watch for circular references (a dictionary
    of the id of every container on the way) is left out, and a structure too deep to encode
    is encoded again with it, for ``json.dumps``'s own error."""
    try:
        return _ENCODERS[ensure_ascii].encode(obj)
    except RecursionError:
        return json.dumps(obj, ensure_ascii=ensure_ascii)


def json_line(record: BaseModel | dict[str, Any]) -> str:
    """One record as one JSONL line: a record's own ``to_json_line()`` where it has one
    (trajectories), a pydantic model's JSON, or a dict as ``json.dumps`` writes it."""
    to_line = getattr(record, "to_json_line", None)
    if callable(to_line):
        return str(to_line())
    if isinstance(record, BaseModel):
        return record.model_dump_json() + "\n"
    return dumps_json(record, ensure_ascii=False) + "\n"


def append_jsonl(
    path: str | Path, record: BaseModel | dict[str, Any], *, fsync: bool = True
) -> None:
    """Append one record as one line, whole: a single write on an O_APPEND descriptor (a killed
    process never leaves half a record behind it). ``fsync`` also survives a power cut; runs
    that write thousands of records skip it."""
    data = json_line(record).encode()
    p = Path(path)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
    try:
        fd = os.open(p, flags, 0o644)
    except FileNotFoundError:  # the directory, at the first record (not a syscall per append)
        p.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(p, flags, 0o644)
    try:
        written = os.write(fd, data)
        while written < len(data):  # a short write (rare) still lands in one piece on disk
            written += os.write(fd, data[written:])
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def jsonl_lines(text: str) -> list[str]:
    """The lines of JSONL text: split at ``\\n`` only. ``str.splitlines`` also splits at
    U+2028, U+0085 and other characters that JSON writers leave raw inside strings (a model
    output holding one would tear its record in two)."""
    return [line.removesuffix("\r") for line in text.split("\n")]


def numbered_lines(text: str) -> Iterator[tuple[int, str]]:
    """The non-blank lines of JSONL text with their line numbers (from 1), split as
    :func:`jsonl_lines` splits."""
    for n, line in enumerate(jsonl_lines(text), 1):
        if line.strip():
            yield n, line


def drop_torn_tail(path: str | Path) -> int:
    """Cut a partial last line (a writer killed mid-write) so that the next append starts on a
    line of its own; returns the bytes removed."""
    p = Path(path)
    if not p.is_file():
        return 0
    with p.open("rb+") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        if size == 0:
            return 0
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return 0
        f.seek(0)
        keep = f.read().rfind(b"\n") + 1
        f.truncate(keep)
        return size - keep


def read_json_lines(path: str | Path) -> list[Any]:
    """The values of a JSONL file, blank lines skipped, reading only: a last line that does not
    end in ``\\n`` and does not parse (a writer killed mid-write, or still writing) is left
    out; any other line that does not parse raises ``json.JSONDecodeError`` (a ValueError)."""
    text = Path(path).read_text(encoding="utf-8")
    lines = jsonl_lines(text)
    out: list[Any] = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except ValueError:
            if i == len(lines) - 1:  # no "\n" after it: torn
                break
            raise
    return out


# ------------------------------------------------------------------ the config of a run


def file_sha256(path: Path) -> str:
    """A file's SHA-256 (hex), read in blocks: how a run's input files are fingerprinted."""
    h = hashlib.sha256()
    with Path(path).open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def config_differences(old: Any, new: Any, prefix: str = "") -> list[str]:
    """How the config ``new`` differs from ``old`` (mappings compared key by key, at every
    depth): one ``"key.path (old → new)"`` per value that differs, ``<unset>`` for a key only
    one has; empty when they are the same. For the message that refuses a run directory that
    holds a run of another config."""
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        out: list[str] = []
        for key in sorted(set(old) | set(new), key=str):
            name = f"{prefix}.{key}" if prefix else str(key)
            out += config_differences(old.get(key, "<unset>"), new.get(key, "<unset>"), name)
        return out
    return [] if old == new else [f"{prefix} ({old!r} → {new!r})"]


def differing_keys(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """The top-level keys whose values differ between two fingerprints (a key only one has
    included), sorted."""
    return sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def scrub_surrogates(obj: Any) -> Any:
    """``obj`` (decoded JSON) with every lone surrogate in its strings and keys replaced by
    U+FFFD: JSON may escape them (``"\\ud800"``), but they are not Unicode text (no UTF-8
    writer, tokenizer or Arrow column takes them)."""
    if isinstance(obj, str):
        return _SURROGATE.sub("\ufffd", obj)
    if isinstance(obj, list):
        return [scrub_surrogates(x) for x in obj]
    if isinstance(obj, dict):
        return {scrub_surrogates(k): scrub_surrogates(v) for k, v in obj.items()}
    return obj


def loads_text(raw: bytes) -> Any:
    """``json.loads(raw)`` with every lone surrogate replaced by U+FFFD (what another process
    or a server sends us must be writable as UTF-8); the walk runs only when ``raw`` holds a
    surrogate's escape."""
    obj = json.loads(raw)
    return scrub_surrogates(obj) if _SURROGATE_ESCAPE.search(raw) else obj
