"""What a tool takes and what it gives, in words: the vocabulary the graph builder compares.

A tool's *signature* holds its parameters (name tokens, JSON type, description tokens, whether
required, and — for id-like parameters such as ``flight_id``, ``userId``, ``entityNames`` — the
entity they are a key of), the fields of its output schema, every token of what it is said to
return (output fields, an ``output_description`` hint, the "Returns …" clause of its
description, the entity a listing or search names), and the entities whose keys its result
holds. Names are split at ``_``, ``-``, spaces and camelCase, lower-cased and singularized
("flights" → "flight"); words in any script are kept (a Chinese name is one token).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from training.synth.tools.pool import ToolRecord


def _vocabulary(text: str) -> frozenset[str]:
    return frozenset(text.split())


# a listing, a search or a creation yields the entities its name holds, with their keys
PRODUCERS = _vocabulary(
    "list search find query lookup browse discover scan create add new register insert make "
    "generate book reserve upload post submit open"
)
# a creation's own keys name new entities, not existing ones
CREATORS = _vocabulary("create add new register insert make generate upload post submit")
# a read yields its entity too, unless it needs that entity's key itself
READERS = _vocabulary("get fetch retrieve read show describe view load download")
VERBS = (
    PRODUCERS
    | READERS
    | _vocabulary(
        "update edit modify set delete remove cancel move rename convert send check validate "
        "calculate compute analyze compare toggle trigger echo write sort filter"
    )
)
KEYS = {"id": 1.0, "ids": 1.0, "uuid": 1.0, "key": 1.0, "name": 0.85, "names": 0.85}
STOP = _vocabulary(
    "a an the of to for in on by with and or from this that these is are be it its as at "
    "specific given optional e g eg etc use used which will can if when all any each one "
    "more multiple into via your you their based default"
)
GENERIC = _vocabulary(
    "content message result data text value output response info status success error type "
    "item object list string number"
)
RETURNS = re.compile(
    r"\b(?:returns?|returning|gives?|outputs?|yields?|provides?|responds? with)\b([^.;\n]*)",
    re.IGNORECASE,
)
# identifiers written in prose ("returns the booking_id", "with its flightId")
_IDENT = re.compile(r"\b[A-Za-z][A-Za-z0-9]*(?:_[A-Za-z0-9]+)+\b|\b[a-z]+(?:[A-Z][a-z0-9]*)+\b")
_WORD = re.compile(r"[^\W_]+", re.UNICODE)
_CAMEL = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+|[^\W\d_a-zA-Z]+")
MAX_DEPTH = 3


def singular(word: str) -> str:
    if len(word) <= 3 or not word.isascii():
        return word
    if word.endswith("ies"):
        return word[:-3] + "y"
    if word.endswith(("ses", "xes", "zes", "ches", "shes")) and not word.endswith("uses"):
        return word[:-2]
    if word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


def split_name(name: str) -> tuple[str, ...]:
    """``searchFlights`` / ``search_flights`` / ``search-flights`` → ("search", "flight")."""
    out: list[str] = []
    for word in _WORD.findall(name):
        parts = _CAMEL.findall(word) if word.isascii() else [word]
        out += [singular(p.lower()) for p in parts or [word]]
    return tuple(out)


def words(text: str) -> frozenset[str]:
    """The content words of a description (no stop words, no single letters)."""
    return frozenset(
        t for t in split_name(text) if t not in STOP and (len(t) > 1 or not t.isascii())
    )


def json_type(schema: Any) -> str | None:
    if not isinstance(schema, dict):
        return None
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), None)
    if kind is None and isinstance(schema.get("anyOf"), list):
        kind = next(filter(None, (json_type(s) for s in schema["anyOf"])), None)
    return kind if isinstance(kind, str) else None


@dataclass(frozen=True)
class Field:
    """A parameter of a tool, or a field of its output (``path`` dotted, ``[]`` for items)."""

    path: str
    tokens: tuple[str, ...]
    type: str | None
    items_type: str | None
    words: frozenset[str]
    required: bool
    description: str = ""
    key_of: tuple[str, ...] | None = None  # the entity this field is a key of
    key_weight: float = 0.0


@dataclass(frozen=True)
class Signature:
    id: str
    name: str
    server: str
    domain: str
    verb: str | None
    entity: tuple[str, ...]
    params: tuple[Field, ...]
    outputs: tuple[Field, ...]
    returns: frozenset[str]  # every token of what the result is said to hold
    produces: frozenset[tuple[str, ...]]  # entities whose keys the result holds
    words: frozenset[str]  # every token of the tool (for the pool's token weights)


def _resolve(schema: Any, root: dict[str, Any], depth: int = 0) -> Any:
    """Follow a local ``#/…`` ref (a few hops at most); anything else as it is."""
    while isinstance(schema, dict) and isinstance(schema.get("$ref"), str) and depth < 8:
        ref = schema["$ref"]
        if not ref.startswith("#/"):
            return {}
        node: Any = root
        for part in ref[2:].split("/"):
            node = node.get(part) if isinstance(node, dict) else None
        schema, depth = node if isinstance(node, dict) else {}, depth + 1
    return schema


def _key(tokens: tuple[str, ...], owner: tuple[str, ...]) -> tuple[tuple[str, ...] | None, float]:
    """``flight_id`` → (("flight",), 1.0); a bare ``id`` is a key of ``owner`` (the tool's
    entity, or the object it sits in)."""
    raw = tokens[-1] if tokens else ""
    weight = KEYS.get(raw) or KEYS.get(singular(raw), 0.0)
    if not weight:
        return None, 0.0
    entity = tuple(t for t in tokens[:-1] if t not in STOP) or owner
    return (entity or None), weight


def fields(
    schema: Any, root: dict[str, Any], owner: tuple[str, ...], prefix: str = "", depth: int = 0
) -> list[Field]:
    """The properties of an object schema, and (a few levels down) those of its nested
    objects and array items. ValueError where the schema is not one (properties not a
    mapping)."""
    schema = _resolve(schema, root)
    if not isinstance(schema, dict) or depth > MAX_DEPTH:
        return []
    props = schema.get("properties", {})
    if not isinstance(props, dict):
        raise ValueError(f"{prefix or 'the schema'}: properties is not an object")
    required = schema.get("required", [])
    required = set(required) if isinstance(required, list) else set()
    out: list[Field] = []
    for name, sub in props.items():
        sub = _resolve(sub, root)
        sub = sub if isinstance(sub, dict) else {}
        tokens = split_name(str(name))
        kind = json_type(sub)
        items = _resolve(sub.get("items"), root) if kind == "array" else None
        key_of, weight = _key(tokens, owner)
        path = f"{prefix}{name}"
        text = str(sub.get("description", "") or "")
        out.append(
            Field(
                path=path,
                tokens=tokens,
                type=kind,
                items_type=json_type(items),
                words=words(f"{text} {sub.get('title', '') or ''}"),
                required=name in required,
                description=text,
                key_of=key_of,
                key_weight=weight,
            )
        )
        inner = items if kind == "array" else sub
        if json_type(inner) == "object" or (isinstance(inner, dict) and "properties" in inner):
            child = tuple(singular(t) for t in tokens if t not in STOP) or owner
            out += fields(
                inner, root, child, f"{path}{'[]' if kind == 'array' else ''}.", depth + 1
            )
    return out


def _name_parts(name: str) -> tuple[str | None, tuple[str, ...]]:
    tokens = split_name(name)
    verb = tokens[0] if tokens and tokens[0] in VERBS else None
    entity = tuple(t for t in (tokens[1:] if verb else tokens) if t not in STOP)
    return verb, entity


def _produces(
    verb: str | None,
    entity: tuple[str, ...],
    params: list[Field],
    outputs: list[Field],
    said: list[str],
) -> frozenset[tuple[str, ...]]:
    """The entities whose keys a tool's result holds: those it lists, searches or creates (or
    reads without needing their key), and those keyed by an output field ("booking_id", "id"
    inside "bookings[]", an identifier in its "Returns …" clause) — unless it takes that key
    itself (it only echoes it back)."""
    made: set[tuple[str, ...]] = set()
    needs = {p.key_of for p in params if p.key_of}
    if entity and (verb in PRODUCERS or (verb in READERS and entity not in needs)):
        made.add(entity)
    keys = [f.key_of for f in outputs] + [_key(split_name(i), ())[0] for i in said]
    made |= {k for k in keys if k and k not in needs}
    return frozenset(made)


def signature(tool: ToolRecord) -> Signature:
    """ValueError where the tool's schemas cannot be read."""
    verb, entity = _name_parts(tool.name)
    params = fields(tool.input_schema, tool.input_schema, entity)
    out_schema = tool.output_schema or {}
    outputs = fields(out_schema, out_schema, entity) if out_schema else []
    # output field names are matched by name (with their types); here their descriptions
    returns: set[str] = set(words(tool.output_description))
    for f in outputs:
        returns |= f.words
    clauses = [m.group(1) for m in RETURNS.finditer(tool.description)]
    for clause in clauses:
        returns |= words(clause)
    said = [i for text in [tool.output_description, *clauses] for i in _IDENT.findall(text)]
    if not outputs and (verb in PRODUCERS or verb in READERS):  # a schema says it better
        returns |= set(entity)
    every = set(split_name(tool.name)) | words(tool.description) | returns
    for f in outputs:
        every |= set(f.tokens)
    for p in params:
        every |= set(p.tokens) | p.words
    return Signature(
        id=tool.id,
        name=tool.name,
        server=tool.server,
        domain=tool.domain,
        verb=verb,
        entity=entity,
        params=tuple(params),
        outputs=tuple(outputs),
        returns=frozenset(returns - STOP),
        produces=_produces(verb, entity, params, outputs, said),
        words=frozenset(every - STOP),
    )


def token_weights(signatures: Iterable[Signature]) -> dict[str, float]:
    """Inverse document frequency over the pool: a token most tools share says little."""
    sigs = list(signatures)
    df = Counter(t for s in sigs for t in s.words)
    n = max(len(sigs), 1)
    return {t: math.log(1 + n / c) for t, c in df.items()}
