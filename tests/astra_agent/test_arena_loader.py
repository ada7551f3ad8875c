"""The arena loader on files that are not what they claim: one ConfigError each, never a
traceback (non-UTF-8 or binary JSONL, corrupt parquet, JSON that json.loads cannot hold)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from astra_agent.arena import load_arena_file
from astra_agent.errors import ConfigError


@pytest.mark.parametrize(
    "data,needle",
    [
        (b'{"prompt": "caf\xe9"}\n', r"is not UTF-8 text \(byte 15, line 1"),
        (b"{}\n" + bytes(range(256)), r"is not UTF-8 text \(byte 131, line 3"),
        (b"{}\n" + b"[" * 100_000 + b"\n", r":2 is not a JSON record"),  # RecursionError
        (b'{"n": ' + b"9" * 5000 + b"}\n", r":1 is not a JSON record"),  # int > 4,300 digits
    ],
    ids=["latin-1", "binary", "deep", "huge-int"],
)
def test_bad_jsonl_is_a_config_error(tmp_path: Path, data: bytes, needle: str) -> None:
    f = tmp_path / "tasks.jsonl"
    f.write_bytes(data)
    with pytest.raises(ConfigError, match=needle):
        load_arena_file(f)


def _parquet(path: Path) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"prompt": json.dumps([{"role": "user", "content": "x" * 2000}])}] * 50
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path.read_bytes()


@pytest.mark.parametrize("damage", ["random", "truncated", "footer", "body"])
def test_corrupt_parquet_is_a_config_error(tmp_path: Path, damage: str) -> None:
    f = tmp_path / "tasks.parquet"
    good = _parquet(f)
    data = {
        "random": bytes(range(256)) * 4,
        "truncated": good[: len(good) // 2],
        "footer": good[:-12] + b"\xff" * 8 + good[-4:],
        "body": good[:4] + b"\xff" * (len(good) - 12) + good[-8:],
    }[damage]
    f.write_bytes(data)
    with pytest.raises(ConfigError, match="is not a readable parquet file"):
        load_arena_file(f)


def test_a_directory_is_not_arena_data(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is not a file"):
        load_arena_file(tmp_path)
