"""What the decomposition stage grows its questions from: domains, a taxonomy, seed questions.

* a domain list: one name a line, or JSON objects with ``name`` (or ``domain``, as ASTRA's
  ``domains.jsonl``) and ``description``; blank lines and ``#`` comments are skipped;
* a taxonomy: a JSON tree of objects and lists of names; each leaf is a domain named by its
  path (``{"finance": ["loans", "stocks"]}`` gives ``finance / loans`` and ``finance / stocks``);
* seed questions: JSONL with ``question`` and optionally ``answer``, ``domain``, ``id``.

Each domain gives ``per_domain`` units (``<slug>:<k>``, k = 0, 1, …), each seed one
(``seed:<id>``, the id being the seed's own or a hash of its question).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from astra_agent.errors import ConfigError
from astra_agent.runio import jsonl_lines
from training.synth.envs.records import ID_PATTERN
from training.synth.inputs import read_records
from training.synth.stage import Rejection


class DomainSpec(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str = Field(min_length=1, max_length=200, pattern=r"\S")
    description: str = Field("", max_length=2000)

    @model_validator(mode="before")
    @classmethod
    def _domain_key(cls, data: Any) -> Any:  # ASTRA's domains.jsonl says "domain"
        if isinstance(data, dict) and "name" not in data and "domain" in data:
            data = {**data, "name": data["domain"]}
        return data


class SeedQuestion(BaseModel):
    model_config = ConfigDict(extra="ignore")

    question: str = Field(min_length=10, max_length=2000, pattern=r"\S")
    answer: str | None = Field(None, min_length=1, max_length=1000, pattern=r"\S")
    domain: str = Field("general", min_length=1, max_length=200, pattern=r"\S")
    id: str | None = Field(None, pattern=ID_PATTERN)

    def key(self) -> str:
        return self.id or hashlib.sha256(self.question.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Slot:
    """One unit: the ``index``-th question of ``domain``, or the decomposition of ``seed``."""

    domain: DomainSpec
    index: int = 0
    seed: SeedQuestion | None = None

    @property
    def source(self) -> str:
        return f"seed {self.seed.key()}" if self.seed else f"domain {self.domain.name!r}"


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:60] or "domain"


def read_domains(path: Path, stage: str) -> tuple[list[DomainSpec], list[Rejection]]:
    """The domains of a domain list; a line that is not one is a ``bad_domain`` rejection."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    got: list[DomainSpec] = []
    bad: list[Rejection] = []
    for n, line in enumerate(jsonl_lines(text), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            if line.startswith("{"):
                got.append(DomainSpec.model_validate_json(line))
            else:
                got.append(DomainSpec(name=line))
        except ValidationError as exc:
            why = exc.errors()[0]["msg"]
            bad.append(
                Rejection(stage=stage, source=f"{path}:{n}", reason="bad_domain", detail=why)
            )
    return got, bad


def read_taxonomy(path: Path) -> list[DomainSpec]:
    """The leaves of a taxonomy, as domains named by their paths."""
    try:
        tree = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"cannot read the taxonomy {path}: {exc}") from None
    out: list[DomainSpec] = []

    def walk(node: Any, trail: list[str]) -> None:
        if isinstance(node, dict) and node:
            for key, child in node.items():
                walk(child, [*trail, str(key)])
        elif isinstance(node, list) and node:
            for child in node:
                walk(child, trail)
        elif isinstance(node, str) and node.strip():
            walk(None, [*trail, node.strip()])
        elif trail:
            out.append(DomainSpec(name=" / ".join(trail), description=" > ".join(trail)))

    walk(tree, [])
    if not out:
        raise ConfigError(f"the taxonomy {path} names no domain")
    return out


def build_slots(
    domains: Sequence[DomainSpec], seeds: Sequence[tuple[int, SeedQuestion]], per_domain: int,
    *, stage: str, seed_file: Path | None = None,
) -> tuple[list[tuple[str, Slot]], list[Rejection]]:  # fmt: skip
    """The units, keyed, each key once: a second domain of the same slug is a
    ``duplicate_domain`` rejection, a second seed of the same id a ``duplicate_seed``."""
    units: dict[str, Slot] = {}
    rejected: list[Rejection] = []
    seen: set[str] = set()
    for d in domains:
        key = slug(d.name)
        if key in seen:
            rejected.append(Rejection(stage=stage, source=f"domain {d.name!r}", id=key,
                                      reason="duplicate_domain"))  # fmt: skip
            continue
        seen.add(key)
        for k in range(per_domain):
            units[f"{key}:{k}"] = Slot(d, k)
    for line, s in seeds:
        key = f"seed:{s.key()}"
        if key in units:
            rejected.append(Rejection(stage=stage, source=f"{seed_file}:{line}", id=key,
                                      reason="duplicate_seed"))  # fmt: skip
            continue
        units[key] = Slot(DomainSpec(name=s.domain), 0, s)
    return list(units.items()), rejected


def read_sources(
    *, domains: Path | None, taxonomy: Path | None, seeds: Path | None, per_domain: int, stage: str
) -> tuple[list[tuple[str, Slot]], list[Rejection], list[Path]]:
    """The units of the inputs, the lines refused, and the files read (for the fingerprint)."""
    specs: list[DomainSpec] = []
    rejected: list[Rejection] = []
    files: list[Path] = []
    if domains:
        specs, rejected = read_domains(domains, stage)
        files.append(domains)
    if taxonomy:
        specs += read_taxonomy(taxonomy)
        files.append(taxonomy)
    questions: list[tuple[int, SeedQuestion]] = []
    if seeds:
        questions, bad = read_records(seeds, SeedQuestion, stage)
        rejected += bad
        files.append(seeds)
    if not specs and not questions:
        raise ConfigError("the inputs name no domain and no seed question")
    slots, more = build_slots(specs, questions, per_domain, stage=stage, seed_file=seeds)
    return slots, rejected + more, files
