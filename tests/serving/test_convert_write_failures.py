"""`astra-serve convert` when the write itself fails: a disk that fills after the free-space check,
an existing DST that cannot be renamed aside (``--overwrite``), a name too long for the temporary
sibling, a folder of DST's path the system refuses. Each is one error line and a non-zero exit,
no traceback; the temporary directory is gone and an existing DST is left as it was (the same
protocol as import-gguf's, test_gguf_write_failures.py, through serving.placement).

The failures are the system's own where a test can cause them (a name too long, ``chattr +i``)
and the failing call's OSError otherwise (a disk with a few kB left, a rename refused).
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from astra_agent import console as console_mod
from serving import convert
from serving.cli import app

runner = CliRunner()
OLD = "the old conversion"


@pytest.fixture(autouse=True)
def _wide(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(console_mod.err_console, "_width", 400)  # one message, one line


def _convert(src: Path, dst: Path, *args: str) -> tuple[int, str]:
    """The CLI in-process (the monkeypatched failure is in this process): exit code, output."""
    res = runner.invoke(app, ["convert", str(src), str(dst), "--max-shard-size", "1MB", *args])
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    return res.exit_code, " ".join(res.output.split())


def _leftovers(dst: Path) -> list[Path]:
    return list(dst.parent.glob(f".{dst.name}.*"))


def _old_conversion(dst: Path) -> None:
    dst.mkdir()
    (dst / "model.safetensors").write_text(OLD)


def _old_conversion_kept(dst: Path) -> None:
    assert sorted(p.name for p in dst.iterdir()) == ["model.safetensors"]
    assert (dst / "model.safetensors").read_text() == OLD


class _Disk:
    """A disk with ``room`` bytes left: the write that passes it writes what fits, then fails
    with ENOSPC, as a file's ``write`` does on a full disk."""

    def __init__(self, room: int) -> None:
        self.room = room

    def file(self, f: Any) -> Any:
        disk = self

        class Filling:
            def write(self, data: Any) -> int:
                view = memoryview(data).cast("B")
                fits = min(len(view), disk.room)
                f.write(view[:fits])
                disk.room -= fits
                if fits < len(view):
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), f.name)
                return fits

        return Filling()


def test_a_disk_that_fills_while_a_shard_is_written(
    tiny_fp32: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The free-space check passed, then the disk filled: the second shard's write fails with
    ENOSPC (in the background writer's thread) having written part of the file."""
    disk, writer = _Disk(room=1_200_000), convert._BackgroundWriter
    monkeypatch.setattr(convert, "_BackgroundWriter", lambda f: writer(disk.file(f)))
    dst = tmp_path / "out"
    code, said = _convert(tiny_fp32, dst)
    assert code == 1, said
    assert said.startswith(
        f"error: the disk of {tmp_path} filled up while the conversion was written (No space "
        f"left on device): the partial conversion was removed and {dst} left as it was"
    )
    assert "hint: the conversion needs ≈" in said and "or convert to another disk" in said
    assert "Traceback" not in said
    assert disk.room == 0  # the double did fill up: the failure is the disk's
    assert not dst.exists() and not _leftovers(dst)


def test_a_disk_that_fills_while_the_tokenizer_is_copied_keeps_the_old_conversion(
    tiny_fp32: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The weights are written and verified, then the copy of a file beside them fills the disk,
    over an existing conversion (``--overwrite``): the old conversion is left whole."""
    copy = shutil.copy2

    def full(src: Any, dst: Any, **kwargs: Any) -> Any:
        if Path(src).name != "tokenizer.json":
            return copy(src, dst, **kwargs)
        Path(dst).write_text('{"version": "1.0", "trunc')
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(dst))

    dst = tmp_path / "out"
    _old_conversion(dst)
    monkeypatch.setattr(shutil, "copy2", full)
    code, said = _convert(tiny_fp32, dst, "--overwrite")
    assert code == 1, said
    assert f"error: the disk of {tmp_path} filled up while the conversion was written" in said
    assert f"the partial conversion was removed and {dst} left as it was" in said
    _old_conversion_kept(dst)
    assert not _leftovers(dst)


def test_a_write_that_fails_otherwise_names_the_file(
    tiny_fp32: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failing disk (EIO), not a full one: the message says which file, no disk-full hint."""

    def failing(path: Path, dtype_name: str) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO), str(path))

    monkeypatch.setattr(convert, "_patch_config", failing)
    dst = tmp_path / "out"
    code, said = _convert(tiny_fp32, dst)
    assert code == 1, said
    assert said.startswith(f"error: writing the conversion to {dst} failed: Input/output error (")
    assert f"config.json): the partial conversion was removed and {dst} left as it was" in said
    assert "hint" not in said and not dst.exists() and not _leftovers(dst)


def test_a_bug_is_not_taken_for_a_write_failure(
    tiny_fp32: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the writers' errors become one line: a programming error still raises (and the
    temporary directory is removed all the same)."""

    def bug(path: Path, dtype_name: str) -> None:
        raise TypeError("a bug")

    monkeypatch.setattr(convert, "_patch_config", bug)
    dst = tmp_path / "out"
    with pytest.raises(TypeError, match="a bug"):
        convert.convert_checkpoint(tiny_fp32, dst)
    assert not dst.exists() and not _leftovers(dst)


@pytest.mark.parametrize("code", [errno.EPERM, errno.EBUSY, errno.EACCES])
def test_an_existing_conversion_that_cannot_be_renamed_aside_is_left_intact(
    tiny_fp32: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    """``--overwrite`` over a directory whose rename fails (immutable: EPERM; a mount point:
    EBUSY; not writable: EACCES), after the new conversion was written and verified."""
    dst = tmp_path / "out"
    _old_conversion(dst)
    rename = Path.rename

    def refuse(self: Path, target: Any) -> Any:
        if self == dst:
            raise OSError(code, os.strerror(code), str(self), str(target))
        return rename(self, target)

    monkeypatch.setattr(Path, "rename", refuse)
    exit_code, said = _convert(tiny_fp32, dst, "--overwrite")
    assert exit_code == 2, said
    assert f"error: the existing {dst} cannot be replaced: renaming it aside failed" in said
    assert f"({os.strerror(code)}); it is left as it was and the new conversion was removed" in said
    assert "hint: an immutable (chattr +i)" in said and "or convert to another DST" in said
    assert "Traceback" not in said
    _old_conversion_kept(dst)
    assert not _leftovers(dst)


def test_an_immutable_existing_conversion_is_left_intact(tiny_fp32: Path, tmp_path: Path) -> None:
    """The real failure: ``chattr +i`` on the existing conversion (its rename fails with EPERM,
    for root too)."""
    dst = tmp_path / "out"
    _old_conversion(dst)
    chattr = shutil.which("chattr")
    if chattr is None or subprocess.run([chattr, "+i", str(dst)], capture_output=True).returncode:
        pytest.skip("this filesystem has no immutable attribute (chattr +i)")
    try:
        exit_code, said = _convert(tiny_fp32, dst, "--overwrite")
    finally:
        subprocess.run([chattr, "-i", str(dst)], check=False)
    assert exit_code == 2, said
    assert f"error: the existing {dst} cannot be replaced: renaming it aside failed " in said
    assert "(Operation not permitted); it is left as it was" in said
    _old_conversion_kept(dst)
    assert not _leftovers(dst)


def test_a_name_too_long_for_the_temporary_sibling(tiny_fp32: Path, tmp_path: Path) -> None:
    """A name the filesystem takes whose temporary sibling it would not (ENAMETOOLONG): refused
    before anything is written."""
    limit = os.pathconf(tmp_path, "PC_NAME_MAX")
    name = "n" * (limit - 5)
    (tmp_path / name).mkdir()  # the system takes the name itself
    (tmp_path / name).rmdir()
    code, said = _convert(tiny_fp32, tmp_path / name)
    assert code == 2, said
    assert said.startswith(
        f"error: the name of DST is {limit - 5} bytes: the conversion is written into a "
        "temporary sibling"
    )
    assert f"over this filesystem's limit of {limit} bytes a name" in said
    assert f"hint: pick a name of at most {limit - 13 - len(str(os.getpid()))} bytes" in said
    assert sorted(tmp_path.iterdir()) == []
    with pytest.raises(OSError) as exc:  # the temporary sibling's name is really too long
        convert.CONVERSION.sibling(tmp_path / name).mkdir()
    assert exc.value.errno == errno.ENAMETOOLONG


def test_a_name_that_just_fits_converts(tiny_fp32: Path, tmp_path: Path) -> None:
    """The longest name the hint allows: the conversion is written and renamed into place."""
    limit = os.pathconf(tmp_path, "PC_NAME_MAX")
    name = "n" * (limit - 13 - len(str(os.getpid())))  # ".NAME.converting-PID" is the limit
    code, said = _convert(tiny_fp32, tmp_path / name)
    assert code == 0, said
    assert (tmp_path / name / "model.safetensors.index.json").is_file()
    assert not _leftovers(tmp_path / name)


def test_a_folder_name_too_long_in_the_path_of_dst(tiny_fp32: Path, tmp_path: Path) -> None:
    dst = tmp_path / ("d" * 300) / "model"
    code, said = _convert(tiny_fp32, dst)
    assert code == 2, said
    assert said.startswith(f"error: DST {dst} cannot be created: File name too long")
    assert sorted(tmp_path.iterdir()) == []
