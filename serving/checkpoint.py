"""Finding and validating checkpoints on disk: Hugging Face directories and verl FSDP ones."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

from astra_agent.errors import CheckpointError
from serving.safetensors_io import DTYPE_NAMES, TensorInfo, read_header

WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
VERL_RANK_FILE = re.compile(r"model_world_size_(\d+)_rank_(\d+)\.pt$")


@dataclass
class Shard:
    path: Path
    fmt: str  # "safetensors" or "bin"
    tensors: list[TensorInfo] = field(default_factory=list)  # safetensors only

    @property
    def nbytes(self) -> int:
        return self.path.stat().st_size


@dataclass
class HFCheckpoint:
    root: Path
    shards: list[Shard]

    @property
    def largest_shard_bytes(self) -> int:
        return max(s.nbytes for s in self.shards)

    def aux_files(self) -> list[Path]:
        """Everything but the weights: config, tokenizer, chat template, generation config."""
        skip = {s.path.name for s in self.shards} | set(WEIGHT_INDEXES)
        return sorted(
            p
            for p in self.root.iterdir()
            if p.is_file() and p.name not in skip and not p.name.startswith(".")
        )


def _shards_from_index(root: Path, index: Path, fmt: str) -> list[Shard]:
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{index} is not a valid weight index: {exc}") from exc
    names = list(dict.fromkeys(weight_map.values()))
    missing = [n for n in names if not (root / n).is_file()]
    if missing:
        raise CheckpointError(
            f"{index.name} names shard(s) that are missing: {', '.join(missing)}",
            hint="the download is incomplete; fetch the missing files again",
        )
    shards = [Shard(root / n, fmt) for n in names]
    if fmt == "safetensors":
        _load_headers(shards)
        have = {t.name for s in shards for t in s.tensors}
        absent = sorted(set(weight_map) - have)
        if absent:
            raise CheckpointError(
                f"{index.name} lists tensors that no shard holds: {', '.join(absent[:5])}"
                + (" …" if len(absent) > 5 else "")
            )
    return shards


def _load_headers(shards: list[Shard]) -> None:
    seen: dict[str, Path] = {}
    for s in shards:
        s.tensors, _ = read_header(s.path)
        for t in s.tensors:
            if t.name in seen:
                raise CheckpointError(f"tensor {t.name!r} is in both {seen[t.name]} and {s.path}")
            seen[t.name] = s.path


def open_hf_checkpoint(root: Path) -> HFCheckpoint:
    """Validate a Hugging Face checkpoint directory and read every safetensors header."""
    if not root.exists():
        raise CheckpointError(f"checkpoint not found: {root}")
    if not root.is_dir():
        raise CheckpointError(f"{root} is not a directory; point at the checkpoint's folder")
    if not (root / "config.json").is_file():
        raise CheckpointError(
            f"{root} is not a Hugging Face checkpoint: it has no config.json",
            hint="for a verl checkpoint, point at global_step_N/actor (or its parent)",
        )
    st_index, bin_index = (root / n for n in WEIGHT_INDEXES)
    if st_index.is_file():
        return HFCheckpoint(root, _shards_from_index(root, st_index, "safetensors"))
    if (root / "model.safetensors").is_file():
        shards = [Shard(root / "model.safetensors", "safetensors")]
    elif sorted(root.glob("*.safetensors")):
        shards = [Shard(p, "safetensors") for p in sorted(root.glob("*.safetensors"))]
    elif bin_index.is_file():
        return HFCheckpoint(root, _shards_from_index(root, bin_index, "bin"))
    elif (root / "pytorch_model.bin").is_file():
        shards = [Shard(root / "pytorch_model.bin", "bin")]
    else:
        raise CheckpointError(
            f"{root} has a config.json but no weights (*.safetensors or pytorch_model*.bin)"
        )
    if shards[0].fmt == "safetensors":
        _load_headers(shards)
    return HFCheckpoint(root, shards)


def load_bin(path: Path) -> dict[str, torch.Tensor]:
    """Load a pytorch_model*.bin lazily (mmap) and safely (weights only)."""
    try:
        state = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except Exception as exc:  # torch raises many kinds for a bad file
        raise CheckpointError(f"{path} is corrupt or truncated: {exc}") from exc
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{path} does not hold a flat state dict of tensors")
    for name, t in state.items():
        if t.dtype not in DTYPE_NAMES:
            raise CheckpointError(f"{path}: tensor {name!r} has unsupported dtype {t.dtype}")
    return state


# --------------------------------------------------------------------------- verl


def find_verl_actor(path: Path) -> Path | None:
    """The verl FSDP actor directory at or under ``path`` (latest step), or None."""
    if not path.is_dir():
        return None
    if (path / "fsdp_config.json").is_file() or any(
        VERL_RANK_FILE.match(p.name) for p in path.iterdir()
    ):
        return path
    if (path / "actor").is_dir():
        return find_verl_actor(path / "actor")
    steps = sorted(
        (p for p in path.glob("global_step_*") if p.name.split("_")[-1].isdigit()),
        key=lambda p: int(p.name.split("_")[-1]),
    )
    latest = path / "latest_checkpointed_iteration.txt"
    if latest.is_file() and (path / f"global_step_{latest.read_text().strip()}").is_dir():
        return find_verl_actor(path / f"global_step_{latest.read_text().strip()}")
    return find_verl_actor(steps[-1]) if steps else None


def check_verl_actor(actor: Path) -> None:
    """Fail early, with the reason, on a verl actor directory the merger would choke on."""
    cfg = actor / "fsdp_config.json"
    if not cfg.is_file():
        raise CheckpointError(f"{actor} has no fsdp_config.json (needed to know the world size)")
    try:
        world = int(json.loads(cfg.read_text())["world_size"])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{cfg} is not valid: {exc}") from exc
    missing = [
        f"model_world_size_{world}_rank_{r}.pt"
        for r in range(world)
        if not (actor / f"model_world_size_{world}_rank_{r}.pt").is_file()
    ]
    if missing:
        raise CheckpointError(f"{actor} lacks rank files: {', '.join(missing)}")
    if not (actor / "huggingface" / "config.json").is_file():
        raise CheckpointError(f"{actor}/huggingface/config.json is missing (verl writes it)")
