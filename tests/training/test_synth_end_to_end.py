"""The synthesis pipeline end to end, as a user runs it: every stage through `astra-train synth …`
(and `astra-eval`) in a subprocess, against the scripted teacher over real HTTP.

A, tool chains → SFT data: real MCP servers (`mcp-server-time`, the npm `server-everything`
and `server-filesystem`) → pool → graph → confirm (the teacher's verdict on each edge) → chains →
check-chains (a vote and a back-translation per chain) → tasks → interact (the time and
everything servers live, the filesystem's tools played by the teacher) → judge → `astra-train
data sft`.
B, environments → RL arenas: domains → decompose → env-code (the bubblewrap sandbox) → arenas
→ `astra-eval arenas validate` and `astra-eval arenas` with a model replaying the reference
chains. After every stage: its counts against its inputs (kept + rejected = asked, where that
holds), a reason on every rejection, and provenance naming records of the stage before.

Last, the tiny vLLM model (garbage answers for these prompts) as the teacher of one stage:
every input rejected with a reason and the raw reply, tokens counted, nothing crashed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from astra_agent.arena import load_arena_file
from astra_agent.sandbox import bwrap_available
from astra_agent.testing.scripted_server import ScriptedServer
from eval.arenas import replay_script
from serving.server import ModelServer
from serving.tiny import Script
from training.testing import scripted_teacher_server

pytestmark = pytest.mark.integration

MODEL = "scripted-teacher"
NODE_BIN = Path(__file__).resolve().parents[2] / ".mcp-servers" / "node_modules" / ".bin"
PROGRAMS = {"astra-train": "training.cli", "astra-eval": "eval"}
needs_bwrap = pytest.mark.skipif(not bwrap_available(), reason="bubblewrap is not installed")

Record = dict[str, Any]


# ------------------------------------------------------------------ running and reading


@dataclass(frozen=True)
class Step:
    """One command of a pipeline: ``program args…``, writing the directory ``root/name``."""

    name: str
    args: list[str]
    program: str = "astra-train"


def run(step: Step) -> subprocess.CompletedProcess[str]:
    """The command as a user types it (``python -m`` of the console script's module)."""
    argv = [sys.executable, "-m", PROGRAMS[step.program], *step.args]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=180,
                         env={**os.environ, "COLUMNS": "200"})  # fmt: skip
    assert out.returncode == 0, f"{step.program} {' '.join(step.args)}\n{out.stderr[-4000:]}"
    return out


def read(path: Path) -> list[Record]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def stats(d: Path) -> Record:
    return json.loads((d / "stats.json").read_text())


def rejections(d: Path, stage: str) -> list[Record]:
    """The stage's rejections, each checked to carry a reason and a source, and counted in
    stats.json as written."""
    got = read(d / "rejections.jsonl")
    for r in got:
        assert r["reason"] and r["source"] and r["stage"] == stage, r
    assert stats(d)["rejections"] == dict(sorted(Counter(r["reason"] for r in got).items()))
    return got


def outputs(d: Path, name: str, stage: str) -> tuple[list[Record], list[Record]]:
    """(records, rejections) of a finished stage: stats.json complete and counting both."""
    s = stats(d)
    assert s["stage"] == stage and s["fingerprint"] and s["finished"]
    kept = read(d / name)
    assert s["records"] == len(kept) and not (d / ".journal.jsonl").exists()
    return kept, rejections(d, stage)


def provenance(record: Record) -> Record:
    prov = record.get("provenance") or record.get("metadata", {}).get("provenance")
    assert isinstance(prov, dict) and prov["code_version"], record.get("id")
    return prov


def linked(records: list[Record], stage: str, parents: set[str]) -> None:
    """Every record was made by ``stage`` from records in ``parents`` (ids)."""
    for r in records:
        prov = provenance(r)
        assert prov["stage"] == stage and prov["inputs"], r.get("id")
        assert set(prov["inputs"]) <= parents, (r.get("id"), prov["inputs"])


def asked(srv: ScriptedServer, template: str) -> int:
    """Requests the teacher got from ``template`` (its marker line)."""
    marker = f"[astra-synth:{template}]"
    return sum(str(b["messages"][0].get("content", "")).startswith(marker) for b in srv.requests)


def teacher_calls(s: Record) -> dict[str, int]:
    return {ref: t["calls"] for ref, t in s["tokens"].items()}


# ------------------------------------------------------------------ A: tool chains → SFT data


def chain_pipeline(root: Path, url: str, tokenizer: Path) -> list[Step]:
    """The commands of pipeline A, in order; each reads the directories of the steps before."""
    d = {name: str(root / name) for name in
         ("pool", "graph", "confirm", "chains", "check-chains", "tasks", "interact", "judge",
          "sft")}  # fmt: skip
    teacher = ["--base-url", url, "--model", MODEL]
    return [
        Step("pool", ["synth", "pool", "--mcp-config", str(root / "mcp.json"),
                      "--domain", "workspace", "--out", d["pool"]]),
        Step("graph", ["synth", "graph", "--pool", d["pool"], "--out", d["graph"]]),
        Step("confirm", ["synth", "confirm", "--graph", d["graph"], "--out", d["confirm"],
                         *teacher, "--batch", "8"]),
        Step("chains", ["synth", "chains", "--graph", d["confirm"], "--count", "4", "--seed", "1",
                        "--out", d["chains"]]),
        Step("check-chains", ["synth", "check-chains", "--chains", d["chains"], "--pool",
                              d["pool"], "--out", d["check-chains"], *teacher]),
        Step("tasks", ["synth", "tasks", "--chains", d["check-chains"], "--pool", d["pool"],
                       "--out", d["tasks"], *teacher, "--concurrency", "4"]),
        Step("interact", ["synth", "interact", "--tasks", d["tasks"], "--pool", d["pool"],
                          "--out", d["interact"], *teacher, "--mcp-config",
                          str(root / "live.json"), "--simulate", "--seed", "0",
                          "--concurrency", "4"]),
        Step("judge", ["synth", "judge", "--interactions", d["interact"], "--out", d["judge"],
                       *teacher, "--min-each", "call_success=3"]),
        Step("sft", ["data", "sft", str(Path(d["judge"]) / "trajectories.jsonl"),
                     "--out", d["sft"], "--tokenizer", str(tokenizer)]),
    ]  # fmt: skip


def write_mcp_configs(root: Path) -> None:
    """mcp.json: the three real servers (the pool's); live.json: those interact runs live (the
    filesystem's tools are played by the teacher: synthetic episodes edit no real files)."""
    files = root / "files"
    files.mkdir(parents=True)
    (files / "notes.txt").write_text("quarterly report: due on Friday\n")
    for name in ("mcp-server-everything", "mcp-server-filesystem"):
        assert (NODE_BIN / name).exists(), f"{NODE_BIN / name} missing: run `make setup-mcp`"
    servers = {
        "time": {"command": "mcp-server-time", "env": {"TZ": "UTC"}},
        "every": {"command": str(NODE_BIN / "mcp-server-everything"), "args": ["stdio"]},
        "fs": {"command": str(NODE_BIN / "mcp-server-filesystem"), "args": [str(files)]},
    }
    (root / "mcp.json").write_text(json.dumps({"mcpServers": servers}))
    live = {k: v for k, v in servers.items() if k != "fs"}
    (root / "live.json").write_text(json.dumps({"mcpServers": live}))


def check_pool(root: Path, srv: ScriptedServer) -> None:
    tools, rejected = outputs(root / "pool", "pool.jsonl", "pool")
    s = stats(root / "pool")
    assert s["servers"] == 3 and not s["servers_failed"] and not rejected
    by_server = Counter(t["server"] for t in tools)
    assert by_server == s["by_server"] and set(by_server) == {"time", "every", "fs"}
    assert s["tools"] == len(tools) == len({t["id"] for t in tools}) and s["by_domain"] == {
        "workspace": len(tools)}  # fmt: skip
    assert {"time/get_current_time", "every/echo", "fs/read_text_file"} <= {t["id"] for t in tools}
    linked(tools, "pool", {f"mcp:{root / 'mcp.json'}"})


def check_graph(root: Path, srv: ScriptedServer) -> None:
    edges, rejected = outputs(root / "graph", "edges.jsonl", "graph")
    nodes = read(root / "graph" / "nodes.jsonl")
    pool = {t["id"] for t in read(root / "pool" / "pool.jsonl")}
    assert {n["id"] for n in nodes} == pool and not rejected
    assert stats(root / "graph")["edges"] == len(edges) > 0
    for e in edges:
        assert e["id"] == f"{e['source']}->{e['target']}" and e["score"] >= 0.5 and e["reason"]
    degree = Counter(e["source"] for e in edges)
    assert all(n["out_degree"] == degree[n["id"]] for n in nodes)
    linked(edges, "graph", pool)


def check_confirm(root: Path, srv: ScriptedServer) -> None:
    """A graph directory (``stage: graph``) whose edges carry the teacher's verdict."""
    d = root / "confirm"
    s = stats(d)
    assert s["stage"] == "graph" and s["check"] == "confirm" and s["finished"]
    edges, rejected = read(d / "edges.jsonl"), rejections(d, "confirm")
    proposed = {e["id"] for e in read(root / "graph" / "edges.jsonl")}
    assert {e["id"] for e in edges} == proposed and s["records"] == s["proposed"] == len(edges)
    assert s["confirmed"] == s["edges"] == sum(e["confirmed"] for e in edges) > 0
    assert {r["id"] for r in rejected} == {e["id"] for e in edges if not e["confirmed"]}
    assert all(e["judge_reason"] and isinstance(e["confirmed"], bool) for e in edges)
    linked(edges, "confirm", proposed)
    assert teacher_calls(s) == {"edge_confirm.v1": asked(srv, "edge_confirm.v1")}
    assert s["batches"] == -(-len(edges) // 8) and s["prompt_tokens"] > 0


def check_chains(root: Path, srv: ScriptedServer) -> None:
    chains, rejected = outputs(root / "chains", "chains.jsonl", "chains")
    edges = {e["id"] for e in read(root / "confirm" / "edges.jsonl") if e["confirmed"]}
    s = stats(root / "chains")
    assert s["chains"] == s["requested"] == len(chains) == 4 and not rejected
    assert sum(s["lengths"].values()) == len(chains)
    assert len({tuple(c["tools"]) for c in chains}) == len(chains)  # distinct
    for c in chains:
        walk = [f"{a}->{b}" for a, b in zip(c["tools"], c["tools"][1:], strict=False)]
        assert c["edges"] == walk and set(walk) <= edges and 2 <= len(c["tools"]) <= 5
    linked(chains, "chains", edges)


def check_check_chains(root: Path, srv: ScriptedServer) -> None:
    """A chains directory (``stage: chains``) of the chains that passed the vote and the
    back-translation."""
    d = root / "check-chains"
    s = stats(d)
    assert s["stage"] == "chains" and s["check"] == "check-chains" and s["finished"]
    kept, rejected = read(d / "chains.jsonl"), rejections(d, "check-chains")
    chains = {c["id"]: c for c in read(root / "chains" / "chains.jsonl")}
    assert {c["id"] for c in kept} | {r["id"] for r in rejected} == set(chains)
    assert len(kept) + len(rejected) == s["checked"] == len(chains)
    assert s["kept"] == s["records"] == len(kept) > 0
    for c in kept:
        detail = provenance(c)["detail"]
        assert c["tools"] == chains[c["id"]]["tools"] and detail["votes"] and detail["question"]
        assert len(detail["predicted"]) == len(c["tools"]) and detail["offered"] >= len(c["tools"])
    linked(kept, "check-chains", set(chains))
    assert teacher_calls(s) == {ref: asked(srv, ref) for ref in
                                ("back_translate.v1", "chain_vote.v1", "tasks.v1")}  # fmt: skip


def check_tasks(root: Path, srv: ScriptedServer) -> None:
    tasks, rejected = outputs(root / "tasks", "tasks.jsonl", "tasks")
    chains = {c["id"]: c for c in read(root / "check-chains" / "chains.jsonl")}
    checking = stats(root / "check-chains")["tokens"]["tasks.v1"]["calls"]  # its requests
    s = stats(root / "tasks")
    asked_for = {f"{c}:{m}" for c in chains for m in ("diverse", "constrained", "persona")}
    assert {t["id"] for t in tasks} | {r["id"] for r in rejected} == asked_for
    assert len(tasks) + len(rejected) == len(asked_for) and s["questions"] == len(tasks) > 0
    for t in tasks:
        assert t["tools"] == chains[t["chain"]]["tools"] and t["question"]
    linked(tasks, "tasks", set(chains))
    assert teacher_calls(s) == {"tasks.v1": asked(srv, "tasks.v1") - checking,
                                "tasks_judge.v1": asked(srv, "tasks_judge.v1")}  # fmt: skip
    assert s["prompt_tokens"] > 0 and s["completion_tokens"] > 0


def check_interact(root: Path, srv: ScriptedServer) -> None:
    trajs, rejected = outputs(root / "interact", "interactions.jsonl", "interact")
    tasks = {t["id"]: t for t in read(root / "tasks" / "tasks.jsonl")}
    s = stats(root / "interact")
    assert {t["id"] for t in trajs} | {r["id"] for r in rejected} == set(tasks)
    assert len(trajs) + len(rejected) == s["tasks"] == len(tasks)
    assert s["servers_live"] == ["every", "time"] and not s["servers_failed"]
    environments: Counter[str] = Counter()
    for t in trajs:
        meta = t["metadata"]
        servers = {tool.split("/")[0] for tool in meta["tools"]}
        expected = "live" if servers <= {"every", "time"} else (
            "simulated" if "time" not in servers else "mixed")  # fmt: skip
        assert meta["environment"] == expected and meta["tools"] == tasks[t["id"]]["tools"]
        called = {e["name"] for e in t["events"]}
        assert called and called & set(meta["chain_names"]), t["id"]
        if expected == "live":
            assert not meta["simulated"]
        environments[expected] += 1
    assert environments == s["by_environment"] and {"live", "simulated"} <= set(environments)
    assert s["calls"] == sum(len(t["events"]) for t in trajs)
    linked(trajs, "interact", set(tasks))
    agent = sum(bool(b.get("tools")) for b in srv.requests)
    assert teacher_calls(s) == {"agent": agent, "simulate_tool.v1": asked(srv, "simulate_tool.v1")}


def check_judge(root: Path, srv: ScriptedServer) -> None:
    kept, rejected = outputs(root / "judge", "trajectories.jsonl", "judge")
    trajs = {t["id"] for t in read(root / "interact" / "interactions.jsonl")}
    s = stats(root / "judge")
    assert {t["id"] for t in kept} | {r["id"] for r in rejected} == trajs
    assert len(kept) + len(rejected) == s["trajectories"] == len(trajs)
    assert s["kept"] == len(kept) > 0 and rejected  # the failed live calls: call_success 2
    for r in rejected:
        assert r["reason"] == "low_score" and r["scores"]["call_success"] < 3 and r["raw"]
    for t in kept:
        scores = t["metadata"]["scores"]
        assert scores["overall"] >= 3.5 and scores["call_success"] >= 3
    linked(kept, "judge", trajs)
    assert teacher_calls(s) == {"trajectory_judge.v1": asked(srv, "trajectory_judge.v1")}


def check_sft(root: Path, srv: ScriptedServer) -> None:
    kept = [t["id"] for t in read(root / "judge" / "trajectories.jsonl")]
    table = pq.read_table(root / "sft" / "sft.parquet")
    assert table.num_rows == len(kept) and sorted(table.column("id").to_pylist()) == sorted(kept)
    assert json.loads((root / "sft" / "stats.json").read_text())["rejections"] == {}


CHECKS: dict[str, Callable[[Path, ScriptedServer], None]] = {
    "pool": check_pool,
    "graph": check_graph,
    "confirm": check_confirm,
    "chains": check_chains,
    "check-chains": check_check_chains,
    "tasks": check_tasks,
    "interact": check_interact,
    "judge": check_judge,
    "sft": check_sft,
}


def test_tool_chains_to_sft_data(
    environment_run: Future[list[Record]], tmp_path: Path, tiny_tokenizer_dir: Path
) -> None:
    """(``environment_run``: pipeline B runs meanwhile.)"""
    write_mcp_configs(tmp_path)
    with scripted_teacher_server(model=MODEL) as srv:
        for step in chain_pipeline(tmp_path, srv.base_url, tiny_tokenizer_dir):
            run(step)
            CHECKS[step.name](tmp_path, srv)
    # live calls reached the real servers: their own error texts, not a simulation's
    live = [t for t in read(tmp_path / "interact" / "interactions.jsonl")
            if t["metadata"]["environment"] == "live"]  # fmt: skip
    results = [m["content"] for t in live for m in t["messages"] if m["role"] == "tool"]
    assert any("Invalid timezone" in r or '"timezone"' in r for r in results)


# ------------------------------------------------------------------ B: environments → arenas


def environment_pipeline(root: Path, url: str) -> list[Step]:
    d = {name: str(root / name) for name in ("decompose", "envs", "arenas")}
    teacher = ["--base-url", url, "--model", MODEL]
    arenas = Path(d["arenas"])
    return [
        Step("decompose", ["synth", "decompose", "--domains", str(root / "domains.txt"),
                           "--per-domain", "2", "--out", d["decompose"], *teacher]),
        Step("envs", ["synth", "env-code", "--decompositions", d["decompose"], "--out",
                      d["envs"], *teacher]),
        Step("arenas", ["synth", "arenas", "--envs", d["envs"], "--out", d["arenas"],
                        "--heldout", "0.25", "--near", "1", "--far", "1", "--seed", "0"]),
        Step("validate", ["arenas", "validate", str(arenas / "train.jsonl")], "astra-eval"),
        Step("validate", ["arenas", "validate", str(arenas / "heldout.jsonl")], "astra-eval"),
    ]  # fmt: skip


def check_decompose(root: Path) -> None:
    kept, rejected = outputs(root / "decompose", "decompositions.jsonl", "decompose")
    s = stats(root / "decompose")
    assert s["units"] == 3 * 2 == len(kept) + len(rejected)  # 3 domains × 2 questions
    assert {r["id"] for r in rejected} == {"plant-cycle:0", "plant-cycle:1"}
    assert {r["reason"] for r in rejected} == {"cycle"} and all(r["raw"] for r in rejected)
    assert {r["domain"] for r in kept} == {"logistics", "retail banking"}
    linked(kept, "decompose", {"logistics", "retail banking"})
    assert set(s["tokens"]) == {"decompose.v1", "necessity.v1", "verify.v1"}


def check_envs(root: Path) -> None:
    envs, rejected = outputs(root / "envs", "envs.jsonl", "env_code")
    decomps = {r["id"]: r for r in read(root / "decompose" / "decompositions.jsonl")}
    assert {e["id"] for e in envs} | {r["source"] for r in rejected} == set(decomps)
    assert not rejected and stats(root / "envs")["environments"] == len(envs)
    for e in envs:
        needs = [q for q in decomps[e["id"]]["subquestions"] if q["needs_tool"] is not False]
        assert len(e["steps"]) == len(needs) and all(t["source"] for t in e["tools"])
    linked(envs, "env_code", set(decomps))


def check_arenas(root: Path) -> list[Record]:
    every, rejected = outputs(root / "arenas", "arenas.jsonl", "arenas")
    train, held = read(root / "arenas" / "train.jsonl"), read(root / "arenas" / "heldout.jsonl")
    envs = {e["id"] for e in read(root / "envs" / "envs.jsonl")}
    s = stats(root / "arenas")
    assert not rejected and s["train"] == len(train) and s["heldout"] == len(held) == 1
    assert sorted(r["task_id"] for r in every) == sorted(r["task_id"] for r in train + held)
    assert {r["task_id"] for r in every} == envs
    linked(every, "arenas", envs)
    return every


def run_environment_pipeline(root: Path) -> list[Record]:
    """Pipeline B with its checks; the arena records it made."""
    plant = {"name": "Plant cycle", "description": "plant:cycle"}  # the teacher loops its chain
    (root / "domains.txt").write_text(f"logistics\nretail banking\n{json.dumps(plant)}\n")
    with scripted_teacher_server(model=MODEL) as srv:
        steps = environment_pipeline(root, srv.base_url)
        for step, check in zip(steps, (check_decompose, check_envs), strict=False):
            run(step)
            check(root)
            tokens = stats(root / step.name)["tokens"]
            assert teacher_calls(stats(root / step.name)) == {
                ref: asked(srv, ref) for ref in tokens
            }
        run(steps[2])
        records = check_arenas(root)
    for step in steps[3:]:
        n = len(read(Path(step.args[-1])))
        assert f"{n} loaded, {n} validated in the sandbox, 0 problem(s)" in run(step).stdout
    # a model that follows the reference chains solves every task, held-out ones included
    data = root / "arenas" / "arenas.jsonl"
    with ScriptedServer(replay_script(load_arena_file(data).tasks)) as replay:
        args = ["arenas", "--data", str(data), "--base-url", replay.base_url, "--out",
                str(root / "run"), "--concurrency", "4"]  # fmt: skip
        run(Step("run", args, "astra-eval"))
    results = read(root / "run" / "results.jsonl")
    assert sorted(r["id"] for r in results) == sorted(r["task_id"] for r in records)
    assert all(r["reward"] == 1.0 and r["fully_solved"] for r in results), results
    return records


@pytest.fixture(scope="module")
def environment_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Future[list[Record]]]:
    """Pipeline B, started in a background thread when a test of this module first asks for
    it: its subprocesses take the second core while pipeline A runs (most of the file's time
    is the commands' start-up imports, one core each)."""
    if not bwrap_available():
        yield Future()  # never done: the test that waits for it is skipped
        return
    with ThreadPoolExecutor(1, thread_name_prefix="pipeline-b") as pool:
        yield pool.submit(run_environment_pipeline, tmp_path_factory.mktemp("environments"))


@needs_bwrap
def test_domains_to_validated_and_solved_arenas(environment_run: Future[list[Record]]) -> None:
    records = environment_run.result(timeout=600)  # its failures are raised here
    assert len(records) == 4 and {r["split"] for r in records} == {"train", "heldout"}


# ------------------------------------------------------------------ a real model as the teacher


def test_tiny_vllm_model_as_teacher_is_rejected_with_reasons(
    tmp_path: Path, vllm_server: ModelServer
) -> None:
    """The tiny model answers every prompt with its canned tool call: no decomposition, but a
    complete run (exit 0, its warning), each question rejected with the raw reply kept."""
    (tmp_path / "domains.txt").write_text("logistics\nretail banking\ntravel\n")
    out = tmp_path / "decompose"
    res = run(Step("decompose", ["synth", "decompose", "--domains", str(tmp_path / "domains.txt"),
                                 "--per-domain", "1", "--out", str(out), "--base-url",
                                 vllm_server.base_url, "--max-attempts", "2"]))  # fmt: skip
    assert "no decomposition was kept" in res.stderr
    kept, rejected = outputs(out, "decompositions.jsonl", "decompose")
    assert not kept and len(rejected) == stats(out)["units"] == 3
    for r in rejected:  # its canned tool call: a JSON object, but not a decomposition
        assert r["reason"] == "decompose:schema" and "question: Field required" in r["detail"]
        assert r["raw"].startswith("<tool_call>") and Script().tool_name in r["raw"], r
    s = stats(out)
    assert s["teacher"]["model"] == "astra-tiny"
    assert teacher_calls(s) == {"decompose.v1": 3 * 2}  # two tries each, nothing more asked
    assert s["prompt_tokens"] > 0 and s["completion_tokens"] > 0
