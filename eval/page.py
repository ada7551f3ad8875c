"""``astra-eval report``: one self-contained HTML page over eval and training runs, built
from each run's kind (its section: :attr:`eval.run.EvalKind.section`; the training runs'
curves) with the toolkit of :mod:`eval.report`. It sits above the registry (:mod:`eval.kinds`),
which sits above the eval packages, which sit above the toolkit.

The page needs no network. plotly's JavaScript is embedded once, as gzip + base64 (1.9 MB
instead of 4.8), which the page's script unpacks with the browser's ``DecompressionStream``
and runs; the charts travel as one JSON block beside it. An entry list (BFCL entries, arena
tasks, general samples) travels as a JSON index of its lines, built into the page when it
comes near the screen, and its drill-down views as gzip + base64 blocks of :data:`CHUNK`
entries each, unpacked when one of their entries is first opened and rendered as text nodes.

Everything from a run is escaped: HTML by the template's autoescaping, JSON blocks by escaping
``<``, ``>``, ``&`` and U+2028/U+2029 (no ``</script>`` can end a block early), the packed
blocks by being base64. The page is written through a temp file and a rename.
"""

from __future__ import annotations

import base64
import gzip
import json
import math
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from markupsafe import Markup

from astra_agent.errors import AstraError, ConfigError
from astra_agent.runio import write_text_atomic
from eval.compare import compare_loaded
from eval.kinds import registry
from eval.report import charts
from eval.report.blocks import Block, Entries, Note, Page, Section
from eval.report.comparison import comparison_blocks
from eval.report.curves import rl_section, sft_section
from eval.run import EvalKind, Run

TEMPLATES = Path(__file__).parent / "report" / "templates"
# The training kinds' sections and titles (the eval kinds': eval.kinds).
TRAINING: dict[str, tuple[str, Callable[[list[Run], Page], Section]]] = {
    "sft": ("SFT", sft_section),
    "rl": ("RL", rl_section),
}
GZIP_LEVEL = 6  # 9 saves ≈5 % for twice the time
CHUNK = 100  # entry views per packed block: packed in parallel, unpacked as they are opened


def build_report(
    runs: Sequence[Run], out: Path, overwrite: bool = False, title: str | None = None
) -> Path:
    """Render ``runs`` into the HTML file ``out`` (refused if it exists, unless
    ``overwrite``); returns ``out``."""
    out = Path(out)
    check_target(out, overwrite)
    write_atomic(out, render_report(runs, title))
    return out


def check_target(out: Path, overwrite: bool) -> None:
    """``out`` may be written: not a directory, and not an existing file unless
    ``overwrite``."""
    if out.is_dir():
        raise ConfigError(f"{out} is a directory", hint="--out names the HTML file to write")
    if out.exists() and not overwrite:
        raise ConfigError(
            f"{out} already exists", hint="pass --overwrite to replace it, or choose another --out"
        )


def write_atomic(out: Path, text: str) -> None:
    """Write ``text`` to ``out`` whole (:func:`astra_agent.runio.write_text_atomic`); a
    directory or file that cannot be written is a ConfigError."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(out, text)
    except OSError as exc:
        raise ConfigError(f"cannot write {out}: {exc.strerror or exc}") from None


def render_report(runs: Sequence[Run], title: str | None = None) -> str:
    """The page's HTML."""
    if not runs:
        raise ConfigError("no run to report on", hint="pass one or more run directories")
    page = Page()
    sections = _sections(list(runs), page)
    names = [r.name for r in runs]
    title = title or "ASTRA report: " + ", ".join(names[:3]) + (" …" if len(names) > 3 else "")
    context = {
        "title": title,
        "generated": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "runs": [_overview(r, sections) for r in runs],
        "sections": sections,
        "figures": script_json({"template": charts.template(), "figures": page.figures}),
        "indexes": _indexes(sections),
        **_packed(page.views),
    }
    return str(_environment().get_template("report.html.jinja").render(**context))


def _sections(runs: list[Run], page: Page) -> list[Section]:
    """A section per kind of run there is, eval kinds first (in the registry's order)."""
    out = []
    for kind in registry():
        if group := [r for r in runs if r.eval_kind is kind]:
            out.append(_eval_section(kind, group, page))
    for name, (_, section) in TRAINING.items():
        if group := [r for r in runs if r.eval_kind is None and r.kind == name]:
            out.append(section(group, page))
    return out


def _eval_section(kind: EvalKind, runs: list[Run], page: Page) -> Section:
    section = kind.section(runs, page)
    if kind.pairing is not None and len(runs) == 2:
        section = replace(section, extra=_comparison(kind, *runs))
    return section


def _comparison(kind: EvalKind, a: Run, b: Run) -> list[Block]:
    """``eval.compare`` of two runs of one eval, or why there is none."""
    try:
        data = compare_loaded(a, b).to_dict()
    except AstraError as exc:
        return [Note(f"no comparison of {a.name} and {b.name}: {exc.message}", "warn")]
    extra = kind.compare_blocks(data) if kind.compare_blocks is not None else []
    return [*comparison_blocks(a, b, data), *extra]


def _title(run: Run) -> str:
    return run.eval_kind.title if run.eval_kind is not None else TRAINING[run.kind][0]


def _overview(run: Run, sections: list[Section]) -> dict[str, Any]:
    size = f"{len(run.records):,} records" if run.is_eval else f"{len(run.metrics):,} steps logged"
    anchor = next((s.anchor for s in sections if s.kind == run.kind), "")
    return {
        "name": run.name,
        "kind": _title(run),
        "anchor": anchor,
        "model": run.model,
        "path": str(run.path),
        "size": size,
        "partial": run.partial,
        "problems": run.problems,
    }


# ------------------------------------------------------------------ embedding


@cache
def _environment() -> Environment:
    return Environment(
        loader=FileSystemLoader(TEMPLATES),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )


_SCRIPT_SAFE = str.maketrans(
    {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
)


def _dumps(data: Any) -> str:
    try:
        return json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except ValueError:  # NaN or infinity somewhere (a diverged loss): JSON has no such number
        return json.dumps(_finite(data), ensure_ascii=False, separators=(",", ":"))


def _finite(data: Any) -> Any:
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: _finite(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [_finite(v) for v in data]
    return data


def script_json(data: Any) -> Markup:
    """JSON for a ``<script type="application/json">`` block: nothing in it can end the block
    or be read as HTML (``<``, ``>``, ``&`` and the JavaScript line separators escaped)."""
    return Markup(_dumps(data).translate(_SCRIPT_SAFE))


def pack(views: list[dict[str, Any]]) -> str:
    """Entry views as gzip + base64 (the page decodes them with ``DecompressionStream``)."""
    raw = _dumps(views).encode("utf-8")
    return base64.b64encode(gzip.compress(raw, compresslevel=GZIP_LEVEL, mtime=0)).decode("ascii")


def _indexes(sections: list[Section]) -> list[dict[str, Any]]:
    """Each entry list's lines ([id, status, label] per entry) as a JSON block: the page
    builds the list from it when the list comes near the screen."""
    lists = [b for s in sections for b in (*s.blocks, *s.entries) if isinstance(b, Entries)]
    return [
        {"slot": b.slot, "json": script_json([[e.id, e.status, e.label] for e in b.items])}
        for b in lists
    ]


def _packed(views: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """plotly.js and every chunk of entry views, packed in parallel (zlib releases the GIL)."""
    chunks = [
        (f"{slot}-{i // CHUNK}", vs[i : i + CHUNK])
        for slot, vs in enumerate(views)
        for i in range(0, len(vs), CHUNK)
    ]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        js = pool.submit(packed_plotly_js)
        data = list(pool.map(pack, [c for _, c in chunks]))
        return {
            "entry_blocks": [{"id": k, "data": d} for (k, _), d in zip(chunks, data, strict=True)],
            "chunk": CHUNK,
            "plotly_js": js.result(),
        }


@cache
def plotly_js() -> str:
    """plotly.js as shipped in the plotly package."""
    from plotly.offline import get_plotlyjs

    return str(get_plotlyjs())


@cache
def packed_plotly_js() -> str:
    """plotly.js as gzip + base64 (a third of its size); the page unpacks and runs it."""
    raw = plotly_js().encode("utf-8")
    return base64.b64encode(gzip.compress(raw, compresslevel=GZIP_LEVEL, mtime=0)).decode("ascii")
