"""verl's side of the replay buffer, over a real TransferQueue on a local Ray: what verl 0.9.1's
sync V1 trainer and its TransferQueue agent-loop workers do around the sampler.

* the trainer registers each prompt it dispatches as a tag-only marker ``{is_prompt, status:
  pending, global_steps}`` (``trainer_base``), then hands the batch to the workers;
* a worker marks the prompt ``running``, runs one agent loop per session, writes each session's
  ``AgentLoopOutput.as_dict()`` under ``{uid}_{session}_{index}`` with ``kv_batch_put``
  (``agent_loop_tq._agent_loop_postprocess``: ``rm_scores`` carries the reward on the last
  response token), and only then tags the prompt ``finished`` (or ``failure``);
* the sampler's ``refill_fn`` is the trainer's ``_add_prompts_to_generate``: more prompts;
* after the update the trainer clears the batch's keys (``kv_clear``).

Workers run in a thread and finish a prompt after a short delay, so the sampler really polls
and waits for in-flight groups, as it does on a cluster. Each prompt's session rewards come from
a script, in dispatch order; ``"failure"`` makes a group whose sessions raised.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

POLL_S = 0.02  # the sampler's poll interval in tests (verl's default: 2 s)
WORK_S = 0.05  # how long a worker takes per prompt


@contextmanager
def local_transfer_queue() -> Iterator[Any]:
    """A local Ray with more logical CPUs than the machine's 2 (TransferQueue's controller and
    two storage units take one each, verl's agent-loop workers and our rollout-server actors
    one each: with Ray's default of one per core they would wait forever), and TransferQueue
    on it; both shut down after."""
    import ray
    import transfer_queue as tq

    ray.init(
        num_cpus=8,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"RAY_USAGE_STATS_ENABLED": "0"}},
    )
    try:
        tq.init()
        try:
            yield tq
        finally:
            tq.close()
    finally:
        ray.shutdown()


def clear_partitions(tq: Any) -> None:
    for partition, items in (tq.kv_list() or {}).items():
        if items:
            tq.kv_clear(keys=list(items), partition_id=partition)


def session_output(reward: float) -> dict[str, Any]:
    """One session's TransferQueue fields, as verl's worker builds them."""
    import torch
    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput

    out = AgentLoopOutput(
        prompt_ids=[11, 12, 13],
        response_ids=[21, 22, 23, 24],
        response_mask=[1, 1, 0, 1],
        response_logprobs=[-0.1, -0.2, 0.0, -0.3],
        reward_score=reward,
        num_turns=3,
        metrics=AgentLoopMetrics(),
        extra_fields={"reward_extra_info": {"reward": reward}},
    )
    field = out.as_dict()
    field["loss_mask"] = field["response_mask"]
    field["input_ids"] = torch.cat([field["prompts"], field["responses"]])
    return field


class VerlSide:
    """verl's sync trainer and its workers around ``sampler_cls`` (see the module docstring)."""

    def __init__(self, tq: Any, sampler_cls: type, script: list[Any], **abf: Any) -> None:
        from omegaconf import OmegaConf

        self.tq, self.script = tq, list(script)
        self.step = 0
        self.n = 0
        self.refills: list[int] = []
        self.jobs: queue.Queue[tuple[str, Any, int] | None] = queue.Queue()
        self.errors: list[BaseException] = []
        self.worker = threading.Thread(target=self._work, daemon=True)
        self.worker.start()
        options = {
            "enabled": True,
            "delta": 0.1,
            "max_age": 1,
            "max_flat_rounds": 3,
            "oversample": 1.0,
            **abf,
        }
        trainer_mode = options.pop("trainer_mode", "sync")
        # the keywords verl's trainer_base passes a custom sampler, plus a test poll interval
        self.buffer = sampler_cls(
            trainer_mode=trainer_mode,
            trainer_config=OmegaConf.create({}),
            max_off_policy_threshold=8,
            max_off_policy_strategy="drop",
            sampler_kwargs=OmegaConf.create(options),
            refill_fn=self.refill,
            poll_interval=POLL_S,
        )

    # ------------------------------------------------------------------ the workers

    def _work(self) -> None:
        while (job := self.jobs.get()) is not None:
            uid, item, step = job
            try:
                self._run_prompt(uid, item, step)
            except BaseException as exc:  # surfaced by close()
                self.errors.append(exc)

    def _run_prompt(self, uid: str, item: Any, step: int) -> None:
        from verl.utils.tensordict_utils import list_of_dict_to_tensordict

        self.tq.kv_put(key=uid, partition_id="train", tag={"status": "running"})
        time.sleep(WORK_S)
        if item == "failure":
            self.tq.kv_put(key=uid, partition_id="train", tag={"status": "failure"})
            return
        keys = [f"{uid}_{s}_0" for s in range(len(item))]
        fields = [session_output(float(r)) for r in item]
        tags = [{"status": "success", "global_steps": step, "seq_len": 7} for _ in item]
        self.tq.kv_batch_put(
            keys=keys, fields=list_of_dict_to_tensordict(fields), tags=tags, partition_id="train"
        )
        self.tq.kv_put(key=uid, partition_id="train", tag={"status": "finished"})

    # ------------------------------------------------------------------ the trainer

    def _dispatch(self, n: int) -> list[str]:
        uids = [f"p{self.n + i}" for i in range(n)]
        self.n += n
        tags = [{"is_prompt": True, "status": "pending", "global_steps": self.step}] * n
        self.tq.kv_batch_put(keys=uids, partition_id="train", tags=tags)
        for uid in uids:
            self.jobs.put((uid, self.script.pop(0), self.step))
        return uids

    def refill(self, n: int) -> int:
        self.refills.append(n)
        self._dispatch(n)
        return n

    def train_step(self, batch_size: int, submit: int) -> tuple[list[str], dict[str, float]]:
        """One step: dispatch ``submit`` prompts, sample, read the batch's rewards back from
        the queue (it must materialise), clear it as the trainer does after the update."""
        self.step += 1
        self._dispatch(submit)
        meta, metrics = self.buffer.sample(
            global_steps=self.step, partition_id="train", batch_size=batch_size
        )
        self.batch_rewards = self.rewards_of(list(meta.keys))
        self.tq.kv_clear(keys=list(meta.keys), partition_id="train")
        return sorted({k.split("_")[0] for k in meta.keys}), metrics

    def rewards_of(self, keys: list[str]) -> dict[str, float]:
        if not keys:
            return {}
        data = self.tq.kv_batch_get(keys=keys, partition_id="train", select_fields=["rm_scores"])
        return {k: float(v.sum().item()) for k, v in zip(keys, data["rm_scores"], strict=True)}

    def uids_in_queue(self) -> set[str]:
        items = (self.tq.kv_list(partition_id="train") or {}).get("train", {})
        return {k.split("_")[0] for k in items}

    def close(self) -> None:
        self.jobs.put(None)
        self.worker.join(timeout=30)
        assert not self.worker.is_alive(), "the worker thread did not finish"
        if self.errors:
            raise self.errors[0]
