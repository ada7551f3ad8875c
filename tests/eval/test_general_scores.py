"""The figures of a general run when some samples got no usable reply: recomputed over the
scored samples (mean metrics), other metrics and groups left out with a note, untouched tasks
as lm-eval computed them."""

from __future__ import annotations

from typing import Any

import pytest

from eval.general.runner import GeneralRecord

pytest.importorskip("lm_eval")

from eval.general.scores import mean_metrics, recompute, summarize_tasks


def rec(task: str, i: int, error: bool = False, **metrics: Any) -> GeneralRecord:
    fields = dict.fromkeys(("prompt", "response", "answer", "extracted", "target"), "")
    return GeneralRecord.model_validate(
        {
            "id": f"{task}/{i}",
            "task": task,
            "index": i,
            **fields,
            "error": "no choices" if error else None,
            "error_kind": "inference" if error else None,
            **({} if error else metrics),
        }
    )


def results(with_group: bool = True) -> dict[str, Any]:
    """lm-eval's result for t1 (exact_match: a mean; bleu: corpus-level) and t2, in group g."""
    out: dict[str, Any] = {
        "samples": {"t1": [], "t2": []},
        "results": {
            "t1": {
                "alias": "t1",
                "exact_match,none": 0.25,
                "exact_match_stderr,none": 0.2,
                "bleu,none": 31.5,
                "bleu_stderr,none": "N/A",
            },
            "t2": {"alias": "t2", "exact_match,none": 1.0, "exact_match_stderr,none": 0.0},
        },
        "configs": {
            "t1": {
                "metric_list": [
                    {"metric": "exact_match", "aggregation": "mean"},
                    {"metric": "bleu", "aggregation": "bleu"},
                ]
            },
            "t2": {"metric_list": [{"metric": "exact_match"}]},  # the registry's default: mean
        },
    }
    if with_group:
        out["results"]["g"] = {"alias": "g", "exact_match,none": 0.625}
    return out


RECORDS_OK = [rec("t1", i, exact_match=float(i == 0), bleu=9.0) for i in range(4)] + [
    rec("t2", i, exact_match=1.0) for i in range(2)
]


def test_mean_metrics_from_configs_and_the_registry_default() -> None:
    assert mean_metrics(results()) == {"t1": {"exact_match"}, "t2": {"exact_match"}}


def test_without_errors_lm_evals_figures_stand() -> None:
    tasks, notes = summarize_tasks(RECORDS_OK, results(), groups={"g": ["t1", "t2"]})
    assert tasks == {
        "t1": {"exact_match": 0.25, "exact_match_stderr": 0.2, "bleu": 31.5},
        "t2": {"exact_match": 1.0, "exact_match_stderr": 0.0},
        "g": {"exact_match": 0.625},
    }
    assert notes == []


def test_errors_are_left_out_of_the_figures() -> None:
    records = [
        rec("t1", 0, exact_match=1.0, bleu=9.0),
        rec("t1", 1, error=True),
        rec("t1", 2, exact_match=0.0, bleu=9.0),
        rec("t1", 3, exact_match=1.0, bleu=9.0),
        rec("t2", 0, exact_match=1.0),
    ]
    tasks, notes = summarize_tasks(records, results(), groups={"g": ["t1", "t2"]})
    assert tasks["t1"] == {
        "exact_match": pytest.approx(2 / 3),
        "exact_match_stderr": pytest.approx((1 / 3) ** 0.5 / 3**0.5),
    }
    assert tasks["t2"] == {"exact_match": 1.0, "exact_match_stderr": 0.0}  # lm-eval's own
    assert "g" not in tasks
    assert any(n.startswith("t1: bleu left out (not a mean") for n in notes)
    assert any(n.startswith("g: the group's figures are left out") for n in notes)


def test_a_group_whose_tasks_had_no_error_keeps_its_figures() -> None:
    records = [*RECORDS_OK, rec("t3", 0, error=True), rec("t3", 1, exact_match=1.0)]
    res = results()
    res["samples"]["t3"] = []
    res["results"]["t3"] = {"exact_match,none": 0.5}
    res["configs"]["t3"] = {"metric_list": [{"metric": "exact_match", "aggregation": "mean"}]}
    tasks, notes = summarize_tasks(records, res, groups={"g": ["t1", "t2"]})
    assert tasks["g"] == {"exact_match": 0.625}
    assert tasks["t3"] == {"exact_match": 1.0}  # one scored sample: no stderr
    assert notes == []


def test_a_task_with_no_scored_sample_has_no_figures() -> None:
    records = [rec("t2", 0, error=True), rec("t2", 1, error=True), *RECORDS_OK[:4]]
    tasks, notes = summarize_tasks(records, results(False), groups={})
    assert tasks["t2"] == {}
    assert notes == ["t2: no sample was scored (2 got no usable reply)"]


def test_a_retry_recomputes_what_it_ran_and_keeps_the_rest() -> None:
    """--retry-errors re-ran t1's errors: t1 from the merged records (lm-eval's t1 figure
    covers only the re-run samples), t2 as the old summary had it, the group left out."""
    old = {"t1": {"exact_match": 0.0}, "t2": {"exact_match": 0.5, "x": 3.0}, "g": {"m": 1.0}}
    res = results(with_group=False)
    res["samples"] = {"t1": []}
    res["results"] = {"t1": {"exact_match,none": 1.0, "exact_match_stderr,none": 0.0}}
    tasks, notes = summarize_tasks(RECORDS_OK, res, groups={"g": ["t1", "t2"]}, old=old)
    assert tasks["t1"]["exact_match"] == pytest.approx(0.25)
    assert tasks["t2"] == {"exact_match": 0.5, "x": 3.0}
    assert "g" not in tasks and any(n.startswith("g: ") for n in notes)


def test_recompute_ignores_values_that_are_not_finite_numbers() -> None:
    records = [rec("t", 0, m=1.0), rec("t", 1, m=float("nan")), rec("t", 2, m=True)]
    out, left_out = recompute(records, {"m"})
    assert out == {"m": 1.0, "m_stderr": 0.0} and left_out == []
