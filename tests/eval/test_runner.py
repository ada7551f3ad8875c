"""The one eval runner (eval/runner.py) and its results directory (eval/results.py), without a
network: items → one(item) → typed record; resume, retry, progress, a dead endpoint."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from astra_agent.errors import ConfigError
from astra_agent.model import ModelConfig
from eval.results import (
    CONFIG,
    RESULTS,
    EvalRecord,
    RunMeta,
    ensure_writable_dir,
    model_fingerprint,
    prepare_results_dir,
    read_results,
)
from eval.runner import EndpointDied, ProgressEvent, run_items


class Rec(EvalRecord):
    value: int = 0


def ok(i: int) -> Rec:
    return Rec(id=f"e{i}", value=i)


def unreachable(i: int) -> Rec:
    return Rec(
        id=f"e{i}",
        error="cannot connect",
        error_kind="inference",
        endpoint_failure="unreachable",
    )


def lines(out: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (out / RESULTS).read_text().splitlines()]


async def test_runs_each_item_once_concurrently_with_a_known_total(tmp_path: Path) -> None:
    running, peak = 0, 0
    events: list[ProgressEvent[Rec]] = []

    async def one(i: int) -> Rec:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0)
        running -= 1
        return ok(i)

    result = await run_items(
        list(range(10)), lambda i: f"e{i}", one, out=tmp_path, done={}, concurrency=3,
        progress=events.append,
    )  # fmt: skip
    assert [r.value for r in result.records] == list(range(10)) and result.complete
    assert peak == 3 and result.ran == 10
    assert sorted(x["id"] for x in lines(tmp_path)) == sorted(f"e{i}" for i in range(10))
    assert events[0].record is None and events[0].done == 0
    assert all(e.total == 10 for e in events) and events[-1].done == 10


async def test_resume_skips_done_and_retry_errors_reruns_errors_last_wins(tmp_path: Path) -> None:
    first = [ok(0), Rec(id="e1", error="HTTP 400", error_kind="inference"), ok(2)]
    for rec in first:
        (tmp_path / RESULTS).open("a").write(rec.model_dump_json() + "\n")
    ran: list[int] = []

    async def one(i: int) -> Rec:
        ran.append(i)
        return ok(i)

    done = read_results(tmp_path / RESULTS, Rec)
    result = await run_items(
        [0, 1, 2, 3], lambda i: f"e{i}", one, out=tmp_path, done=done, concurrency=2
    )
    assert ran == [3]  # e1's error is kept without --retry-errors
    assert result.records[1].error_kind == "inference"
    done = read_results(tmp_path / RESULTS, Rec)
    result = await run_items(
        [0, 1, 2, 3], lambda i: f"e{i}", one, out=tmp_path, done=done, concurrency=2,
        retry_errors=True,
    )  # fmt: skip
    assert ran == [3, 1]
    assert len(lines(tmp_path)) == 5  # appended, never rewritten
    again = read_results(tmp_path / RESULTS, Rec)  # the later record of e1 wins
    assert len(again) == 4 and again["e1"].error_kind is None and again["e1"].value == 1
    assert [r.id for r in result.records] == ["e0", "e1", "e2", "e3"]


async def test_a_dead_endpoint_stops_the_run_and_records_none_of_its_failures(
    tmp_path: Path,
) -> None:
    async def one(i: int) -> Rec:
        return ok(i) if i < 4 else unreachable(i)

    with pytest.raises(EndpointDied, match="stopped answering after 4 entries") as info:
        await run_items(
            list(range(20)), lambda i: f"e{i}", one, out=tmp_path, done={}, concurrency=1,
            max_connection_failures=3,
        )  # fmt: skip
    assert info.value.exit_code == 1 and "--resume" in (info.value.hint or "")
    assert [x["id"] for x in lines(tmp_path)] == ["e0", "e1", "e2", "e3"]


async def test_a_passing_connection_failure_is_recorded_once_the_endpoint_answers(
    tmp_path: Path,
) -> None:
    async def one(i: int) -> Rec:
        return unreachable(i) if i in (1, 2, 5) else ok(i)

    result = await run_items(
        list(range(6)), lambda i: f"e{i}", one, out=tmp_path, done={}, concurrency=1,
        max_connection_failures=3,
    )  # fmt: skip
    assert result.complete
    written = [x["id"] for x in lines(tmp_path)]
    assert written == ["e0", "e3", "e1", "e2", "e4", "e5"]  # e1, e2 held until e3 answered


async def test_other_errors_never_stop_the_run(tmp_path: Path) -> None:
    async def one(i: int) -> Rec:
        return Rec(id=f"e{i}", error="HTTP 400", error_kind="inference", endpoint_failure="status")

    result = await run_items(
        list(range(8)), lambda i: f"e{i}", one, out=tmp_path, done={}, concurrency=2,
        max_connection_failures=2,
    )  # fmt: skip
    assert len(result.records) == 8 and len(lines(tmp_path)) == 8


def meta(model: str, url: str, temperature: float = 0.6) -> RunMeta:
    cfg = ModelConfig(base_url=url, temperature=temperature)
    return RunMeta(fingerprint={**model_fingerprint(cfg, model), "data": 1}, base_url=url)


def test_the_fingerprint_is_the_served_model_and_sampling_not_the_url(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first = meta("astra", "http://127.0.0.1:8000/v1")
    assert "base_url" not in first.fingerprint and first.fingerprint["model"] == "astra"
    prepare_results_dir(tmp_path, first, False, Rec)
    (tmp_path / RESULTS).write_text(ok(0).model_dump_json() + "\n")
    with pytest.raises(ConfigError, match="already holds results"):
        prepare_results_dir(tmp_path, first, False, Rec)
    with caplog.at_level(logging.WARNING):
        done = prepare_results_dir(tmp_path, meta("astra", "http://localhost:9001/v1"), True, Rec)
    assert list(done) == ["e0"]
    assert "http://127.0.0.1:8000/v1" in caplog.text and "localhost:9001" in caplog.text
    with pytest.raises(ConfigError, match=r"different configuration \(model differ\)"):
        prepare_results_dir(tmp_path, meta("other", "http://localhost:9001/v1"), True, Rec)
    with pytest.raises(ConfigError, match=r"different configuration \(temperature differ\)"):
        prepare_results_dir(tmp_path, meta("astra", "http://x/v1", 0.1), True, Rec)


def test_results_of_an_older_format_are_refused_clearly(tmp_path: Path) -> None:
    old = {"base_url": "http://127.0.0.1:8000/v1", "model": None, "temperature": 0.6}
    (tmp_path / CONFIG).write_text(json.dumps(old))
    (tmp_path / RESULTS).write_text(json.dumps({"index": 0, "reward": 1.0}) + "\n")
    with pytest.raises(ConfigError, match="older astra-eval"):
        prepare_results_dir(tmp_path, meta("astra", "http://x/v1"), True, Rec)
    with pytest.raises(ConfigError, match=r"results.jsonl:1 is not a Rec record"):
        read_results(tmp_path / RESULTS, Rec)


def test_an_unwritable_out_is_refused_before_any_work(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="cannot write results to"):
        ensure_writable_dir(tmp_path / "file" / "out")
    readonly = Path("/sys/kernel")  # read-only even for root
    if readonly.is_dir():
        with pytest.raises(ConfigError, match="cannot write results to /sys/kernel"):
            ensure_writable_dir(readonly)


def test_arena_record_ids_are_task_ids_and_stay_unique_when_a_file_repeats_one(
    tmp_path: Path,
) -> None:
    from astra_agent.arena import load_arena_file
    from eval.arenas import DATA_DIR
    from eval.arenas.runner import task_ids

    rows = [json.loads(x) for x in (DATA_DIR / "heldout.jsonl").read_text().splitlines()[:3]]
    rows[2]["task_id"] = rows[0]["task_id"]
    path = tmp_path / "dup.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ids = task_ids(load_arena_file(path).tasks)
    first = rows[0]["task_id"]
    assert ids == {0: f"{first}@0", 1: rows[1]["task_id"], 2: f"{first}@2"}
