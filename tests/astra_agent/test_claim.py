"""A directory claimed by a fingerprint (:mod:`astra_agent.claim`): no claim, this one, another
one refused with the differences named in the place's words, a corrupt claim file, where the
fingerprint lies in the file, the layouts it is written in, and a directory that cannot be
one."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from astra_agent.claim import Claim, Refusal, indented, one_line, sorted_lines
from astra_agent.errors import ConfigError
from astra_agent.runio import differing_keys

WORDS = Refusal("{dir} holds a run of another config: {differences}", hint="pick another dir")


def claim(directory: Path, fingerprint: Any, **kw: Any) -> Claim:
    return Claim(directory, "run.json", fingerprint, WORDS, **kw)


def test_no_claim_then_this_one_then_another_refused_naming_the_differences(
    tmp_path: Path,
) -> None:
    fp = {"lr": 0.1, "model": {"name": "a", "layers": 2}}
    mine = claim(tmp_path / "out", fp)
    assert mine.recorded() is None and mine.check() is False
    mine.write()
    assert mine.check() is True and mine.recorded() == fp
    other = claim(tmp_path / "out", {"lr": 0.2, "model": {"name": "a", "layers": 3}, "seed": 1})
    with pytest.raises(ConfigError) as err:
        other.check()
    assert err.value.message == (
        f"{tmp_path / 'out'} holds a run of another config: lr (0.1 → 0.2); "
        "model.layers (2 → 3); seed ('<unset>' → 1)"
    )
    assert err.value.hint == "pick another dir"


def test_the_fingerprint_under_a_key_beside_other_fields(tmp_path: Path) -> None:
    words = Refusal("{dir}: other ({differences} differ)", hint="h", joiner=", ")
    mine = Claim(tmp_path, "config.json", {"a": 1, "b": 2}, words, "fp", differing_keys)
    assert mine.record() == {"fp": {"a": 1, "b": 2}}
    mine.write({"format": 2, "fp": {"a": 1, "b": 2}, "url": "x"})
    assert mine.check() is True
    moved = Claim(tmp_path, "config.json", {"a": 0, "b": 3}, words, "fp", differing_keys)
    with pytest.raises(ConfigError, match=r": other \(a, b differ\)\n"):
        moved.check()


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("{torn", "Expecting property name"),
        ('["a list"]', "no 'fp'"),
        ('{"other": 1}', "no 'fp'"),
    ],
)
def test_a_claim_file_that_cannot_be_read_is_corrupt_in_the_places_words(
    tmp_path: Path, text: str, why: str
) -> None:
    (tmp_path / "run.json").write_text(text)
    words = Refusal("{dir} other", hint="h", corrupt="{name} in {dir} is bad: {why}")
    said = re.escape(f"run.json in {tmp_path} is bad: {why}")
    with pytest.raises(ConfigError, match=said) as err:
        Claim(tmp_path, "run.json", {}, words, key="fp").check()
    assert err.value.hint == "h"


def test_a_record_the_compare_cannot_take_is_corrupt_with_its_own_hint(tmp_path: Path) -> None:
    def compare(old: Any, new: Any) -> list[str]:
        return [] if old["fingerprint"] == new else ["fingerprint"]

    words = Refusal("{dir} other", hint="resume or move", corrupt_hint="move")
    (tmp_path / "run.json").write_text('{"digest": "x"}')
    with pytest.raises(ConfigError, match=r"run.json is corrupt \('fingerprint'\)") as err:
        Claim(tmp_path, "run.json", {}, words, compare=compare).check()
    assert err.value.hint == "move"


def test_the_layouts_byte_for_byte_and_a_file_in_a_subdirectory(tmp_path: Path) -> None:
    data = {"b": "é", "a": [1]}
    assert indented(data) == '{\n  "b": "é",\n  "a": [\n    1\n  ]\n}'
    assert sorted_lines(data) == '{\n  "a": [\n    1\n  ],\n  "b": "\\u00e9"\n}\n'
    assert one_line(data) == '{"b": "\\u00e9", "a": [1]}'
    job = Claim(tmp_path / "out", "job/fp.json", data, WORDS, dumps=sorted_lines)
    job.write()
    assert (tmp_path / "out" / "job" / "fp.json").read_text() == sorted_lines(data)
    assert [p.name for p in (tmp_path / "out" / "job").iterdir()] == ["fp.json"]  # no temp left
    assert job.check() is True


def test_a_place_that_cannot_be_a_directory_is_refused_before_any_work(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match=re.escape(f"--out {tmp_path / 'file'} is a file")) as err:
        claim(tmp_path / "file", {}).check_place("--out", hint="name a directory")
    assert err.value.hint == "name a directory"
    with pytest.raises(ConfigError, match=r"cannot be created: .* is not a directory"):
        claim(tmp_path / "file" / "x", {}).check_place("--out", hint="name a directory")
    claim(tmp_path / "new" / "deep", {}).check_place("--out", hint="name a directory")
    claim(tmp_path, {}).check_place("--out", hint="name a directory")
    assert not (tmp_path / "new").exists()  # checked, not created
