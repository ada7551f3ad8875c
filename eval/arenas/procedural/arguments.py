"""Arguments of the general families' calls: drawn from the catalogue's pools and ranges (the
value a correct call passes), and written into a request the way a person would write them
(a date as "March 5, 2026", a time as "2:30 pm", a small number as a word, a list as
"A, B and C", an object through its form), so that the model has to normalise them."""

from __future__ import annotations

import random
from typing import Any

from astra_agent.errors import ConfigError
from eval.arenas.procedural.catalog import Catalog, Param
from eval.arenas.procedural.runtime import norm
from eval.arenas.procedural.values import VALUE_KINDS, make_kind

_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August",
           "September", "October", "November", "December")  # fmt: skip
_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
          "eleven", "twelve")  # fmt: skip


def _step_value(p: Param, rng: random.Random) -> float:
    """A value of ``p``'s range on its grid (``min + k * step``)."""
    assert p.min is not None and p.max is not None
    step = p.step or 1.0
    return round(p.min + step * rng.randint(0, round((p.max - p.min) / step)), 2)


def _text(p: Param, catalog: Catalog, rng: random.Random) -> str:
    if p.pattern is not None:
        return "".join(str(rng.randint(0, 9)) if c == "#" else c for c in p.pattern)
    assert p.pool is not None
    if p.pool in catalog.pools:
        return rng.choice(catalog.pools[p.pool])
    return make_kind(p.pool, rng) if p.pool in VALUE_KINDS else p.pool


def draw(p: Param, catalog: Catalog, rng: random.Random) -> Any:
    """A valid value of ``p``, as a correct call passes it."""
    if p.type == "text":
        return _text(p, catalog, rng)
    if p.type == "int":
        return int(_step_value(p, rng))
    if p.type == "float":
        return _step_value(p, rng)
    if p.type == "bool":
        return rng.random() < 0.5
    if p.type == "enum":
        return rng.choice(p.values)
    if p.type == "date":
        return f"{rng.randint(2026, 2027)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    if p.type == "time":
        return f"{rng.randint(7, 21):02d}:{rng.choice(('00', '15', '30', '45'))}"
    if p.type == "object":
        return {f.name: draw(f, catalog, rng) for f in p.fields}
    assert p.items is not None
    want = rng.randint(p.min_items, p.max_items)
    items: list[Any] = []
    keys: set[str] = set()
    for _ in range(50 * want):  # distinct items, so that a list reads as a list
        if len(items) == want:
            break
        item = draw(p.items, catalog, rng)
        if key(p.items, item) not in keys:
            keys.add(key(p.items, item))
            items.append(item)
    if len(items) < p.min_items:
        raise ConfigError(f"list {p.name!r}: its pool has too few distinct values")
    return items


def key(p: Param, value: Any) -> str:
    """The runtime's canonical form of ``value`` (how the tool will see it)."""
    return repr(norm(p.runtime_spec(), value, p.name))


def other(p: Param, value: Any, catalog: Catalog, rng: random.Random) -> Any:
    """A valid value of ``p`` that the tool tells apart from ``value``."""
    if p.type == "bool":
        return not value
    base = None if value is None else key(p, value)
    for _ in range(200):
        new = draw(p, catalog, rng)
        if key(p, new) != base:
            return new
    raise ConfigError(f"parameter {p.name!r}: no other value to draw")


def _number(v: float) -> str:
    return f"{v:.2f}".rstrip("0").rstrip(".")


def _date(v: str, rng: random.Random) -> str:
    y, m, d = int(v[:4]), int(v[5:7]), int(v[8:])
    month = _MONTHS[m - 1]
    th = "th" if 10 <= d % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(d % 10, "th")
    return rng.choice(
        (
            v,
            f"{month} {d}, {y}",
            f"{d} {month} {y}",
            f"{month[:3]} {d}, {y}",
            f"the {d}{th} of {month} {y}",
        )
    )


def _time(v: str, rng: random.Random) -> str:
    h, m = int(v[:2]), int(v[3:])
    twelve = f"{(h - 1) % 12 + 1}{'' if m == 0 else f':{m:02d}'} {'am' if h < 12 else 'pm'}"
    return rng.choice((v, twelve, twelve.upper()))


def write(p: Param, value: Any, rng: random.Random, *, words: bool = True) -> str:
    """``value`` as a request writes it."""
    if p.type == "text":
        return f'"{value}"' if p.quote else str(value)
    if p.type == "int":
        small = 0 < value < len(_WORDS) and words and rng.random() < 0.3
        return _WORDS[value] if small else str(value)
    if p.type == "float":
        return _number(value)
    if p.type == "enum":
        return value.title() if p.title else value
    if p.type == "date":
        return _date(value, rng)
    if p.type == "time":
        return _time(value, rng)
    if p.type == "object":
        assert p.form is not None
        return p.form.format(
            **{f.name: write(f, value[f.name], rng, words=False) for f in p.fields}
        )
    if p.type == "list":
        assert p.items is not None
        parts = [write(p.items, v, rng, words=False) for v in value]
        return parts[0] if len(parts) == 1 else f"{', '.join(parts[:-1])} and {parts[-1]}"
    raise ConfigError(f"parameter {p.name!r}: a {p.type} is not written as a value")


def phrase(p: Param, value: Any, rng: random.Random) -> str:
    """How a request mentions ``p`` set to ``value``: ``for 3 nights``, ``with breakfast``."""
    if p.type == "bool":
        return rng.choice(p.when_true if value else p.when_false)
    return rng.choice(p.say).format(v=write(p, value, rng))
