"""Tool arguments checked against the tool's JSON schema: nothing fetched, bounded in time.

The schemas come from the tool's server, so they are untrusted input:

* **Nothing is fetched.** jsonschema's default registry retrieves unknown ``$ref`` URIs with
  ``urlopen`` (``http://``, ``file://``, relative to an ``$id``). Here only local references
  (``#…``) are resolved: a schema with any other ``$ref``/``$dynamicRef``/``$recursiveRef``
  is not checked at all (the call goes to the tool, which decides), and the validator's
  registry retrieves nothing (a second lock on the same door).
* **Bounded in time.** Python's ``re`` backtracks, and it holds the GIL for a whole match:
  ``^(a+)+$`` against ``"a" * 26 + "!"`` took 5.6 s here, during which no other thread — the
  event loop included, even if the match runs in a worker thread — ran once. So the keywords
  that match regular expressions (``pattern``, ``patternProperties``, ``additionalProperties``)
  use the ``regex`` engine instead, with ``timeout=`` (it stops the match at the deadline) and
  ``concurrent=True`` (it releases the GIL while matching: 166 loop ticks of 10 ms during a
  1.7 s match). The whole check runs in a worker thread under ``budget_s`` (≤ 2 s), so the
  loop stays responsive; a thread cannot be killed, but the regex deadline ends it, and the
  rest of jsonschema is pure Python (bounded by the size of the arguments). Constructs that
  would reach ``re`` through jsonschema's own code are not checked: ``unevaluatedProperties``
  together with ``patternProperties``, and a ``$schema`` below the root (it switches to a
  stock validator class). ``format`` is an annotation only (no format checker), as before.
* **Failures are data.** A schema that is broken, not checkable, or whose check runs out of
  budget is skipped with one warning per schema, and the call goes to the tool: the server's
  fault is not charged to the model. Only arguments that fail a completed check are an error.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import regex

from astra_agent.environment import ToolSpec

log = logging.getLogger(__name__)

SCHEMA_BUDGET_S = 2.0  # the most a check may take; less when the call's own timeout is shorter
_REF_KEYS = ("$ref", "$dynamicRef", "$recursiveRef")


@dataclass(frozen=True)
class _Compiled:
    validator: Any  # None: not checked
    why: str = ""  # why not
    regexes: bool = True  # it matches regular expressions: check off the loop, under a deadline


_VALIDATORS: dict[int, tuple[ToolSpec, _Compiled]] = {}  # by tool spec object
_COMPILED: dict[str, _Compiled] = {}  # by schema text: checking a schema costs ~1 ms
_WARNED: set[str] = set()
_deadline = threading.local()


# --------------------------------------------------------------------------- bounded regexes


@functools.lru_cache(maxsize=1024)
def _regex(pattern: str) -> Any:
    return regex.compile(pattern)


def _search(pattern: str, text: str) -> bool:
    """``re.search`` semantics on the regex engine, stopped at this thread's deadline."""
    left = getattr(_deadline, "at", float("inf")) - time.monotonic()
    if left <= 0:
        raise TimeoutError("schema check out of time")
    timeout = None if left == float("inf") else left
    return _regex(pattern).search(text, timeout=timeout, concurrent=True) is not None


def _pattern(validator: Any, patrn: str, instance: Any, schema: Any) -> Iterator[Any]:
    from jsonschema import ValidationError

    if validator.is_type(instance, "string") and not _search(patrn, instance):
        yield ValidationError(f"{instance!r} does not match {patrn!r}")


def _pattern_properties(validator: Any, pp: dict, instance: Any, schema: Any) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in pp.items():
        for key, value in instance.items():
            if _search(pattern, key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties(validator: Any, ap: Any, instance: Any, schema: Any) -> Iterator[Any]:
    from jsonschema import ValidationError

    if not validator.is_type(instance, "object"):
        return
    properties = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    extras = [
        k for k in instance if k not in properties and not any(_search(p, k) for p in patterns)
    ]
    if validator.is_type(ap, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], ap, path=extra)
    elif not ap and extras:
        names = ", ".join(repr(e) for e in sorted(extras, key=str))
        if patterns:
            regexes = ", ".join(repr(p) for p in sorted(patterns))
            verb = "does" if len(extras) == 1 else "do"
            yield ValidationError(f"{names} {verb} not match any of the regexes: {regexes}")
        else:
            verb = "was" if len(extras) == 1 else "were"
            yield ValidationError(
                f"Additional properties are not allowed ({names} {verb} unexpected)"
            )


_BOUNDED = {
    "pattern": _pattern,
    "patternProperties": _pattern_properties,
    "additionalProperties": _additional_properties,
}


# --------------------------------------------------------------------------- compiling


def _walk(node: Any, root: bool = True) -> Iterator[tuple[str, Any, bool]]:
    """Every (key, value, at_root) of every mapping in a schema document."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield key, value, root
            yield from _walk(value, False)
    elif isinstance(node, list):
        for item in node:
            yield from _walk(item, False)


def unchecked_reason(schema: Any) -> str:
    """Why a schema cannot be checked safely here ('' if it can)."""
    keys: set[str] = set()
    for key, value, at_root in _walk(schema):
        if key in _REF_KEYS and isinstance(value, str) and not value.startswith("#"):
            return f"it refers to {value!r} (only local '#…' references are resolved)"
        if key == "$schema" and isinstance(value, str) and not at_root:
            return "it declares '$schema' below its root"
        keys.add(key)
    if {"unevaluatedProperties", "patternProperties"} <= keys:
        return "it combines unevaluatedProperties with patternProperties"
    return ""


def _refuse(uri: str) -> Any:
    from referencing.exceptions import NoSuchResource

    raise NoSuchResource(ref=uri)  # type: ignore[call-arg]


@functools.cache
def _registry() -> Any:
    from referencing import Registry

    return Registry(retrieve=_refuse)  # type: ignore[call-arg]


def compile_schema(schema: Any) -> _Compiled:
    """A validator whose regexes are bounded and that fetches nothing, or why there is none."""
    import jsonschema

    if not isinstance(schema, dict):
        return _Compiled(None, "it is not a JSON object")
    if why := unchecked_reason(schema):
        return _Compiled(None, why)
    base = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        base.check_schema(schema)
    except jsonschema.SchemaError as exc:
        return _Compiled(None, f"it is not a valid JSON schema ({exc.message})")
    bounded = {k: f for k, f in _BOUNDED.items() if k in base.VALIDATORS}
    cls = jsonschema.validators.extend(base, bounded)
    regexes = any(k in ("pattern", "patternProperties") for k, _, _ in _walk(schema))
    return _Compiled(cls(schema, registry=_registry()), regexes=regexes)


def _known(spec: ToolSpec) -> _Compiled | None:
    """The validator of ``spec`` if its schema was compiled already (for this spec object or
    another with the same schema: an episode's specs are new objects), else None."""
    known = _by_id(spec)
    return known if known is not None else _by_schema(spec, _schema_key(spec))


def _by_id(spec: ToolSpec) -> _Compiled | None:
    hit = _VALIDATORS.get(id(spec))
    return hit[1] if hit is not None and hit[0] is spec else None


def _by_schema(spec: ToolSpec, key: str) -> _Compiled | None:
    compiled = _COMPILED.get(key)
    if compiled is not None:
        _remember(spec, compiled)
    return compiled


def _schema_key(spec: ToolSpec) -> str:
    return json.dumps(spec.parameters, sort_keys=True, default=str)


def _remember(spec: ToolSpec, compiled: _Compiled) -> None:
    if len(_VALIDATORS) > 10_000:
        _VALIDATORS.clear()
    _VALIDATORS[id(spec)] = (spec, compiled)


def _compiled(spec: ToolSpec) -> _Compiled:
    known = _by_id(spec)
    if known is not None:
        return known
    key = _schema_key(spec)  # made once, for the look-up and the store
    known = _by_schema(spec, key)
    if known is not None:
        return known
    compiled = compile_schema(spec.parameters)
    if len(_COMPILED) > 10_000:
        _COMPILED.clear()
    _COMPILED[key] = compiled
    _remember(spec, compiled)
    return compiled


# --------------------------------------------------------------------------- checking


def _first_error(spec: ToolSpec, args: Any, deadline: float) -> str | None:
    """The first schema violation of ``args`` (None: valid or not checked). Runs in a thread."""
    _deadline.at = deadline
    try:
        compiled = _compiled(spec)
        if compiled.validator is None:
            _skip(spec, compiled.why)
            return None
        try:
            error = next(iter(compiled.validator.iter_errors(args)), None)
        except TimeoutError:
            raise
        except Exception as exc:  # an unresolvable $ref, a regex the engine rejects, recursion
            _skip(spec, f"checking failed ({type(exc).__name__}: {exc})")
            return None
    finally:
        _deadline.at = float("inf")
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path)
    return str(error.message) + (f" (at '{where}')" if where else "")


def _skip(spec: ToolSpec, why: str) -> None:
    key = f"{spec.origin}/{spec.name}: {why}"
    if key not in _WARNED:
        _WARNED.add(key)
        log.warning("arguments of tool %r are not checked against its schema: %s", spec.name, why)


async def schema_error(spec: ToolSpec, args: Any, timeout_s: float = SCHEMA_BUDGET_S) -> str | None:
    """Check ``args`` within min(timeout_s, SCHEMA_BUDGET_S) seconds: off the event loop the
    first time (compiling) and whenever the schema matches regular expressions."""
    budget = min(timeout_s, SCHEMA_BUDGET_S)
    deadline = time.monotonic() + budget
    known = _known(spec)
    if known is not None and not known.regexes:
        # Compiled already and no regular expression in it: plain Python bounded by the size
        # of the arguments, cheaper inline than a thread hop on every call.
        return _first_error(spec, args, deadline)
    try:
        async with asyncio.timeout(budget + 0.5):
            return await asyncio.to_thread(_first_error, spec, args, deadline)
    except TimeoutError:
        _skip(spec, f"the check ran out of its {budget:g} s budget (a pathological pattern?)")
        return None
