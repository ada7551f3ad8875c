"""The run-directory I/O layer: whole files, whole directories, whole JSONL records, torn tails,
config differences. Failures are real (a writer that raises, a read-only directory, a process
killed by SIGKILL in the middle of a write)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from astra_agent.runio import (
    append_jsonl,
    building_dir,
    config_differences,
    creation_problem,
    differing_keys,
    drop_torn_tail,
    dumps_json,
    file_sha256,
    json_line,
    jsonl_lines,
    probe_writable,
    read_json_lines,
    write_atomic_with,
    write_bytes_atomic,
    write_json_atomic,
    write_lines_atomic,
    write_text_atomic,
)
from astra_agent.trajectory import Trajectory

REPO = Path(__file__).resolve().parents[2]
UNICODE = "naïve ☃ 𝄞 \u2028 line-sep \u0085 nel \r cr"


def test_whole_file_writes_replace_and_keep_bytes_exact(tmp_path: Path) -> None:
    p = tmp_path / "f.json"
    p.write_text("old")
    write_json_atomic(p, {"b": UNICODE, "a": [1, 2]})
    assert (
        p.read_bytes()
        == json.dumps({"b": UNICODE, "a": [1, 2]}, indent=2, ensure_ascii=False).encode()
    )
    write_text_atomic(p, "a\r\nb\n")  # line ends as given: no translation
    assert p.read_bytes() == b"a\r\nb\n"
    write_bytes_atomic(p, b"\x00\xff")
    assert p.read_bytes() == b"\x00\xff"
    write_lines_atomic(p, (f"{i}{UNICODE}\n" for i in range(3)))
    assert p.read_bytes() == "".join(f"{i}{UNICODE}\n" for i in range(3)).encode()
    write_text_atomic(p, "", fsync=True)
    assert p.read_bytes() == b""
    assert sorted(x.name for x in tmp_path.iterdir()) == ["f.json"]  # no temporary left


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    p = tmp_path / "stats.json"
    p.write_text("complete")

    def half(tmp: Path) -> None:
        tmp.write_text("half of it")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        write_atomic_with(p, half)

    def lines():
        yield "one\n"
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_lines_atomic(p, lines())
    with pytest.raises(TypeError):  # not JSON: nothing written at all
        write_json_atomic(p, {"x": object()})
    assert p.read_text() == "complete"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["stats.json"]


def test_writing_into_a_missing_or_read_only_directory_fails_cleanly(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        write_text_atomic(tmp_path / "no" / "such" / "f", "x")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        if os.access(ro, os.W_OK):  # root: permissions do not stop it
            probe_writable(ro)
        else:
            with pytest.raises(PermissionError):
                probe_writable(ro)
            with pytest.raises(PermissionError):
                write_text_atomic(ro / "f", "x")
    finally:
        ro.chmod(0o700)
    with pytest.raises(NotADirectoryError):
        probe_writable(Path(__file__))
    probe_writable(tmp_path)
    assert sorted(x.name for x in tmp_path.iterdir()) == ["ro"]


def test_a_write_killed_midway_leaves_the_old_file(tmp_path: Path) -> None:
    """SIGKILL while the writer is half-way through its lines: the file is the old one."""
    p = tmp_path / "results.jsonl"
    p.write_text('{"id": "old"}\n')
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        sys.path.insert(0, {str(REPO)!r})
        from astra_agent.runio import write_lines_atomic
        def lines():
            for i in range(1000):
                if i == 500:
                    os.kill(os.getpid(), signal.SIGKILL)
                yield '{{"id": "%d"}}\\n' % i
        write_lines_atomic({str(p)!r}, lines())
        """
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60)
    assert run.returncode == -signal.SIGKILL
    assert p.read_text() == '{"id": "old"}\n'
    left = [x.name for x in tmp_path.iterdir() if x != p]  # the killed writer's temporary
    assert left and all(name.startswith(".results.jsonl.tmp-") for name in left)


def test_building_dir_swaps_whole_or_leaves_the_old(tmp_path: Path) -> None:
    dst = tmp_path / "final"
    with building_dir(dst) as tmp:
        assert tmp.is_dir() and not any(tmp.iterdir()) and tmp.parent == tmp_path
        (tmp / "a").write_text("1")
    assert (dst / "a").read_text() == "1"
    with pytest.raises(RuntimeError), building_dir(dst) as tmp:
        (tmp / "b").write_text("2")
        raise RuntimeError("save failed")
    assert sorted(p.name for p in dst.iterdir()) == ["a"]  # the old one, untouched
    with building_dir(dst) as tmp:
        (tmp / "c").write_text("3")
    assert sorted(p.name for p in dst.iterdir()) == ["c"]  # replaced, not merged
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final"]  # no temporary, no old


def test_building_dir_starts_from_a_clean_temporary(tmp_path: Path) -> None:
    """A temporary that a killed earlier run of this pid left is not built upon."""
    dst = tmp_path / "w"
    stale = tmp_path / f".w.partial-{os.getpid()}"
    stale.mkdir()
    (stale / "junk").write_text("x")
    with building_dir(dst) as tmp:
        assert not any(tmp.iterdir())
        (tmp / "ok").write_text("y")
    assert sorted(p.name for p in dst.iterdir()) == ["ok"]


class Rec(BaseModel):
    id: str
    text: str


def test_json_line_formats(tmp_path: Path) -> None:
    assert json_line({"a": UNICODE}) == json.dumps({"a": UNICODE}, ensure_ascii=False) + "\n"
    assert (
        json_line(Rec(id="1", text=UNICODE)) == Rec(id="1", text=UNICODE).model_dump_json() + "\n"
    )
    traj = Trajectory(messages=[{"role": "user", "content": UNICODE}])
    assert json_line(traj) == traj.to_json_line()


JSON_VALUES: list[Any] = [
    {"a": UNICODE, "b": [1, 2.5, -0.0, 1e300, None, True, {"c": "\ud800"}], "": {}},
    [float("nan"), float("inf"), 10**30, ""],
    UNICODE,
    {"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}] * 3},
]


@pytest.mark.parametrize("value", JSON_VALUES)
@pytest.mark.parametrize("ensure_ascii", [True, False])
def test_dumps_json_writes_what_json_dumps_writes(value: Any, ensure_ascii: bool) -> None:
    assert dumps_json(value, ensure_ascii=ensure_ascii) == json.dumps(
        value, ensure_ascii=ensure_ascii
    )


def test_dumps_json_fails_as_json_dumps_does() -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(ValueError, match="Circular reference detected"):
        dumps_json({"a": loop})
    with pytest.raises(TypeError, match="not JSON serializable"):
        dumps_json({"a": object()})


def test_append_and_read_back_with_unicode_line_separators(tmp_path: Path) -> None:
    p = tmp_path / "sub" / "m.jsonl"  # the directory is created
    records = [{"step": i, "text": UNICODE} for i in range(3)]
    for r in records:
        append_jsonl(p, r, fsync=False)
    append_jsonl(p, Rec(id="x", text=UNICODE))
    assert read_json_lines(p) == [*records, {"id": "x", "text": UNICODE}]
    assert len(jsonl_lines(p.read_text(encoding="utf-8"))) == 5  # 4 lines and the final ""


def test_a_torn_tail_is_left_out_on_read_and_cut_before_append(tmp_path: Path) -> None:
    p = tmp_path / "r.jsonl"
    p.write_text('{"a": 1}\n\n   \n{"a": 2}\n{"a": 3, "b": "tor')
    assert read_json_lines(p) == [{"a": 1}, {"a": 2}]  # reading changes nothing
    assert p.read_text().endswith('"tor')
    assert drop_torn_tail(p) == len('{"a": 3, "b": "tor')
    append_jsonl(p, {"a": 4}, fsync=False)
    assert read_json_lines(p) == [{"a": 1}, {"a": 2}, {"a": 4}]
    assert drop_torn_tail(p) == 0
    assert drop_torn_tail(tmp_path / "missing") == 0
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert drop_torn_tail(empty) == 0 and read_json_lines(empty) == []
    only = tmp_path / "only.jsonl"
    only.write_text('{"half')
    assert read_json_lines(only) == [] and drop_torn_tail(only) == 6 and only.read_text() == ""


def test_a_whole_last_line_without_newline_is_kept(tmp_path: Path) -> None:
    p = tmp_path / "r.jsonl"
    p.write_text('{"a": 1}\n{"a": 2}')
    assert read_json_lines(p) == [{"a": 1}, {"a": 2}]


def test_a_bad_line_inside_the_file_is_an_error(tmp_path: Path) -> None:
    p = tmp_path / "r.jsonl"
    p.write_text('{"a": 1}\nnot json\n{"a": 2}\n')
    with pytest.raises(ValueError):
        read_json_lines(p)
    p.write_text('{"a": 1}\nnot json\n')  # a bad last line that did end: not a torn one
    with pytest.raises(ValueError):
        read_json_lines(p)
    p.write_bytes(b'{"a": "\xff"}\n')
    with pytest.raises(UnicodeDecodeError):
        read_json_lines(p)


def test_config_differences() -> None:
    old = {"lr": 1e-3, "model": {"path": "a", "dtype": "bf16"}, "gone": 1}
    new = {"lr": 2e-3, "model": {"path": "a", "dtype": "fp32"}, "added": "☃"}
    assert config_differences(old, new) == [
        "added ('<unset>' → '☃')",
        "gone (1 → '<unset>')",
        "lr (0.001 → 0.002)",
        "model.dtype ('bf16' → 'fp32')",
    ]
    assert config_differences(old, dict(old)) == []
    assert config_differences({1: "a", "1": "b"}, {1: "a", "1": "c"}) == ["1 ('b' → 'c')"]
    assert differing_keys(old, new) == ["added", "gone", "lr", "model"]
    assert differing_keys(old, old) == []


def test_file_sha256_reads_in_blocks(tmp_path: Path) -> None:
    import hashlib

    p = tmp_path / "big.bin"
    data = os.urandom((1 << 20) * 2 + 17)  # over two blocks
    p.write_bytes(data)
    assert file_sha256(p) == hashlib.sha256(data).hexdigest()
    (tmp_path / "empty").write_bytes(b"")
    assert file_sha256(tmp_path / "empty") == hashlib.sha256(b"").hexdigest()
    with pytest.raises(FileNotFoundError):
        file_sha256(tmp_path / "missing")


def test_creation_problem_names_the_directory_that_would_be_written(tmp_path: Path) -> None:
    assert creation_problem(tmp_path / "a" / "b" / "c") == (tmp_path, None)
    assert creation_problem(tmp_path) == (tmp_path, None)
    f = tmp_path / "file"
    f.write_text("x")
    parent, problem = creation_problem(f / "sub" / "out")
    assert parent == f and isinstance(problem, NotADirectoryError)
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        parent, problem = creation_problem(ro / "new" / "out")
        assert parent == ro
        if os.access(ro, os.W_OK):  # root: permissions do not stop it
            assert problem is None
        else:
            assert isinstance(problem, PermissionError) and problem.strerror
    finally:
        ro.chmod(0o700)
    assert not (tmp_path / "a").exists() and sorted(p.name for p in tmp_path.iterdir()) == [
        "file",
        "ro",
    ]  # nothing created


def test_a_name_near_the_length_limit_still_gets_a_temporary(tmp_path: Path) -> None:
    name = "é" * 120 + ".json"  # 245 bytes of the 255 a name may have
    write_json_atomic(tmp_path / name, {"ok": True})
    assert json.loads((tmp_path / name).read_text()) == {"ok": True}
    assert [p.name for p in tmp_path.iterdir()] == [name]


def test_threads_writing_one_file_never_leave_half_of_one(tmp_path: Path) -> None:
    import threading

    p = tmp_path / "summary.json"
    texts = [json.dumps({"writer": i, "pad": "x" * 200_000}) for i in range(8)]

    def write(text: str) -> None:
        for _ in range(5):
            write_text_atomic(p, text)

    threads = [threading.Thread(target=write, args=(t,)) for t in texts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert p.read_text() in texts
    assert [x.name for x in tmp_path.iterdir()] == ["summary.json"]


def test_a_failed_swap_puts_the_old_directory_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The new directory cannot be renamed in (a full or read-only parent, a busy name): the
    old one is renamed back, so `dst` still holds it whole, and the error is raised."""
    from astra_agent.runio import swap_into_place

    dst, ready = tmp_path / "model", tmp_path / ".model.partial-1"
    dst.mkdir()
    (dst / "weights").write_text("old")
    ready.mkdir()
    (ready / "weights").write_text("new")
    rename = Path.rename

    def refuse_ready(self: Path, target: Any) -> Path:
        if self == ready:
            raise OSError(16, "Device or resource busy")
        return rename(self, target)

    monkeypatch.setattr(Path, "rename", refuse_ready)
    with pytest.raises(OSError, match="busy"):
        swap_into_place(ready, dst)
    assert (dst / "weights").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".model.partial-1", "model"]
