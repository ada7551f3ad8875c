"""``backend: trl``: multi-turn RL on one machine with TRL's ``GRPOTrainer``.

TRL's trainer keeps what it does well — the optimizer, schedule, gradient accumulation,
checkpoints, resume, logging — and :class:`ArenaGRPOTrainer` (a subclass) replaces the one
method that turns a batch of prompts into a batch of scored completions,
``_generate_and_score_completions``. TRL cannot host Adaptive Batch Filling through its public
hooks: ``rollout_func`` is called once per generation batch with the dataloader's prompts and
must return exactly that many completions, while ABF rolls out *more* prompts than the batch
holds (until it has enough valid groups) and carries surplus groups to later steps. So our
method asks the :class:`~training.rl.batch.BatchCollector` for the step's batch (our
rollouts, reward, ABF, GRPO advantages) and TRL's dataloader only paces the steps; the prompts
come from our seeded, resumable task sampler.

The loss is ours too (:func:`training.rl.core.policy_loss`, the batch-level token mean,
``beta = 0``: no reference model, no KL, no entropy): ``_compute_loss`` divides each
micro-batch's token sum by the token count of the whole step's batch, so the accumulated
gradient is that of one token mean over the batch. A test checks that TRL's own ``dapo`` loss
gives the same value on the same tensors. On CPU the log-probabilities come from the LM head
at the trained positions only (:func:`trained_logps`); TRL's fused head stays on GPUs.

Rollouts run on a persistent event loop (``asyncio.Runner``) so that pooled sandboxes and the
inference side's connections live across steps (:mod:`training.rl.inference`; by
``rollout.engine``: ``hf`` samples with the trained model itself, concurrent episodes batched,
where vLLM is not installed and in tests; ``vllm`` samples from a vLLM server whose weights are
reloaded after every optimizer step, ``training.rollout_server``).
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from astra_agent.errors import AstraError, ConfigError
from training.device import device_of, trains_in_bf16
from training.guard import FiniteGuard, check_start_weights
from training.metrics import Heldout, MetricsLog, RLStep, Rollouts, Update
from training.rl.batch import BatchCollector, ProgressHook, StepBatch
from training.rl.config import RLConfig
from training.rl.core import policy_loss
from training.rl.inference import RolloutInference, make_inference
from training.rl.rollout import settings_of
from training.run import FinishedRun

log = logging.getLogger(__name__)

STATE_FILE = "astra-rl-state.json"


@dataclass
class RLResult:
    output_dir: Path
    final: Path
    converted: Path | None
    steps: int
    resumed_from: Path | None
    skipped_records: list[str]
    rerun: FinishedRun | None = None  # the run had finished: nothing was trained


def batch_tensors(batch: StepBatch, pad_id: int) -> dict[str, Any]:
    """The step's episodes as the tensors TRL's loss reads: prompts left-padded, responses
    right-padded; ``tool_mask`` 0 on template/tool tokens; one advantage per episode."""
    import torch

    eps = batch.episodes
    recs = [e.trajectory.tokens for e in eps]
    prompts = [r.prompt_ids if r else [] for r in recs]
    responses = [r.response_ids if r else [] for r in recs]
    masks = [r.response_mask if r else [] for r in recs]
    p_len = max(1, max(len(p) for p in prompts))
    r_len = max(1, max(len(r) for r in responses))
    prompt_ids = torch.full((len(eps), p_len), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((len(eps), p_len), dtype=torch.long)
    completion_ids = torch.full((len(eps), r_len), pad_id, dtype=torch.long)
    completion_mask = torch.zeros((len(eps), r_len), dtype=torch.long)
    tool_mask = torch.zeros((len(eps), r_len), dtype=torch.long)
    sampled = torch.zeros((len(eps), r_len), dtype=torch.float32)
    for i, (p, r, m) in enumerate(zip(prompts, responses, masks, strict=True)):
        if p:
            prompt_ids[i, p_len - len(p) :] = torch.tensor(p)
            prompt_mask[i, p_len - len(p) :] = 1
        if r:
            completion_ids[i, : len(r)] = torch.tensor(r)
            completion_mask[i, : len(r)] = 1
            tool_mask[i, : len(r)] = torch.tensor(m)
            sampled[i, : len(r)] = torch.tensor(recs[i].logprobs)  # type: ignore[union-attr]
    num_items = (completion_mask * tool_mask).sum()
    return {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "tool_mask": tool_mask,
        "advantages": torch.tensor(batch.advantages, dtype=torch.float32),
        "sampling_logps": sampled,
        "num_items_in_batch": num_items,
    }


def trim_padding(inputs: dict[str, Any]) -> dict[str, Any]:
    """Drop the columns that are padding in every row of a micro-batch (the step's batch is
    padded to its longest prompt and response): a micro-batch of one sequence then has no
    padding at all, and attention runs without a mask, as in the SFT backend's packed rows."""
    pm, cm = inputs["prompt_mask"], inputs["completion_mask"]
    cols = pm.any(0).nonzero()
    lead = int(cols[0]) if len(cols) else pm.size(1) - 1
    rows = cm.any(0).nonzero()
    tail = int(rows[-1]) + 1 if len(rows) else 1
    out = dict(inputs)
    for key in ("prompt_ids", "prompt_mask"):
        out[key] = inputs[key][:, lead:]
    for key in ("completion_ids", "completion_mask", "tool_mask", "sampling_logps"):
        out[key] = inputs[key][:, :tail]
    return out


def head_at_trained_positions(ids: Any) -> bool:
    """Whether the update runs the LM head only where a token trains (:func:`trained_logps`):
    on CPU. TRL's fused head stays elsewhere (it never holds a tokens × vocabulary block of
    logits, which long sequences on a GPU need)."""
    return bool(ids.device.type == "cpu")


def trained_logps(
    model: Any, ids: Any, attn: Any, completion_ids: Any, mask: Any, temperature: float = 1.0
) -> Any:
    """Log-probabilities of the completion tokens (batch × completion length) at temperature
    ``temperature``, with the LM head run only at the positions that predict a trained token
    (``mask``: completion and not tool output); 0 at the others, which the loss and its
    statistics mask out. TRL's fused head scores every position of prompt and completion on
    CPU (only CUDA's Triton kernel skips the rest) and computes its backward in float32; the
    values where the mask is set are the same."""
    cols = mask.any(0).nonzero().squeeze(-1)  # completion columns with a trained token
    pos = ids.size(1) - completion_ids.size(1) - 1 + cols  # the positions predicting them
    logits = model(input_ids=ids, attention_mask=attn, use_cache=False, logits_to_keep=pos)
    z = logits.logits.float() / temperature
    picked = completion_ids[:, cols]
    logp = z.gather(-1, picked.unsqueeze(-1)).squeeze(-1) - z.logsumexp(-1)
    return logp.new_zeros(completion_ids.shape).index_copy(1, cols, logp)


def _trainer_class() -> type:
    from trl import GRPOTrainer

    class ArenaGRPOTrainer(FiniteGuard, GRPOTrainer):
        """GRPOTrainer with our step batch (ABF over arena rollouts) and our loss; a loss or
        gradient norm that is not finite stops it (``FiniteGuard``)."""

        rl: RLConfig
        inference: RolloutInference
        collector: BatchCollector
        runner: asyncio.Runner
        heldout: list[Any]
        rolled: _Rolled | None = None

        def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
            model: Any = self.model
            if not model.training:
                raise ConfigError("evaluation goes through BatchCollector.evaluate, not TRL's")
            step = self.state.global_step + 1
            self.runner.run(self.inference.sync(self.model, step - 1))
            held = None
            if self.rl.eval_every and self.heldout and (step - 1) % self.rl.eval_every == 0:
                held = self.runner.run(
                    self.collector.evaluate(self.inference.generator, self.heldout)
                )
            batch = self.runner.run(self.collector.collect(self.inference.generator, step))
            rollouts = batch.stats
            self.rolled = (
                _Rolled(step, held, rollouts, time.monotonic()) if rollouts is not None else None
            )
            tokenizer: Any = self.processing_class
            pad = tokenizer.pad_token_id or 0
            out = batch_tensors(batch, pad)
            return {k: v.to(self.accelerator.device) for k, v in out.items()}

        def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> Any:
            import torch

            inputs = trim_padding(inputs)
            ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
            attn = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
            keep = inputs["completion_ids"].size(1)
            mask = inputs["completion_mask"] * inputs["tool_mask"]
            if head_at_trained_positions(ids):
                with self.accelerator.autocast():
                    logp = trained_logps(
                        model, ids, attn, inputs["completion_ids"], mask, self.temperature
                    )
            else:
                logp, _, _ = self._get_per_token_logps_and_entropies(model, ids, attn, keep)
            # one token mean over the step's batch: each micro-batch's sum over the tokens of
            # the whole batch. TRL tells the Trainer its loss is already scaled for gradient
            # accumulation (compute_loss_func set), so the Trainer adds no division; should a
            # version divide by the accumulation steps, multiply them back
            total = float(inputs["num_items_in_batch"])
            if self.compute_loss_func is None:
                total /= self.current_gradient_accumulation_steps
            loss, st = policy_loss(
                logp, logp.detach(), inputs["advantages"], mask,
                clip_low=self.rl.clip_low, clip_high=self.rl.clip_high, num_tokens=total,
            )  # fmt: skip
            self._metrics["train"]["clip_ratio/region_mean"].append(st.clip_fraction)
            # how far the sampler's log-probs are from the trainer's on the same tokens: ≈0
            # when the inference side samples the current weights (stale or drifting weights
            # show here first)
            gap = (
                (logp.detach() - inputs["sampling_logps"]).abs() * mask
            ).sum() / mask.sum().clamp(min=1)
            self._metrics["train"]["sampling/logp_gap"].append(float(gap))
            return loss

    return ArenaGRPOTrainer


def arena_reward(prompts: Any, completions: Any, **kwargs: Any) -> list[float]:
    """TRL requires a reward source at construction; ours is computed inside the rollouts
    (``rollout_episode``: ASTRA's F1 over sub-questions), so TRL never calls this."""
    raise RuntimeError("arena rewards are computed by the rollouts, not by TRL")


def grpo_args(cfg: RLConfig, device: str) -> Any:
    """TRL's ``GRPOConfig``: one optimizer step per batch of ``batch_groups × group_size``
    episodes, in micro-batches of ``micro_batch_size``; beta 0; the token-mean loss."""
    from trl import GRPOConfig

    from training.rl.run import check_batch_shape

    check_batch_shape(cfg)
    accum = cfg.batch_groups * cfg.group_size // cfg.micro_batch_size
    return GRPOConfig(
        output_dir=str(cfg.output_dir),
        use_cpu=device == "cpu",
        bf16=trains_in_bf16(cfg.trl.dtype, device),
        report_to="none",
        disable_tqdm=True,
        seed=cfg.seed,
        per_device_train_batch_size=cfg.micro_batch_size,
        gradient_accumulation_steps=accum,
        steps_per_generation=accum,
        num_generations=cfg.group_size,
        num_iterations=1,
        beta=0.0,
        loss_type="dapo",
        epsilon=cfg.clip_low,
        epsilon_high=cfg.clip_high,
        learning_rate=cfg.learning_rate,
        lr_scheduler_type=cfg.lr_scheduler,
        warmup_steps=cfg.warmup_steps,
        weight_decay=cfg.weight_decay,
        max_grad_norm=cfg.max_grad_norm,
        max_steps=cfg.steps,
        logging_steps=1,
        save_strategy="steps",
        save_steps=cfg.save_steps,
        save_total_limit=cfg.save_total_limit,
        dataloader_num_workers=0,
        use_vllm=False,
        gradient_checkpointing=cfg.trl.gradient_checkpointing,  # TRL's default is on
        log_completions=False,
    )


def _state_hooks(trainer: Any, collector: BatchCollector) -> None:
    """Write the task sampler's position into each checkpoint before TRL's own files (its
    ``trainer_state.json``, written last, marks the checkpoint complete)."""
    base = trainer._save_checkpoint

    def save(model: Any, trial: Any) -> Any:
        trainer.check_weights()  # before anything of the checkpoint is written
        folder = Path(trainer.args.output_dir) / f"checkpoint-{trainer.state.global_step}"
        folder.mkdir(parents=True, exist_ok=True)
        state = {"sampler": collector.sampler.state(), "step": trainer.state.global_step}
        (folder / STATE_FILE).write_text(json.dumps(state) + "\n", encoding="utf-8")
        return base(model, trial)

    trainer._save_checkpoint = save


@dataclass(frozen=True)
class _Rolled:
    """A step rolled out, its update not logged yet."""

    step: int
    heldout: Heldout | None
    rollouts: Rollouts
    t_update: float  # when the update began


def _metrics_callback(
    trainer: Any, metrics: MetricsLog[RLStep], progress: ProgressHook | None
) -> Any:
    """One metrics.jsonl record per optimizer step: rollout statistics (reward, solved share,
    ABF, tokens, times) joined with TRL's log of the update (loss, grad norm, lr, clipping)."""
    from transformers import TrainerCallback

    total = trainer.rl.steps

    class Metrics(TrainerCallback):
        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            rolled: _Rolled | None = trainer.rolled
            if not logs or "loss" not in logs or rolled is None or rolled.step != state.global_step:
                return
            update = Update(
                loss=logs.get("loss"),
                grad_norm=logs.get("grad_norm"),
                learning_rate=logs.get("learning_rate"),
                clip_fraction=logs.get("clip_ratio/region_mean"),
                logp_gap=logs.get("sampling/logp_gap"),
                update_s=round(time.monotonic() - rolled.t_update, 3),
            )
            rec = RLStep(
                step=rolled.step, heldout=rolled.heldout, rollouts=rolled.rollouts, update=update
            )
            metrics.append(rec)
            if progress:
                progress(state.global_step, total, rec)

    return Metrics()


def _load_model(cfg: RLConfig) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    if cfg.trl.threads:
        torch.set_num_threads(cfg.trl.threads)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(cfg.model), dtype=torch.float32, attn_implementation="sdpa"
        )
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot load a causal LM from {cfg.model}: {exc}") from None
    return check_start_weights(model, cfg.model)


def _environment_factory(cfg: RLConfig, runner: asyncio.Runner) -> tuple[Any, Any]:
    """A pooled arena environment per episode (one pool for the run); returns (factory, pool)."""
    from training.rl.pool import SandboxPool

    pool = SandboxPool(cfg.sandbox, unsafe_no_sandbox=cfg.unsafe_no_sandbox)
    runner.run(pool.__aenter__())
    return pool.environment, pool


async def _cancel_pending() -> None:
    """Cancel the tasks still pending on the loop (the rollouts of a step that was stopped)
    and collect their outcomes, before the inference side and the sandboxes close under them:
    each would otherwise fail on a closed pool and be logged as "Task exception was never
    retrieved"."""
    me = asyncio.current_task()
    pending = [t for t in asyncio.all_tasks() if t is not me]
    for t in pending:
        t.cancel()
    await asyncio.gather(*pending, return_exceptions=True)


def _resume_state(ckpt: Path | None, collector: BatchCollector) -> None:
    if ckpt is None:
        return
    state_file = ckpt / STATE_FILE
    if state_file.is_file():
        collector.sampler.load(json.loads(state_file.read_text(encoding="utf-8"))["sampler"])
    else:
        log.warning("%s has no %s: the task order restarts", ckpt, STATE_FILE)


def build_trainer(
    cfg: RLConfig,
    model: Any,
    tokenizer: Any,
    tasks: list[Any],
    collector: BatchCollector,
    inference: RolloutInference,
    runner: asyncio.Runner,
    args: Any = None,
) -> Any:
    """An :class:`ArenaGRPOTrainer` wired to our collector, inference side and event loop;
    ``args``: TRL's arguments (default: ``grpo_args`` of ``cfg``)."""
    import datasets

    # the dataset only paces TRL's steps (our collector draws the tasks): each generation batch
    # takes batch_groups distinct rows, so it must hold at least that many, or TRL trains
    # nothing ("not a single sample in your epoch_iterator")
    n = max(len(tasks), cfg.batch_groups)
    rows = [{"prompt": [{"role": "user", "content": f"task {i}"}]} for i in range(n)]
    data = datasets.Dataset.from_list(rows)
    trainer = _trainer_class()(
        model=model,
        reward_funcs=[arena_reward],
        args=args if args is not None else grpo_args(cfg, device_of(cfg)),
        train_dataset=data,
        processing_class=tokenizer,
    )
    from transformers import PrinterCallback

    trainer.remove_callback(PrinterCallback)  # each step goes to metrics.jsonl and the progress
    trainer.rl, trainer.inference, trainer.collector = cfg, inference, collector
    trainer.runner, trainer.heldout = runner, []
    return trainer


def run_trl(cfg: RLConfig, progress: ProgressHook | None = None) -> RLResult:
    """Train ``cfg`` with TRL; resume from the newest complete checkpoint of ``output_dir``."""
    import datasets
    from transformers.utils import logging as hf_logging

    from training.rl.run import prepare

    hf_logging.disable_progress_bar()
    datasets.disable_progress_bars()
    prep = prepare(cfg)  # checks the batch shape and loads the tasks before anything starts
    tokenizer, tasks, skipped, heldout = prep.tokenizer, prep.tasks, prep.skipped, prep.heldout
    run, ckpt = prep.run, prep.run.checkpoint
    done = run.finished(tokenizer, prep.serving)
    if done is not None:  # before the model, the sandboxes or the rollout server start
        return RLResult(cfg.output_dir, done.final, done.converted, done.steps, ckpt, skipped, done)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    device = device_of(cfg)
    args = grpo_args(cfg, device)  # a dtype the device lacks: refused before any write
    model = _load_model(cfg)  # its weights checked before anything is written
    run.begin()
    runner = asyncio.Runner()
    inference: RolloutInference | None = None
    pool = None
    try:
        factory, pool = _environment_factory(cfg, runner)
        collector = BatchCollector(cfg, tasks, tokenizer, factory, settings_of(cfg, tokenizer))
        _resume_state(ckpt, collector)
        inference = make_inference(cfg, model, device)
        trainer = build_trainer(cfg, model, tokenizer, tasks, collector, inference, runner, args)
        trainer.heldout = heldout
        metrics = run.metrics(RLStep)
        trainer.add_callback(_metrics_callback(trainer, metrics, progress))
        _state_hooks(trainer, collector)
        trainer.train(resume_from_checkpoint=str(ckpt) if ckpt else None)
        if trainer.state.global_step < cfg.steps:
            raise AstraError(
                f"TRL stopped after {trainer.state.global_step} of {cfg.steps} steps",
                hint="a bug: please report it with the run directory's metrics.jsonl",
            )
        final, converted = run.save(trainer, tokenizer, prep.serving)
        return RLResult(cfg.output_dir, final, converted, trainer.state.global_step, ckpt, skipped)
    finally:
        runner.run(_cancel_pending())  # what a stop mid-rollout (Ctrl-C, SIGTERM) left
        if inference is not None:
            runner.run(inference.close())
        if pool is not None:
            runner.run(pool.__aexit__(None, None, None))
        # the sandboxes' subprocess transports that are garbage now are finalised while the
        # loop is open ("Event loop is closed" printed at exit otherwise)
        gc.collect()
        runner.close()
        shutil.rmtree(cfg.output_dir / "rollout-weights", ignore_errors=True)
