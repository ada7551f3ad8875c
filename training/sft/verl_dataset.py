"""The dataset verl's SFT trainer reads our parquet through (``data.custom_cls``).

``run_verl`` sets ``data.custom_cls.path=pkg://training.sft.verl_dataset`` and
``data.custom_cls.name=AstraSFTDataset``; verl's ``create_sft_dataset`` builds it with the
constructor of its own ``MultiTurnSFTDataset`` and batches its items with ``SFTTensorCollator``
(``pad_mode: no_padding``: jagged nested tensors, no pad token computed). Each item is our
conversation tokenized by :func:`training.template.tokenize`, so verl trains exactly the ids and
the loss mask that TRL trains (1 = a target; verl's ``sft_loss`` shifts it, as TRL does).

Why not verl's own ``MultiTurnSFTDataset`` (0.9.1): it renders each message alone, so with the
Qwen3-style serving template (a) the reasoning of every assistant message is dropped (alone it
has no user query before it) and its whole-conversation check fails; (b) consecutive tool
results each become their own user block where the conversation renders one; (c) ``tools`` must
be parquet structs, which parquet unifies across rows (schemas gain ``null`` keys, so
``tojson`` renders other text); and it trains every assistant message, so earlier turns would
be trained without the reasoning they had. tests/training/test_sft_verl.py shows where it agrees
with us.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from astra_agent.errors import ConfigError
from training.template import tokenize

log = logging.getLogger(__name__)

TRUNCATIONS = ("error", "left", "right")


def _files(parquet_files: Any) -> list[Path]:
    if isinstance(parquet_files, str | Path):
        return [Path(parquet_files)]
    return [Path(str(p)) for p in parquet_files]  # a list, or an omegaconf ListConfig


def _num_tokens(files: Sequence[Path]) -> list[int | None]:
    """The ``num_tokens`` column of ``astra-train data sft`` (None where a file lacks it)."""
    import pyarrow.parquet as pq

    out: list[int | None] = []
    for f in files:
        if "num_tokens" in pq.read_schema(f).names:
            out += [int(n) for n in pq.read_table(f, columns=["num_tokens"]).column(0).to_pylist()]
        else:
            out += [None] * pq.read_metadata(f).num_rows
    return out


class AstraSFTDataset(Dataset[dict[str, torch.Tensor]]):
    """Our parquet, tokenized with our training template, as verl's no_padding items."""

    def __init__(
        self,
        parquet_files: str | Sequence[str],
        tokenizer: Any,
        config: Any,
        processor: Any = None,
        max_samples: int = -1,
    ) -> None:
        from training.data import read_sft_parquet

        config = config or {}
        self.tokenizer = tokenizer
        self.max_length = int(config.get("max_length", 1024))
        self.truncation = str(config.get("truncation", "error"))
        pad_mode = str(config.get("pad_mode", "no_padding"))
        if self.truncation not in TRUNCATIONS:
            raise ConfigError(f"data.truncation={self.truncation!r}: use one of {TRUNCATIONS}")
        if pad_mode != "no_padding":
            raise ConfigError(f"data.pad_mode={pad_mode!r}: AstraSFTDataset emits no_padding only")
        if processor is not None:
            raise ConfigError("AstraSFTDataset is text only (the model came with a processor)")
        files = _files(parquet_files)
        self.rows = read_sft_parquet(files)
        lengths = _num_tokens(files)
        if max_samples is not None and 0 < max_samples < len(self.rows):
            self.rows, lengths = self.rows[:max_samples], lengths[:max_samples]
        self._check_lengths(lengths)
        log.info("AstraSFTDataset: %d conversations from %d file(s)", len(self.rows), len(files))

    def _check_lengths(self, lengths: Sequence[int | None]) -> None:
        """With ``truncation: error``, refuse before training what ``num_tokens`` says is long."""
        if self.truncation != "error":
            return
        over = [
            (r.id, n) for r, n in zip(self.rows, lengths, strict=True) if n and n > self.max_length
        ]
        if over:
            rid, n = over[0]
            raise ConfigError(
                f"{len(over)} conversation(s) exceed data.max_length={self.max_length} "
                f"(first: {rid!r}, {n} tokens)",
                hint="re-run `astra-train data sft --max-length` or raise max_length",
            )

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, item: int) -> dict[str, torch.Tensor]:
        row = self.rows[item]
        tok = tokenize(self.tokenizer, row.messages, row.tools)
        ids, mask = tok.input_ids, tok.loss_mask
        if len(ids) > self.max_length:
            if self.truncation == "error":
                raise ValueError(
                    f"conversation {row.id!r}: {len(ids)} tokens "
                    f"> data.max_length={self.max_length}"
                )
            cut = (
                slice(-self.max_length, None)
                if self.truncation == "left"
                else slice(self.max_length)
            )
            ids, mask = ids[cut], mask[cut]
        return {
            "input_ids": torch.tensor(ids, dtype=torch.long),
            "position_ids": torch.arange(len(ids), dtype=torch.long),
            "loss_mask": torch.tensor(mask, dtype=torch.long),
        }
