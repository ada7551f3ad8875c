"""Procedural arenas: seeded, deterministic arena records in the project's ASTRA-RL shape, with
training domains, held-out domains and held-out chain signatures (the paper's Table 2 in
miniature measures transfer on them). They live beside the hand-written arena set
(:data:`eval.arenas.DATA_DIR`): arena data, made by a program instead of by hand, that training
and evaluation both read.

Each domain of ``domains.yaml`` is a chain of three entity types (an order → its customer → the
customer's store), each with two attributes; its tools are one *link* tool per hop
(``get_order_customer(order_id)`` → the customer id) and one *attribute* tool per attribute
(``get_customer_email(customer_id)``), over small random tables. A task asks for one of five
*chain kinds*:

``attr``   one attribute of an entity whose id the question gives (1 call);
``hop``    an attribute of the entity linked to the given one (2 calls);
``hop2``   an attribute two links away (3 calls);
``both``   two attributes of one entity (2 independent calls);
``pair``   an attribute of the given entity and one of the entity it links to (3 calls).

Every chain call is a sub-question (its gold answer is what it returns: the linked id or the
value), scored by ``arena_reward``; ids such as ``ORD-4821`` must be copied from the question or
a tool result. 1-3 distractor tools of the same domain are offered beside the chain's.

Splits (``train`` and the held-out ``a``, ``b``, ``c``):

``a``  training domains and signatures, start entities the training tasks never use;
``b``  training domains, chain *signatures* (kind + the tools called) held out of training
       by a fixed hash, so no seed can move one into training;
``c``  held-out domains, whose entity and field words appear in no training domain.

These chains are the default. ``GenSpec.families`` can add the general task families of
:mod:`eval.arenas.procedural.families` (typed and optional arguments, one function among near
namesakes, parallel calls, several functions, no call, a follow-up turn) over the services of
``services.yaml``, split the same way (:mod:`eval.arenas.procedural.general`).
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
)

from astra_agent.claim import Claim, Refusal
from astra_agent.errors import ConfigError
from astra_agent.runio import file_sha256, write_lines_atomic
from eval.arenas.procedural.catalog import load_catalog
from eval.arenas.procedural.families import GENERAL
from eval.arenas.procedural.general import GeneralTasks
from eval.arenas.procedural.values import Attr, make_value

DOMAINS_FILE = Path(__file__).with_name("domains.yaml")
SPLITS = ("train", "a", "b", "c")
KINDS = ("attr", "hop", "hop2", "both", "pair")
FAMILIES = (*KINDS, *GENERAL)  # the chain kinds, then the general families (families.py)
TABLE_ROWS = 24  # entities per type and domain
_SIGNATURE_SALT = "astra-table2-signature-v1"  # fixed: the held-out signatures never move


class Entity(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(pattern=r"^[a-z]+$")
    prefix: str = Field(pattern=r"^[A-Z]{3}$")
    attrs: list[Attr] = Field(min_length=2, max_length=2)


class Domain(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(pattern=r"^[a-z]+$")
    verb: str = Field(pattern=r"^[a-z]+$")
    heldout: bool = False
    entities: list[Entity] = Field(min_length=3, max_length=3)

    def words(self) -> set[str]:
        """The entity and field words its tool names are made of (``id`` aside)."""
        out = {e.name for e in self.entities}
        out |= {w for e in self.entities for a in e.attrs for w in a.field.split("_")}
        return out - {"id"}


class GenSpec(BaseModel):
    """What the generator makes: the seed, the sizes, and which domains and what share of chain
    signatures are held out of training."""

    model_config = ConfigDict(extra="forbid")
    seed: int = Field(0, ge=0, description="seed of the tables, tasks and wording")
    train_tasks: int = Field(400, ge=1, le=20000, description="training tasks")
    eval_tasks: int = Field(60, ge=1, le=5000, description="tasks in each held-out split")
    heldout_domains: list[str] | None = Field(
        None, description="domains of split c (default: those marked heldout in domains.yaml)"
    )
    signature_holdout_pct: int = Field(
        20, ge=1, le=80, description="percent of chain signatures held out of training (split b)"
    )
    families: list[str] = Field(
        default_factory=lambda: list(KINDS),
        description="task families: chain kinds (attr, hop, hop2, both, pair) and general ones "
        "(typed, optional, choose, parallel, multi, none, followup); default: the chain kinds",
    )

    @field_validator("heldout_domains")
    @classmethod
    def _unique(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and len(set(v)) != len(v):
            raise ValueError(f"a domain is named twice: {v}")
        return v

    @field_validator("families")
    @classmethod
    def _known_families(cls, v: list[str]) -> list[str]:
        unknown = [f for f in v if f not in FAMILIES]
        if unknown or len(set(v)) != len(v) or not v:
            raise ValueError(f"families must be distinct names of {FAMILIES}, got {v}")
        return sorted(v, key=FAMILIES.index)

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Without ``families`` when it is the default: a spec of the chain kinds alone dumps
        (and is recorded in ``arenas.json`` and experiment fingerprints) as before the field."""
        data: dict[str, Any] = handler(self)
        if self.families == list(KINDS):
            data.pop("families", None)
        return data

    @property
    def general(self) -> list[str]:
        """The general families asked for (none: the chain generator as it always was)."""
        return [f for f in self.families if f in GENERAL]


def load_domains(path: Path = DOMAINS_FILE) -> list[Domain]:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    try:
        domains = [Domain.model_validate(d) for d in data["domains"]]
    except (TypeError, KeyError, ValueError) as exc:
        raise ConfigError(f"{path}: not a domains file: {exc}") from exc
    names = [d.name for d in domains]
    if len(set(names)) != len(names):
        raise ConfigError(f"{path}: a domain name is used twice")
    return domains


def split_domains(spec: GenSpec, domains: list[Domain]) -> tuple[list[Domain], list[Domain]]:
    """(training domains, held-out domains); a split that would put a held-out domain into
    training, by name or by its words, is refused."""
    by_name = {d.name: d for d in domains}
    names = spec.heldout_domains
    if names is None:
        names = [d.name for d in domains if d.heldout]
    unknown = sorted(set(names) - set(by_name))
    if unknown:
        raise ConfigError(
            f"unknown held-out domain(s) {unknown}", hint=f"known: {', '.join(by_name)}"
        )
    held = [by_name[n] for n in names]
    train = [d for d in domains if d.name not in names]
    if not held or not train:
        raise ConfigError("the split needs at least one training and one held-out domain")
    seen = set().union(*(d.words() for d in train))
    for d in held:
        shared = sorted(d.words() & seen)
        if shared:
            raise ConfigError(
                f"held-out domain {d.name!r} shares the words {shared} with the training "
                "domains: its tools would be seen in training",
                hint="hold out domains whose entity and field words are their own",
            )
    return train, held


def signature_heldout(signature: str, pct: int) -> bool:
    """Is this chain signature held out of training? A fixed hash of the signature alone."""
    digest = hashlib.sha256(f"{_SIGNATURE_SALT}|{signature}".encode()).hexdigest()
    return int(digest[:8], 16) % 100 < pct


@dataclass(frozen=True)
class Tables:
    """One domain's data: each entity type's ids, attribute values and link to the next."""

    ids: list[list[str]]  # per entity type
    values: list[dict[str, dict[str, str]]]  # per type: field → id → value
    links: list[dict[str, str]]  # per hop (0: type 0 → 1, 1: type 1 → 2): id → next id


def make_tables(domain: Domain, seed: int) -> Tables:
    rng = random.Random(f"tables|{seed}|{domain.name}")
    ids = []
    for e in domain.entities:
        nums = rng.sample(range(1000, 10000), TABLE_ROWS)
        ids.append([f"{e.prefix}-{n}" for n in nums])
    values = [
        {a.field: {i: make_value(a, rng) for i in ids[k]} for a in e.attrs}
        for k, e in enumerate(domain.entities)
    ]
    links = [{i: rng.choice(ids[k + 1]) for i in ids[k]} for k in range(2)]
    return Tables(ids, values, links)


# --------------------------------------------------------------------------- tools

# Every tool (attribute or link) looks its entity's id up in one table and returns the id and
# the value found (an attribute, or the linked entity's id) under ``out``.
_TOOL_SRC = """ROWS = {rows!r}


def {name}({param}):
    key = str({param}).strip().upper()
    if key not in ROWS:
        return {{"error": "no {entity} with id " + repr(str({param}))}}
    return {{"{param}": key, "{out}": ROWS[key]}}
"""


@dataclass(frozen=True)
class Tool:
    name: str
    entity: int  # the entity type it takes the id of
    field: str | None  # None: the link tool to entity + 1
    schema: dict[str, Any]
    source: str


def _schema(name: str, description: str, ent: Entity) -> dict[str, Any]:
    param = f"{ent.name}_id"
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {
                    param: {
                        "type": "string",
                        "description": f"{ent.name} id, e.g. '{ent.prefix}-1234'",
                    }
                },
                "required": [param],
            },
        },
    }


def _a(noun: str) -> str:
    return f"{'an' if noun[0] in 'aeiou' else 'a'} {noun}"


def domain_tools(domain: Domain, tables: Tables) -> dict[str, Tool]:
    """The domain's tools by name: 6 attribute tools and 2 link tools."""
    verb, tools = domain.verb, {}
    for k, ent in enumerate(domain.entities):
        param = f"{ent.name}_id"
        for a in ent.attrs:
            name = f"{verb}_{ent.name}_{a.field}"
            rows = dict(sorted(tables.values[k][a.field].items()))
            src = _TOOL_SRC.format(rows=rows, name=name, param=param, entity=ent.name, out=a.field)
            desc = f"The {a.label} of {_a(ent.name)}, by its {ent.name} id."
            tools[name] = Tool(name, k, a.field, _schema(name, desc, ent), src)
        if k < 2:
            nxt = domain.entities[k + 1].name
            name = f"{verb}_{ent.name}_{nxt}"
            rows = dict(sorted(tables.links[k].items()))
            out = f"{nxt}_id"
            src = _TOOL_SRC.format(rows=rows, name=name, param=param, entity=ent.name, out=out)
            desc = f"The {nxt} of {_a(ent.name)}: returns the {nxt} id."
            tools[name] = Tool(name, k, None, _schema(name, desc, ent), src)
    if len(tools) != 8:
        raise ConfigError(f"domain {domain.name!r}: two of its tools have one name")
    return tools


# --------------------------------------------------------------------------- tasks

_OPEN = ("", "", "Hi! ", "Quick question: ", "Please help me. ", "I need some data. ")
_CLOSE = ("", "", " Thanks!", " Use the tools to find out.", " Please look it up.")
_TEMPLATES: dict[str, tuple[str, ...]] = {
    "attr": (
        "What is the {l1} of {e} {id}?",
        "Look up the {l1} for {e} {id}.",
        "I have {e} {id}. Tell me its {l1}.",
        "Find the {l1} recorded for {e} {id}.",
    ),
    "hop": (
        "What is the {l2} of the {n} of {e} {id}?",
        "{E} {id} belongs to {an}. What is that {n}'s {l2}?",
        "Find the {n} linked to {e} {id} and tell me its {l2}.",
        "For {e} {id}, I need the {l2} of its {n}.",
    ),
    "hop2": (
        "What is the {l2} of the {n2} of the {n} of {e} {id}?",
        "Start from {e} {id}: find its {n}, then that {n}'s {n2}, and tell me the {n2}'s {l2}.",
        "{E} {id} leads to {an}, which leads to {an2}. What is the {n2}'s {l2}?",
        "I need the {l2} of the {n2} behind {e} {id} (through its {n}).",
    ),
    "both": (
        "What are the {l1} and the {l2} of {e} {id}?",
        "For {e} {id}, tell me both its {l1} and its {l2}.",
        "Look up {e} {id}: I need its {l1} as well as its {l2}.",
        "Two things about {e} {id}: its {l1}, and its {l2}.",
    ),
    "pair": (
        "What is the {l1} of {e} {id}, and what is the {l2} of its {n}?",
        "For {e} {id}, I need its {l1} and the {l2} of the {n} it belongs to.",
        "Tell me the {l1} of {e} {id}. Also find its {n} and give me that {n}'s {l2}.",
        "Two things about {e} {id}: its {l1}, and the {l2} of its {n}.",
    ),
}


@dataclass(frozen=True)
class Plan:
    """A chain shape in one domain: the kind, the start entity type, the attributes asked."""

    kind: str
    start: int
    attrs: tuple[int, ...]  # attribute indices, see :func:`_chain`

    def tools(self, domain: Domain) -> list[str]:
        v, es = domain.verb, domain.entities

        def attr(k: int, a: int) -> str:
            return f"{v}_{es[k].name}_{es[k].attrs[a].field}"

        def link(k: int) -> str:
            return f"{v}_{es[k].name}_{es[k + 1].name}"

        k, a = self.start, self.attrs
        return {
            "attr": lambda: [attr(k, a[0])],
            "hop": lambda: [link(k), attr(k + 1, a[0])],
            "hop2": lambda: [link(0), link(1), attr(2, a[0])],
            "both": lambda: [attr(k, 0), attr(k, 1)],
            "pair": lambda: [attr(k, a[0]), link(k), attr(k + 1, a[1])],
        }[self.kind]()

    def signature(self, domain: Domain) -> str:
        return f"{domain.name}:{self.kind}:{'>'.join(self.tools(domain))}"


def plans() -> list[Plan]:
    """Every chain shape of a domain (23)."""
    out = [Plan("attr", k, (a,)) for k in range(3) for a in range(2)]
    out += [Plan("hop", k, (a,)) for k in range(2) for a in range(2)]
    out += [Plan("hop2", 0, (a,)) for a in range(2)]
    out += [Plan("both", k, (0, 1)) for k in range(3)]
    out += [Plan("pair", k, (a, b)) for k in range(2) for a in range(2) for b in range(2)]
    return out


def _prompt(domain: Domain, plan: Plan, start_id: str, rng: random.Random) -> str:
    es, k, a = domain.entities, plan.start, plan.attrs
    nxt = es[min(k + 1, 2)].name
    if plan.kind == "hop2":
        slots = {"n": es[1].name, "n2": es[2].name, "l2": es[2].attrs[a[0]].label}
    elif plan.kind == "hop":
        slots = {"n": nxt, "l2": es[k + 1].attrs[a[0]].label}
    elif plan.kind == "both":
        slots = {"l1": es[k].attrs[0].label, "l2": es[k].attrs[1].label}
    elif plan.kind == "pair":
        slots = {"n": nxt, "l1": es[k].attrs[a[0]].label, "l2": es[k + 1].attrs[a[1]].label}
    else:
        slots = {"l1": es[k].attrs[a[0]].label}
    e = es[k].name
    if "n" in slots:
        slots["an"] = _a(slots["n"])
    if "n2" in slots:
        slots["an2"] = _a(slots["n2"])
    text = rng.choice(_TEMPLATES[plan.kind]).format(e=e, E=e.capitalize(), id=start_id, **slots)
    return rng.choice(_OPEN) + text + rng.choice(_CLOSE)


def _run_chain(
    names: list[str], tools: dict[str, Tool], tables: Tables, start_id: str
) -> tuple[list[dict[str, Any]], dict[str, list[str]]]:
    """The reference calls and each one's gold answer, computed from the tables (the sandbox
    run of the same chain is the self-check)."""
    ids = {tools[names[0]].entity: start_id}
    reference, golds = [], {}
    for name in names:
        tool = tools[name]
        arg = ids[tool.entity]
        reference.append({"name": name, "arguments": {f"{_entity_param(tool)}": arg}})
        if tool.field is None:
            nid = tables.links[tool.entity][arg]
            ids[tool.entity + 1] = nid
            golds[name] = [nid]
        else:
            golds[name] = [tables.values[tool.entity][tool.field][arg]]
    return reference, golds


def _entity_param(tool: Tool) -> str:
    return next(iter(tool.schema["function"]["parameters"]["properties"]))


@dataclass(frozen=True)
class _Pool:
    """Where one split draws its tasks: the domains, the plans allowed in each, the rows its
    start entities come from (``None``: every row)."""

    domains: list[Domain]
    plans: dict[str, list[Plan]]
    rows: slice | None


def _pools(spec: GenSpec, domains: list[Domain]) -> dict[str, _Pool]:
    train, held = split_domains(spec, domains)
    pct = spec.signature_holdout_pct
    kept = {
        d.name: [p for p in plans() if not signature_heldout(p.signature(d), pct)] for d in train
    }
    out = {d.name: [p for p in plans() if signature_heldout(p.signature(d), pct)] for d in train}
    if not any(out.values()) or not all(kept.values()):
        raise ConfigError(
            f"signature_holdout_pct {pct} leaves split b or a training domain without tasks"
        )
    return {
        "train": _Pool(train, kept, slice(0, None, 2)),
        "a": _Pool(train, kept, slice(1, None, 2)),
        "b": _Pool([d for d in train if out[d.name]], out, None),
        "c": _Pool(held, {d.name: plans() for d in held}, None),
    }


def _record(
    split: str,
    n: int,
    domain: Domain,
    plan: Plan,
    start_id: str,
    ctx: tuple[dict[str, Tool], Tables],
    rng: random.Random,
) -> dict[str, Any]:
    tools, tables = ctx
    chain = plan.tools(domain)
    reference, golds = _run_chain(chain, tools, tables, start_id)
    others = sorted(set(tools) - set(chain))
    n_dis = rng.randint(max(1, 3 - len(chain)), min(3, 6 - len(chain)))
    offered = sorted([*chain, *rng.sample(others, n_dis)])
    return {
        "prompt": [{"role": "user", "content": _prompt(domain, plan, start_id, rng)}],
        "tool_schema": json.dumps([tools[t].schema for t in offered]),
        "tool_dict": json.dumps({t: tools[t].source for t in offered}),
        "sub_qa_dict": json.dumps(golds),
        "task_id": f"{split}-{domain.name}-{n:04d}",
        "domain": domain.name,
        "reference": reference,
        "split": split,
        "kind": plan.kind,
        "signature": plan.signature(domain),
    }


def _chain_record(
    split: str,
    n: int,
    pool: _Pool,
    ctx: dict[str, tuple[dict[str, Tool], Tables]],
    rng: random.Random,
    seen: set[tuple[str, str]],
    kinds: tuple[str, ...],
) -> dict[str, Any] | None:
    """One chain task of ``kinds`` (one kind: drawn by the caller; several: drawn here after
    the domain), or None for a (signature, start) the split already has."""
    domains = [d for d in pool.domains if any(p.kind in kinds for p in pool.plans[d.name])]
    if not domains:
        raise ConfigError(f"split {split} has no chain task of the kinds {list(kinds)}")
    d = rng.choice(domains)
    kind = kinds[0]
    if len(kinds) > 1:
        kind = rng.choice(sorted({p.kind for p in pool.plans[d.name] if p.kind in kinds}))
    plan = rng.choice([p for p in pool.plans[d.name] if p.kind == kind])
    rows = ctx[d.name][1].ids[plan.start]
    start = rng.choice(rows[pool.rows] if pool.rows else rows)
    if (plan.signature(d), start) in seen:
        return None
    seen.add((plan.signature(d), start))
    return _record(split, n, d, plan, start, ctx[d.name], rng)


def _chain_kinds(pool: _Pool, kinds: list[str]) -> list[str]:
    have = {p.kind for plans in pool.plans.values() for p in plans}
    return [k for k in kinds if k in have]


def _general(spec: GenSpec, domains: list[Domain]) -> GeneralTasks | None:
    if not spec.general:
        return None
    train, held = split_domains(spec, domains)
    words = (set().union(*(d.words() for d in train)), set().union(*(d.words() for d in held)))
    pct = spec.signature_holdout_pct
    return GeneralTasks.of(spec.general, words, lambda s: signature_heldout(s, pct))


def generate(spec: GenSpec, domains: list[Domain] | None = None) -> dict[str, list[dict[str, Any]]]:
    """Every split's records, deterministic for ``spec``. Chain kinds alone (the default): a
    domain drawn uniformly, then a chain kind, then a shape of that kind and a start entity;
    no (signature, start) twice in a split. With general families: first a family, drawn
    uniformly, the chain kinds asked counting as one; then a task of it (:mod:`general`)."""
    domains = domains if domains is not None else load_domains()
    pools = _pools(spec, domains)
    ctx = {d.name: (domain_tools(d, t := make_tables(d, spec.seed)), t) for d in domains}
    chain_kinds = [f for f in spec.families if f in KINDS]
    general = _general(spec, domains)
    out: dict[str, list[dict[str, Any]]] = {}
    for split in SPLITS:
        pool, rng = pools[split], random.Random(f"tasks|{spec.seed}|{split}")
        want = spec.train_tasks if split == "train" else spec.eval_tasks
        seen: set[tuple[str, str]] = set()
        records: list[dict[str, Any]] = []
        kinds = _chain_kinds(pool, chain_kinds)
        slots = (["chains"] if kinds else []) + (general.pools[split].families() if general else [])
        if not slots:
            raise ConfigError(f"split {split} has no task of the families {spec.families}")
        for _ in range(want * 50):
            if len(records) == want:
                break
            n = len(records)
            if general is None:
                record = _chain_record(split, n, pool, ctx, rng, seen, tuple(kinds))
            elif (slot := rng.choice(slots)) == "chains":
                kind = (rng.choice(kinds),)
                record = _chain_record(split, n, pool, ctx, rng, seen, kind)
            else:
                record = general.record(split, n, slot, rng)
            if record is not None:
                records.append(record)
        if len(records) < want:
            raise ConfigError(f"split {split}: only {len(records)} distinct tasks, {want} asked")
        out[split] = records
    check_split(out, spec, domains)
    return out


def _start(record: dict[str, Any]) -> str:
    """The id a task starts from."""
    return str(next(iter(record["reference"][0]["arguments"].values())))


def check_split(
    splits: dict[str, list[dict[str, Any]]], spec: GenSpec, domains: list[Domain] | None = None
) -> None:
    """No training record of a held-out domain, service or signature, no start entity (chains)
    or task values (general families) of split a in training, no first or last user turn
    twice: a ConfigError naming the first record that breaks it."""
    domains = domains if domains is not None else load_domains()
    _, held = split_domains(spec, domains)
    held_names = {d.name for d in held}
    if spec.general:
        held_names |= {s.name for s in load_catalog().services if s.heldout}
    train_starts = {_start(r) for r in splits["train"] if "instance" not in r}
    train_values = {r["instance"] for r in splits["train"] if "instance" in r}
    for r in splits["train"]:
        if r["domain"] in held_names or signature_heldout(
            r["signature"], spec.signature_holdout_pct
        ):
            raise ConfigError(f"training task {r['task_id']} is of a held-out domain or signature")
    for r in splits.get("a", []):
        seen = r["instance"] in train_values if "instance" in r else _start(r) in train_starts
        if seen:
            raise ConfigError(f"task {r['task_id']} of split a starts where a training task does")
    for end in (0, -1):
        prompts = [r["prompt"][end]["content"] for rs in splits.values() for r in rs]
        if len(set(prompts)) != len(prompts):
            raise ConfigError("two generated tasks have the same prompt")


MANIFEST = "arenas.json"
_OTHER_SPEC = Refusal(
    "{dir} holds arenas of another spec ({differences})",
    hint="use another --out, or the spec it was written with",
)


def write_arenas(out: Path, spec: GenSpec) -> dict[str, Path]:
    """Generate and write ``OUT/{train,a,b,c}.jsonl`` and ``OUT/arenas.json`` (the spec, the
    counts and each file's SHA-256), each file whole. A directory written under another spec
    is refused with the differences named; under the same spec it is left as it is."""
    claim = Claim(out, MANIFEST, spec.model_dump(), _OTHER_SPEC, key="spec")
    claim.check_place("--out", hint="name a directory")
    paths = {s: out / f"{s}.jsonl" for s in SPLITS}
    old = claim.recorded()
    if old is not None:
        claim.refuse_other(old)
        sha = old.get("sha256")
        if isinstance(sha, dict) and all(
            p.is_file() and file_sha256(p) == sha.get(s) for s, p in paths.items()
        ):
            return paths
    splits = generate(spec)
    out.mkdir(parents=True, exist_ok=True)
    for s, p in paths.items():
        write_lines_atomic(p, (json.dumps(r, ensure_ascii=False) + "\n" for r in splits[s]))
    counts = {s: len(rs) for s, rs in splits.items()}
    sha256 = {s: file_sha256(p) for s, p in paths.items()}
    claim.write({"spec": spec.model_dump(), "counts": counts, "sha256": sha256})
    return paths
