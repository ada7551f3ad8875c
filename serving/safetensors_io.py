"""Streaming reads and writes of safetensors files, a chunk at a time.

The safetensors format is an 8-byte little-endian header length, a JSON header naming each
tensor's dtype, shape and byte range, then the bytes. Reading and writing through plain file
I/O (no mmap) keeps resident memory at one chunk, whatever the size of the file.
"""

from __future__ import annotations

import json
import mmap
import struct
import warnings
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

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


def convert_bytes(buf: memoryview | bytes, src: torch.dtype, dst: torch.dtype) -> memoryview:
    """Elementwise dtype conversion of raw little-endian bytes (torch's own rounding)."""
    if src == dst or not len(buf):
        return memoryview(buf)
    with warnings.catch_warnings():  # a read-only mmap is fine: torch only reads it here
        warnings.simplefilter("ignore", UserWarning)
        t = torch.frombuffer(buf, dtype=src)
    return t.to(dst).view(torch.uint8).numpy().data


class MappedFile:
    """A read-only mmap of a file, read in chunks whose pages are released from this process
    once used (MADV_DONTNEED): no copy out of the page cache, and resident memory stays at one
    chunk however large the file."""

    def __init__(self, path: Path) -> None:
        self._f = path.open("rb")
        size = path.stat().st_size
        self._mm = mmap.mmap(self._f.fileno(), size, access=mmap.ACCESS_READ) if size else None

    def chunks(self, info: TensorInfo, chunk_bytes: int = CHUNK_BYTES) -> Iterator[memoryview]:
        if self._mm is None or info.nbytes == 0:
            return
        item = info.torch_dtype.itemsize
        step = max(item, chunk_bytes // item * item)
        view = memoryview(self._mm)
        try:
            for start in range(info.begin, info.begin + info.nbytes, step):
                end = min(start + step, info.begin + info.nbytes)
                piece = view[start:end]
                try:
                    yield piece
                finally:
                    piece.release()  # fails loudly if a consumer kept a reference
                lo = start - start % mmap.PAGESIZE
                self._mm.madvise(mmap.MADV_DONTNEED, lo, end - lo)
        finally:
            view.release()

    def close(self) -> None:
        if self._mm is not None:
            self._mm.close()
        self._f.close()


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


def checksum(data: memoryview | bytes, value: int = 1) -> int:
    """Running Adler-32: about twice as fast as CRC-32, plenty to catch bytes that did not
    land on disk as written (truncation, a failing disk)."""
    return zlib.adler32(data, value)


def checksums_of_tensors(path: Path) -> dict[str, tuple[str, tuple[int, ...], int]]:
    """Name → (dtype, shape, checksum of the bytes) for every tensor of a file."""
    infos, _ = read_header(path)
    out = {}
    mapped = MappedFile(path)
    try:
        for info in infos:
            value = 1
            for chunk in mapped.chunks(info):
                value = checksum(chunk, value)
            out[info.name] = (info.dtype, info.shape, value)
    finally:
        mapped.close()
    return out
