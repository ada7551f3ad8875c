"""``astra-eval report``: one self-contained HTML page (plotly charts, per-entry drill-downs)
over the eval runs (each kind's section: :mod:`eval.kinds`) and SFT/RL training runs.

Importing the package imports nothing: the eval kinds import their sections from its modules,
and :mod:`eval.report.build` imports the kinds."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from eval.report.build import build_report, render_report

__all__ = ["build_report", "render_report"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from eval.report import build

        return getattr(build, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
