"""``astra-eval report``: one self-contained HTML page (plotly charts, per-entry drill-downs)
over BFCL, arena and general eval runs and SFT/RL training runs."""

from eval.report.build import build_report, render_report

__all__ = ["build_report", "render_report"]
