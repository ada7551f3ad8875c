"""The arena SFT corpus (``python -m training.replay``): every training task's reference chain
replayed through the real loop and solved, its calls as vLLM's parser returns them; a broken
chain is refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from astra_agent.arena import load_arena_file
from astra_agent.errors import ConfigError
from tests.training.conftest import ARENA_TRAIN
from tests.training.e2e import parsed_by_vllm
from training.replay import replay_arenas


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


async def test_replay_without_reasoning_for_a_model_that_does_not_think(tmp_path: Path) -> None:
    path, _ = await replay_arenas(ARENA_TRAIN, tmp_path / "replay", reasoning=False)
    records = [json.loads(x) for x in path.read_text().splitlines()]
    turns = [m for r in records for m in r["trajectory"]["messages"] if m["role"] == "assistant"]
    assert turns and all(r["reward"] == 1.0 for r in records)
    assert not any(m.get("reasoning") or m.get("reasoning_content") for m in turns)
