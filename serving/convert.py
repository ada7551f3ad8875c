"""Convert a float32 checkpoint (as verl saves it) to bf16 safetensors shards, streaming.

Memory stays at one chunk (64 MiB) whatever the model size: tensors are read, cast and written
piece by piece, so a 14B float32 checkpoint (≈56 GB) converts on a 24 GiB machine. The output
is written into a temporary sibling directory and renamed into place only after it has been
verified; an interrupted run never leaves a DST that looks complete. A write that fails (a disk
that fills during it, an existing DST that cannot be renamed aside, a name with no room for the
temporary sibling's) is one clear error, as for ``import-gguf`` (:mod:`serving.placement`).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import queue
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import torch

from astra_agent.config import check_writable
from astra_agent.errors import CheckpointError, ConfigError
from astra_agent.runio import fsync_dir, remove_stale_siblings
from serving.checkpoint import (
    HFCheckpoint,
    check_verl_actor,
    find_verl_actor,
    load_bin,
    open_hf_checkpoint,
)
from serving.placement import Placement, check_free_space
from serving.safetensors_io import (
    CHUNK_BYTES,
    DTYPE_NAMES,
    DTYPES,
    MappedFile,
    OutTensor,
    TensorInfo,
    checksum,
    checksums_of_tensors,
    convert_bytes,
    header_bytes,
)

log = logging.getLogger(__name__)

Progress = Callable[[int, int, str], None]  # (bytes done, bytes total, what)
TARGET_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
CONVERSION = Placement(tag="converting", noun="conversion", verb="convert")  # .DST.converting-PID
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?i?B)?\s*$", re.IGNORECASE)


def parse_size(text: str | int) -> int:
    """'5GB' → 5e9, '512MiB' → 512·2**20, plain integers are bytes."""
    if isinstance(text, int):
        return text
    m = _SIZE.match(text)
    if not m:
        raise ConfigError(f"not a size: {text!r} (examples: 5GB, 512MiB, 1000000)")
    unit = (m.group(2) or "B").upper()
    power = {"B": 0, "K": 1, "M": 2, "G": 3, "T": 4}[unit[0]]
    base = 1024 if "I" in unit else 1000
    return int(float(m.group(1)) * base**power)


@dataclass(frozen=True)
class ConvertResult:
    dst: Path
    tensors: int
    shards: int
    bytes_written: int
    source_kind: str


@dataclass(frozen=True)
class _Planned:
    out: OutTensor
    src_dtype: torch.dtype
    shard: int


def _target_dtype(src: torch.dtype, target: torch.dtype) -> torch.dtype:
    return target if src.is_floating_point and src.itemsize >= 2 else src


@dataclass(frozen=True)
class _Entry:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]


class _Source:
    """Tensors of a checkpoint, in file order, each readable as a stream of raw chunks."""

    def __init__(self, ckpt: HFCheckpoint) -> None:
        self.entries: list[_Entry] = []
        self._st: dict[str, tuple[Path, TensorInfo]] = {}
        self._bin: dict[str, torch.Tensor] = {}
        self._handle: tuple[Path, MappedFile] | None = None
        for shard in ckpt.shards:
            if shard.fmt == "safetensors":
                for t in shard.tensors:
                    self._st[t.name] = (shard.path, t)
                    self.entries.append(_Entry(t.name, t.torch_dtype, t.shape))
            else:  # pytorch_model*.bin: mmapped, so nothing is resident until read
                for name, tensor in load_bin(shard.path).items():
                    self._bin[name] = tensor
                    self.entries.append(_Entry(name, tensor.dtype, tuple(tensor.shape)))

    def chunks(self, name: str) -> Iterator[memoryview]:
        if name in self._bin:
            flat = self._bin[name].contiguous().view(-1)
            step = max(1, CHUNK_BYTES // max(1, flat.element_size()))
            for i in range(0, flat.numel(), step):
                yield flat[i : i + step].view(torch.uint8).numpy().data
            return
        path, info = self._st[name]
        if self._handle is None or self._handle[0] != path:
            self.close()
            self._handle = (path, MappedFile(path))
        yield from self._handle[1].chunks(info)

    def close(self) -> None:
        if self._handle is not None:
            self._handle[1].close()
            self._handle = None


def _plan(entries: list[_Entry], target: torch.dtype, max_shard: int) -> list[_Planned]:
    """Output tensors in source order, grouped into shards of at most ``max_shard`` bytes."""
    plan: list[_Planned] = []
    shard, size = 0, 0
    for e in entries:
        dst = _target_dtype(e.dtype, target)
        nbytes = _numel(e.shape) * dst.itemsize
        if size and size + nbytes > max_shard:
            shard, size = shard + 1, 0
        size += nbytes
        plan.append(_Planned(OutTensor(e.name, DTYPE_NAMES[dst], e.shape, nbytes), e.dtype, shard))
    return plan


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _shard_name(i: int, n: int) -> str:
    return f"model-{i + 1:05d}-of-{n:05d}.safetensors"


class _BackgroundWriter:
    """Writes chunks from a thread, so that reading, casting and checksumming the next chunk
    overlaps the (often throttled) write of this one. Errors surface on put() or close()."""

    def __init__(self, f: BinaryIO, depth: int = 3) -> None:
        self._f = f
        self._q: queue.Queue[memoryview | bytes | None] = queue.Queue(maxsize=depth)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (item := self._q.get()) is not None:
            if self._error is None:
                try:
                    self._f.write(item)
                except BaseException as exc:
                    self._error = exc

    def put(self, data: memoryview | bytes) -> None:
        if self._error is not None:
            raise self._error
        self._q.put(data)

    def close(self) -> None:
        self._q.put(None)
        self._thread.join()
        if self._error is not None:
            raise self._error


class _Writer:
    """Writes planned shards one after another, a checksum per tensor; each finished shard is
    fsynced and read back in a second thread while the next one is written."""

    def __init__(self, out_dir: Path, plan: list[_Planned], progress: Progress | None) -> None:
        self.out_dir = out_dir
        self.plan = plan
        self.n_shards = plan[-1].shard + 1 if plan else 1
        self.total = sum(p.out.nbytes for p in plan)
        self.done = 0
        self.progress = progress
        self.sums: dict[str, int] = {}
        self._by_shard: dict[int, list[_Planned]] = {}
        for p in plan:
            self._by_shard.setdefault(p.shard, []).append(p)

    def write(self, chunks_of: Callable[[str], Iterator[memoryview]]) -> None:
        with ThreadPoolExecutor(max_workers=1) as checker:
            checks = []
            for shard, items in sorted(self._by_shard.items()):
                path = self.out_dir / _shard_name(shard, self.n_shards)
                self._write_shard(path, items, chunks_of)
                checks.append(checker.submit(self._verify_shard, path, items))
            for c in checks:
                c.result()

    def _write_shard(
        self, path: Path, items: list[_Planned], chunks_of: Callable[[str], Iterator[memoryview]]
    ) -> None:
        with path.open("wb") as f:
            bg = _BackgroundWriter(f)
            try:
                bg.put(header_bytes([p.out for p in items], {"format": "pt"}))
                for p in items:
                    total = 1  # Adler-32 of nothing (empty tensors)
                    dst = DTYPES[p.out.dtype]
                    for raw in chunks_of(p.out.name):
                        data = convert_bytes(raw, p.src_dtype, dst)
                        if data.obj is raw.obj:  # a view of the source mapping: copy it
                            data = memoryview(bytes(data))
                        bg.put(data)
                        total = checksum(data, total)
                        self.done += len(data)
                        if self.progress:
                            self.progress(self.done, self.total, p.out.name)
                    self.sums[p.out.name] = total
            finally:
                bg.close()

    def _verify_shard(self, path: Path, items: list[_Planned]) -> None:
        """fsync, then re-read: each tensor present, right dtype and shape, same bytes."""
        with path.open("rb+") as f:
            os.fsync(f.fileno())
        found = checksums_of_tensors(path)
        for p in items:
            got = found.get(p.out.name)
            want = (p.out.dtype, p.out.shape, self.sums[p.out.name])
            if got != want:
                raise CheckpointError(
                    f"verification failed for {p.out.name!r} in {path.name}: wrote "
                    f"{want[:2]}, read back {got[:2] if got else 'nothing'} (disk full or failing?)"
                )

    def write_index(self) -> None:
        index = {
            "metadata": {"total_size": self.total},
            "weight_map": {
                p.out.name: _shard_name(p.shard, self.n_shards)
                for p in sorted(self.plan, key=lambda p: p.out.name)
            },
        }
        (self.out_dir / "model.safetensors.index.json").write_text(
            json.dumps(index, indent=2) + "\n"
        )


def _patch_config(path: Path, dtype_name: str) -> None:
    cfg = json.loads(path.read_text())
    cfg["dtype"] = dtype_name
    if "torch_dtype" in cfg:
        cfg["torch_dtype"] = dtype_name
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def _convert_hf(
    src: Path, out: Path, target: torch.dtype, max_shard: int, progress: Progress | None
) -> tuple[int, int, int]:
    ckpt = open_hf_checkpoint(src)
    source = _Source(ckpt)
    try:
        plan = _plan(source.entries, target, max_shard)
        writer = _Writer(out, plan, progress)
        writer.write(source.chunks)
    finally:
        source.close()
    writer.write_index()
    for f in ckpt.aux_files():
        shutil.copy2(f, out / f.name)
    _patch_config(out / "config.json", str(target).removeprefix("torch."))
    return len(plan), writer.n_shards, writer.total


def _merge_verl(actor: Path, merged: Path) -> Path:
    """Run verl's own model merger (FSDP backend) into the directory ``merged``."""
    check_verl_actor(actor)
    cmd = [
        sys.executable,
        "-m",
        "verl.model_merger",
        "merge",
        "--backend",
        "fsdp",
        "--local_dir",
        str(actor),
        "--target_dir",
        str(merged),
    ]
    log.info("merging verl FSDP checkpoint with verl's model merger: %s", actor)
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0 or not (merged / "config.json").is_file():
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        if "No module named verl" in tail:
            raise ConfigError("converting a verl checkpoint needs verl installed (make setup)")
        raise CheckpointError(f"verl's model merger failed on {actor}:\n{tail}")
    return merged


def _estimate_out_bytes(src: Path) -> int:
    return sum(p.stat().st_size for p in src.rglob("*") if p.is_file()) // 2


def _convert_into(
    out: Path,
    *,
    src: Path,
    actor: Path | None,
    target: torch.dtype,
    max_shard: int,
    progress: Progress | None,
) -> tuple[int, int, int]:
    """Write the converted checkpoint into the empty directory ``out``: tensors, shards and
    checksums (see :func:`_convert_hf`); a verl checkpoint is merged first, into a folder of
    ``out`` that is gone before ``out`` is renamed into place."""
    if actor is None:
        written = _convert_hf(src, out, target, max_shard, progress)
    else:
        merged = _merge_verl(actor, out / ".verl-merged")
        try:
            written = _convert_hf(merged, out, target, max_shard, progress)
        finally:
            shutil.rmtree(merged, ignore_errors=True)
    fsync_dir(out)
    return written


def convert_checkpoint(
    src: str | Path,
    dst: str | Path,
    *,
    dtype: str = "bfloat16",
    max_shard_size: str | int = "5GB",
    overwrite: bool = False,
    progress: Progress | None = None,
) -> ConvertResult:
    """Convert ``src`` (HF float32, or a verl FSDP checkpoint) to ``dst`` in ``dtype``."""
    src, dst = Path(src).resolve(), Path(dst).resolve()
    if dtype not in TARGET_DTYPES:
        raise ConfigError(f"unsupported dtype {dtype!r}: choose from {', '.join(TARGET_DTYPES)}")
    max_shard = parse_size(max_shard_size)
    if not src.exists():
        raise CheckpointError(f"source checkpoint not found: {src}")
    if dst == src or src in dst.parents:
        raise ConfigError("DST must not be SRC or lie inside it")
    with CONVERSION.creating(dst):  # before the merge and the conversion, not after
        CONVERSION.check_name(dst)
        if dst.exists() and not overwrite:
            raise ConfigError(f"{dst} already exists", hint="pass --overwrite to replace it")
        check_writable(dst, "DST", kind="dir")
    actor = None if (src / "config.json").is_file() else find_verl_actor(src)
    if actor is None:
        open_hf_checkpoint(src)  # validate everything before writing anything
    else:
        check_verl_actor(actor)
    need = _estimate_out_bytes(src) * (3 if actor else 1)
    with CONVERSION.creating(dst):
        dst.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_siblings(dst, CONVERSION.tag)  # of conversions whose process is gone
        check_free_space(dst.parent, need)
    save = functools.partial(
        _convert_into,
        src=src,
        actor=actor,
        target=TARGET_DTYPES[dtype],
        max_shard=max_shard,
        progress=progress,
    )
    n, shards, written = CONVERSION.write(dst, save, need)
    return ConvertResult(dst, n, shards, written, "verl-fsdp" if actor else "hf")
