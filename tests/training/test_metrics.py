"""The step records of ``metrics.jsonl`` (:mod:`training.metrics`): lines as the TRL backends
wrote them before the records were typed read back into their records and are written again
byte for byte (keys, order, number formatting); the report reads these records' names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from training.metrics import ABLATION_KEYS, ABFStats, MetricsLog, RLStep, Rollouts, SFTStep

# written by `astra-train sft` (TRL) and `astra-train rl` (TRL) on the tiny model
SFT_LINES = [
    '{"step": 1, "loss": 7.627734184265137, "learning_rate": 0.0, "grad_norm": '
    '3.2686803340911865, "tokens": 8059, "padding_tokens": 0, "trained_tokens": 993, '
    '"tokens_per_s": 521.4043082996706, "trained_tokens_per_s": 64.24549921101537, "epoch": '
    '0.16666666666666666, "elapsed_s": 15.456335652999996, "tokens_total": 8059, '
    '"trained_tokens_total": 993, "padding_tokens_total": 0}',
    '{"step": 12, "loss": 4.790990829467773, "learning_rate": 6.0760539578254115e-05, '
    '"grad_norm": 1.6233701705932617, "tokens": 5867, "padding_tokens": 0, "trained_tokens": '
    '659, "tokens_per_s": 400.2360575212735, "trained_tokens_per_s": 44.95578011019588, '
    '"epoch": 2.0, "elapsed_s": 244.64574463099996, "tokens_total": 97116, '
    '"trained_tokens_total": 12042, "padding_tokens_total": 0}',
]
RL_LINE = (
    '{"step": 1, "reward_mean": 0.9999995000002501, "solved": 1.0, "episode_errors": 0, '
    '"sampled_tokens": 62, "response_tokens": 102, "prompt_tokens": 556, '
    '"rerender_mismatches": 2, "rerender_checked": 2, "model_s": 0.9400110650002489, '
    '"tools_s": 0.19421043100010138, "turns_mean": 2.0, "reward_mean_sampled": '
    '0.9999995000002501, "abf": {"step": 1, "sampled": 1, "valid": 0, "dropped_flat": 0, '
    '"from_buffer": 0, "dropped_stale": 0, "buffered": 0, "rounds": 0, "mean_reward_sampled": '
    '0.0}, "rollout_s": 0.872, "loss": 0.0, "grad_norm": 0.0, "learning_rate": 2e-06, '
    '"clip_fraction": 0.0, "logp_gap": 0.0, "update_s": 0.618}'
)
# a step that began with a held-out evaluation: its figures right after the step number
HELD = '"eval_reward": 0.5, "eval_solved": 0.25, "eval_tasks": 4, '
RL_HELD_LINE = RL_LINE.replace('"step": 1, ', '"step": 1, ' + HELD, 1)
# a step with failed episodes: why, counted, right after how many (a step without has no field)
RL_ERROR_LINE = RL_LINE.replace(
    '"episode_errors": 0, ',
    '"episode_errors": 3, "episode_error_reasons": {"model error: the chat template or '
    'tokenizer failed on the messages: é": 2, "reward failed: KeyError: \'x\'": 1}, ',
)

# a step of a run since the ablation's figures: ASTRA's reward, its parts and the calls
RL_ABLATION_LINE = RL_LINE.replace(
    '"rollout_s": 0.872, ',
    '"rollout_s": 0.872, "f1_mean": 0.5, "recall_mean": 1.0, "precision_mean": 0.3333333333333333, '
    '"calls_mean": 3.0, ',
)


@pytest.mark.parametrize("line", SFT_LINES)
def test_an_sft_line_reads_back_and_is_written_byte_for_byte(line: str) -> None:
    assert SFTStep.from_row(json.loads(line)).to_json_line() == line + "\n"


@pytest.mark.parametrize(
    "line",
    [RL_LINE, RL_HELD_LINE, RL_ERROR_LINE, RL_ABLATION_LINE],
    ids=["rollouts", "held-out", "errors", "ablation"],
)
def test_an_rl_line_reads_back_and_is_written_byte_for_byte(line: str) -> None:
    rec = RLStep.from_row(json.loads(line))
    assert (rec.heldout is not None) == (line == RL_HELD_LINE)
    assert sum(rec.rollouts.episode_error_reasons.values()) == rec.rollouts.episode_errors
    assert rec.to_json_line() == line + "\n"


def test_an_rl_line_with_a_field_of_no_part_is_refused() -> None:
    with pytest.raises(ValueError, match="not fields of an RL step: surprise"):
        RLStep.from_row({**json.loads(RL_LINE), "surprise": 1})


def test_the_log_writes_the_record_with_its_running_totals(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    log = MetricsLog[SFTStep](path)
    row = json.loads(SFT_LINES[0])
    first = SFTStep.from_row({k: v for k, v in row.items() if not k.endswith("_total")})
    assert log.append(first).tokens_total == 8059
    rl = MetricsLog[RLStep](tmp_path / "rl.jsonl")
    rl.append(RLStep.from_row(json.loads(RL_LINE)))
    assert path.read_text() == SFT_LINES[0] + "\n"
    assert (tmp_path / "rl.jsonl").read_text() == RL_LINE + "\n"  # no totals in RL steps


def test_the_report_reads_the_names_these_records_write() -> None:
    """The report reads metrics.jsonl by its format (eval imports nothing of training): each
    of our names it reads is a field of a step record."""
    from eval.report.curves import ABF_KEYS, ALIASES

    sft = set(SFTStep.model_fields)
    rl = set(RLStep.from_row(json.loads(RL_HELD_LINE)).row())
    assert {names[0] for names in ALIASES.values()} <= sft | rl
    assert set(ABLATION_KEYS) <= set(Rollouts.model_fields)  # the ablation's curves
    assert set(ABF_KEYS) <= set(ABFStats.model_fields)
    assert {"abf", "reward_mean"} <= rl and "loss" in sft  # how eval.rundir tells them apart
