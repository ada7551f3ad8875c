"""`score_official_results`: result files in the official format scored by our checker into
the official score layout — checked against the official `bfcl evaluate` on the same files."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

import pytest

from astra_agent.errors import ConfigError
from bench.bfcl_fuzz import RandomChoose, ground_truth_raw, mutate
from eval.bfcl import CATEGORIES, load_category
from eval.bfcl.official import OFFICIAL_FC_MODEL
from eval.bfcl.parity import run_bfcl_evaluate
from eval.bfcl.score import score_official_results

OFFICIAL_BFCL = Path(
    os.environ.get("ASTRA_BFCL_OFFICIAL", Path(__file__).parents[2] / ".venv-bfcl/bin/bfcl")
)
MODEL_DIR = OFFICIAL_FC_MODEL.replace("/", "_")


def write_results(root: Path, per_category: int, prefix: str = "BFCL_v4") -> Path:
    """Result files as `bfcl generate` writes them: the ground truth, mutated for most
    entries, one entry's result not a list (an inference error), one a turn short."""
    target = root / MODEL_DIR / "multi_turn"
    target.mkdir(parents=True)
    c = RandomChoose(random.Random("score"))
    for cat in CATEGORIES:
        lines = []
        for i, e in enumerate(load_category(cat)[:per_category]):
            result: Any = ground_truth_raw(e) if i % 3 == 0 else mutate(e, c)
            if i == 1:
                result = "Error during inference: connection refused"
            if i == 2:
                result = result[:-1]
            lines.append(json.dumps({"id": e.id, "result": result, "inference_log": f"log {i}"}))
        lines.reverse()  # any order: the official evaluator sorts by id
        (target / f"{prefix}_multi_turn_{cat}_result.json").write_text("\n".join(lines) + "\n")
    return root


def read_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


COMPARED = (
    "id",
    "model_name",
    "test_category",
    "valid",
    "prompt",
    "model_result",
    "model_result_raw",
    "model_result_decoded",
    "possible_answer",
    "inference_log",
)


@pytest.mark.integration
def test_scores_equal_the_official_evaluate_on_the_same_files(tmp_path: Path) -> None:
    results = write_results(tmp_path / "result", 12)
    summary = score_official_results(results, tmp_path / "ours")
    official = run_bfcl_evaluate(
        OFFICIAL_BFCL, results, tmp_path / "official", list(CATEGORIES), OFFICIAL_FC_MODEL
    )
    mine = summary["models"][MODEL_DIR]
    for cat in CATEGORIES:
        theirs = official[cat]
        ours = read_lines(
            tmp_path / "ours" / MODEL_DIR / "multi_turn" / f"BFCL_v4_multi_turn_{cat}_score.json"
        )
        assert ours[0] == theirs[0]  # accuracy, correct_count, total_count
        assert mine["accuracy"][cat] == theirs[0]["accuracy"]
        assert [x["id"] for x in ours[1:]] == [x["id"] for x in theirs[1:]]
        assert len(theirs) > 3  # failures of several kinds, not only the planted two
        for a, b in zip(ours[1:], theirs[1:], strict=True):
            assert set(a) == set(b), a["id"]
            assert {k: a.get(k) for k in COMPARED} == {k: b.get(k) for k in COMPARED}, a["id"]
            assert a["error"]["error_type"] == b["error"]["error_type"], a["id"]
            assert a["error"]["error_message"] == b["error"]["error_message"], a["id"]
    csv_ours = (tmp_path / "ours" / "data_multi_turn.csv").read_text().split("\n")
    csv_theirs = (tmp_path / "official" / "data_multi_turn.csv").read_text().split("\n")
    assert csv_ours[0] == csv_theirs[0] and len(csv_ours) == len(csv_theirs) == 2
    drop_model = [row.split(",")[:1] + row.split(",")[2:] for row in (csv_ours[1], csv_theirs[1])]
    assert drop_model[0] == drop_model[1]


def test_summary_and_layout(tmp_path: Path) -> None:
    results = write_results(tmp_path / "result", 3, prefix="BFCL_v3")  # older names read too
    summary = score_official_results(results, tmp_path / "scores")
    model = summary["models"][MODEL_DIR]
    assert model["counts"] == dict.fromkeys(CATEGORIES, 3)
    assert model["overall"] == pytest.approx(sum(model["accuracy"].values()) / 4)
    for cat in CATEGORIES:
        path = (
            tmp_path / "scores" / MODEL_DIR / "multi_turn" / f"BFCL_v4_multi_turn_{cat}_score.json"
        )
        head, *failing = read_lines(path)
        assert head["total_count"] == 3 and head["correct_count"] == 3 - len(failing)
        kinds = {f["id"]: f["error"]["error_type"] for f in failing}
        assert kinds[f"multi_turn_{cat}_1"] == "multi_turn:inference_error"
        assert kinds[f"multi_turn_{cat}_2"] == "multi_turn:force_terminated"


def _one_file(tmp_path: Path, text: str, cat: str = "base") -> Path:
    target = tmp_path / "r" / "m" / "multi_turn"
    target.mkdir(parents=True)
    (target / f"BFCL_v4_multi_turn_{cat}_result.json").write_text(text)
    return tmp_path / "r"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"id": "multi_turn_base_0", "result": []}\nnot json\n', ":2: not a JSON line"),
        ('{"id": "multi_turn_base_999", "result": []}\n', "unknown id 'multi_turn_base_999'"),
        ('{"id": "multi_turn_miss_func_0", "result": []}\n', "unknown id"),
        ('{"id": "multi_turn_base_0"}\n', "needs 'id' and 'result'"),
        ('{"id": "multi_turn_base_0", "result": []}\n' * 2, "appears twice"),
        ('{"id": "multi_turn_base_0", "result": [[], 5, [], []]}\n', "not a list of steps"),
    ],
)
def test_bad_result_files_are_config_errors(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        score_official_results(_one_file(tmp_path, text), tmp_path / "scores")


def test_a_missing_or_empty_result_dir_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no result directory"):
        score_official_results(tmp_path / "nope", tmp_path / "scores")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no multi-turn result files"):
        score_official_results(tmp_path / "empty", tmp_path / "scores")
    assert not (tmp_path / "scores").exists()  # nothing written before the input is checked
