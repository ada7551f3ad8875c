"""What a report page is made of: sections of blocks (tables, charts, notes, entry lists), and
the page's data (plotly figures, the entries' drill-down views) collected while they are built.

Blocks hold text only; the template escapes all of it. Numbers that tests and readers look up
carry ``key`` (``data-metric``) and ``run`` (``data-run``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Cell:
    text: str
    key: str = ""  # data-metric: what the number is (e.g. "accuracy.base")
    run: str = ""  # data-run: whose it is
    cls: str = ""  # CSS classes: num, partial, pass, fail, …
    title: str = ""  # shown on hover


@dataclass(frozen=True)
class Table:
    columns: list[str]
    rows: list[list[Cell]]
    caption: str = ""
    type: str = "table"


@dataclass(frozen=True)
class Charts:
    ids: list[str]  # figure ids in the page's figure data
    type: str = "charts"


@dataclass(frozen=True)
class Note:
    text: str
    level: str = "info"  # info, warn
    type: str = "note"


@dataclass(frozen=True)
class Heading:
    text: str
    type: str = "heading"


@dataclass(frozen=True)
class Entry:
    """One line of an entry list; its drill-down is ``views[index]`` of the list's slot."""

    id: str
    status: str  # pass, fail, part, error
    label: str  # what to show beside the id (the error type, the reward, …)


@dataclass(frozen=True)
class Entries:
    run: str
    slot: int  # which data block holds the views
    items: list[Entry]
    type: str = "entries"


Block = Table | Charts | Note | Heading | Entries


@dataclass(frozen=True)
class Section:
    """One kind's runs: ``blocks`` (figures side by side), then ``extra`` (a comparison of
    two runs), then ``entries`` (each run's per-entry lists)."""

    kind: str
    title: str
    anchor: str
    blocks: list[Block]
    entries: list[Block] = field(default_factory=list)
    extra: list[Block] = field(default_factory=list)


@dataclass
class Page:
    """Figures and drill-down views, collected while the sections are built."""

    figures: dict[str, dict[str, Any]] = field(default_factory=dict)
    views: list[list[dict[str, Any]]] = field(default_factory=list)

    def figure(self, fig: dict[str, Any]) -> str:
        fid = f"fig{len(self.figures)}"
        self.figures[fid] = fig
        return fid

    def entries(self, views: list[dict[str, Any]]) -> int:
        self.views.append(views)
        return len(self.views) - 1


# ------------------------------------------------------------------ formatting


def num(value: Any, digits: int = 2) -> str:
    """A number for a table ("–" where there is none)."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return str(value)
        if value and abs(value) < 10 ** (-digits):
            return f"{value:.2e}"
        return f"{value:,.{digits}f}"
    return "–" if value is None else str(value)


def pct(value: Any) -> str:
    """A fraction (0..1) as a percentage."""
    return f"{100 * value:.1f} %" if isinstance(value, int | float) else "–"


def counts(mapping: Any) -> str:
    if not isinstance(mapping, dict) or not mapping:
        return "none"
    return ", ".join(f"{k}={v}" for k, v in mapping.items())
