"""``astra-train sft`` and ``rl`` with an ``--output-dir`` that cannot be created or written: one
line and exit 2 before anything runs, never a PermissionError traceback from the run-dir code
(a parent that is a file; a parent made immutable with ``chattr +i``, which stops root too)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.training.conftest import ARENA_TRAIN, RECIPES, train_in_process
from tests.training.e2e import write_recipe


def _recipe(kind: str, tmp_path: Path, model: Path, data: Path, out: Path) -> Path:
    base = {"model": str(model), "train_files": [str(data)], "output_dir": str(out)}
    cfg = {**__import__("yaml").safe_load((RECIPES / f"{kind}-tiny-cpu.yaml").read_text())}
    return write_recipe(tmp_path, cfg, base)


@pytest.fixture
def immutable(tmp_path: Path) -> Iterator[Path]:
    """A directory with ``chattr +i`` (nothing can be created in it, by root either)."""
    d = tmp_path / "frozen"
    d.mkdir()
    chattr = shutil.which("chattr")
    if chattr is None or subprocess.run([chattr, "+i", str(d)], capture_output=True).returncode:
        pytest.skip("this filesystem has no immutable attribute (chattr +i)")
    try:
        yield d
    finally:
        subprocess.run([chattr, "-i", str(d)], check=False)


@pytest.mark.parametrize("kind", ["sft", "rl"])
def test_an_output_dir_under_a_file_is_refused_with_one_line(
    kind: str, tmp_path: Path, random_tiny: Path, arena_parquet: Path, wide_consoles: None
) -> None:
    (tmp_path / "file").write_text("x")
    data = arena_parquet if kind == "sft" else ARENA_TRAIN
    cfg = _recipe(kind, tmp_path, random_tiny, data, tmp_path / "file" / "run")
    code, out = train_in_process(kind, "--config", str(cfg))
    assert code == 2 and "cannot be created" in out and "not a directory" in out, out
    assert "Traceback" not in out


@pytest.mark.parametrize("kind", ["sft", "rl"])
def test_an_output_dir_in_an_immutable_directory_is_refused_with_one_line(
    kind: str,
    tmp_path: Path,
    immutable: Path,
    random_tiny: Path,
    arena_parquet: Path,
    wide_consoles: None,
) -> None:
    data = arena_parquet if kind == "sft" else ARENA_TRAIN
    cfg = _recipe(kind, tmp_path, random_tiny, data, immutable / "run")
    code, out = train_in_process(kind, "--config", str(cfg))
    assert code == 2 and "cannot be created" in out and "not writable" in out, out
    assert "Traceback" not in out and "PermissionError" not in out
