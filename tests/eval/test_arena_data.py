"""The arena set's builder: data files -> the committed JSONL, byte for byte, and a self-check
that refuses broken tasks."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from astra_agent.errors import ConfigError
from eval.arenas import DATA_DIR
from eval.arenas.data.build import build, main

Tasks = list[dict[str, Any]]


def one_domain(tmp_path: Path, edit: Callable[[Tasks], None], keep: int = 1) -> Path:
    """A copy of the data files with only the bookings domain and its first ``keep`` tasks."""
    data = tmp_path / "data"
    shutil.copytree(DATA_DIR, data, ignore=shutil.ignore_patterns("*.jsonl", "__pycache__"))
    (data / "arenas.yaml").write_text("domains: [bookings]\n")
    path = data / "domains" / "bookings" / "tasks.yaml"
    tasks = yaml.safe_load(path.read_text())[:keep]
    edit(tasks)
    path.write_text(yaml.safe_dump(tasks, sort_keys=False, allow_unicode=True))
    return data


def test_rebuild_is_byte_identical_to_the_committed_files(tmp_path: Path) -> None:
    assert main(["--out", str(tmp_path)]) == 0
    for name in ("train.jsonl", "heldout.jsonl"):
        assert (tmp_path / name).read_bytes() == (DATA_DIR / name).read_bytes(), name


def test_minted_gold_codes_are_the_tools_hashes() -> None:
    """Golds written as {from: ...} are what the hash helper gives for the chain's inputs."""
    ns: dict[str, Any] = {}
    exec((DATA_DIR / "helpers" / "hash.py").read_text(), ns)
    quote = ns["_h"]("QT", "H-4907", "RM-T02", "2025-05-14", 3)
    records = [json.loads(line) for line in (DATA_DIR / "train.jsonl").read_text().splitlines()]
    rec = next(r for r in records if r["task_id"] == "bookings-03")
    assert json.loads(rec["sub_qa_dict"])["book_room"] == [ns["_h"]("CNF", quote, "Dana Reyes")]
    assert rec["reference"][3]["arguments"]["quote_id"] == quote


def _gold(value: Any) -> Callable[[Tasks], None]:
    def edit(tasks: Tasks) -> None:
        tasks[0]["chain"][1]["gold"] = value

    return edit


def _distract_chain_tool(tasks: Tasks) -> None:
    tasks[0]["distractors"].append("search_hotels")


def _ref_ahead(tasks: Tasks) -> None:
    tasks[0]["chain"][0]["arguments"]["city"] = {"from": "get_hotel_details.city"}


def _gold_in_prompt(tasks: Tasks) -> None:
    tasks[0]["prompt"] += " Is it Rua da Fonte Taurina 14?"


def _one_call(tasks: Tasks) -> None:
    del tasks[0]["chain"][1]


def _reused_id(tasks: Tasks) -> None:
    tasks[1]["id"] = tasks[0]["id"]


def _misspelt_key(tasks: Tasks) -> None:
    tasks[0]["distractor"] = tasks[0].pop("distractors")


def _unknown_field(tasks: Tasks) -> None:
    tasks[0]["chain"][1]["arguments"]["hotel_id"] = {"from": "search_hotels.no_such_field"}


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        (_gold("Rua Inexistente 99"), "lacks ['Rua Inexistente 99']"),
        (_gold({"from": "get_hotel_details.no_such_field"}), "no 'no_such_field'"),
        (_distract_chain_tool, "a chain tool is listed as a distractor"),
        (_ref_ahead, "get_hotel_details has not been called yet"),
        (_gold_in_prompt, "appears in the prompt"),
        (_one_call, "chain length 1"),
        (_reused_id, "reused"),
        (_unknown_field, "no 'no_such_field' in search_hotels's output"),
        (_misspelt_key, "distractor: Extra inputs are not permitted"),
        (_gold(2139.5), "Input should be a valid string"),  # an unquoted YAML number
    ],
)
def test_self_check_rejects_a_broken_task(
    tmp_path: Path, edit: Callable[[Tasks], None], reason: str
) -> None:
    data = one_domain(tmp_path, edit, keep=2)
    with pytest.raises(ConfigError) as err:
        build(data)
    assert "SELF-CHECK FAILED [bookings: bookings-0" in str(err.value)
    assert reason in str(err.value)
    assert main(["--data", str(data)]) == 1  # and nothing is written
    assert not list(data.glob("*.jsonl"))


def test_a_tool_that_raises_on_bogus_arguments_is_rejected(tmp_path: Path) -> None:
    data = one_domain(tmp_path, lambda tasks: None)
    tool = data / "domains" / "bookings" / "tools" / "search_flights.py"  # a distractor
    tool.write_text(tool.read_text().replace("rows = FLIGHTS.get(key)", "rows = FLIGHTS[key]"))
    with pytest.raises(ConfigError, match=r"search_flights\(\*\*\{.*ZZ-404"):
        build(data)


def test_check_flag_reports_stale_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = one_domain(tmp_path, lambda tasks: None, keep=2)
    assert main(["--data", str(data)]) == 0
    assert main(["--data", str(data), "--check"]) == 0
    train = data / "train.jsonl"
    train.write_text(train.read_text().replace("Porto", "Oporto"))
    assert main(["--data", str(data), "--check"]) == 1
    assert "stale: train.jsonl" in capsys.readouterr().out
