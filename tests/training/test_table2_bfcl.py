"""The Table 2 experiment judged on BFCL: the one BFCL run of each model becomes a row per
leaderboard group (non-live AST, live AST, irrelevance, relevance, multi-turn), each with its
own n, accuracy and paired tests over that group's entries only; ``bfcl_half`` reaches
``astra-eval bfcl --half`` and leaves the fingerprint of experiments that do not set it as it
was."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.eval.test_compare import bfcl, write_run
from training.table2.config import ExperimentConfig
from training.table2.directory import Experiment
from training.table2.table import build_table, render_markdown

MISMATCH = "simple_function_checker:wrong_value"


def _runs(x: Experiment) -> None:
    """base and SFT on 12 non-live AST, 4 irrelevance and 2 live entries: SFT fixes 10 of the
    AST entries and breaks 2 irrelevance ones; the live entries fail in both."""
    base, sft = [], []
    for i in range(12):
        base.append(bfcl(f"simple_python_{i}", False, MISMATCH, category="simple_python"))
        sft.append(bfcl(f"simple_python_{i}", i < 10, MISMATCH, category="simple_python"))
    for i in range(4):
        base.append(bfcl(f"irrelevance_{i}", True, category="irrelevance"))
        sft.append(bfcl(f"irrelevance_{i}", i >= 2, "irrelevance:call", category="irrelevance"))
    for i in range(2):
        base.append(bfcl(f"live_simple_{i}-0-0", False, MISMATCH, category="live_simple"))
        sft.append(bfcl(f"live_simple_{i}-0-0", False, MISMATCH, category="live_simple"))
    write_run(x.eval_dir("base", "bfcl"), base)
    write_run(x.eval_dir("sft", "bfcl"), sft)


def _experiment(tmp_path: Path, **bfcl_settings: object) -> Experiment:
    cfg = ExperimentConfig(
        out=tmp_path / "x",
        eval={"splits": ["c"], "bfcl_limit": 20, **bfcl_settings},
    )
    return Experiment(cfg)


def test_each_bfcl_group_is_a_row_with_its_own_paired_tests(tmp_path: Path) -> None:
    x = _experiment(tmp_path, bfcl_categories="single_turn", bfcl_half="selection")
    _runs(x)
    table = build_table(x)
    assert table["sets"] == [
        "c", "bfcl-non-live", "bfcl-live", "bfcl-irrelevance", "bfcl-relevance"
    ]  # fmt: skip
    base, sft = table["cells"]["base"], table["cells"]["sft"]
    assert base["c"] is None and table["cells"]["rl"]["bfcl-non-live"] is None
    assert (base["bfcl-non-live"]["n"], base["bfcl-non-live"]["mean"]) == (12, 0.0)
    assert (sft["bfcl-non-live"]["n"], sft["bfcl-non-live"]["mean"]) == (12, round(10 / 12, 4))
    assert (base["bfcl-irrelevance"]["mean"], sft["bfcl-irrelevance"]["mean"]) == (1.0, 0.5)
    assert base["bfcl-live"]["n"] == 2 and base["bfcl-relevance"] is None  # no entry ran
    step = table["comparisons"]["sft vs base"]
    assert set(step) == {"bfcl-non-live", "bfcl-live", "bfcl-irrelevance"}
    ast = {t["name"].split()[0]: t for t in step["bfcl-non-live"]["tests"]}
    assert step["bfcl-non-live"]["n"] == 12 and step["bfcl-non-live"]["mean_diff"] > 0.8
    assert ast["McNemar"]["p_value"] == pytest.approx(2 / 2**10)  # 10 fixed, 0 broken
    irr = {t["name"].split()[0]: t for t in step["bfcl-irrelevance"]["tests"]}
    assert irr["McNemar"]["p_value"] == pytest.approx(0.5)  # 0 fixed, 2 broken
    md = render_markdown(table)
    assert "| BFCL non-live AST | 12 |" in md and "| BFCL irrelevance (no call) | 4 |" in md
    assert (x.path("compare", "sft-vs-base-bfcl.json")).is_file()


def test_bfcl_half_is_passed_on_and_absent_from_old_fingerprints(tmp_path: Path) -> None:
    plain = ExperimentConfig(out=tmp_path / "x")
    assert "bfcl_half" not in plain.fingerprint()["eval"]
    halved = ExperimentConfig(out=tmp_path / "x", eval={"bfcl_half": "report"})
    assert halved.fingerprint()["eval"]["bfcl_half"] == "report"
    with pytest.raises(ValueError, match="bfcl_half"):
        ExperimentConfig(out=tmp_path / "x", eval={"bfcl_half": "train"})


def test_a_multi_turn_slice_keeps_its_one_row(tmp_path: Path) -> None:
    x = _experiment(tmp_path)  # the shipped default: bfcl_categories base
    write_run(x.eval_dir("base", "bfcl"), [bfcl("multi_turn_base_0", False, MISMATCH)])
    table = build_table(x)
    assert table["sets"] == ["c", "bfcl-multi-turn"]
    assert table["cells"]["base"]["bfcl-multi-turn"]["n"] == 1
