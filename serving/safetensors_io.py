"""Streaming reads and writes of safetensors files, a chunk at a time.

The safetensors format is an 8-byte little-endian header length, a JSON header naming each
tensor's dtype, shape and byte range, then the bytes. Reading and writing through plain file
I/O (no mmap) keeps resident memory at one chunk, whatever the size of the file.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import torch

from astra_agent.errors import CheckpointError

DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
MAX_HEADER = 100 * 1024 * 1024
CHUNK_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int  # absolute byte offset in the file
    nbytes: int

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


def read_header(path: Path) -> tuple[list[TensorInfo], dict[str, str]]:
    """Parse and validate a safetensors header; raise CheckpointError if it is corrupt."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                raise CheckpointError(f"{path} is truncated: shorter than a safetensors header")
            (n,) = struct.unpack("<Q", raw)
            if n > MAX_HEADER or n + 8 > size:
                raise CheckpointError(
                    f"{path} is corrupt or truncated: header claims {n} bytes, file has {size}"
                )
            header = json.loads(f.read(n))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path} has a corrupt safetensors header: {exc}") from exc
    except OSError as exc:
        raise CheckpointError(f"cannot read {path}: {exc}") from exc
    if not isinstance(header, dict):
        raise CheckpointError(f"{path} has a corrupt safetensors header (not a mapping)")
    meta = header.pop("__metadata__", None) or {}
    base = 8 + n
    tensors: list[TensorInfo] = []
    for name, spec in header.items():
        try:
            dtype, shape, (b, e) = spec["dtype"], tuple(spec["shape"]), spec["data_offsets"]
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"{path}: corrupt entry for tensor {name!r}") from exc
        if dtype not in DTYPES:
            raise CheckpointError(f"{path}: tensor {name!r} has unsupported dtype {dtype}")
        info = TensorInfo(name, dtype, shape, base + b, e - b)
        if e < b or info.nbytes != info.numel * DTYPES[dtype].itemsize:
            raise CheckpointError(f"{path}: tensor {name!r} has inconsistent offsets")
        if base + e > size:
            raise CheckpointError(
                f"{path} is truncated: tensor {name!r} ends at byte {base + e}, "
                f"file has {size} bytes"
            )
        tensors.append(info)
    tensors.sort(key=lambda t: t.begin)
    return tensors, {str(k): str(v) for k, v in meta.items()}


def iter_chunks(
    f: BinaryIO, info: TensorInfo, chunk_bytes: int = CHUNK_BYTES
) -> Iterator[memoryview]:
    """Yield a tensor's raw bytes in chunks of whole elements.

    The chunks are views of one reused buffer: use each before asking for the next.
    """
    item = info.torch_dtype.itemsize
    step = max(item, chunk_bytes // item * item)
    buf = bytearray(min(step, info.nbytes))
    view = memoryview(buf)
    f.seek(info.begin)
    left = info.nbytes
    while left > 0:
        n = f.readinto(view[: min(step, left)])
        if not n:
            raise CheckpointError(f"unexpected end of file while reading {info.name!r}")
        left -= n
        yield view[:n]


def convert_bytes(buf: memoryview | bytes, src: torch.dtype, dst: torch.dtype) -> memoryview:
    """Elementwise dtype conversion of raw little-endian bytes (torch's own rounding)."""
    if src == dst or not len(buf):
        return memoryview(buf)
    t = torch.frombuffer(buf, dtype=src).to(dst)
    return memoryview(t.view(torch.uint8).numpy())


@dataclass(frozen=True)
class OutTensor:
    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int


def header_bytes(tensors: list[OutTensor], metadata: dict[str, str]) -> bytes:
    header: dict[str, object] = {"__metadata__": metadata}
    offset = 0
    for t in tensors:
        header[t.name] = {
            "dtype": t.dtype,
            "shape": list(t.shape),
            "data_offsets": [offset, offset + t.nbytes],
        }
        offset += t.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw


def crc_of_tensors(path: Path) -> dict[str, tuple[str, tuple[int, ...], int]]:
    """Name → (dtype, shape, crc32 of the bytes) for every tensor of a file."""
    infos, _ = read_header(path)
    out = {}
    with path.open("rb") as f:
        for info in infos:
            crc = 0
            for buf in iter_chunks(f, info):
                crc = zlib.crc32(buf, crc)
            out[info.name] = (info.dtype, info.shape, crc)
    return out


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
