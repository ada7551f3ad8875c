"""The report's charts: plotly figures built with graph objects, kept as JSON for plotly.js in
the page (the layout template is sent once for all figures, not per figure).

Plotly reads a little HTML in labels (``<b>``, ``<a href>``, entities): every label from the
data (run names, domains, error types, tasks) is HTML-escaped first, so it shows as written.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from functools import cache
from typing import Any

Fig = dict[str, Any]
Series = tuple[str, Sequence[Any], Sequence[Any]]  # name, x, y


def label(text: Any) -> str:
    return html.escape(str(text), quote=False)


@cache
def template() -> dict[str, Any]:
    """The layout template every figure shares."""
    import plotly.io as pio

    out: dict[str, Any] = pio.templates["plotly_white"].to_plotly_json()
    return out


def _figure(traces: list[Any], title: str, xtitle: str, ytitle: str, **layout: Any) -> Fig:
    import plotly.graph_objects as go

    fig = go.Figure(data=traces)
    base: dict[str, Any] = {
        "title": {"text": label(title), "font": {"size": 15}},
        "xaxis_title": label(xtitle),
        "yaxis_title": label(ytitle),
        "height": 330,
        "margin": {"l": 60, "r": 20, "t": 50, "b": 50},
        "legend": {"orientation": "h", "yanchor": "top", "y": -0.18},
    }
    fig.update_layout(**(base | layout))
    out: Fig = fig.to_plotly_json()
    out["layout"].pop("template", None)
    return out


def bars(
    title: str,
    x: Sequence[Any],
    series: Sequence[tuple[str, Sequence[Any]]],
    *,
    ytitle: str = "",
    xtitle: str = "",
    horizontal: bool = False,
    digits: int = 2,
) -> Fig:
    """Grouped bars: one series per run (or published model) over the same categories."""
    import plotly.graph_objects as go

    cats = [label(c) for c in x]
    traces = []
    labelled = len(series) <= 3  # values on the bars while they fit
    for name, ys in series:
        text = [_bar_text(y, digits) for y in ys] if labelled else []
        if horizontal:
            traces.append(
                go.Bar(
                    name=label(name),
                    y=cats,
                    x=list(ys),
                    orientation="h",
                    text=text,
                    textposition="auto",
                )
            )
        else:
            traces.append(
                go.Bar(name=label(name), x=cats, y=list(ys), text=text, textposition="auto")
            )
    extra: dict[str, Any] = {"barmode": "group"}
    if horizontal:
        extra["height"] = max(330, 90 + 28 * len(cats) * max(1, len(series)))
        extra["yaxis"] = {"automargin": True, "autorange": "reversed"}
    return _figure(traces, title, xtitle, ytitle, **extra)


def bars_ci(
    title: str,
    x: Sequence[Any],
    series: Sequence[tuple[str, Sequence[float | None], Sequence[float | None]]],
    *,
    ytitle: str = "",
    xtitle: str = "",
) -> Fig:
    """Grouped bars with error bars: one series (name, means, half-widths of the intervals)
    per model over the same categories, the bars kept within [0, 1] (rewards, shares); a
    missing mean is no bar."""
    import plotly.graph_objects as go

    cats = [label(c) for c in x]
    traces = [
        go.Bar(
            name=label(name),
            x=cats,
            y=list(ys),
            error_y={
                "type": "data",
                "symmetric": False,
                "array": [min(e or 0, 1 - (y or 0)) for y, e in zip(ys, errs, strict=True)],
                "arrayminus": [min(e or 0, y or 0) for y, e in zip(ys, errs, strict=True)],
                "visible": True,
            },
            text=[_bar_text(y, 3) for y in ys],
            textposition="outside",
        )
        for name, ys, errs in series
    ]
    return _figure(traces, title, xtitle, ytitle, barmode="group")


def _bar_text(y: Any, digits: int) -> str:
    if isinstance(y, float):
        return f"{y:.{digits}f}"
    return "" if y is None else str(y)


def lines(title: str, series: Sequence[Series], *, ytitle: str = "", xtitle: str = "step") -> Fig:
    """Curves over steps, overlaid (one per run, or per run and statistic)."""
    import plotly.graph_objects as go

    traces = [
        go.Scatter(
            name=label(name),
            x=list(xs),
            y=list(ys),
            mode="lines+markers" if len(xs) <= 40 else "lines",
        )
        for name, xs, ys in series
    ]
    extra: dict[str, Any] = {"hovermode": "x unified"}
    values = {y for _, _, ys in series for y in ys if y is not None}
    if len(values) == 1 and next(iter(values)) != 0:  # a flat curve: plotly would span ±1
        v = next(iter(values))
        extra["yaxis"] = {"range": [min(0, 2 * v), max(0, 2 * v)]}
    return _figure(traces, title, xtitle, ytitle, **extra)


def histogram(
    title: str,
    series: Sequence[tuple[str, Sequence[float]]],
    *,
    xtitle: str,
    start: float,
    end: float,
    size: float,
) -> Fig:
    """Distributions, overlaid, in the same bins."""
    import plotly.graph_objects as go

    traces = [
        go.Histogram(
            name=label(name),
            x=list(values),
            opacity=0.65 if len(series) > 1 else 1.0,
            xbins={"start": start, "end": end, "size": size},
        )
        for name, values in series
    ]
    return _figure(traces, title, xtitle, "count", barmode="overlay", bargap=0.05)
