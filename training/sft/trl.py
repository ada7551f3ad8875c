"""The ``trl`` backend of ``astra-train sft``: TRL's ``SFTTrainer`` on one machine (CPU or GPUs).

TRL does no templating here: every row is tokenized by :func:`training.template.tokenize` (the
training template, the loss mask derived once) and handed over as ``input_ids`` +
``assistant_masks``; TRL turns the mask into labels (-100 elsewhere) and shifts them itself.
``packing: true`` runs padding-free batches (the micro batch's sequences concatenated into one
row, positions restarting per sequence, no pad token computed); rows longer than ``max_length``
are refused, never cut. On CPU the loss runs the LM head only at the trained positions
(:func:`trained_token_loss`); TRL's fused head, which scores every position there, stays on
GPUs.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from astra_agent.errors import ConfigError
from training.device import device_of, trains_in_bf16
from training.guard import FiniteGuard, check_start_weights
from training.metrics import MetricsLog, SFTStep
from training.run import FinishedRun, TrainingRun, check_model
from training.sft.common import (
    check_sft_parquet,
    check_train_files,
    grad_accumulation,
    world_size,
)
from training.sft.config import SFTConfig

log = logging.getLogger(__name__)

# (step, total steps, loss of the last logging step or None)
ProgressHook = Callable[[int, int, float | None], None]


@dataclass(frozen=True)
class SFTResult:
    output_dir: Path
    final: Path
    converted: Path | None
    steps: int
    resumed_from: Path | None
    rerun: FinishedRun | None = None  # the run had finished: nothing was trained


class TokenCounts:
    """Tokens the trainer processed since the last logging step (the metrics callback reads and
    resets them): all of them, the padding among them, and the trained ones (labels != -100)."""

    def __init__(self) -> None:
        self.tokens = self.padding = self.trained = 0

    def add(self, inputs: dict[str, Any]) -> None:
        ids = inputs["input_ids"]
        self.tokens += int(ids.numel())
        if "attention_mask" in inputs:
            self.padding += int(ids.numel() - inputs["attention_mask"].sum())
        self.trained += int((inputs["labels"] != -100).sum())

    def take(self) -> tuple[int, int, int]:
        out = (self.tokens, self.padding, self.trained)
        self.tokens = self.padding = self.trained = 0
        return out


def tokenized_rows(cfg: SFTConfig, tokenizer: Any) -> list[dict[str, Any]]:
    """Every row of ``cfg.train_files`` as ``{"input_ids", "assistant_masks"}``."""
    from training.data import read_sft_parquet
    from training.template import tokenize

    rows = []
    for row in read_sft_parquet(list(cfg.train_files)):
        tools = json.loads(row.tools) if isinstance(row.tools, str) else row.tools
        try:
            tok = tokenize(tokenizer, list(row.messages), tools)
        except ConfigError as exc:
            raise type(exc)(f"record {row.id!r}: {exc.message}", hint=exc.hint) from None
        if tok.num_tokens > cfg.max_length:
            raise ConfigError(
                f"record {row.id!r} has {tok.num_tokens} tokens, over max_length {cfg.max_length}",
                hint="rebuild the data with `astra-train data sft --max-length` (it drops or "
                "splits such records), or raise max_length",
            )
        rows.append({"input_ids": tok.input_ids, "assistant_masks": tok.loss_mask})
    if not rows:
        raise ConfigError(f"no records in {', '.join(map(str, cfg.train_files))}")
    return rows


def trl_args(cfg: SFTConfig, device: str, **extra: Any) -> Any:
    """TRL's ``SFTConfig`` for ``cfg`` (the paper's schedule, the global batch, no truncation);
    ``trl.dtype`` resolved for ``device`` (bfloat16: autocast, on CPU too)."""
    from trl import SFTConfig as TRLConfig

    on_cpu = device == "cpu"
    padding_free = cfg.packing and cfg.micro_batch_size > 1
    if cfg.report_to and "tensorboard" in cfg.report_to:
        os.environ.setdefault("TENSORBOARD_LOGGING_DIR", str(cfg.output_dir / "tensorboard"))
    kwargs: dict[str, Any] = dict(
        output_dir=str(cfg.output_dir),
        use_cpu=on_cpu,
        bf16=trains_in_bf16(cfg.trl.dtype, device),
        fp16=False,
        report_to=list(cfg.report_to) or "none",
        gradient_checkpointing=cfg.trl.gradient_checkpointing,
        dataloader_num_workers=0,
        disable_tqdm=True,
        seed=cfg.seed,
        per_device_train_batch_size=cfg.micro_batch_size,
        gradient_accumulation_steps=grad_accumulation(cfg, world_size()),
        learning_rate=cfg.learning_rate,
        lr_scheduler_type=cfg.lr_scheduler,
        warmup_steps=cfg.warmup_ratio if cfg.warmup_ratio > 0 else 0,  # a float < 1: a ratio
        weight_decay=cfg.weight_decay,
        max_grad_norm=cfg.max_grad_norm,
        num_train_epochs=cfg.epochs,
        max_steps=cfg.max_steps or -1,
        logging_steps=cfg.logging_steps,
        save_strategy="steps",
        save_steps=cfg.save_steps,
        save_total_limit=cfg.save_total_limit,
        # padding-free takes no max_length; rows are checked against it in tokenized_rows, and
        # one sequence per micro batch has no padding anyway
        padding_free=padding_free,
        max_length=None if padding_free else cfg.max_length,
    )
    kwargs.update(extra)
    return TRLConfig(**kwargs)


def _metrics_callback(
    metrics: MetricsLog[SFTStep], counts: TokenCounts, progress: ProgressHook | None
) -> Any:
    from transformers import TrainerCallback

    class MetricsCallback(TrainerCallback):
        def __init__(self) -> None:
            self.start = self.last = time.monotonic()

        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.start = self.last = time.monotonic()

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            if not logs or "loss" not in logs:
                return  # the end-of-training summary, or an eval log
            now = time.monotonic()
            tokens, padding, trained = counts.take()
            span = max(now - self.last, 1e-9)
            self.last = now
            metrics.append(
                SFTStep(
                    step=state.global_step,
                    loss=logs["loss"],
                    learning_rate=logs.get("learning_rate"),
                    grad_norm=logs.get("grad_norm"),
                    tokens=tokens,
                    padding_tokens=padding,
                    trained_tokens=trained,
                    tokens_per_s=tokens / span,
                    trained_tokens_per_s=trained / span,
                    epoch=logs.get("epoch"),
                    elapsed_s=now - self.start,
                )
            )
            if progress:
                progress(state.global_step, state.max_steps, float(logs["loss"]))

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if progress:
                progress(state.global_step, state.max_steps, None)

    return MetricsCallback()


def head_at_trained_positions(args: Any, inputs: dict[str, Any]) -> bool:
    """Whether the loss runs the LM head only where a token is trained
    (:func:`trained_token_loss`): on CPU. TRL's fused head scores every position there
    (only CUDA's Triton kernel skips the untrained ones) and computes its backward in float32,
    which kept the trainer below a plain torch loop's speed (bench/train_speed.py). Elsewhere
    TRL's head stays: it never holds a (tokens × vocabulary) block of logits, which long
    sequences on a GPU need."""
    return args.device.type == "cpu" and "labels" in inputs and "shift_labels" not in inputs


def trained_token_loss(
    model: Any, inputs: dict[str, Any], num_items_in_batch: Any = None
) -> tuple[Any, dict[str, float]]:
    """The SFT loss of one micro-batch with the LM head at the trained positions only: the
    summed negative log-likelihood of the tokens whose label is not -100 (labels shifted by
    one, as transformers' and TRL's losses shift them), divided by ``num_items_in_batch`` (the
    trained tokens of the whole optimizer step; this micro-batch's when None). The same value
    as TRL's loss; also TRL's metrics over those tokens (entropy, top-1 accuracy). It holds
    the float32 logits of the trained tokens (trained tokens × vocabulary × 4 bytes: 0.2 GB
    for 1,000 of SmolLM2's) and their gradient."""
    import torch

    targets = inputs["labels"][:, 1:]
    keep = (targets != -100).any(0).nonzero().squeeze(-1)  # positions whose next token trains
    fwd = {k: v for k, v in inputs.items() if k != "labels"}
    logits = model(**fwd, use_cache=False, logits_to_keep=keep).logits.float()
    picked = targets[:, keep]
    logp = torch.log_softmax(logits, dim=-1)
    nll = torch.nn.functional.nll_loss(
        logp.flatten(0, 1), picked.flatten(), ignore_index=-100, reduction="sum"
    )
    valid = picked != -100
    n = int(valid.sum())
    total = n if num_items_in_batch is None else num_items_in_batch
    loss = nll / torch.as_tensor(total).clamp(min=1)
    with torch.no_grad():
        entropy = -(logp.exp() * logp).sum(-1)
        right = logp.argmax(-1) == picked
        stats = {
            "entropy": float(entropy[valid].sum()) / n if n else 0.0,
            "mean_token_accuracy": float(right[valid].sum()) / n if n else 0.0,
        }
    return loss, stats


def make_trainer(
    cfg: SFTConfig,
    model: Any,
    tokenizer: Any,
    rows: list[dict[str, Any]],
    args: Any,
    callbacks: list[Any],
    counts: TokenCounts,
) -> Any:
    """TRL's ``SFTTrainer`` that also counts the tokens of every micro batch into ``counts``."""
    from datasets import Dataset
    from transformers import PrinterCallback
    from trl import SFTTrainer

    class CountingSFTTrainer(FiniteGuard, SFTTrainer):
        def compute_loss(
            self,
            model: Any,
            inputs: Any,
            return_outputs: bool = False,
            num_items_in_batch: Any = None,
        ) -> Any:
            if model.training:
                counts.add(inputs)
            if return_outputs or not head_at_trained_positions(self.args, inputs):
                return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            loss, stats = trained_token_loss(model, inputs, num_items_in_batch)
            if self.args.average_tokens_across_devices and num_items_in_batch is not None:
                loss = loss * self.accelerator.num_processes  # as TRL's: DDP averages
            mode = "train" if model.training else "eval"
            for key, value in stats.items():
                self._metrics[mode][key].append(value)
            if mode == "train":  # TRL's running count of the tokens seen, padding excluded
                mask = inputs.get("attention_mask")
                seen = mask.sum() if mask is not None else inputs["input_ids"].size(1)
                self._total_train_tokens += int(seen)
            self._metrics[mode]["num_tokens"] = [self._total_train_tokens]
            return loss

    trainer = CountingSFTTrainer(
        model=model,
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        callbacks=callbacks,
    )
    trainer.remove_callback(PrinterCallback)  # the metrics go to metrics.jsonl and the bar
    return trainer


VARLEN_SDPA = "astra_varlen_sdpa"


def _varlen_sdpa(
    module: Any, query: Any, key: Any, value: Any, attention_mask: Any, **kwargs: Any
) -> tuple[Any, None]:
    """sdpa over each sequence of a padding-free row on its own (``cu_seq_lens_q``), as
    flash-attention's varlen kernel does: no L×L block mask, no attention across sequences."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    cu = kwargs.pop("cu_seq_lens_q", None)
    kwargs = {k: kwargs[k] for k in ("dropout", "scaling") if k in kwargs}
    if cu is None or attention_mask is not None or query.shape[0] != 1:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    bounds = cu.tolist()
    outs = [
        sdpa_attention_forward(
            module,
            query[:, :, s:e],
            key[:, :, s:e],
            value[:, :, s:e],
            None,
            is_causal=True,
            **kwargs,
        )[0]
        for s, e in itertools.pairwise(bounds)
    ]
    return torch.cat(outs, dim=1), None


def attention_for(cfg: SFTConfig) -> str:
    """sdpa on padding-free batches runs per sequence (registered once); otherwise as asked."""
    from transformers import AttentionInterface

    if cfg.trl.attn_implementation == "sdpa" and cfg.packing and cfg.micro_batch_size > 1:
        AttentionInterface.register(VARLEN_SDPA, _varlen_sdpa)
        return VARLEN_SDPA
    return cfg.trl.attn_implementation


def load_model(cfg: SFTConfig) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    if cfg.trl.threads:
        torch.set_num_threads(cfg.trl.threads)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(cfg.model), dtype=torch.float32, attn_implementation=attention_for(cfg)
        )
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot load a causal LM from {cfg.model}: {exc}") from None
    return check_start_weights(model, cfg.model)


def run_trl(cfg: SFTConfig, progress: ProgressHook | None = None) -> SFTResult:
    """Train ``cfg`` with TRL; resume from the newest complete checkpoint of ``output_dir``.
    A run that had finished is not trained again (see ``finished_run``); one whose loss,
    gradient or weights turn non-finite stops with ``TrainingDiverged``, without a
    ``final/``."""
    import datasets
    from transformers.utils import logging as hf_logging

    from training.template import load_tokenizer, serving_template

    hf_logging.disable_progress_bar()
    datasets.disable_progress_bars()
    check_model(cfg.model)
    check_train_files(list(cfg.train_files))
    check_sft_parquet(list(cfg.train_files))
    tokenizer = load_tokenizer(cfg.model)
    serving = serving_template(tokenizer)
    rows = tokenized_rows(cfg, tokenizer)
    grad_accumulation(cfg, world_size())
    run = TrainingRun.open(cfg)
    ckpt = run.checkpoint
    done = run.finished(tokenizer, serving)
    if done is not None:
        return SFTResult(cfg.output_dir, done.final, done.converted, done.steps, ckpt, done)
    args = trl_args(cfg, device_of(cfg))  # a dtype the device lacks: refused before any write
    model = load_model(cfg)  # its weights checked before anything is written
    run.begin()
    counts = TokenCounts()
    callbacks = [_metrics_callback(run.metrics(SFTStep), counts, progress)]
    trainer = make_trainer(cfg, model, tokenizer, rows, args, callbacks, counts)
    if ckpt:
        log.info("resuming from %s", ckpt)
    trainer.train(resume_from_checkpoint=str(ckpt) if ckpt else None)
    trainer.model.set_attn_implementation("sdpa")  # what the saved config says
    final, converted = run.save(trainer, tokenizer, serving)
    return SFTResult(cfg.output_dir, final, converted, trainer.state.global_step, ckpt)
