"""``backend: verl`` for RL: our agent loop driven by a fake server manager through a real
sandbox, the data path through verl's own ``RLHFDataset`` and agent-loop worker, the generated
config against verl's schema, and Adaptive Batch Filling as verl's replay-buffer sampler.

verl's PPO trainer cannot run here (GPUs, Ray, vLLM servers), so what is tested on CPU is each
piece verl calls, with verl's own classes around it: ``hydra.utils.instantiate`` of our
``agent_loops.yaml`` as verl's worker does it, verl's ``AgentLoopOutput.as_dict`` (what its
TransferQueue path stores) and ``AgentLoopWorker.generate_sequences`` (padding, ``rm_scores``,
``reward_extra_info`` in a ``DataProto``). Adaptive Batch Filling inside verl's real
``ReplayBuffer`` over a real TransferQueue: ``test_rl_verl_abf.py``.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from astra_agent.arena import (
    ArenaEnvironment,
    arena_reward,
    load_arena_file,
    trajectory_reward,
)
from astra_agent.config import load_config
from astra_agent.errors import ConfigError
from astra_agent.sandbox import bwrap_available
from training.rl.config import RLConfig
from training.rl.verl import (
    AGENT_NAME,
    VerlRLData,
    build_overrides,
    compose_verl_config,
    prepare_verl,
    run_verl,
    verl_row,
)
from training.template import load_tokenizer

from .conftest import (
    ARENA_HELDOUT,
    ARENA_TRAIN,
    RECIPES,
    check_verl_resume,
    check_verl_run_file,
)

RL_RECIPES = sorted(RECIPES.glob("rl-*.yaml"))

needs_bwrap = pytest.mark.skipif(not bwrap_available(), reason="arena sandboxes need bubblewrap")


def make_cfg(tmp_path: Path, **kw: Any) -> RLConfig:
    base: dict[str, Any] = {
        "backend": "verl",
        "model": tmp_path / "no-such-model",
        "train_files": [ARENA_TRAIN],
        "output_dir": tmp_path / "out",
        "batch_groups": 4,
        "group_size": 2,
        "rollout": {"max_prompt_tokens": 4096, "max_response_tokens": 2048},
    }
    verl = {"gpus_per_node": 8, **kw.pop("verl", {})}
    rollout = {**base.pop("rollout"), **kw.pop("rollout", {})}
    return RLConfig.model_validate({**base, **kw, "rollout": rollout, "verl": verl})


@pytest.fixture(scope="module")
def tok(tiny_tokenizer_dir: Path) -> Any:
    return load_tokenizer(tiny_tokenizer_dir)


@pytest.fixture(scope="module")
def task() -> Any:
    """bookings-01: search_hotels then get_hotel_details, one sub-question each."""
    report = load_arena_file(ARENA_TRAIN)
    return next(t for t in report.tasks if t.task_id == "bookings-01")


# --------------------------------------------------------------------------- a fake server


class FakeServerManager:
    """verl's ``LLMServerClient.generate`` signature; replies are scripted texts, tokenized,
    with scripted log-probs; every request is recorded."""

    def __init__(self, tok: Any, replies: list[str]) -> None:
        self.tok = tok
        self.replies = list(replies)
        self.requests: list[dict[str, Any]] = []

    def ids(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    async def generate(
        self,
        request_id: str,
        *,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        **kwargs: Any,
    ) -> Any:
        from verl.workers.rollout.replica import TokenOutput

        self.requests.append(
            {"request_id": request_id, "prompt_ids": list(prompt_ids), "params": sampling_params}
        )
        ids = self.ids(self.replies.pop(0))
        logprobs = [-0.01 * (i + 1) for i in range(len(ids))]
        return TokenOutput(token_ids=ids, log_probs=logprobs, stop_reason="completed")


CALL = (
    "<think>\nI will search.\n</think>\n\n<tool_call>\n"
    '{"name": "search_hotels", "arguments": {"city": "Porto"}}\n</tool_call><|im_end|>'
)
ANSWER = "<think>\nI have it.\n</think>\n\nThe cheapest hotel is H-6210.<|im_end|>"


def _rows(tmp_path: Path, tasks: list[Any]) -> list[dict[str, Any]]:
    """Our rows through parquet and verl's own RLHFDataset: what verl hands the agent loop."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset

    path = tmp_path / "rows.parquet"
    pq.write_table(
        pa.Table.from_pylist([verl_row(t, i, "train") for i, t in enumerate(tasks)]), path
    )
    config = OmegaConf.create({"filter_overlong_prompts": False, "cache_dir": str(tmp_path / "c")})
    ds = RLHFDataset(str(path), tokenizer=None, config=config)
    return [ds[i] for i in range(len(ds))]


@pytest.fixture(scope="module")
def verl_job(tiny_tokenizer_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A written job (data, agent_loops.yaml, overrides) on the tiny checkpoint, composed."""
    tmp = tmp_path_factory.mktemp("rl-verl")
    cfg = make_cfg(tmp, model=tiny_tokenizer_dir, verl={"gpus_per_node": 1})
    job = prepare_verl(cfg)
    composed = compose_verl_config(job.overrides_file.read_text().splitlines())
    return cfg, job, composed


def _agent_loop(verl_job: Any, tok: Any, server: Any) -> Any:
    """Our loop instantiated as verl's worker does it: Hydra, from agent_loops.yaml."""
    import hydra
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
    from verl.utils.dataset.rl_dataset import RLHFDataset

    _, job, composed = verl_job
    (entry,) = OmegaConf.load(job.agent_loop_file)
    assert entry.name == AGENT_NAME
    return hydra.utils.instantiate(
        config=entry,
        trainer_config=DictConfigWrap(config=composed),
        server_manager=server,
        tokenizer=tok,
        processor=None,
        hf_model_type="qwen3",
        dataset_cls=RLHFDataset,
        data_config=DictConfigWrap(composed.data),
        tools=ToolListWrap([]),
    )


async def _run(loop: Any, row: dict[str, Any], params: dict[str, Any] | None = None) -> Any:
    from training.rl.verl_agent_loop import close_runtimes

    params = params or {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True}
    try:
        return await loop.run(dict(params), **row)
    finally:
        await close_runtimes()


def _generate(worker: Any, batch: Any) -> Any:
    """verl's ``AgentLoopWorker.generate_sequences`` on ``batch``; this loop's sandboxes closed."""
    from training.rl.verl_agent_loop import close_runtimes

    async def go() -> Any:
        try:
            return await worker.generate_sequences(batch)
        finally:
            await close_runtimes()

    return asyncio.run(go())


# --------------------------------------------------------------------------- the agent loop


@needs_bwrap
def test_agent_loop_runs_one_episode_through_a_real_sandbox(
    tmp_path: Path, verl_job: Any, tok: Any, task: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import training.rl.verl_agent_loop as al

    episodes: list[Any] = []
    original = al.rollout_episode

    async def spy(*args: Any, **kwargs: Any) -> Any:
        episodes.append(await original(*args, **kwargs))
        return episodes[-1]

    monkeypatch.setattr(al, "rollout_episode", spy)
    server = FakeServerManager(tok, [CALL, ANSWER])
    (row,) = _rows(tmp_path, [task])
    out = asyncio.run(_run(_agent_loop(verl_job, tok, server), row))

    # the prompt is the template's render of the record's prompt and tools
    tools = [t.to_openai() for t in task.tools]
    prompt = tok.apply_chat_template(
        task.prompt, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=True
    )["input_ids"]
    assert out.prompt_ids == list(prompt) and server.requests[0]["prompt_ids"] == out.prompt_ids
    call, answer = server.ids(CALL), server.ids(ANSWER)
    n = len(out.response_ids)
    assert len(out.response_mask) == len(out.response_logprobs) == n
    assert out.response_ids[: len(call)] == call and out.response_ids[-len(answer) :] == answer
    # masked positions are exactly the tool result and the next turn's header, in between
    masked = [i for i, m in enumerate(out.response_mask) if m == 0]
    assert masked == list(range(len(call), n - len(answer)))
    tool_text = tok.decode(out.response_ids[len(call) : n - len(answer)])
    assert tool_text.startswith("\n<|im_start|>user\n<tool_response>\n")
    assert tool_text.endswith("</tool_response><|im_end|>\n<|im_start|>assistant\n")
    assert "H-6210" in tool_text  # the real tool's output, from the sandbox
    # the second request continues exactly the sampled context
    assert server.requests[1]["prompt_ids"] == out.prompt_ids + out.response_ids[: n - len(answer)]
    scripted = [-0.01 * (i + 1) for i in range(len(call))]
    assert out.response_logprobs[: len(call)] == pytest.approx(scripted)
    assert all(out.response_logprobs[i] == 0.0 for i in masked)
    # the reward is the episode's trajectory reward, with its details
    (episode,) = episodes
    reward = trajectory_reward(task, episode.trajectory)
    assert out.reward_score == reward.reward and 0.6 < reward.reward < 0.7  # 1 of 2 solved
    info = out.extra_fields["reward_extra_info"]
    assert (info["recall"], info["tool_calls"], info["required"]) == (0.5, 1, 2)
    assert info["error"] == "" and info["rerender_mismatch"] == 0 and info["turns"] == 2
    assert out.num_turns == len(episode.trajectory.messages) == 4  # user, call, tool, answer
    # the request carried our sampling: per-turn budget, end-of-turn stop ids, log-probs
    params = server.requests[0]["params"]
    assert params["logprobs"] is True and params["max_tokens"] == 2048
    assert tok.convert_tokens_to_ids("<|im_end|>") in params["stop_token_ids"]
    assert server.requests[0]["request_id"] == server.requests[1]["request_id"]  # sticky


PARALLEL = (
    "<think>\nTwo at once.\n</think>\n\n<tool_call>\n"
    '{"name": "search_hotels", "arguments": {"city": "Porto"}}\n</tool_call>\n<tool_call>\n'
    '{"name": "no_such_tool", "arguments": {}}\n</tool_call><|im_end|>'
)


@needs_bwrap
def test_parallel_calls_and_a_tool_error_through_verls_worker(
    tmp_path: Path, verl_job: Any, tok: Any, task: Any
) -> None:
    """verl's own ``AgentLoopWorker.generate_sequences`` over an episode whose first turn makes
    two parallel calls, one to a tool that does not exist: both results come back in call
    order in one masked span, the error is a result the model reads, and the batch holds the
    sampled ids with their log-probs and nothing sampled under mask 0."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.protocol import DataProto
    from verl.utils.dataset.rl_dataset import collate_fn

    _, _, composed = verl_job
    server = FakeServerManager(tok, [PARALLEL, ANSWER])
    batch = DataProto.from_single_dict(collate_fn(_rows(tmp_path, [task])))
    worker = AgentLoopWorker(composed, server)

    out = _generate(worker, batch)
    p = composed.actor_rollout_ref.rollout.prompt_length
    n = int(out.batch["attention_mask"][0, p:].sum())
    ids = out.batch["responses"][0, :n].tolist()
    mask = out.batch["response_mask"][0, :n].tolist()
    call, answer = server.ids(PARALLEL), server.ids(ANSWER)
    assert ids[: len(call)] == call and ids[-len(answer) :] == answer
    assert mask == [1] * len(call) + [0] * (n - len(call) - len(answer)) + [1] * len(answer)
    tool_text = tok.decode(ids[len(call) : n - len(answer)])
    assert tool_text.count("<tool_response>") == 2
    assert tool_text.index("H-6210") < tool_text.index("no_such_tool")  # call order
    logprobs = out.batch["rollout_log_probs"][0, :n]
    assert logprobs[: len(call)].tolist() == pytest.approx(
        [-0.01 * (i + 1) for i in range(len(call))]
    )
    assert logprobs[torch.tensor(mask) == 0].abs().sum() == 0
    assert out.non_tensor_batch["tool_calls"][0] == 2
    assert (
        server.requests[1]["prompt_ids"]
        == out.batch["prompts"][0][out.batch["attention_mask"][0, :p].bool()].tolist()
        + ids[: n - len(answer)]
    )


@needs_bwrap
def test_the_output_is_what_verls_transfer_queue_path_stores(
    tmp_path: Path, verl_job: Any, tok: Any, task: Any
) -> None:
    """``AgentLoopOutput.as_dict`` (verl's TQ worker): the score on the last response token,
    our log-probs as ``rollout_log_probs``, the reward details in ``extra_fields``."""
    (row,) = _rows(tmp_path, [task])
    out = asyncio.run(_run(_agent_loop(verl_job, tok, FakeServerManager(tok, [CALL, ANSWER])), row))
    d = out.as_dict()
    assert d["responses"].tolist() == out.response_ids
    assert d["rm_scores"][-1].item() == pytest.approx(out.reward_score)
    assert d["rm_scores"][:-1].abs().sum() == 0
    assert d["rollout_log_probs"].tolist() == pytest.approx(out.response_logprobs)
    assert d["extra_fields"]["reward_extra_info"]["reward"] == out.reward_score


@needs_bwrap
def test_greedy_validation_params_reach_the_server(
    tmp_path: Path, verl_job: Any, tok: Any, task: Any
) -> None:
    (row,) = _rows(tmp_path, [task])
    server = FakeServerManager(tok, [ANSWER])
    greedy = {"temperature": 0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0}
    out = asyncio.run(_run(_agent_loop(verl_job, tok, server), row, greedy))
    assert server.requests[0]["params"]["temperature"] == 0.0
    assert server.requests[0]["params"]["repetition_penalty"] == 1.0
    assert out.reward_score == 0.0 and out.extra_fields["reward_extra_info"]["tool_calls"] == 0


def _bad(task: Any, **fields: Any) -> Any:
    from dataclasses import replace

    return replace(task, raw={**task.raw, **fields})


@needs_bwrap
@pytest.mark.parametrize(
    "fields,reason",
    [
        ({"tool_dict": '{"search_hotels": "x = 1"}'}, "does not define a function"),
        ({"sub_qa_dict": "{not json"}, "sub_qa_dict: invalid JSON"),
    ],
)
def test_a_record_that_does_not_parse_scores_zero_with_its_reason(
    tmp_path: Path, verl_job: Any, tok: Any, task: Any, fields: dict[str, str], reason: str
) -> None:
    server = FakeServerManager(tok, [CALL])
    (row,) = _rows(tmp_path, [_bad(task, **fields)])
    out = asyncio.run(_run(_agent_loop(verl_job, tok, server), row))
    assert out.reward_score == 0.0 and server.requests == []
    assert reason in out.extra_fields["reward_extra_info"]["error"]
    assert out.response_mask == [0] and len(out.response_ids) == 1  # nothing to train
    assert out.as_dict()["rm_scores"].tolist() == [0.0]


@needs_bwrap
def test_a_record_whose_tools_fail_to_load_scores_zero_with_its_reason(
    tmp_path: Path, verl_job: Any, tok: Any, task: Any
) -> None:
    sources = json.loads(task.raw["tool_dict"])
    sources["search_hotels"] = "raise RuntimeError('broken module')\n" + sources["search_hotels"]
    server = FakeServerManager(tok, [CALL])
    (row,) = _rows(tmp_path, [_bad(task, tool_dict=json.dumps(sources))])
    out = asyncio.run(_run(_agent_loop(verl_job, tok, server), row))
    error = out.extra_fields["reward_extra_info"]["error"]
    assert out.reward_score == 0.0 and server.requests == []
    assert error.startswith("tools failed to load: search_hotels:") and "broken module" in error


@needs_bwrap
def test_a_prompt_over_the_budget_scores_zero_and_fits_verls_tensors(
    tmp_path: Path, verl_job: Any, tok: Any, task: Any
) -> None:
    from dataclasses import replace

    long = replace(
        task, raw={**task.raw, "prompt": json.dumps([{"role": "user", "content": "x " * 5000}])}
    )
    server = FakeServerManager(tok, [ANSWER])
    (row,) = _rows(tmp_path, [long])
    out = asyncio.run(_run(_agent_loop(verl_job, tok, server), row))
    assert out.reward_score == 0.0 and server.requests == []
    assert "max_prompt_tokens=4096" in out.extra_fields["reward_extra_info"]["error"]
    assert len(out.prompt_ids) == 4096


@needs_bwrap
def test_verls_agent_loop_worker_pads_and_scores_our_samples(
    tmp_path: Path, verl_job: Any, tok: Any, task: Any
) -> None:
    """verl's own ``AgentLoopWorker.generate_sequences`` over our rows (a DataProto batch, one
    good and one bad record): padded tensors, ``rm_scores`` at each last response token,
    every ``reward_extra_info`` key per sample."""
    import numpy as np
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.protocol import DataProto
    from verl.utils.dataset.rl_dataset import collate_fn

    from training.rl.verl_agent_loop import REWARD_KEYS

    _, _, composed = verl_job
    rows = _rows(tmp_path, [task, _bad(task, tool_dict="{}")])
    batch = DataProto.from_single_dict(collate_fn(rows))
    worker = AgentLoopWorker(composed, FakeServerManager(tok, [CALL, ANSWER]))

    out = _generate(worker, batch)
    prompt_len = composed.actor_rollout_ref.rollout.prompt_length
    assert out.batch["input_ids"].shape == (2, prompt_len + composed.data.max_response_length)
    lengths = out.batch["attention_mask"][:, prompt_len:].sum(-1)
    scores = out.batch["rm_scores"]
    assert scores[0, lengths[0] - 1].item() > 0.6 and scores[1].abs().sum() == 0
    assert out.batch["response_mask"][1].sum() == 0  # the bad record trains nothing
    assert set(REWARD_KEYS) <= set(out.non_tensor_batch)
    assert (
        out.non_tensor_batch["error"][0] == "" and "tool_schema" in out.non_tensor_batch["error"][1]
    )
    assert np.allclose(out.non_tensor_batch["recall"].astype(float), [0.5, 0.0])
    assert out.meta_info["reward_extra_keys"] == list(REWARD_KEYS)


# --------------------------------------------------------------------------- config and recipes


def test_the_14b_and_32b_recipes_exist() -> None:
    names = {p.name for p in RL_RECIPES}
    assert {"rl-astra-14b.yaml", "rl-astra-32b.yaml"} <= names


def _data(tmp_path: Path, rows: int = 1000) -> VerlRLData:
    return VerlRLData(tmp_path / "train.parquet", tmp_path / "heldout.parquet", rows, 12)


@pytest.mark.parametrize("recipe", RL_RECIPES, ids=lambda p: p.stem)
def test_every_rl_recipe_composes_with_verls_schema(recipe: Path, tmp_path: Path) -> None:
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer
    from verl.utils.import_utils import load_extern_type

    cfg = load_config(RLConfig, recipe, environ={})
    c = compose_verl_config(
        build_overrides(cfg, _data(tmp_path), tmp_path / "agent_loops.yaml"), check_model=False
    )
    actor, rollout = c.actor_rollout_ref.actor, c.actor_rollout_ref.rollout
    assert c.algorithm.adv_estimator == "grpo" and c.algorithm.use_kl_in_reward is False
    assert actor.use_kl_loss is False and actor.entropy_coeff == 0
    assert actor.loss_agg_mode == "token-mean"
    assert (actor.clip_ratio_low, actor.clip_ratio_high) == (cfg.clip_low, cfg.clip_high)
    assert actor.optim.lr == cfg.learning_rate
    assert c.data.train_batch_size == actor.ppo_mini_batch_size == cfg.batch_groups
    assert (
        rollout.n == cfg.group_size
        and rollout.multi_turn.max_assistant_turns == cfg.rollout.max_turns
    )
    assert c.data.max_prompt_length == rollout.prompt_length == cfg.rollout.max_prompt_tokens
    assert c.data.max_response_length == cfg.rollout.max_response_tokens
    assert rollout.agent.agent_loop_config_path == str(tmp_path / "agent_loops.yaml")
    assert (c.trainer.nnodes, c.trainer.n_gpus_per_node) == (
        cfg.verl.nnodes,
        cfg.verl.gpus_per_node,
    )
    assert c.trainer.total_training_steps == cfg.steps
    sampler = c.trainer.v1.sampler
    assert dict(sampler.sampler_kwargs) == cfg.abf.model_dump(mode="json")
    assert issubclass(
        load_extern_type(sampler.custom_sampler.path, sampler.custom_sampler.name), ReplayBuffer
    )
    sp = cfg.verl.ulysses_sequence_parallel_size
    longest = cfg.rollout.max_prompt_tokens + cfg.rollout.max_response_tokens
    assert actor.use_dynamic_bsz and actor.ppo_max_token_len_per_gpu * sp >= longest


def test_the_14b_recipe_has_the_papers_numbers() -> None:
    cfg = load_config(RLConfig, RECIPES / "rl-astra-14b.yaml", environ={})
    assert (cfg.batch_groups, cfg.learning_rate, cfg.rollout.max_turns) == (256, 2e-6, 32)
    assert (cfg.rollout.max_prompt_tokens, cfg.rollout.max_response_tokens) == (25600, 49152)


def test_the_reward_function_verl_is_given_refuses_to_score(tmp_path: Path) -> None:
    from verl.trainer.ppo.reward import get_custom_reward_fn

    c = compose_verl_config(
        build_overrides(make_cfg(tmp_path), _data(tmp_path), tmp_path / "a.yaml"), check_model=False
    )
    fn = get_custom_reward_fn(c)
    assert fn is not None
    with pytest.raises(Exception, match="only the astra_arena agent loop scores"):
        fn(data_source="astra_arena", solution_str="x", ground_truth="{}")


@pytest.mark.parametrize(
    "override,named",
    [
        ("actor_rollout_ref.actor.bogus_key=1", "bogus_key"),
        ("actor_rollout_ref.actor.loss_agg_mode=seq-mean", "Invalid loss_agg_mode: seq-mean"),
        ("actor_rollout_ref.rollout.mode=sync", "Rollout mode 'sync' has been removed"),
    ],
)
def test_an_unknown_or_bad_override_is_refused_before_anything_is_written(
    tmp_path: Path, override: str, named: str
) -> None:
    cfg = make_cfg(tmp_path, verl={"overrides": [override]})
    with pytest.raises(ConfigError, match=named):
        prepare_verl(cfg)
    assert not (tmp_path / "out" / "verl").exists()


@pytest.mark.parametrize(
    "kw,message",
    [
        ({"lr_scheduler": "linear"}, "not implemented by verl"),
        ({"advantage_eps": 1e-4}, "fixes ε at 1e-6"),
        ({"verl": {"ulysses_sequence_parallel_size": 3}}, "does not divide"),
        ({"verl": {"tensor_model_parallel_size": 3}}, "does not divide"),
        ({"batch_groups": 3, "group_size": 3}, "do not split over the 8 data-parallel"),
        ({"batch_groups": 100}, "fewer than batch_groups"),
    ],
)
def test_settings_verl_cannot_honour_are_refused(
    tmp_path: Path, kw: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        prepare_verl(make_cfg(tmp_path, **kw))


# --------------------------------------------------------------------------- the written job


def test_the_job_holds_verls_data_our_agent_loop_and_the_launch_line(tmp_path: Path) -> None:
    import pyarrow.parquet as pq
    from omegaconf import OmegaConf

    cfg = make_cfg(tmp_path, heldout_files=[ARENA_HELDOUT], eval_every=5)
    job = prepare_verl(cfg)
    assert (job.data.train_rows, job.data.heldout_rows, job.data.skipped) == (24, 12, ())
    table = pq.read_table(job.data.train).to_pylist()
    assert {r["agent_name"] for r in table} == {AGENT_NAME} and table[3]["extra_info"]["index"] == 3
    composed = OmegaConf.load(job.config_file)
    assert composed.trainer.test_freq == 5 and composed.trainer.val_before_train is True
    assert composed.data.val_files == [str(job.data.heldout)]
    (entry,) = OmegaConf.load(job.agent_loop_file)
    assert entry["_target_"] == "training.rl.verl_agent_loop.ArenaAgentLoop"
    assert RLConfig.model_validate_json(entry.astra_config) == cfg
    overrides = job.overrides_file.read_text().splitlines()
    text = job.launch_script.read_text()
    assert os.access(job.launch_script, os.X_OK) and "astra-train rl" in text
    assert shlex.split(text.split("exec ", 1)[1].replace("\\\n", "")) == list(job.command)
    supervisor = [sys.executable, "-m", "training.verl_launch"]  # reaps what verl leaves
    assert list(job.command) == [
        *supervisor,
        sys.executable,
        "-m",
        "verl.trainer.main_ppo",
        *overrides,
    ]
    env = dict(job.env)
    assert env["VERL_FILE_LOGGER_PATH"] == str(job.metrics_file)
    assert Path(env["PYTHONPATH"], "training", "rl", "verl_agent_loop.py").is_file()


def test_a_record_that_fails_to_load_is_skipped_and_counted(tmp_path: Path) -> None:
    lines = ARENA_TRAIN.read_text().splitlines()
    bad = json.loads(lines[0])
    bad["tool_dict"] = "{not json"
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join([json.dumps(bad), *lines[1:]]) + "\n")
    job = prepare_verl(make_cfg(tmp_path, train_files=[path]))
    assert job.data.train_rows == 23 and len(job.data.skipped) == 1
    assert "record 0, tool_dict: invalid JSON" in job.data.skipped[0]


def test_several_nodes_launch_as_a_ray_job(tmp_path: Path) -> None:
    cfg = make_cfg(tmp_path, batch_groups=8, verl={"nnodes": 2, "ray_address": "http://head:8265"})
    job = prepare_verl(cfg)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "ray"
    record = f"json.dump(sys.argv[1:], open({str(tmp_path / 'argv.json')!r}, 'w'))"
    fake.write_text(f"#!{sys.executable}\nimport json, sys\n{record}\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    subprocess.run(["bash", str(job.launch_script)], env=env, check=True, timeout=60)
    argv = json.loads((tmp_path / "argv.json").read_text())
    sep = argv.index("--")
    assert argv[:3] == ["job", "submit", "--address=http://head:8265"]
    runtime = json.loads(argv[3].removeprefix("--runtime-env-json="))
    assert runtime["env_vars"] == dict(job.env)
    assert argv[sep + 1 : sep + 4] == ["python3", "-m", "verl.trainer.main_ppo"]
    assert argv[sep + 4 :] == job.overrides_file.read_text().splitlines()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has GPUs")
def test_run_true_without_gpus_fails_up_front(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"needs 8 CUDA GPU\(s\) here, found 0"):
        run_verl(make_cfg(tmp_path, verl={"run": True}))
    assert not (tmp_path / "out").exists()


def test_resuming_into_a_run_of_another_config_is_refused(tmp_path: Path) -> None:
    check_verl_resume(prepare_verl, make_cfg, tmp_path, "3")


def test_the_job_writes_the_run_file_astra_eval_reads(tmp_path: Path) -> None:
    check_verl_run_file(prepare_verl, make_cfg, tmp_path, "rl")


def test_reward_of_the_reference_chain_matches_arena_reward(task: Any) -> None:
    """The sub-question the scripted episode solves: what the sandboxed tool really returns."""
    if not bwrap_available():
        pytest.skip("needs bubblewrap")

    async def go() -> float:
        async with ArenaEnvironment(task) as env:
            out = await env.call_tool("search_hotels", {"city": "Porto"})
        return arena_reward(task.sub_qa, [("search_hotels", out.text)]).reward

    assert 0.6 < asyncio.run(go()) < 0.7


@pytest.mark.parametrize(
    ("versions", "named"),
    [
        ({"verl": "0.9.0", "TransferQueue": "0.1.11"}, "verl 0.9.0"),
        ({"verl": "0.9.1", "TransferQueue": None}, "TransferQueue not installed"),
    ],
)
def test_verl_or_transfer_queue_at_another_version_is_one_line_naming_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, versions: dict[str, Any], named: str
) -> None:
    import importlib.metadata as md

    def version(name: str) -> str:
        if versions.get(name) is None:
            raise md.PackageNotFoundError(name)
        return str(versions[name])

    monkeypatch.setattr(md, "version", version)
    with pytest.raises(ConfigError, match=named) as err:
        prepare_verl(make_cfg(tmp_path))
    assert "pip install" in (err.value.hint or "") and "==0.1.11" in str(err.value)
    assert not (tmp_path / "out").exists()


def _gone(pid: int, within_s: float = 15.0) -> bool:
    import time

    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.1)
    return False


def test_the_launch_supervisor_reaps_what_the_trainer_left_behind(tmp_path: Path) -> None:
    """verl's driver detaches Ray daemons; whatever is below the supervisor when the command
    ends (here a detached `sleep` in a new session) is stopped, and the status is the
    command's."""
    pidfile = tmp_path / "pid"
    script = f"setsid sleep 300 & echo $! > {pidfile}; exit 3"
    out = subprocess.run(
        [sys.executable, "-m", "training.verl_launch", "bash", "-c", script], timeout=60
    )
    assert out.returncode == 3
    assert _gone(int(pidfile.read_text()))


def test_the_launch_supervisor_stops_everything_on_sigterm(tmp_path: Path) -> None:
    import signal
    import time

    pidfile = tmp_path / "pid"
    script = f"setsid sleep 300 & echo $! > {pidfile}; sleep 300"
    proc = subprocess.Popen([sys.executable, "-m", "training.verl_launch", "bash", "-c", script])
    deadline = time.monotonic() + 20
    while not pidfile.is_file() or not pidfile.read_text().strip():
        assert time.monotonic() < deadline, "the launched script wrote no pid within 20 s"
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    assert _gone(int(pidfile.read_text()))


def test_the_launch_supervisor_survives_its_command_signalling_its_group(tmp_path: Path) -> None:
    """Something below that signals its whole process group (``kill -9 0``) cannot take the
    supervisor with it: the command runs in a group of its own, and what it left is stopped."""
    pidfile = tmp_path / "pid"
    log = tmp_path / "launch.log"
    in_own_session = 'until [ "$(cut -d" " -f6 /proc/$!/stat)" = "$!" ]; do sleep 0.05; done'
    script = f"setsid sleep 300 & echo $! > {pidfile}; {in_own_session}; kill -KILL 0"
    out = subprocess.run(
        [sys.executable, "-m", "training.verl_launch", "bash", "-c", script],
        timeout=60,
        env={**os.environ, "ASTRA_LAUNCH_LOG": str(log)},
    )
    assert out.returncode == 128 + 9
    assert _gone(int(pidfile.read_text()))
    text = log.read_text()
    assert "the command ended (-9)" in text and "stopped 1 process(es); left: []" in text


def test_a_process_that_left_the_tree_is_found_by_its_mark() -> None:
    from training.verl_launch import MARK, descendants

    env = {**os.environ, MARK: "test-mark"}
    other = subprocess.Popen(["sleep", "30"], env=env)  # not below pid 1's child `root`
    try:
        root = other.pid + 10**7  # no such process: nothing is below it
        assert descendants(root) == []
        assert descendants(root, "test-mark") == [other.pid]
        assert descendants(root, "another-mark") == []
    finally:
        other.kill()
        other.wait()
