"""What `run_eval` (eval/runner.py) takes besides the model's endpoint, as τ² uses it: extra
named endpoints (checked and recorded as the model's is) and an external player (an eval's own
loop, handed the items still to run and the clients), against scripted servers over real
HTTP."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from pydantic import Field

from astra_agent.errors import ServerError
from astra_agent.model import ChatModel, ModelConfig
from astra_agent.testing.scripted_server import Reply, ScriptedServer
from eval.results import CONFIG, RESULTS, SUMMARY, EvalRecord
from eval.runner import Clients, EndpointDied, EvalSpec, PlayOne, RunConfig, run_eval
from eval.summaries import EvalSummary
from tests.conftest import free_port

pytestmark = pytest.mark.integration


class Rec(EvalRecord):
    value: int = 0


class Figures(EvalSummary):
    n: int | None = None
    helper: dict[str, Any] = Field(default_factory=dict)


def summarize(records: list[Rec]) -> Figures:
    return Figures(n=len(records))


@pytest.fixture(scope="module")
def agent() -> Iterator[ScriptedServer]:
    with ScriptedServer(lambda req: Reply(content="hi"), model="agent-m") as srv:
        yield srv


@pytest.fixture(scope="module")
def helper() -> Iterator[ScriptedServer]:
    with ScriptedServer(lambda req: Reply(content="hello"), model="helper-m") as srv:
        yield srv


def read(path: Path) -> Any:
    return json.loads(path.read_text())


def spec(**kw: Any) -> EvalSpec[int, Rec, Figures]:
    base: dict[str, Any] = dict(
        items=list(range(4)), key=lambda i: f"e{i}", record=Rec,
        fingerprint={"eval": "x"}, summarize=summarize, kind="test",
    )  # fmt: skip
    return EvalSpec(**{**base, **kw})


async def test_an_extra_endpoint_is_checked_and_recorded_as_the_models_is(
    agent: ScriptedServer, helper: ScriptedServer, tmp_path: Path
) -> None:
    seen: list[str] = []

    async def one(i: int, model: ChatModel) -> Rec:
        seen.append(model.name)
        return Rec(id=f"e{i}", value=i)

    helper_cfg = ModelConfig(base_url=helper.base_url, temperature=0.3)
    cfg = RunConfig(out=tmp_path, model=ModelConfig(base_url=agent.base_url))
    summary, result = await run_eval(cfg, spec(one=one, endpoints={"helper": helper_cfg}))
    assert seen == ["agent-m"] * 4 and result.complete
    fingerprint = read(tmp_path / CONFIG)["fingerprint"]
    # the model's fingerprint, then each extra endpoint's under its name, then the eval's
    assert list(fingerprint)[-2:] == ["helper", "eval"]
    assert fingerprint["model"] == "agent-m"
    assert fingerprint["helper"]["model"] == "helper-m"
    assert fingerprint["helper"]["temperature"] == 0.3
    written = read(tmp_path / SUMMARY)
    assert written["helper"] == fingerprint["helper"] and written["n"] == 4
    assert summary.helper == fingerprint["helper"]


async def test_a_dead_extra_endpoint_fails_before_anything_is_written(
    agent: ScriptedServer, tmp_path: Path
) -> None:
    dead = ModelConfig(base_url=f"http://127.0.0.1:{free_port()}/v1", max_retries=0)

    async def one(i: int, model: ChatModel) -> Rec:
        raise AssertionError("nothing runs")

    cfg = RunConfig(out=tmp_path, model=ModelConfig(base_url=agent.base_url))
    with pytest.raises(ServerError, match=r"127\.0\.0\.1"):
        await run_eval(cfg, spec(one=one, endpoints={"helper": dead}))
    assert not (tmp_path / CONFIG).exists() and not (tmp_path / RESULTS).exists()


def player(calls: list[dict[str, Any]], make: Any) -> Any:
    """A player that plays every item it is handed at once, and says what it was handed and
    how its context ended."""

    @asynccontextmanager
    async def play(todo: Sequence[int], clients: Clients) -> AsyncIterator[PlayOne[int, Rec]]:
        call: dict[str, Any] = {
            "todo": list(todo),
            "model": clients.model.name,
            "others": {n: c.name for n, c in clients.others.items()},
        }
        calls.append(call)

        async def one(i: int) -> Rec:
            return make(i)

        try:
            yield one
        except BaseException as exc:
            call["ended"] = type(exc).__name__
            raise
        call["ended"] = "done"

    return play


async def test_a_player_plays_only_what_is_still_to_run_with_every_client(
    agent: ScriptedServer, helper: ScriptedServer, tmp_path: Path
) -> None:
    calls: list[dict[str, Any]] = []
    endpoints = {"helper": ModelConfig(base_url=helper.base_url)}
    model = ModelConfig(base_url=agent.base_url)

    def make(i: int) -> Rec:
        if i == 2:
            return Rec(id=f"e{i}", error="HTTP 400", error_kind="inference")
        return Rec(id=f"e{i}", value=i)

    play = player(calls, make)
    first = spec(items=[0, 1, 2], player=play, endpoints=endpoints)
    await run_eval(RunConfig(out=tmp_path, model=model), first)
    assert calls == [
        {"todo": [0, 1, 2], "model": "agent-m", "others": {"helper": "helper-m"}, "ended": "done"}
    ]
    more = spec(items=[0, 1, 2, 3], player=play, endpoints=endpoints)
    summary, result = await run_eval(RunConfig(out=tmp_path, model=model, retry_errors=True), more)
    assert calls[1]["todo"] == [2, 3] and result.ran == 2 and summary.n == 4


async def test_a_player_is_stopped_when_the_endpoint_dies_and_the_summary_written(
    agent: ScriptedServer, tmp_path: Path
) -> None:
    calls: list[dict[str, Any]] = []

    def make(i: int) -> Rec:
        if i == 0:
            return Rec(id="e0", value=0)
        return Rec(id=f"e{i}", error="refused", error_kind="inference",
                   endpoint_failure="unreachable")  # fmt: skip

    cfg = RunConfig(
        out=tmp_path, model=ModelConfig(base_url=agent.base_url), max_connection_failures=2
    )
    with pytest.raises(EndpointDied):
        await run_eval(cfg, spec(player=player(calls, make)))
    assert calls[0]["ended"] == "EndpointDied"
    assert read(tmp_path / SUMMARY)["n"] == 1 and read(tmp_path / SUMMARY)["total"] == 4


def test_a_spec_plays_its_items_by_one_or_by_a_player() -> None:
    async def one(i: int, model: ChatModel) -> Rec:
        return Rec(id=f"e{i}")

    with pytest.raises(ValueError, match="one of them"):
        spec()
    with pytest.raises(ValueError, match="one of them"):
        spec(one=one, player=player([], lambda i: Rec(id=f"e{i}")))
