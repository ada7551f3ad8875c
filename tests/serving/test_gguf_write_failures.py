"""`astra-serve import-gguf` when the write itself fails: a disk that fills after the free-space
check, an existing import that cannot be renamed aside (``--overwrite``), a name too long for
the temporary sibling. Each is one error line, no traceback; the temporary directory is gone and
an existing import is left as it was.

The weights are a tiny random model (the GGUF header of ``test_gguf.write_gguf`` holds no
tensors), so that each case reaches the write in a second; the failures are the system's own
where a test can cause them (a name too long) and the failing call's OSError otherwise.
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
from serving import gguf
from serving.cli import app
from tests.conftest import run_module
from tests.serving.test_gguf import refused, write_gguf

runner = CliRunner()


@pytest.fixture
def tiny_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    """``_load_model`` returns a random one-layer llama of the header's shape (and the
    tokenizer's vocabulary) instead of dequantizing tensors the header does not hold."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    def load(path: Path, dtype: torch.dtype) -> Any:
        torch.manual_seed(0)
        cfg = LlamaConfig(
            vocab_size=len(gguf._load_tokenizer(path)), hidden_size=8, intermediate_size=16,
            num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
            max_position_embeddings=128,
        )  # fmt: skip
        return LlamaForCausalLM(cfg).to(dtype).eval()

    monkeypatch.setattr(gguf, "_load_model", load)
    monkeypatch.setattr(console_mod.err_console, "_width", 400)  # one message, one line


def _import(src: Path, dst: Path, *args: str) -> tuple[int, str]:
    """The CLI in-process (the monkeypatched failure is in this process): exit code, output."""
    res = runner.invoke(app, ["import-gguf", str(src), str(dst), "--dtype", "float32", *args])
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    return res.exit_code, " ".join(res.output.split())


def _leftovers(dst: Path) -> list[Path]:
    return list(dst.parent.glob(f".{dst.name}.*"))


def test_the_import_works_with_the_tiny_weights(tmp_path: Path, tiny_weights: None) -> None:
    """The double itself: the same import, unbroken, writes a checkpoint (the failures below are
    the write's, not the double's)."""
    code, said = _import(write_gguf(tmp_path / "m.gguf"), tmp_path / "out")
    assert code == 0, said
    assert (tmp_path / "out" / "model.safetensors").is_file() and not _leftovers(tmp_path / "out")


def test_a_disk_that_fills_while_the_tokenizer_is_saved(
    tmp_path: Path, tiny_weights: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The free-space check passed, then the disk filled: the tokenizer's save (after the
    weights) fails with ENOSPC having written part of a file."""
    from transformers import PreTrainedTokenizerBase

    def full(self: Any, save_directory: str, *args: Any, **kwargs: Any) -> Any:
        part = Path(save_directory) / "tokenizer.json"
        part.write_text('{"version": "1.0", "trunc')
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(part))

    monkeypatch.setattr(PreTrainedTokenizerBase, "save_pretrained", full)
    dst = tmp_path / "out"
    code, said = _import(write_gguf(tmp_path / "m.gguf"), dst)
    assert code == 1, said
    assert f"error: the disk of {tmp_path} filled up while the import was written" in said
    assert "(No space left on device)" in said and "partial import was removed" in said
    assert "hint: the import needs ≈" in said and "Traceback" not in said
    assert not dst.exists() and not _leftovers(dst)


def test_a_full_disk_that_the_tokenizers_writer_reports_as_a_plain_exception(
    tmp_path: Path, tiny_weights: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What tokenizers (Rust) really raises on a full disk: ``Exception("No space left on
    device (os error 28)")``, no OSError; the disk, asked then, has no room left."""
    import shutil

    from transformers import PreTrainedTokenizerBase

    usage = shutil.disk_usage
    filled: list[bool] = []

    def disk_usage(path: Any) -> Any:
        real = usage(path)
        return real._replace(free=4096) if filled else real

    def full(self: Any, save_directory: str, *args: Any, **kwargs: Any) -> Any:
        (Path(save_directory) / "tokenizer.json").write_text('{"version": "1.0", "trunc')
        filled.append(True)
        raise Exception("No space left on device (os error 28)")

    monkeypatch.setattr(shutil, "disk_usage", disk_usage)
    monkeypatch.setattr(PreTrainedTokenizerBase, "save_pretrained", full)
    dst = tmp_path / "out"
    code, said = _import(write_gguf(tmp_path / "m.gguf"), dst)
    assert code == 1, said
    assert said.startswith(
        f"error: the disk of {tmp_path} filled up while the import was written (No space left "
        f"on device (os error 28)): the partial import was removed and {dst} left as it was"
    )
    assert not dst.exists() and not _leftovers(dst)


def test_a_bug_is_not_taken_for_a_write_failure(
    tmp_path: Path, tiny_weights: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the writers' errors become one line: a programming error still raises (and the
    temporary directory is removed all the same)."""
    from transformers import PreTrainedTokenizerBase

    def bug(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("a bug")

    monkeypatch.setattr(PreTrainedTokenizerBase, "save_pretrained", bug)
    dst = tmp_path / "out"
    with pytest.raises(TypeError, match="a bug"):
        gguf.import_gguf(write_gguf(tmp_path / "m.gguf"), dst, dtype="float32")
    assert not dst.exists() and not _leftovers(dst)


def test_a_disk_that_fills_while_the_weights_are_saved_keeps_the_old_import(
    tmp_path: Path, tiny_weights: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """safetensors' writer fails (its own error type, not an OSError) over an existing import
    (--overwrite): the old import is left whole."""
    import transformers.modeling_utils as mu
    from safetensors import SafetensorError

    def full(tensors: Any, filename: str, metadata: Any = None) -> None:
        Path(filename).write_bytes(b"\0" * 16)
        raise SafetensorError("Error while serializing: I/O error: No space left on device")

    dst = tmp_path / "out"
    dst.mkdir()
    (dst / "model.safetensors").write_text("the old import")
    monkeypatch.setattr(mu, "safe_save_file", full)
    code, said = _import(write_gguf(tmp_path / "m.gguf"), dst, "--overwrite")
    assert code == 1, said
    assert f"error: writing the import to {dst} failed:" in said
    assert "No space left on device" in said and f"{dst} left as it was" in said
    assert (dst / "model.safetensors").read_text() == "the old import"
    assert not _leftovers(dst)


@pytest.mark.parametrize("code", [errno.EPERM, errno.EBUSY, errno.EACCES])
def test_an_existing_import_that_cannot_be_renamed_aside_is_left_intact(
    tmp_path: Path, tiny_weights: None, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    """``--overwrite`` over a directory whose rename fails (immutable: EPERM; a mount point:
    EBUSY; not writable: EACCES), after the new import was written and verified."""
    dst = tmp_path / "out"
    dst.mkdir()
    (dst / "model.safetensors").write_text("the old import")
    rename = Path.rename

    def refuse(self: Path, target: Any) -> Any:
        if self == dst:
            raise OSError(code, os.strerror(code), str(self), str(target))
        return rename(self, target)

    monkeypatch.setattr(Path, "rename", refuse)
    exit_code, said = _import(write_gguf(tmp_path / "m.gguf"), dst, "--overwrite")
    assert exit_code == 2, said
    assert f"error: the existing {dst} cannot be replaced: renaming it aside failed" in said
    assert f"({os.strerror(code)}); it is left as it was and the new import was removed" in said
    assert "hint: an immutable (chattr +i)" in said and "Traceback" not in said
    assert sorted(p.name for p in dst.iterdir()) == ["model.safetensors"]
    assert (dst / "model.safetensors").read_text() == "the old import"
    assert not _leftovers(dst)


def test_an_immutable_existing_import_is_left_intact(tmp_path: Path, tiny_weights: None) -> None:
    """The real failure: ``chattr +i`` on the existing import (its rename fails with EPERM, for
    root too)."""
    dst = tmp_path / "out"
    dst.mkdir()
    (dst / "model.safetensors").write_text("the old import")
    chattr = shutil.which("chattr")
    if chattr is None or subprocess.run([chattr, "+i", str(dst)], capture_output=True).returncode:
        pytest.skip("this filesystem has no immutable attribute (chattr +i)")
    try:
        exit_code, said = _import(write_gguf(tmp_path / "m.gguf"), dst, "--overwrite")
    finally:
        subprocess.run([chattr, "-i", str(dst)], check=False)
    assert exit_code == 2, said
    assert f"error: the existing {dst} cannot be replaced: renaming it aside failed " in said
    assert "(Operation not permitted); it is left as it was" in said
    assert (dst / "model.safetensors").read_text() == "the old import"
    assert sorted(p.name for p in dst.iterdir()) == ["model.safetensors"]
    assert not _leftovers(dst)


def test_a_name_too_long_for_the_temporary_sibling(tmp_path: Path) -> None:
    """A name the filesystem takes (250 bytes) whose temporary sibling it would not (ENAMETOOLONG):
    refused before anything is loaded, as the user runs it."""
    limit = os.pathconf(tmp_path, "PC_NAME_MAX")
    name = "n" * (limit - 5)
    (tmp_path / name).mkdir()  # the system takes the name itself
    (tmp_path / name).rmdir()
    said = refused(write_gguf(tmp_path / "m.gguf"), tmp_path / name)
    assert f"error: the name of DST is {limit - 5} bytes: the import is written into a " in said
    assert f"over this filesystem's limit of {limit} bytes a name" in said
    assert "hint: pick a name of at most" in said
    with pytest.raises(OSError) as exc:  # the temporary sibling's name is really too long
        gguf.IMPORT.sibling(tmp_path / name).mkdir()
    assert exc.value.errno == errno.ENAMETOOLONG


def test_a_folder_name_too_long_in_the_path_of_dst(tmp_path: Path) -> None:
    dst = tmp_path / ("d" * 300) / "model"
    out = run_module("serving", "import-gguf", str(write_gguf(tmp_path / "m.gguf")), str(dst),
                     timeout=300, env={"COLUMNS": "1000"})  # fmt: skip
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert f"error: DST {dst} cannot be created: File name too long" in " ".join(out.stderr.split())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf"]
