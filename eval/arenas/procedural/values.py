"""The procedural arenas' attributes (:class:`Attr`) and how their values are made: each kind
(an amount, a date, a person, a city…) from the arena's seeded random generator, always at least
3 characters (the arena matcher's shortest gold answer)."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from astra_agent.errors import ConfigError

ValueKind = Literal[
    "amount", "date", "int", "year", "email", "city", "person", "phone", "code", "country",
    "company", "time", "choice",
]  # fmt: skip


class Attr(BaseModel):
    """An attribute of an entity: its field (the tool's name part), its label in questions, its
    kind of value, and the values a ``choice`` takes."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    field: str = Field(pattern=r"^[a-z][a-z_]*$")
    label: str
    kind: ValueKind
    values: list[str] = Field(default_factory=list)


_FIRST = ("Ada", "Bruno", "Chiara", "Dmitri", "Elena", "Farid", "Greta", "Hugo", "Ines",
          "Jonas", "Keiko", "Luca", "Marta", "Nadia", "Oscar", "Priya", "Quentin", "Rosa",
          "Sven", "Tamsin", "Umar", "Vera", "Wen", "Yusuf")  # fmt: skip
_LAST = ("Abbott", "Barros", "Castell", "Duarte", "Ekberg", "Fontaine", "Gallo", "Haddad",
         "Ivanova", "Jansen", "Kowalski", "Lindqvist", "Moreau", "Novak", "Okafor", "Petrov",
         "Quiroga", "Romano", "Sato", "Tanaka", "Ueda", "Varga", "Weber", "Zielinski")  # fmt: skip
_CITIES = ("Lisbon", "Porto", "Valencia", "Lyon", "Utrecht", "Ghent", "Bergen", "Tampere",
           "Gdansk", "Brno", "Graz", "Bologna", "Seville", "Aarhus", "Cork", "Leeds",
           "Dresden", "Basel", "Krakow", "Tallinn", "Riga", "Malmo", "Nantes", "Turin")  # fmt: skip
_COUNTRIES = ("Portugal", "Spain", "France", "Netherlands", "Belgium", "Norway", "Finland",
              "Poland", "Czechia", "Austria", "Italy", "Denmark", "Ireland", "Estonia",
              "Latvia", "Sweden", "Greece", "Chile", "Kenya", "Japan")  # fmt: skip
_COMPANY_A = ("Northwind", "Bluefin", "Copperleaf", "Silverline", "Redwood", "Ironbridge",
              "Greenhill", "Starling", "Harbor", "Summit", "Westgate", "Amberly")  # fmt: skip
_COMPANY_B = ("Mutual", "Partners", "Holdings", "Group", "Trust", "Alliance", "Works",
              "Collective")  # fmt: skip


def _code(rng: random.Random) -> str:
    return "".join(rng.choice("ABCDEFGHJKLMNPRSTUVWXYZ") for _ in range(2)) + str(
        rng.randint(100, 999)
    )


def _email(rng: random.Random) -> str:
    first, last = rng.choice(_FIRST).lower(), rng.choice(_LAST).lower()
    return f"{first}.{last}{rng.randint(2, 98)}@mail.example"


_MAKERS: dict[str, Callable[[random.Random], str]] = {
    "amount": lambda r: f"{r.randint(12, 9999)}.{r.randint(0, 99):02d}",
    "date": lambda r: f"{r.randint(2019, 2026)}-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}",
    "int": lambda r: str(r.randint(120, 98000)),
    "year": lambda r: str(r.randint(1901, 2011)),
    "email": _email,
    "city": lambda r: r.choice(_CITIES),
    "person": lambda r: f"{r.choice(_FIRST)} {r.choice(_LAST)}",
    "phone": lambda r: f"+1-555-{r.randint(100, 999)}-{r.randint(1000, 9999)}",
    "code": _code,
    "country": lambda r: r.choice(_COUNTRIES),
    "company": lambda r: f"{r.choice(_COMPANY_A)} {r.choice(_COMPANY_B)}",
    "time": lambda r: f"{r.randint(7, 20):02d}:{r.choice(('00', '15', '30', '45'))}",
}


def make_value(attr: Attr, rng: random.Random) -> str:
    """A value of ``attr``'s kind: at least 3 characters, as the tool returns it."""
    if attr.kind != "choice":
        return _MAKERS[attr.kind](rng)
    if not attr.values:
        raise ConfigError(f"attribute {attr.field!r} of kind choice has no values")
    return rng.choice(attr.values)


def make_kind(kind: str, rng: random.Random) -> str:
    """A value of one of the kinds above (``person``, ``city``…; not ``choice``)."""
    if kind not in _MAKERS:
        raise ConfigError(f"unknown value kind {kind!r}", hint=f"known: {', '.join(_MAKERS)}")
    return _MAKERS[kind](rng)


VALUE_KINDS = tuple(_MAKERS)
