"""Text helpers the synthesis stages share: near-duplicate detection, cutting and quoting.

Similarity is MinHash over word shingles (3 words by default; 128 hash functions from one
``hashlib.shake_128`` digest per shingle, banded into an LSH index chosen for the threshold).
"""

from __future__ import annotations

import hashlib
import json
import operator
import re
import struct
from collections.abc import Iterable, Sequence

PERMUTATIONS = 128
_WORD = re.compile(r"\w+")
_ROW = struct.Struct(f"<{PERMUTATIONS}I")


def shingles(text: str, size: int = 3) -> set[str]:
    """The text's lower-cased word ``size``-grams (the whole text when it is shorter)."""
    words = _WORD.findall(text.lower())
    if len(words) <= size:
        return {" ".join(words)} if words else set()
    return {" ".join(words[i : i + size]) for i in range(len(words) - size + 1)}


def signature(text: str, size: int = 3) -> tuple[int, ...]:
    """MinHash signature: per hash function (a 4-byte slice of the shingle's shake_128
    digest), the minimum over the shingles. Empty for a text without words."""
    rows = [
        _ROW.unpack(hashlib.shake_128(s.encode()).digest(_ROW.size)) for s in shingles(text, size)
    ]
    return tuple(map(min, zip(*rows, strict=True))) if rows else ()


def similarity(a: Sequence[int], b: Sequence[int]) -> float:
    """The Jaccard similarity estimate of two signatures."""
    if not a or not b:
        return 0.0
    if len(a) != len(b):
        raise ValueError(f"signatures of {len(a)} and {len(b)} hashes")
    return sum(map(operator.eq, a, b)) / len(a)


def _rows_per_band(threshold: float) -> int:
    """The most rows per LSH band that still finds a pair at ``threshold`` with ≥ 99.9 %."""
    for rows in (16, 8, 4, 2):
        if 1 - (1 - threshold**rows) ** (PERMUTATIONS // rows) >= 0.999:
            return rows
    return 1


class NearDuplicates:
    """Signatures indexed by LSH bands: which known text is at least ``threshold`` similar."""

    def __init__(self, threshold: float) -> None:
        self.threshold = threshold
        self.rows = _rows_per_band(threshold)
        # a band's labels: one label as a string, more as a list (a string is no container
        # for the garbage collector to walk: BFCL's index is ~80,000 bands, most of one text)
        self._bands: dict[tuple[int, tuple[int, ...]], str | list[str]] = {}
        self._sigs: dict[str, tuple[int, ...]] = {}

    def __len__(self) -> int:
        return len(self._sigs)

    def _keys(self, sig: tuple[int, ...]) -> Iterable[tuple[int, tuple[int, ...]]]:
        r = self.rows
        return ((b, sig[b * r : (b + 1) * r]) for b in range(PERMUTATIONS // r))

    def query(self, sig: tuple[int, ...]) -> tuple[str, float] | None:
        """The most similar known text at or over the threshold (label, similarity)."""
        if not sig:
            return None
        found: set[str] = set()
        for key in self._keys(sig):
            labels = self._bands.get(key, ())
            if isinstance(labels, str):
                found.add(labels)
            else:
                found.update(labels)
        best = max(((similarity(sig, self._sigs[x]), x) for x in sorted(found)), default=None)
        return (best[1], best[0]) if best and best[0] >= self.threshold else None

    def add(self, label: str, sig: tuple[int, ...]) -> None:
        if not sig or label in self._sigs:
            return
        self._sigs[label] = sig
        for key in self._keys(sig):
            labels = self._bands.get(key)
            if labels is None:
                self._bands[key] = label
            elif isinstance(labels, str):
                self._bands[key] = [labels, label]
            else:
                labels.append(label)


def cut_text(text: str, limit: int = 3_000, mark: str = " …[{} chars cut]") -> str:
    """``text``, or its first ``limit`` characters and ``mark`` with how many were cut."""
    return text if len(text) <= limit else text[:limit] + mark.format(len(text) - limit)


def quote(text: str, limit: int = 160) -> str:
    """``text`` (its start) as a JSON string, for a rejection's detail."""
    return json.dumps(text if len(text) <= limit else text[:limit] + "…", ensure_ascii=False)
