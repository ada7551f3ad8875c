"""Stage B.6, distractors: tools of *other* environments offered beside a record's own, chosen
by how similar they are to the record's tools — a near band (easy to confuse) and a far band.

Similarity is Okapi BM25 (``k1`` 1.5, ``b`` 0.75; standard library only) of a candidate's
name and description (names split at ``_``, ``-`` and camelCase, lower-cased, common words
dropped) against the same words of the record's tools. For one record, every tool of the
other records whose name is not one of the record's is a candidate; ranked by score (ties by
name, then record id):

* the **near band** is the ``near_pool`` best-ranked candidates with a score above zero;
* the **far band** is the candidates scoring at most ``far_ratio`` × the best score (words
  in common with none of the record's tools, at the default 0) and outside the near band;
  when it holds fewer than asked, the lowest-ranked other candidates fill in.

``near`` and ``far`` distractors are drawn from the bands with ``random.Random(f"{seed}:{id}")``
(the record's own stream: the same whatever the order, shard or resume), each name once.
"""

from __future__ import annotations

import heapq
import math
import random
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

_STOP = (
    "a an and any are as at be by for from get give given has have in into is it its of on "
    "one or out set that the their this to use used uses using with"
)
STOPWORDS = frozenset(_STOP.split())
_CAMEL = re.compile(r"([a-z0-9])([A-Z])")
_WORD = re.compile(r"[a-z0-9]+")


def words(text: str) -> list[str]:
    """Lower-cased words of a name or description: ``getCityPopulation`` → get, city, ..."""
    spaced = _CAMEL.sub(r"\1 \2", text).lower()
    return [w for w in _WORD.findall(spaced) if len(w) > 1 and w not in STOPWORDS]


@dataclass(frozen=True)
class Entry:
    """A tool as the index knows it: its record, its name, its words."""

    record: str
    name: str
    text: str

    @property
    def words(self) -> list[str]:
        return words(self.text)


@dataclass
class BM25:
    """Okapi BM25 over ``docs`` (word lists) with an inverted index: only the documents that
    share a word with the query are scored."""

    docs: Sequence[Sequence[str]]
    k1: float = 1.5
    b: float = 0.75
    _postings: dict[str, list[tuple[int, int]]] = field(default_factory=dict, init=False)
    _lengths: list[int] = field(default_factory=list, init=False)
    _idf: dict[str, float] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        for i, doc in enumerate(self.docs):
            self._lengths.append(len(doc))
            for word, tf in Counter(doc).items():
                self._postings.setdefault(word, []).append((i, tf))
        n = len(self.docs)
        for word, posting in self._postings.items():
            df = len(posting)
            self._idf[word] = math.log(1 + (n - df + 0.5) / (df + 0.5))
        self._avg = (sum(self._lengths) / n) if n else 0.0

    def scores(self, query: Iterable[str]) -> dict[int, float]:
        """Score of every document sharing a word with ``query`` (each query word once)."""
        out: dict[int, float] = {}
        for word in set(query):
            idf = self._idf.get(word)
            if idf is None:
                continue
            for i, tf in self._postings[word]:
                norm = self.k1 * (1 - self.b + self.b * self._lengths[i] / (self._avg or 1))
                out[i] = out.get(i, 0.0) + idf * tf * (self.k1 + 1) / (tf + norm)
        return out


@dataclass(frozen=True)
class Pick:
    entry: Entry
    band: str  # "near" or "far"
    score: float


class DistractorIndex:
    """The tools of a set of records, for drawing distractors of one record at a time."""

    def __init__(self, entries: Sequence[Entry]) -> None:
        self.entries = list(entries)
        self.bm25 = BM25([e.words for e in self.entries])

    def choose(
        self,
        record: str,
        own: Sequence[Entry],
        *,
        near: int,
        far: int,
        seed: int,
        near_pool: int = 10,
        far_ratio: float = 0.0,
    ) -> list[Pick]:
        """``near`` + ``far`` distractors for ``record`` whose tools are ``own`` (fewer when
        there are not enough candidates), near ones first."""
        names = {e.name for e in own}
        entries = self.entries

        def candidate(i: int) -> bool:
            return entries[i].record != record and entries[i].name not in names

        scored = {i: s for i, s in self.bm25.scores(w for e in own for w in e.words).items()
                  if candidate(i)}  # fmt: skip

        def rank(i: int) -> tuple[float, str, str]:
            return (-scored.get(i, 0.0), entries[i].name, entries[i].record)

        near_band = heapq.nsmallest(near_pool, scored, key=rank)
        rng = random.Random(f"{seed}:{record}")
        picks: list[Pick] = []
        taken: set[str] = set()

        def take(i: int, band: str) -> None:
            if entries[i].name not in taken:
                taken.add(entries[i].name)
                picks.append(Pick(entries[i], band, round(scored.get(i, 0.0), 4)))

        for i in rng.sample(near_band, len(near_band)):
            if len(picks) < near:
                take(i, "near")
        threshold = far_ratio * max(scored.values(), default=0.0)
        excluded = set(near_band)

        def in_far_band(i: int) -> bool:
            return candidate(i) and i not in excluded and scored.get(i, 0.0) <= threshold

        wanted = len(picks) + far
        for _ in range(64 * far):  # draws over the whole index: the band is most of it
            if len(picks) >= wanted or not entries:
                break
            i = rng.randrange(len(entries))
            if in_far_band(i):
                take(i, "far")
        if len(picks) < wanted:  # a small band, or small index: go through it in order
            band = [i for i in range(len(entries)) if in_far_band(i)]
            inside = set(band)
            rest = sorted((i for i in scored if i not in inside), key=rank)
            for i in [*rng.sample(band, len(band)), *reversed(rest)]:
                if len(picks) < wanted:
                    take(i, "far")
        return picks
